# Generated from tests/_async/test_runner.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""The runner and ``lease.hold()``: every way a run or a held block can end.

Fencing is produced for real (the fake clock moves past the expiry and a rival takes the
work ID over); window exhaustion with a backend whose renewals keep failing. Outside
cancellation exists only in the asyncio flavour and is tested in ``tests/async_only``.
"""

from __future__ import annotations

import math
from time import monotonic

import pytest

from tests._compat import sleep, spawn_all
from worklease import (
    BackendError,
    Backoff,
    Checkpoint,
    ConfigError,
    ExitMode,
    FencedError,
    Hold,
    Lease,
    LeaseHeldError,
    LeaseRequiredError,
    LeaseWindowExhaustedError,
    Retire,
    Runner,
    Token,
    WorkFnRequiredError,
    current_renewal,
)
from worklease.testing import FakeClock, RecordingObserver

from .helpers import ScriptedBackend, spin, transient

HOLDER = "test-worker"
TTL = 10.0
FAST = Backoff(0.001, 0.005, 0.0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> ScriptedBackend:
    return ScriptedBackend(clock=clock)


@pytest.fixture
def observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture
def lease(backend: ScriptedBackend, observer: RecordingObserver) -> Lease:
    return Lease(backend, holder_id=HOLDER, ttl=TTL, observer=observer)


@pytest.fixture
def rival(backend: ScriptedBackend) -> Lease:
    return Lease(backend, holder_id="rival", ttl=TTL)


def prior_of(rival: Lease, work_id: str) -> Checkpoint:
    """What the next holder reads: acquire fail-fast as the rival and read the checkpoint."""
    token = rival.acquire(work_id)
    return rival.read_checkpoint(token)


class Recorder:
    """A work function that records its calls, optionally checkpoints, then ends as told."""

    def __init__(
        self,
        lease: Lease,
        *,
        result: bytes | None = None,
        midway: bytes | None = None,
        error: BaseException | None = None,
    ) -> None:
        self.lease = lease
        self.result = result
        self.midway = midway
        self.error = error
        self.calls: list[tuple[Token, Checkpoint]] = []

    def __call__(self, token: Token, prior: Checkpoint) -> bytes | None:
        self.calls.append((token, prior))
        if self.midway is not None:
            self.lease.checkpoint(token, self.midway)
        if self.error is not None:
            raise self.error
        return self.result


# -- runner: normal endings -------------------------------------------------------------------


def test_quick_start_runs_twice(lease: Lease, backend: ScriptedBackend) -> None:
    """The quick start: the first run starts fresh, the second sees it finished."""
    work = Recorder(lease, result=b"step 1 done")
    runner = Runner(lease, work)
    runner.run("job")  # returns None (typed so; mypy --strict checks it)
    runner.run("job")
    (token1, prior1), (token2, prior2) = work.calls
    assert prior1 == Checkpoint(None, ExitMode.NONE, None)
    assert prior2 == Checkpoint(b"step 1 done", ExitMode.FINISHED, HOLDER)
    assert token1.work_id == token2.work_id == "job"
    assert token2.fencing_token > token1.fencing_token
    (row,) = backend.inner.rows()
    assert (row.exit_mode, row.checkpoint) == (ExitMode.FINISHED, b"step 1 done")


def test_none_keeps_the_checkpoint(lease: Lease, rival: Lease, backend: ScriptedBackend) -> None:
    """Returning None keeps the last checkpoint written; released FINISHED."""
    Runner(lease, Recorder(lease, midway=b"mid")).run("job")
    assert backend.count("checkpoint") == 1
    assert prior_of(rival, "job") == Checkpoint(b"mid", ExitMode.FINISHED, HOLDER)


def test_empty_bytes_clear_the_checkpoint(
    lease: Lease, rival: Lease, backend: ScriptedBackend
) -> None:
    """Returning b"" writes it as the final checkpoint, which clears the state."""
    Runner(lease, Recorder(lease, midway=b"mid", result=b"")).run("job")
    assert backend.count("checkpoint") == 2
    assert prior_of(rival, "job") == Checkpoint(None, ExitMode.FINISHED, HOLDER)


def test_bytes_become_the_final_checkpoint(
    lease: Lease, rival: Lease, backend: ScriptedBackend
) -> None:
    """Returning bytes writes them, then releases FINISHED."""
    Runner(lease, Recorder(lease, midway=b"mid", result=b"final")).run("job")
    assert backend.names()[-2:] == ["checkpoint", "release"]
    assert prior_of(rival, "job") == Checkpoint(b"final", ExitMode.FINISHED, HOLDER)


def test_retire_with_state(lease: Lease, rival: Lease, backend: ScriptedBackend) -> None:
    """Retire(state) writes the state, releases RETIRED, and run returns None."""
    runner = Runner(lease, Recorder(lease, midway=b"mid", error=Retire(b"final")))
    runner.run("job")  # the Retire does not propagate
    assert backend.of("release")[-1].args[1] is ExitMode.RETIRED
    assert prior_of(rival, "job") == Checkpoint(b"final", ExitMode.RETIRED, HOLDER)


def test_retire_without_state(lease: Lease, rival: Lease, backend: ScriptedBackend) -> None:
    """Retire() keeps the last checkpoint and releases RETIRED."""
    Runner(lease, Recorder(lease, midway=b"mid", error=Retire())).run("job")
    assert backend.count("checkpoint") == 1
    assert prior_of(rival, "job") == Checkpoint(b"mid", ExitMode.RETIRED, HOLDER)


def test_exception_abandons(lease: Lease, rival: Lease, backend: ScriptedBackend) -> None:
    """Any other exception releases ABANDONED, keeps the checkpoint, and propagates."""
    boom = ValueError("work failed")
    with pytest.raises(ValueError, match="work failed") as caught:
        Runner(lease, Recorder(lease, midway=b"half", result=b"x", error=boom)).run("job")
    assert caught.value is boom
    assert backend.count("checkpoint") == 1
    assert prior_of(rival, "job") == Checkpoint(b"half", ExitMode.ABANDONED, HOLDER)


def test_renews_during_long_work(lease: Lease, backend: ScriptedBackend) -> None:
    """The lease is renewed in the background while the work runs past its TTL."""
    short = Lease(backend, holder_id=HOLDER, ttl=0.3)

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        renewal = current_renewal()
        assert renewal is not None
        assert renewal.token == token
        spin(renewal, seconds=0.6)
        return b"done"

    Runner(short, work).run("job")
    assert backend.count("renew") >= 2
    assert backend.inner.rows()[0].exit_mode is ExitMode.FINISHED


def test_concurrent_runs(lease: Lease, backend: ScriptedBackend) -> None:
    """One runner runs several work IDs at once."""
    work = Recorder(lease, result=b"ok")
    runner = Runner(lease, work)

    def one(index: int) -> None:
        runner.run("job-" + str(index))

    assert spawn_all(one, 3) == [None, None, None]
    assert [row.exit_mode for row in backend.inner.rows()] == [ExitMode.FINISHED] * 3


# -- runner: lost leases and failures ---------------------------------------------------------


def test_fenced_during_work(lease: Lease, backend: ScriptedBackend, clock: FakeClock) -> None:
    """A successor takes over mid-work: FencedError, nothing written or released."""

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        backend.take_over("job", "rival", clock)
        renewal = current_renewal()
        assert renewal is not None
        for _ in range(500):  # ignores the loss (never raise_if_lost); async: cancelled
            if renewal.lost:
                break
            sleep(0.01)
        return b"written by a zombie"

    runner = Runner(lease, work, renewal_interval=0.02)
    with pytest.raises(FencedError):
        runner.run("job")
    successor_row = backend.inner.rows()[0]
    assert successor_row.holder_id == "rival"
    assert successor_row.exit_mode is None
    assert successor_row.checkpoint is None
    assert "checkpoint" not in backend.names()
    assert "release" not in backend.names()


def test_window_exhausted(backend: ScriptedBackend, rival: Lease, clock: FakeClock) -> None:
    """Renewals keep failing: LeaseWindowExhaustedError, no release; successor sees EXPIRED."""
    short = Lease(backend, holder_id=HOLDER, ttl=0.3)
    backend.fail_always("renew")
    called: list[Token] = []

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        called.append(token)
        short.checkpoint(token, b"partial")
        renewal = current_renewal()
        assert renewal is not None
        spin(renewal)
        return b"never written"

    start = monotonic()
    with pytest.raises(LeaseWindowExhaustedError):
        Runner(short, work, renewal_interval=0.02, renewal_backoff=FAST).run("job")
    assert monotonic() - start < 3.0
    assert len(called) == 1
    assert backend.count("checkpoint") == 1
    assert "release" not in backend.names()
    clock.advance(1)
    assert prior_of(rival, "job") == Checkpoint(b"partial", ExitMode.EXPIRED, HOLDER)


def test_read_checkpoint_failure(
    lease: Lease, rival: Lease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """A failed checkpoint read: the error propagates, work is not called, nothing released."""
    work = Recorder(lease)
    boom = transient()
    backend.fail("read_checkpoint", boom)
    with pytest.raises(BackendError) as caught:
        Runner(lease, work).run("job")
    assert caught.value is boom
    assert work.calls == []
    assert backend.names() == ["acquire", "read_checkpoint"]
    with pytest.raises(LeaseHeldError):
        rival.acquire("job")  # still held until its TTL runs out
    clock.advance(TTL + 1)
    assert prior_of(rival, "job") == Checkpoint(None, ExitMode.EXPIRED, HOLDER)


def test_final_checkpoint_failure_abandons(
    lease: Lease, rival: Lease, backend: ScriptedBackend
) -> None:
    """The final checkpoint fails: released ABANDONED and the write error propagates."""
    boom = transient()
    backend.fail("checkpoint", boom)
    with pytest.raises(BackendError) as caught:
        Runner(lease, Recorder(lease, result=b"final")).run("job")
    assert caught.value is boom
    assert prior_of(rival, "job") == Checkpoint(None, ExitMode.ABANDONED, HOLDER)


def test_release_failure_after_success(lease: Lease, backend: ScriptedBackend) -> None:
    """The release of a successful run fails: the release error propagates."""
    boom = transient()
    backend.fail("release", boom)
    with pytest.raises(BackendError) as caught:
        Runner(lease, Recorder(lease, result=b"final")).run("job")
    assert caught.value is boom
    assert backend.inner.rows()[0].checkpoint == b"final"


def test_held_fails_fast(lease: Lease, rival: Lease) -> None:
    """A held work ID raises LeaseHeldError; the work is not called."""
    rival.acquire("job")
    work = Recorder(lease)
    with pytest.raises(LeaseHeldError):
        Runner(lease, work).run("job")
    assert work.calls == []


def test_acquire_timeout(lease: Lease, rival: Lease) -> None:
    """acquire_wait with acquire_timeout ends with TimeoutError; the work is not called."""
    rival.acquire("job")
    work = Recorder(lease)
    runner = Runner(lease, work, acquire_wait=True, acquire_timeout=0.2, poll_interval=0.05)
    start = monotonic()
    with pytest.raises(TimeoutError):
        runner.run("job")
    assert 0.15 <= monotonic() - start < 3.0
    assert work.calls == []


def test_acquire_wait(lease: Lease, backend: ScriptedBackend) -> None:
    """acquire_wait polls until the work ID is free, then runs the work."""
    backend.fail("acquire", LeaseHeldError("held (injected)"), LeaseHeldError("held"))
    work = Recorder(lease, result=b"ok")
    Runner(lease, work, acquire_wait=True, poll_interval=0.01).run("job")
    assert backend.count("acquire") == 3
    assert len(work.calls) == 1


@pytest.mark.parametrize("work_id", ["", "a\x00b", "x" * 1025, 7])
def test_bad_work_id(lease: Lease, backend: ScriptedBackend, work_id: object) -> None:
    """An invalid work ID fails before any I/O; the work is not called."""
    work = Recorder(lease)
    with pytest.raises((TypeError, ValueError)):
        Runner(lease, work).run(work_id)  # type: ignore[arg-type]
    assert backend.calls == []
    assert work.calls == []


# -- runner: configuration --------------------------------------------------------------------


def test_config_lease_required(lease: Lease) -> None:
    """A runner without a lease raises LeaseRequiredError (checked before the work)."""
    with pytest.raises(LeaseRequiredError) as caught:
        Runner(None, Recorder(lease))  # type: ignore[arg-type]
    assert isinstance(caught.value, ConfigError)
    with pytest.raises(LeaseRequiredError):
        Runner(None, None)  # type: ignore[arg-type]


def test_config_work_required(lease: Lease) -> None:
    """A runner without a (callable) work function raises WorkFnRequiredError."""
    with pytest.raises(WorkFnRequiredError) as caught:
        Runner(lease, None)  # type: ignore[arg-type]
    assert isinstance(caught.value, ConfigError)
    with pytest.raises(WorkFnRequiredError):
        Runner(lease, "not callable")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {"cleanup_timeout": 0},
        {"cleanup_timeout": -1.0},
        {"cleanup_timeout": math.nan},
        {"poll_interval": 0},
        {"renewal_interval": 0},
        {"acquire_timeout": 1.0},
    ],
    ids=["cleanup-0", "cleanup-negative", "cleanup-nan", "poll-0", "interval-0", "timeout-no-wait"],
)
def test_config_errors(lease: Lease, options: dict[str, float]) -> None:
    """Unusable runner options raise ConfigError at construction."""
    with pytest.raises(ConfigError):
        Runner(lease, Recorder(lease), **options)  # type: ignore[arg-type]


# -- hold -------------------------------------------------------------------------------------


def test_hold_normal_exit_finishes(lease: Lease, rival: Lease, backend: ScriptedBackend) -> None:
    """hold: a normal exit releases FINISHED; token, prior, renewal and checkpoint work."""
    hold = lease.hold("job", interval=0.05)
    assert hold.work_id == "job"
    with pytest.raises(RuntimeError):
        _ = hold.token  # not entered yet
    with hold as h:
        assert h is hold
        assert h.prior == Checkpoint(None, ExitMode.NONE, None)
        assert h.token.work_id == "job"
        assert current_renewal() is h.renewal
        h.checkpoint(b"progress")
    assert current_renewal() is None
    assert h.renewal.remaining() is None
    assert backend.of("release")[0].args == (h.token, ExitMode.FINISHED)
    assert prior_of(rival, "job") == Checkpoint(b"progress", ExitMode.FINISHED, HOLDER)


def test_hold_enters_once(lease: Lease) -> None:
    """hold: a hold object is entered once."""
    hold = lease.hold("job")
    with hold:
        pass
    with pytest.raises(RuntimeError):
        with hold:
            pass


def test_hold_retire_with_state(lease: Lease, rival: Lease) -> None:
    """hold: Retire(state) checkpoints the state, releases RETIRED, does not propagate."""
    with lease.hold("job") as h:
        h.checkpoint(b"mid")
        raise Retire(b"final")
    assert prior_of(rival, "job") == Checkpoint(b"final", ExitMode.RETIRED, HOLDER)


def test_hold_retire_without_state(lease: Lease, rival: Lease, backend: ScriptedBackend) -> None:
    """hold: Retire() keeps the checkpoint and releases RETIRED."""
    with lease.hold("job") as h:
        h.checkpoint(b"mid")
        raise Retire()
    assert backend.count("checkpoint") == 1
    assert prior_of(rival, "job") == Checkpoint(b"mid", ExitMode.RETIRED, HOLDER)


def test_hold_exception_abandons(lease: Lease, rival: Lease) -> None:
    """hold: another exception releases ABANDONED, keeps the checkpoint, and propagates."""

    def body(hold: Hold) -> None:
        hold.checkpoint(b"half")
        raise KeyError("boom")

    with pytest.raises(KeyError):
        with lease.hold("job") as h:
            body(h)
    assert prior_of(rival, "job") == Checkpoint(b"half", ExitMode.ABANDONED, HOLDER)


def test_hold_lost_writes_nothing(lease: Lease, backend: ScriptedBackend, clock: FakeClock) -> None:
    """hold: when the lease is lost nothing is written and the loss propagates."""

    def body(hold: Hold) -> None:
        backend.take_over("job", "rival", clock)
        spin(hold.renewal)

    with pytest.raises(FencedError):
        with lease.hold("job", interval=0.02) as h:
            body(h)
    assert h.renewal.lost
    assert "release" not in backend.names()
    (row,) = backend.inner.rows()
    assert (row.holder_id, row.exit_mode) == ("rival", None)


def test_hold_window_exhausted_writes_nothing(
    backend: ScriptedBackend, rival: Lease, clock: FakeClock
) -> None:
    """hold: window exhaustion propagates; nothing released, the successor sees EXPIRED."""
    short = Lease(backend, holder_id=HOLDER, ttl=0.3)
    backend.fail_always("renew")
    with pytest.raises(LeaseWindowExhaustedError):
        with short.hold("job", interval=0.02, backoff=FAST) as h:
            spin(h.renewal)
    assert "release" not in backend.names()
    clock.advance(1)
    assert (prior_of(rival, "job")).prev_exit is ExitMode.EXPIRED


def test_hold_body_fenced_error_writes_nothing(
    lease: Lease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """hold: a FencedError raised by the block (before the renewal noticed) releases nothing."""

    def body(hold: Hold) -> None:
        backend.take_over("job", "rival", clock)
        hold.checkpoint(b"late")

    with pytest.raises(FencedError):
        with lease.hold("job", interval=30) as h:
            body(h)
    assert not h.renewal.lost
    assert "release" not in backend.names()
    assert backend.inner.rows()[0].holder_id == "rival"


def test_hold_read_failure_releases_nothing(lease: Lease, backend: ScriptedBackend) -> None:
    """hold: a failed checkpoint read raises on entry; the block never runs; no release."""
    backend.fail("read_checkpoint", transient())
    ran = False
    with pytest.raises(BackendError):
        with lease.hold("job"):
            ran = True
    assert not ran
    assert backend.names() == ["acquire", "read_checkpoint"]
    assert backend.inner.rows()[0].exit_mode is None


def test_hold_wait_timeout(lease: Lease, rival: Lease) -> None:
    """hold: wait=True with a timeout ends with TimeoutError when the work ID stays held."""
    rival.acquire("job")
    ran = False
    with pytest.raises(TimeoutError):
        with lease.hold("job", wait=True, timeout=0.1, poll_interval=0.02):
            ran = True
    assert not ran


def test_hold_release_failure_on_error_is_noted(lease: Lease, backend: ScriptedBackend) -> None:
    """hold: if releasing ABANDONED fails, the block's exception propagates with a note."""
    backend.fail("release", transient("release failed (injected)"))
    with pytest.raises(KeyError) as caught:
        with lease.hold("job"):
            raise KeyError("boom")
    assert any("release failed" in note for note in caught.value.__notes__)


