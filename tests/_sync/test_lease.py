# Generated from tests/_async/test_lease.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Lease-level cases L1-L28 (behaviour.md section 4.5), adapted to the Python API.

Go's mock backend becomes ``ScriptedBackend`` (a memory backend with a call log and injected
failures or delays); Go contexts become ``timeout=`` (acquire) and the renewal context
manager. Fencing is produced for real: the fake clock moves past the expiry and a rival
takes the work ID over.

Cases that need an outside cancellation (L6: cancel a waiting acquire after 20 ms; L21: the
parent context's deadline ends the renewal) exist only in the asyncio flavour and are
tested in ``tests/async_only``; L27 (``HasWaitForLease``) has no Python counterpart:
``acquire(wait=True)`` is a keyword argument, not an option list to inspect.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from datetime import UTC, datetime, timedelta
from time import monotonic

import pytest

from tests._compat import sleep, spawn_all
from worklease import (
    AcquireEvent,
    BackendError,
    BackendRequiredError,
    Backoff,
    Checkpoint,
    CheckpointEvent,
    ConfigError,
    DeclaredExit,
    ExitMode,
    FencedError,
    FencedEvent,
    ForgetEvent,
    InvalidExitModeError,
    InvalidTokenError,
    Lease,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLapsedError,
    LeaseObserver,
    LeaseWindowExhaustedError,
    Operation,
    ReadCheckpointEvent,
    ReleaseEvent,
    Renewal,
    RenewEvent,
    RetentionRequiredError,
    SweepEvent,
    Token,
    Vacuum,
    current_renewal,
)
from worklease.testing import FakeClock, RecordingObserver

from .helpers import ScriptedBackend, spin, transient

HOLDER = "test-worker"
TTL = 10.0
FAST = Backoff(0.001, 0.005, 0.0)
"""Retry pacing for tests that exhaust a window quickly."""


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


def renew_events(observer: RecordingObserver) -> list[RenewEvent]:
    return observer.of_type(RenewEvent)


def write(lease: Lease, token: Token, operation: Operation) -> None:
    """One write through the lease: checkpoint (7 bytes), renew or release FINISHED."""
    if operation is Operation.CHECKPOINT:
        lease.checkpoint(token, b"payload")
    elif operation is Operation.RENEW:
        lease.renew(token)
    else:
        lease.release(token, ExitMode.FINISHED)


# -- L1: construction ---------------------------------------------------------------------


def test_l1_valid_config(backend: ScriptedBackend) -> None:
    """L1: a valid config gives a lease; a timedelta TTL and the 1 ms minimum are accepted."""
    lease = Lease(backend, holder_id="h", ttl=timedelta(seconds=2))
    assert (lease.holder_id, lease.ttl, lease.backend) == ("h", 2.0, backend)
    assert Lease(backend, holder_id="h", ttl=0.001).ttl == 0.001
    assert isinstance(lease.observer, LeaseObserver)
    assert backend.calls == []


def test_l1_backend_required() -> None:
    """L1: no backend raises BackendRequiredError (a ConfigError and a ValueError)."""
    with pytest.raises(BackendRequiredError) as caught:
        Lease(None, holder_id="h", ttl=1)  # type: ignore[arg-type]
    assert isinstance(caught.value, ConfigError)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "ttl",
    [
        0,
        -1,
        0.0,
        math.nan,
        math.inf,
        -math.inf,
        0.0005,
        timedelta(0),
        timedelta(seconds=-1),
        timedelta(microseconds=999),
        True,
        "soon",
        "0s",
        None,
    ],
)
def test_l1_bad_ttl(backend: ScriptedBackend, ttl: object) -> None:
    """L1: a TTL that is not a finite number of seconds of at least 1 ms is a ConfigError."""
    with pytest.raises(ConfigError):
        Lease(backend, holder_id="h", ttl=ttl)  # type: ignore[arg-type]
    assert backend.calls == []


@pytest.mark.parametrize("holder_id", ["", None, 5, "a\x00b"])
def test_l1_bad_holder_id(backend: ScriptedBackend, holder_id: object) -> None:
    """L1: an empty (or non-string) holder ID is a ConfigError."""
    with pytest.raises(ConfigError):
        Lease(backend, holder_id=holder_id, ttl=1)  # type: ignore[arg-type]


def test_l1_observer_must_be_a_lease_observer(backend: ScriptedBackend) -> None:
    """L1: an observer that is not a LeaseObserver is a ConfigError."""
    with pytest.raises(ConfigError):
        Lease(backend, holder_id="h", ttl=1, observer=object())  # type: ignore[arg-type]


# -- L2-L7: acquire ---------------------------------------------------------------------------


def test_l2_acquire_returns_backend_token(
    lease: Lease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """L2: the token carries the backend's values; the backend got (work_id, holder, TTL)."""
    token = lease.acquire("w1")
    assert backend.names() == ["acquire"]
    assert backend.calls[0].args == ("w1", HOLDER, TTL)
    (row,) = backend.inner.rows()
    assert token == Token("w1", HOLDER, row.fencing_token, row.expires_at)
    assert token.expires_at == clock.now() + timedelta(seconds=TTL)
    assert hash(token) == hash(Token("w1", HOLDER, row.fencing_token, row.expires_at))


def test_l3_fail_fast_when_held(lease: Lease, rival: Lease, backend: ScriptedBackend) -> None:
    """L3: a held work ID raises LeaseHeldError after exactly one backend call."""
    rival.acquire("w1")
    backend.calls.clear()
    with pytest.raises(LeaseHeldError) as caught:
        lease.acquire("w1")
    assert backend.names() == ["acquire"]
    assert caught.value.holder_id == "rival"
    assert caught.value.expires_at == backend.inner.rows()[0].expires_at


def test_l3_not_reentrant(lease: Lease) -> None:
    """L3: the holder itself gets LeaseHeldError for a lease it holds."""
    lease.acquire("w1")
    with pytest.raises(LeaseHeldError):
        lease.acquire("w1")


def test_l4_wait_polls_until_acquired(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L4: held, held, then free: a waiting acquire returns the token after three tries."""
    busy = LeaseHeldError("held (injected)", work_id="w1", holder_id="rival")
    backend.fail("acquire", busy, LeaseHeldError("held again (injected)"))
    token = lease.acquire("w1", wait=True, poll_interval=0.01)
    assert token.fencing_token == 1
    assert backend.count("acquire") == 3
    events = observer.of_type(AcquireEvent)
    assert [(e.token is None, type(e.error)) for e in events] == [
        (True, LeaseHeldError),
        (True, LeaseHeldError),
        (False, type(None)),
    ]
    assert events[0].error is busy
    assert events[2].token == token


def test_l4_wait_gets_the_lease_when_released(lease: Lease, rival: Lease) -> None:
    """L4: a waiting acquire gets the lease once the holder releases it."""
    held = rival.acquire("w1")

    def step(index: int) -> Token | None:
        if index == 0:
            return lease.acquire("w1", wait=True, timeout=5, poll_interval=0.02)
        sleep(0.1)
        rival.release(held, ExitMode.FINISHED)
        return None

    got, _ = spawn_all(step, 2)
    assert isinstance(got, Token)
    assert got.fencing_token == held.fencing_token + 1
    prior = lease.read_checkpoint(got)
    assert (prior.prev_exit, prior.prev_holder_id) == (ExitMode.FINISHED, "rival")


def test_l5_wait_timeout_raises_timeout_error(
    lease: Lease, rival: Lease, backend: ScriptedBackend
) -> None:
    """L5: an always-held work ID ends a bounded wait with TimeoutError, not LeaseHeldError."""
    rival.acquire("w1")
    backend.calls.clear()
    start = monotonic()
    with pytest.raises(TimeoutError) as caught:
        lease.acquire("w1", wait=True, timeout=0.2, poll_interval=0.02)
    elapsed = monotonic() - start
    assert not isinstance(caught.value, LeaseHeldError)
    assert isinstance(caught.value.__cause__, LeaseHeldError)
    assert 0.15 <= elapsed < 3.0
    assert backend.count("acquire") >= 2


def test_l5_default_poll_ends_by_the_timeout(lease: Lease, rival: Lease) -> None:
    """L5: with the default 2 s poll interval the wait still ends at the timeout."""
    rival.acquire("w1")
    start = monotonic()
    with pytest.raises(TimeoutError):
        lease.acquire("w1", wait=True, timeout=timedelta(milliseconds=200))
    assert monotonic() - start < 1.5


def test_l5_zero_timeout_tries_once(lease: Lease, rival: Lease, backend: ScriptedBackend) -> None:
    """L5: timeout=0 makes one attempt, then TimeoutError."""
    rival.acquire("w1")
    backend.calls.clear()
    with pytest.raises(TimeoutError):
        lease.acquire("w1", wait=True, timeout=0)
    assert backend.names() == ["acquire"]


@pytest.mark.parametrize(
    ("wait", "timeout", "poll"),
    [(False, 1.0, 2.0), (True, -1.0, 2.0), (True, math.nan, 2.0), (True, None, 0.0)],
)
def test_l5_bad_wait_arguments(
    lease: Lease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    wait: bool,
    timeout: float | None,
    poll: float,
) -> None:
    """L5: timeout without wait, a negative timeout or a zero poll raise ValueError, no I/O."""
    with pytest.raises(ValueError):
        lease.acquire("w1", wait=wait, timeout=timeout, poll_interval=poll)
    assert backend.calls == []
    assert observer.events == []


BAD_WORK_IDS = [
    pytest.param("", ValueError, id="empty"),
    pytest.param("a\x00b", ValueError, id="nul"),
    pytest.param("x" * 1025, ValueError, id="1025-bytes"),
    pytest.param("\u00e9" * 513, ValueError, id="1026-utf8-bytes"),
    pytest.param(42, TypeError, id="int"),
    pytest.param(None, TypeError, id="none"),
    pytest.param(b"w1", TypeError, id="bytes"),
]


@pytest.mark.parametrize(("work_id", "error"), BAD_WORK_IDS)
@pytest.mark.parametrize("wait", [False, True])
def test_l7_bad_work_id_before_any_io(
    lease: Lease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    work_id: object,
    error: type[Exception],
    wait: bool,
) -> None:
    """L7: an invalid work ID raises TypeError/ValueError with no backend call, no event;
    hold() builds a context manager, so it raises ConfigError (the argument-error rule)."""
    with pytest.raises(error):
        lease.acquire(work_id, wait=wait)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        lease.hold(work_id, wait=wait)  # type: ignore[arg-type]
    assert backend.calls == []
    assert observer.events == []


def test_l7_work_id_of_1024_utf8_bytes_is_accepted(lease: Lease) -> None:
    """L7: the limit is inclusive: 1024 UTF-8 bytes is a valid work ID."""
    token = lease.acquire("\u00e9" * 512)
    assert token.work_id == "\u00e9" * 512


# -- L8-L14: writes, release, read, forget ----------------------------------------------------


def test_l8_fenced_writes(lease: Lease, backend: ScriptedBackend, clock: FakeClock) -> None:
    """L8: checkpoint, renew and release of a superseded token raise FencedError naming it."""
    token = lease.acquire("job-17")
    successor = backend.take_over("job-17", "rival", clock)
    for operation in (Operation.CHECKPOINT, Operation.RENEW, Operation.RELEASE):
        with pytest.raises(FencedError) as caught:
            write(lease, token, operation)
        error = caught.value
        assert "job-17" in str(error), operation
        assert HOLDER in str(error), operation
        assert (error.work_id, error.holder_id, error.fencing_token) == (
            "job-17",
            HOLDER,
            token.fencing_token,
        )
    (row,) = backend.inner.rows()
    assert (row.holder_id, row.fencing_token, row.exit_mode) == (
        "rival",
        successor.fencing_token,
        None,
    )


def test_l9_exit_mode_text() -> None:
    """L9: ExitMode values are their text; unknown stored values read as EXPIRED."""
    assert [str(mode) for mode in ExitMode] == [
        "none",
        "expired",
        "finished",
        "abandoned",
        "retired",
    ]
    assert ExitMode("finished") is ExitMode.FINISHED
    assert ExitMode.from_stored("bogus") is ExitMode.EXPIRED
    assert ExitMode.from_stored(42) is ExitMode.EXPIRED
    assert ExitMode.from_stored(None) is ExitMode.NONE
    assert ExitMode.from_stored("retired") is ExitMode.RETIRED
    assert {m for m in ExitMode if m.declarable} == {
        ExitMode.FINISHED,
        ExitMode.ABANDONED,
        ExitMode.RETIRED,
    }
    with pytest.raises(ValueError):
        ExitMode("bogus")


@pytest.mark.parametrize(
    "mode", [None, "expired", ExitMode.NONE, ExitMode.EXPIRED, 99, "bogus", "FINISHED"]
)
def test_l10_invalid_exit_mode(
    lease: Lease,
    rival: Lease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    mode: object,
) -> None:
    """L10: an undeclarable mode raises InvalidExitModeError: no I/O, no event, still held."""
    token = lease.acquire("w1")
    backend.calls.clear()
    observer.clear()
    with pytest.raises(InvalidExitModeError) as caught:
        lease.release(token, mode)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert backend.calls == []
    assert observer.events == []
    with pytest.raises(LeaseHeldError):
        rival.acquire("w1")


def test_a_misspelt_exit_mode_is_a_type_error_too(lease: Lease) -> None:
    """The mode is typed (``ExitMode | DeclaredExit``): mypy --strict refuses the misspelling
    below, which is why it carries an ignore (an ignore it did not need would fail the
    type-check, so a mode typed as any string again would be caught there); at run time it
    raises InvalidExitModeError."""
    token = lease.acquire("w1")
    with pytest.raises(InvalidExitModeError):
        lease.release(token, "finishd")  # type: ignore[arg-type]
    lease.release(token, "finished")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (ExitMode.FINISHED, ExitMode.FINISHED),
        (ExitMode.ABANDONED, ExitMode.ABANDONED),
        (ExitMode.RETIRED, ExitMode.RETIRED),
        ("retired", ExitMode.RETIRED),
    ],
)
def test_l11_release_passes_the_mode(
    lease: Lease,
    rival: Lease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    mode: ExitMode | DeclaredExit,
    expected: ExitMode,
) -> None:
    """L11: each valid mode reaches the backend and is reported in ReleaseEvent.mode."""
    token = lease.acquire("w1")
    lease.release(token, mode)
    assert backend.of("release")[0].args == (token, expected)
    (event,) = observer.of_type(ReleaseEvent)
    assert (event.token, event.mode, event.error) == (token, expected, None)
    assert event.duration >= 0
    assert observer.names() == ["AcquireEvent", "ReleaseEvent"]
    successor = rival.acquire("w1")  # released: acquirable at once
    assert (rival.read_checkpoint(successor)).prev_exit is expected


def test_l12_release_after_lapse(
    lease: Lease, rival: Lease, observer: RecordingObserver, clock: FakeClock
) -> None:
    """L12: releasing a lapsed lease raises LeaseExpiredError, one event, no FencedEvent."""
    token = lease.acquire("w1")
    lease.checkpoint(token, b"partial")
    clock.advance(TTL + 1)
    observer.clear()
    with pytest.raises(LeaseExpiredError) as caught:
        lease.release(token, ExitMode.FINISHED)
    assert not isinstance(caught.value, FencedError)
    (event,) = observer.events
    assert isinstance(event, ReleaseEvent)
    assert event.error is caught.value
    assert event.mode is ExitMode.FINISHED
    successor = rival.acquire("w1")
    prior = rival.read_checkpoint(successor)
    assert prior == Checkpoint(b"partial", ExitMode.EXPIRED, HOLDER)


def test_l12_second_release(lease: Lease, backend: ScriptedBackend) -> None:
    """L12: a second release raises LeaseExpiredError; the first mode stands."""
    token = lease.acquire("w1")
    lease.release(token, ExitMode.RETIRED)
    with pytest.raises(LeaseExpiredError):
        lease.release(token, ExitMode.ABANDONED)
    with pytest.raises(LeaseExpiredError):
        lease.checkpoint(token, b"late")
    assert backend.inner.rows()[0].exit_mode is ExitMode.RETIRED


def test_l13_read_checkpoint(lease: Lease, backend: ScriptedBackend, clock: FakeClock) -> None:
    """L13: first read is empty/NONE; later reads pass the backend's value unchanged."""
    token = lease.acquire("w1")
    assert lease.read_checkpoint(token) == Checkpoint(None, ExitMode.NONE, None)
    lease.checkpoint(token, b"progress")
    assert lease.read_checkpoint(token) == backend.inner.read_checkpoint(token)
    assert (lease.read_checkpoint(token)).state == b"progress"
    backend.take_over("w1", "rival", clock)
    with pytest.raises(FencedError) as caught:
        lease.read_checkpoint(token)
    assert "w1" in str(caught.value)
    assert HOLDER in str(caught.value)


def test_l13_read_checkpoint_other_error(lease: Lease, backend: ScriptedBackend) -> None:
    """L13: any other backend error propagates unchanged."""
    token = lease.acquire("w1")
    boom = transient()
    backend.fail("read_checkpoint", boom)
    with pytest.raises(BackendError) as caught:
        lease.read_checkpoint(token)
    assert caught.value is boom


def test_l14_forget(
    lease: Lease, rival: Lease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L14: forget deletes the row, reports ForgetEvent; the next holder starts fresh."""
    token = lease.acquire("w1")
    lease.checkpoint(token, b"x")
    observer.clear()
    lease.forget(token)
    (event,) = observer.events
    assert isinstance(event, ForgetEvent)
    assert (event.token, event.error) == (token, None)
    assert backend.inner.rows() == []
    successor = rival.acquire("w1")
    assert successor.fencing_token > token.fencing_token
    assert rival.read_checkpoint(successor) == Checkpoint()


def test_l14_forget_after_own_release(lease: Lease, backend: ScriptedBackend) -> None:
    """L14: forget works after the holder's own release."""
    token = lease.acquire("w1")
    lease.release(token, ExitMode.RETIRED)
    lease.forget(token)
    assert backend.inner.rows() == []


def test_l14_forget_fenced(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver, clock: FakeClock
) -> None:
    """L14: forgetting a superseded token: FencedError, ForgetEvent then FencedEvent."""
    token = lease.acquire("w1")
    backend.take_over("w1", "rival", clock)
    observer.clear()
    with pytest.raises(FencedError) as caught:
        lease.forget(token)
    assert "w1" in str(caught.value)
    assert HOLDER in str(caught.value)
    forget, fenced = observer.events
    assert isinstance(forget, ForgetEvent)
    assert forget.error is caught.value
    assert isinstance(fenced, FencedEvent)
    assert (fenced.operation, fenced.error) == (Operation.FORGET, caught.value)
    assert backend.inner.rows()[0].holder_id == "rival"


def test_l14_forget_other_error(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L14: another forget failure propagates unchanged with ForgetEvent, no FencedEvent."""
    token = lease.acquire("w1")
    boom = transient()
    backend.fail("forget", boom)
    observer.clear()
    with pytest.raises(BackendError) as caught:
        lease.forget(token)
    assert caught.value is boom
    assert observer.names() == ["ForgetEvent"]
    assert len(backend.inner.rows()) == 1


# -- L15-L21: renewal -------------------------------------------------------------------------


def test_l15_stop_is_not_a_loss(lease: Lease) -> None:
    """L15: stopping (twice) leaves no cause; the block exits normally."""
    token = lease.acquire("w1")
    renewal = lease.renewal(token, interval=0.05)
    assert renewal.interval == 0.05
    with renewal as r:
        assert r is renewal
        assert r.token == token
        remaining = r.remaining()
        assert remaining is not None
        assert 0 < remaining <= TTL
        r.stop()
        r.stop()
        assert r.remaining() is None
        assert (r.cause, r.lost) == (None, False)
        r.raise_if_lost()
    assert (renewal.cause, renewal.lost) == (None, False)
    lease.checkpoint(token, b"after stop")  # the token still works


def test_l15_renewal_keeps_the_lease(lease: Lease, observer: RecordingObserver) -> None:
    """L15: a running renewal renews every interval; attempt 1 each cycle; no loss."""
    token = lease.acquire("w1")
    with lease.renewal(token, interval=0.02) as r:
        for _ in range(300):
            if len(renew_events(observer)) >= 3:
                break
            sleep(0.01)
        assert not r.lost
    events = renew_events(observer)
    assert len(events) >= 3
    assert {(e.attempt, e.error) for e in events} == {(1, None)}


def test_l15_default_interval_is_a_third_of_the_ttl(lease: Lease) -> None:
    """L15: the renewal interval defaults to TTL/3."""
    token = lease.acquire("w1")
    assert lease.renewal(token).interval == pytest.approx(TTL / 3)


def test_l15_renewal_arguments(lease: Lease) -> None:
    """L15: a non-positive interval or a non-Backoff backoff is refused with ConfigError
    (renewal() builds a context manager: the argument-error rule)."""
    token = lease.acquire("w1")
    with pytest.raises(ConfigError):
        lease.renewal(token, interval=0)
    with pytest.raises(ConfigError):
        lease.renewal(token, backoff=(0.1, 5.0, 0.2))  # type: ignore[arg-type]


def test_l15_renewal_runs_once(lease: Lease) -> None:
    """L15: a renewal object cannot be entered twice."""
    token = lease.acquire("w1")
    renewal = lease.renewal(token, interval=1)
    with renewal:
        pass
    with pytest.raises(RuntimeError):
        with renewal:
            pass


def test_l16_fenced_renewal(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver, clock: FakeClock
) -> None:
    """L16: a fenced renewal loses at once: FencedError, one RenewEvent, then FencedEvent."""
    token = lease.acquire("w1")
    backend.take_over("w1", "rival", clock)
    observer.clear()
    start = monotonic()
    with pytest.raises(FencedError) as caught:
        with lease.renewal(token, interval=0.02, backoff=Backoff(3600, 3600)) as r:
            spin(r)
    assert monotonic() - start < 3.0
    assert r.cause is caught.value
    assert r.lost
    assert r.remaining() is None
    assert observer.names() == ["RenewEvent", "FencedEvent"]
    renew, fenced = observer.events
    assert isinstance(renew, RenewEvent)
    assert (renew.attempt, renew.error) == (1, caught.value)
    assert isinstance(fenced, FencedEvent)
    assert (fenced.operation, fenced.token) == (Operation.RENEW, token)
    assert backend.count("renew") == 1


def test_l17_window_exhausted(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L17: renewals failing until the window closes: LeaseWindowExhaustedError, attempts +1."""
    quick = Lease(backend, holder_id=HOLDER, ttl=0.3, observer=observer)
    token = quick.acquire("w1")
    backend.fail_always("renew")
    start = monotonic()
    with pytest.raises(LeaseWindowExhaustedError) as caught:
        with quick.renewal(token, interval=0.02, backoff=FAST) as r:
            spin(r)
    assert 0.2 < monotonic() - start < 3.0
    assert not isinstance(caught.value, LeaseExpiredError)
    assert r.cause is caught.value
    events = renew_events(observer)
    attempts = [e.attempt for e in events]
    assert len(attempts) >= 3
    assert attempts == list(range(1, len(attempts) + 1))
    assert all(isinstance(e.error, BackendError) for e in events)
    assert observer.of_type(FencedEvent) == []


def test_l18_lapsed_renewal(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver, clock: FakeClock
) -> None:
    """L18: a renewal finding the lease lapsed loses at once with LeaseLapsedError, no retry."""
    token = lease.acquire("w1")
    clock.advance(TTL + 1)
    observer.clear()
    start = monotonic()
    with pytest.raises(LeaseLapsedError) as caught:
        with lease.renewal(token, interval=0.02, backoff=Backoff(3600, 3600)) as r:
            spin(r)
    assert monotonic() - start < 3.0
    assert isinstance(caught.value, LeaseWindowExhaustedError)
    assert isinstance(caught.value, LeaseExpiredError)
    assert r.cause is caught.value
    assert backend.count("renew") == 1
    (event,) = observer.events
    assert isinstance(event, RenewEvent)
    assert event.attempt == 1
    assert isinstance(event.error, LeaseExpiredError)


def test_l19_window_advances_past_the_original_expiry() -> None:
    """L19: a transient failure after the token's original expiry is retried, not fatal."""
    backend = ScriptedBackend()  # real clock
    observer = RecordingObserver()
    lease = Lease(backend, holder_id=HOLDER, ttl=0.5, observer=observer)
    token = lease.acquire("w1")
    backoff = Backoff(0.01, 0.05, 0.0)
    with lease.renewal(token, interval=0.1, backoff=backoff) as r:
        sleep(0.7)  # past token.expires_at: only renewals keep the lease
        assert datetime.now(UTC) > token.expires_at
        backend.fail("renew", transient())
        for _ in range(40):
            assert not r.lost
            sleep(0.01)
        for _ in range(300):  # wait for the retry to have succeeded
            if any(e.attempt == 2 and e.error is None for e in renew_events(observer)):
                break
            sleep(0.01)
        assert not r.lost
        remaining = r.remaining()
        assert remaining is not None
        assert remaining > 0
    assert r.cause is None
    failed = [e for e in renew_events(observer) if e.error is not None]
    assert len(failed) == 1
    assert failed[0].attempt == 1
    assert any(e.attempt == 2 and e.error is None for e in renew_events(observer))


def test_l20_backend_clock_ahead() -> None:
    """L20: backend clock 10 s ahead, renewals failing: the window closes by local time."""
    ahead = FakeClock(datetime.now(UTC) + timedelta(seconds=10))
    backend = ScriptedBackend(clock=ahead)
    lease = Lease(backend, holder_id=HOLDER, ttl=0.3)
    token = lease.acquire("w1")
    backend.fail_always("renew")
    start = monotonic()
    with pytest.raises(LeaseWindowExhaustedError):
        with lease.renewal(token, interval=0.02, backoff=FAST) as r:
            spin(r, seconds=10)
    assert monotonic() - start < 3.0


def test_l20_stalled_renewal_loses_on_time(
    backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L20: a renewal call that stalls cannot keep the lease past its window."""
    lease = Lease(backend, holder_id=HOLDER, ttl=0.4, observer=observer)
    token = lease.acquire("w1")
    backend.delay_always("renew", 3.0)
    start = monotonic()
    with pytest.raises(LeaseWindowExhaustedError):
        with lease.renewal(token, interval=0.05, backoff=FAST) as r:
            spin(r, seconds=10)
    assert monotonic() - start < 2.5
    assert r.remaining() is None


def test_renewal_body_exception_is_not_masked(
    lease: Lease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """L16: the body's own exception propagates even when the lease was lost meanwhile."""
    token = lease.acquire("w1")
    backend.take_over("w1", "rival", clock)

    def body(renewal: Renewal) -> None:
        try:
            for _ in range(500):
                if renewal.lost:
                    break
                sleep(0.01)
        finally:
            raise ValueError("body failed")

    with pytest.raises(ValueError, match="body failed") as caught:
        with lease.renewal(token, interval=0.02) as r:
            body(r)
    assert isinstance(r.cause, FencedError)
    assert any("lost" in note for note in caught.value.__notes__)


def test_renewal_body_exception_without_loss(lease: Lease) -> None:
    """L15: a body exception with the lease intact propagates as is; the renewal stops."""
    token = lease.acquire("w1")
    with pytest.raises(KeyError):
        with lease.renewal(token, interval=0.02) as r:
            raise KeyError("mine")
    assert (r.cause, r.remaining()) == (None, None)


# -- writes after a loss, renewal bookkeeping ----------------------------------------------


def test_writes_after_loss_are_refused_without_io(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver, clock: FakeClock
) -> None:
    """L18: after a loss, checkpoint/renew/release raise the cause and never reach the backend."""
    token = lease.acquire("w1")
    clock.advance(TTL + 1)
    with pytest.raises(LeaseLapsedError):
        with lease.renewal(token, interval=0.02, backoff=Backoff(3600, 3600)) as r:
            spin(r)
    cause = r.cause
    assert cause is not None
    backend.calls.clear()
    observer.clear()
    with pytest.raises(LeaseLapsedError) as caught:
        lease.checkpoint(token, b"would revive")
    assert caught.value is cause
    with pytest.raises(LeaseLapsedError):
        lease.renew(token)
    with pytest.raises(LeaseLapsedError):
        lease.release(token, ExitMode.FINISHED)
    with pytest.raises(LeaseLapsedError):
        lease.renewal(token)
    assert backend.calls == []
    assert observer.events == []
    (row,) = backend.inner.rows()
    assert row.expires_at < clock.now()  # not revived
    assert row.checkpoint is None
    # reading is not a write: it still reaches the backend
    assert (lease.read_checkpoint(token)).prev_exit is ExitMode.NONE
    assert backend.names() == ["read_checkpoint"]


def test_direct_writes_extend_the_window(backend: ScriptedBackend) -> None:
    """L19: a direct renew or checkpoint extends the renewal's remaining()."""
    quick = Lease(backend, holder_id=HOLDER, ttl=0.6)
    token = quick.acquire("w1")
    with quick.renewal(token, interval=30) as r:
        sleep(0.25)
        before = r.remaining()
        quick.renew(token)
        after = r.remaining()
        assert before is not None
        assert after is not None
        assert after > before + 0.1
        assert after <= 0.6
        sleep(0.25)
        before = r.remaining()
        quick.checkpoint(token, b"step")
        after = r.remaining()
        assert before is not None
        assert after is not None
        assert after > before + 0.1
    assert backend.count("renew") == 1  # the renewal itself never ticked


def after_a_renewal(observer: RecordingObserver) -> None:
    """Wait until a renewal attempt has just finished (the next one is an interval away)."""
    seen = len(renew_events(observer))
    for _ in range(500):
        if len(renew_events(observer)) > seen:
            return
        sleep(0.002)
    raise AssertionError("no renewal attempt within 1 s")


def test_release_stops_a_running_renewal(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L11: releasing inside a renewal stops it; the block then exits normally."""
    token = lease.acquire("w1")
    with lease.renewal(token, interval=0.05) as r:
        after_a_renewal(observer)
        lease.release(token, ExitMode.FINISHED)
        assert r.remaining() is None
        renewed = backend.count("renew")
        sleep(0.2)
        assert backend.count("renew") == renewed
    assert (r.cause, r.lost) == (None, False)
    assert observer.of_type(ReleaseEvent)[0].error is None


def test_forget_stops_a_running_renewal(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L14: forgetting inside a renewal stops it; no fenced renewal follows."""
    token = lease.acquire("w1")
    with lease.renewal(token, interval=0.05) as r:
        after_a_renewal(observer)
        lease.forget(token)
        assert r.remaining() is None
        renewed = backend.count("renew")
        sleep(0.2)
        assert backend.count("renew") == renewed
    assert (r.cause, r.lost) == (None, False)
    assert observer.of_type(FencedEvent) == []


def test_current_renewal(lease: Lease) -> None:
    """L15: current_renewal() is the innermost active renewal, None outside any."""
    first = lease.acquire("w1")
    second = lease.acquire("w2")
    assert current_renewal() is None
    with lease.renewal(first, interval=1) as outer:
        assert current_renewal() is outer
        with lease.renewal(second, interval=1) as inner:
            active = current_renewal()
            assert active is inner
            assert active.token == second
            assert active.remaining() is not None
        assert current_renewal() is outer
    assert current_renewal() is None


def test_current_renewal_reset_after_loss(
    lease: Lease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """L16: a lost renewal is no longer current after its block."""
    token = lease.acquire("w1")
    backend.take_over("w1", "rival", clock)

    def body(renewal: Renewal) -> None:
        assert current_renewal() is renewal
        spin(renewal)

    with pytest.raises(FencedError):
        with lease.renewal(token, interval=0.02) as r:
            body(r)
    assert current_renewal() is None


# -- invalid tokens, invalid state ------------------------------------------------------------


def _assert_refused(lease: Lease, token: Token, error: type[Exception]) -> None:
    with pytest.raises(error):
        lease.read_checkpoint(token)
    with pytest.raises(error):
        lease.checkpoint(token, b"x")
    with pytest.raises(error):
        lease.renew(token)
    with pytest.raises(error):
        lease.release(token, ExitMode.FINISHED)
    with pytest.raises(error):
        lease.forget(token)
    with pytest.raises(error):
        lease.renewal(token)


@pytest.mark.parametrize("kind", ["hand-built", "replaced-token", "replaced-holder", "foreign"])
def test_invalid_tokens(
    lease: Lease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    clock: FakeClock,
    kind: str,
) -> None:
    """L22: tokens not issued by acquire through this backend raise InvalidTokenError."""
    token = lease.acquire("w1")
    if kind == "hand-built":
        bad = Token(token.work_id, token.holder_id, token.fencing_token, token.expires_at)
        assert bad == token  # equal values, but not sealed
    elif kind == "replaced-token":
        bad = dataclasses.replace(token, fencing_token=token.fencing_token + 1)
    elif kind == "replaced-holder":
        bad = dataclasses.replace(token, holder_id="impostor")
    else:
        other = Lease(ScriptedBackend(clock=clock), holder_id=HOLDER, ttl=TTL)
        bad = other.acquire("w1")
        assert bad == token
    backend.calls.clear()
    observer.clear()
    _assert_refused(lease, bad, InvalidTokenError)
    assert issubclass(InvalidTokenError, ValueError)
    assert backend.calls == []
    assert observer.events == []
    lease.renew(token)  # the genuine token still works


def test_non_token_is_a_type_error(lease: Lease, backend: ScriptedBackend) -> None:
    """L22: passing something that is not a Token raises TypeError."""
    _assert_refused(lease, "w1", TypeError)  # type: ignore[arg-type]
    assert backend.calls == []


@pytest.mark.parametrize("state", ["text", 42, 1.5, ["b"]])
def test_state_must_be_bytes_like(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver, state: object
) -> None:
    """L24: checkpoint state that is not bytes-like raises TypeError before any I/O."""
    token = lease.acquire("w1")
    backend.calls.clear()
    observer.clear()
    with pytest.raises(TypeError):
        lease.checkpoint(token, state)  # type: ignore[arg-type]
    assert backend.calls == []
    assert observer.events == []


def test_state_is_copied_and_empty_clears(lease: Lease, observer: RecordingObserver) -> None:
    """L24: bytearray/memoryview state is copied; empty state clears the checkpoint."""
    token = lease.acquire("w1")
    buffer = bytearray(b"payload")
    lease.checkpoint(token, memoryview(buffer))
    buffer[:] = b"changed"
    assert (lease.read_checkpoint(token)).state == b"payload"
    assert observer.of_type(CheckpointEvent)[0].size == 7
    lease.checkpoint(token, b"")
    assert (lease.read_checkpoint(token)).state is None


# -- L22-L26: token text and observers -----------------------------------------------------


def test_l22_token_repr() -> None:
    """L22: the token's text form mirrors Go's, with the expiry at second precision."""
    clock = FakeClock(datetime(2026, 1, 1, 11, 59, 49, 250000, tzinfo=UTC))
    lease = Lease(ScriptedBackend(clock=clock), holder_id=HOLDER, ttl=11.25)
    token = lease.acquire("w1")
    expected = (
        "Token(work_id='w1', holder_id='test-worker', fencing_token=1, "
        "expires_at=2026-01-01T12:00:00Z)"
    )
    assert repr(token) == expected
    assert str(token) == expected
    assert token.work_id == "w1"
    assert token.holder_id == HOLDER
    assert token.fencing_token == 1
    assert token.expires_at == datetime(2026, 1, 1, 12, 0, 0, 500000, tzinfo=UTC)


def test_l23_no_observer(backend: ScriptedBackend, clock: FakeClock) -> None:
    """L23: without an observer every operation, failing or not, works."""
    lease = Lease(backend, holder_id=HOLDER, ttl=TTL)
    token = lease.acquire("w1")
    lease.read_checkpoint(token)
    lease.checkpoint(token, b"x")
    lease.renew(token)
    with lease.renewal(token, interval=0.01):
        sleep(0.05)
    lease.release(token, ExitMode.FINISHED)
    lease.forget(token)
    token = lease.acquire("w1")
    backend.take_over("w1", "rival", clock)
    with pytest.raises(FencedError):
        lease.checkpoint(token, b"y")


class Exploding(LeaseObserver):
    def on_acquire(self, event: AcquireEvent) -> None:
        raise RuntimeError("observer bug")

    def on_checkpoint(self, event: CheckpointEvent) -> None:
        raise RuntimeError("observer bug")

    def on_renew(self, event: RenewEvent) -> None:
        raise RuntimeError("observer bug")

    def on_release(self, event: ReleaseEvent) -> None:
        raise RuntimeError("observer bug")

    def on_read_checkpoint(self, event: ReadCheckpointEvent) -> None:
        raise RuntimeError("observer bug")

    def on_forget(self, event: ForgetEvent) -> None:
        raise RuntimeError("observer bug")

    def on_fenced(self, event: FencedEvent) -> None:
        raise RuntimeError("observer bug")


def test_l23_observer_errors_are_logged(
    backend: ScriptedBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """L23: an exception raised by an observer is logged and never breaks the operation."""
    lease = Lease(backend, holder_id=HOLDER, ttl=TTL, observer=Exploding())
    with caplog.at_level(logging.ERROR, logger="worklease"):
        token = lease.acquire("w1")
        lease.read_checkpoint(token)
        lease.checkpoint(token, b"x")
        lease.renew(token)
        lease.release(token, ExitMode.FINISHED)
        lease.forget(token)
    records = [r for r in caplog.records if r.name == "worklease"]
    assert len(records) == 6
    assert all("observer bug" in str(r.exc_info[1]) for r in records if r.exc_info)


@pytest.mark.parametrize("operation", [Operation.CHECKPOINT, Operation.RENEW, Operation.RELEASE])
def test_l24_fenced_event_follows_the_operation_event(
    lease: Lease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    clock: FakeClock,
    operation: Operation,
) -> None:
    """L24: a fenced write reports its own event, then FencedEvent with the operation."""
    token = lease.acquire("w1")
    backend.take_over("w1", "rival", clock)
    backend.delay(str(operation), 0.05)
    with pytest.raises(FencedError) as caught:
        write(lease, token, operation)
    kinds = {
        Operation.CHECKPOINT: CheckpointEvent,
        Operation.RENEW: RenewEvent,
        Operation.RELEASE: ReleaseEvent,
    }
    assert observer.names() == ["AcquireEvent", kinds[operation].__name__, "FencedEvent"]
    _, event, fenced = observer.events
    assert isinstance(event, CheckpointEvent | RenewEvent | ReleaseEvent)
    assert event.error is caught.value
    assert event.token == token
    assert event.duration >= 0.04
    if isinstance(event, CheckpointEvent):
        assert event.size == 7
    if isinstance(event, RenewEvent):
        assert event.attempt == 1
    assert isinstance(fenced, FencedEvent)
    assert (fenced.token, fenced.operation, fenced.error) == (token, operation, caught.value)


def test_l24_no_fenced_event_otherwise(
    lease: Lease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L24: successes and non-fencing failures report no FencedEvent."""
    token = lease.acquire("w1")
    lease.checkpoint(token, b"payload")
    lease.renew(token)
    backend.fail("checkpoint", transient())
    with pytest.raises(BackendError):
        lease.checkpoint(token, b"payload")
    backend.fail("renew", transient())
    with pytest.raises(BackendError):
        lease.renew(token)
    lease.release(token, ExitMode.FINISHED)
    with pytest.raises(LeaseExpiredError):
        lease.checkpoint(token, b"late")
    with pytest.raises(LeaseExpiredError):
        lease.renew(token)
    assert observer.names() == [
        "AcquireEvent",
        "CheckpointEvent",
        "RenewEvent",
        "CheckpointEvent",
        "RenewEvent",
        "ReleaseEvent",
        "CheckpointEvent",
        "RenewEvent",
    ]
    checkpoints = observer.of_type(CheckpointEvent)
    assert [e.size for e in checkpoints] == [7, 7, 4]
    assert [e.error is None for e in checkpoints] == [True, False, False]


def test_l25_read_checkpoint_event(
    lease: Lease,
    rival: Lease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    clock: FakeClock,
) -> None:
    """L25: ReadCheckpointEvent carries the prior; zeroed on error; never a FencedEvent."""
    previous = rival.acquire("w1")
    rival.checkpoint(previous, b"prior")
    rival.release(previous, ExitMode.ABANDONED)
    token = lease.acquire("w1")
    observer.clear()
    lease.read_checkpoint(token)
    (event,) = observer.events
    assert isinstance(event, ReadCheckpointEvent)
    assert (event.token, event.prev_exit, event.prev_holder_id, event.size, event.error) == (
        token,
        ExitMode.ABANDONED,
        "rival",
        5,
        None,
    )
    observer.clear()
    boom = transient()
    backend.fail("read_checkpoint", boom)
    with pytest.raises(BackendError):
        lease.read_checkpoint(token)
    (event,) = observer.events
    assert isinstance(event, ReadCheckpointEvent)
    assert (event.prev_exit, event.prev_holder_id, event.size, event.error) == (
        ExitMode.NONE,
        None,
        0,
        boom,
    )
    observer.clear()
    backend.take_over("w1", "third", clock)
    with pytest.raises(FencedError) as caught:
        lease.read_checkpoint(token)
    (event,) = observer.events
    assert isinstance(event, ReadCheckpointEvent)
    assert (event.prev_exit, event.prev_holder_id, event.size) == (ExitMode.NONE, None, 0)
    assert event.error is caught.value


def test_l26_acquire_events(lease: Lease, rival: Lease, observer: RecordingObserver) -> None:
    """L26: AcquireEvent has no token and the error on failure, the token on success."""
    rival.acquire("busy")
    with pytest.raises(LeaseHeldError) as caught:
        lease.acquire("busy")
    token = lease.acquire("free")
    failed, ok = observer.of_type(AcquireEvent)
    assert (failed.work_id, failed.token, failed.error) == ("busy", None, caught.value)
    assert (ok.work_id, ok.token, ok.error) == ("free", token, None)
    assert failed.duration >= 0
    assert ok.duration >= 0


def test_l26_one_event_per_poll(lease: Lease, rival: Lease, observer: RecordingObserver) -> None:
    """L26: a waiting acquire reports every attempt."""
    rival.acquire("w1")
    with pytest.raises(TimeoutError):
        lease.acquire("w1", wait=True, timeout=0.15, poll_interval=0.03)
    events = observer.of_type(AcquireEvent)
    assert len(events) >= 2
    assert all(e.token is None and isinstance(e.error, LeaseHeldError) for e in events)


# L27 (HasWaitForLease) does not apply: waiting is the keyword argument acquire(wait=True),
# so there is no option list whose contents a caller would need to inspect.

# -- L28: vacuum --------------------------------------------------------------------------


def test_l28_vacuum_requires_backend() -> None:
    """L28: a vacuum without a backend raises BackendRequiredError."""
    with pytest.raises(BackendRequiredError):
        Vacuum(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Vacuum(ScriptedBackend(), observer=LeaseObserver())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "retention",
    [0, 0.0, -1, math.nan, math.inf, timedelta(0), timedelta(hours=-1), "0s", "soon", None],
)
def test_l28_retention_required(retention: object) -> None:
    """L28: retention that is not a positive duration: RetentionRequiredError, no I/O."""
    backend = ScriptedBackend()
    observer = RecordingObserver()
    vacuum = Vacuum(backend, observer=observer)
    with pytest.raises(RetentionRequiredError) as caught:
        vacuum.sweep(retention)  # type: ignore[arg-type]
    assert isinstance(caught.value, ConfigError)
    assert backend.calls == []
    assert observer.events == []


def test_l28_sweep_result(lease: Lease, backend: ScriptedBackend, clock: FakeClock) -> None:
    """L28: a positive retention delegates to the backend and reports one SweepEvent."""
    token = lease.acquire("retired")
    lease.release(token, ExitMode.RETIRED)
    lease.acquire("lapsed")
    clock.advance(7200)
    observer = RecordingObserver()
    vacuum = Vacuum(backend, observer=observer)
    assert vacuum.sweep(timedelta(hours=1)) == 1
    assert vacuum.sweep(3600, include_expired=True) == 1
    assert backend.of("sweep")[0].args == (3600.0, False)
    assert backend.of("sweep")[1].args == (3600.0, True)
    first, second = observer.of_type(SweepEvent)
    assert (first.retention, first.include_expired, first.deleted, first.error) == (
        3600.0,
        False,
        1,
        None,
    )
    assert (second.include_expired, second.deleted) == (True, 1)
    assert backend.inner.rows() == []


def test_l28_sweep_error_unchanged(backend: ScriptedBackend) -> None:
    """L28: a backend sweep error propagates unchanged and is reported."""
    observer = RecordingObserver()
    vacuum = Vacuum(backend, observer=observer)
    boom = transient()
    backend.fail("sweep", boom)
    with pytest.raises(BackendError) as caught:
        vacuum.sweep(60)
    assert caught.value is boom
    (event,) = observer.of_type(SweepEvent)
    assert (event.deleted, event.error) == (0, boom)


def test_release_during_a_renewal_attempt(lease: Lease, backend: ScriptedBackend) -> None:
    """L11: releasing while a renewal attempt is under way ends the renewal without a loss."""
    token = lease.acquire("w1")
    backend.delay("renew", 0.2)
    with lease.renewal(token, interval=0.02) as r:
        for _ in range(300):
            if backend.count("renew"):
                break
            sleep(0.01)
        lease.release(token, ExitMode.FINISHED)
        sleep(0.4)  # the attempt under way ends (threads) or was cancelled (asyncio)
    assert (r.cause, r.lost) == (None, False)
    lease.forget(token)  # the token is not marked lost


def test_release_with_a_slow_answer_inside_a_renewal(
    lease: Lease, backend: ScriptedBackend, rival: Lease
) -> None:
    """L11: a release stored at once but answered slowly is not reported as a lost lease."""
    token = lease.acquire("w1")
    backend.delay_after("release", 0.2)
    with lease.renewal(token, interval=0.02) as r:
        lease.release(token, ExitMode.FINISHED)
    assert (r.cause, r.lost) == (None, False)
    successor = rival.acquire("w1")
    assert (rival.read_checkpoint(successor)).prev_exit is ExitMode.FINISHED