def test_hold_release_failure_on_success(lease: Lease, backend: ScriptedBackend) -> None:
    """hold: if releasing FINISHED fails, the release error propagates."""
    boom = transient()
    backend.fail("release", boom)
    with pytest.raises(BackendError) as caught:
        with lease.hold("job"):
            pass
    assert caught.value is boom


def test_hold_retire_checkpoint_failure(
    lease: Lease, rival: Lease, backend: ScriptedBackend
) -> None:
    """hold: Retire(state) whose write fails releases ABANDONED and raises the write error."""
    boom = transient()

    def body(hold: Hold) -> None:
        hold.checkpoint(b"mid")
        backend.fail("checkpoint", boom)
        raise Retire(b"final")

    with pytest.raises(BackendError) as caught:
        with lease.hold("job") as h:
            body(h)
    assert caught.value is boom
    assert backend.of("release")[-1].args[1] is ExitMode.ABANDONED
    assert prior_of(rival, "job") == Checkpoint(b"mid", ExitMode.ABANDONED, HOLDER)


def test_hold_bad_cleanup_timeout(lease: Lease, backend: ScriptedBackend) -> None:
    """hold: a non-positive cleanup_timeout is refused before any I/O."""
    with pytest.raises(ValueError):
        lease.hold("job", cleanup_timeout=0)
    assert backend.calls == []


def test_hold_cleanup_timeout_bounds_final_writes(lease: Lease, backend: ScriptedBackend) -> None:
    """hold: the wait for the final release ends after cleanup_timeout (both flavours)."""
    backend.delay("release", 2.0)
    start = monotonic()
    with pytest.raises(TimeoutError):
        with lease.hold("job", cleanup_timeout=0.2):
            pass
    assert monotonic() - start < 1.5
