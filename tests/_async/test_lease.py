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

from tests._acompat import asleep, aspawn_all
from worklease import (
    AcquireEvent,
    AsyncLease,
    AsyncRenewal,
    AsyncVacuum,
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
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLapsedError,
    LeaseObserver,
    LeaseWindowExhaustedError,
    Operation,
    ReadCheckpointEvent,
    ReleaseEvent,
    RenewEvent,
    RetentionRequiredError,
    SweepEvent,
    Token,
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
def lease(backend: ScriptedBackend, observer: RecordingObserver) -> AsyncLease:
    return AsyncLease(backend, holder_id=HOLDER, ttl=TTL, observer=observer)


@pytest.fixture
def rival(backend: ScriptedBackend) -> AsyncLease:
    return AsyncLease(backend, holder_id="rival", ttl=TTL)


def renew_events(observer: RecordingObserver) -> list[RenewEvent]:
    return observer.of_type(RenewEvent)


async def write(lease: AsyncLease, token: Token, operation: Operation) -> None:
    """One write through the lease: checkpoint (7 bytes), renew or release FINISHED."""
    if operation is Operation.CHECKPOINT:
        await lease.checkpoint(token, b"payload")
    elif operation is Operation.RENEW:
        await lease.renew(token)
    else:
        await lease.release(token, ExitMode.FINISHED)


# -- L1: construction ---------------------------------------------------------------------


async def test_l1_valid_config(backend: ScriptedBackend) -> None:
    """L1: a valid config gives a lease; a timedelta TTL and the 1 ms minimum are accepted."""
    lease = AsyncLease(backend, holder_id="h", ttl=timedelta(seconds=2))
    assert (lease.holder_id, lease.ttl, lease.backend) == ("h", 2.0, backend)
    assert AsyncLease(backend, holder_id="h", ttl=0.001).ttl == 0.001
    assert isinstance(lease.observer, LeaseObserver)
    assert backend.calls == []


async def test_l1_backend_required() -> None:
    """L1: no backend raises BackendRequiredError (a ConfigError and a ValueError)."""
    with pytest.raises(BackendRequiredError) as caught:
        AsyncLease(None, holder_id="h", ttl=1)  # type: ignore[arg-type]
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
async def test_l1_bad_ttl(backend: ScriptedBackend, ttl: object) -> None:
    """L1: a TTL that is not a finite number of seconds of at least 1 ms is a ConfigError."""
    with pytest.raises(ConfigError):
        AsyncLease(backend, holder_id="h", ttl=ttl)  # type: ignore[arg-type]
    assert backend.calls == []


@pytest.mark.parametrize("holder_id", ["", None, 5, "a\x00b"])
async def test_l1_bad_holder_id(backend: ScriptedBackend, holder_id: object) -> None:
    """L1: an empty (or non-string) holder ID is a ConfigError."""
    with pytest.raises(ConfigError):
        AsyncLease(backend, holder_id=holder_id, ttl=1)  # type: ignore[arg-type]


async def test_l1_observer_must_be_a_lease_observer(backend: ScriptedBackend) -> None:
    """L1: an observer that is not a LeaseObserver is a ConfigError."""
    with pytest.raises(ConfigError):
        AsyncLease(backend, holder_id="h", ttl=1, observer=object())  # type: ignore[arg-type]


# -- L2-L7: acquire ---------------------------------------------------------------------------


async def test_l2_acquire_returns_backend_token(
    lease: AsyncLease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """L2: the token carries the backend's values; the backend got (work_id, holder, TTL)."""
    token = await lease.acquire("w1")
    assert backend.names() == ["acquire"]
    assert backend.calls[0].args == ("w1", HOLDER, TTL)
    (row,) = backend.inner.rows()
    assert token == Token("w1", HOLDER, row.fencing_token, row.expires_at)
    assert token.expires_at == clock.now() + timedelta(seconds=TTL)
    assert hash(token) == hash(Token("w1", HOLDER, row.fencing_token, row.expires_at))


async def test_l3_fail_fast_when_held(
    lease: AsyncLease, rival: AsyncLease, backend: ScriptedBackend
) -> None:
    """L3: a held work ID raises LeaseHeldError after exactly one backend call."""
    await rival.acquire("w1")
    backend.calls.clear()
    with pytest.raises(LeaseHeldError) as caught:
        await lease.acquire("w1")
    assert backend.names() == ["acquire"]
    assert caught.value.holder_id == "rival"
    assert caught.value.expires_at == backend.inner.rows()[0].expires_at


async def test_l3_not_reentrant(lease: AsyncLease) -> None:
    """L3: the holder itself gets LeaseHeldError for a lease it holds."""
    await lease.acquire("w1")
    with pytest.raises(LeaseHeldError):
        await lease.acquire("w1")


async def test_l4_wait_polls_until_acquired(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L4: held, held, then free: a waiting acquire returns the token after three tries."""
    busy = LeaseHeldError("held (injected)", work_id="w1", holder_id="rival")
    backend.fail("acquire", busy, LeaseHeldError("held again (injected)"))
    token = await lease.acquire("w1", wait=True, poll_interval=0.01)
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


async def test_l4_wait_gets_the_lease_when_released(lease: AsyncLease, rival: AsyncLease) -> None:
    """L4: a waiting acquire gets the lease once the holder releases it."""
    held = await rival.acquire("w1")

    async def step(index: int) -> Token | None:
        if index == 0:
            return await lease.acquire("w1", wait=True, timeout=5, poll_interval=0.02)
        await asleep(0.1)
        await rival.release(held, ExitMode.FINISHED)
        return None

    got, _ = await aspawn_all(step, 2)
    assert isinstance(got, Token)
    assert got.fencing_token == held.fencing_token + 1
    prior = await lease.read_checkpoint(got)
    assert (prior.prev_exit, prior.prev_holder_id) == (ExitMode.FINISHED, "rival")


async def test_l5_wait_timeout_raises_timeout_error(
    lease: AsyncLease, rival: AsyncLease, backend: ScriptedBackend
) -> None:
    """L5: an always-held work ID ends a bounded wait with TimeoutError, not LeaseHeldError."""
    await rival.acquire("w1")
    backend.calls.clear()
    start = monotonic()
    with pytest.raises(TimeoutError) as caught:
        await lease.acquire("w1", wait=True, timeout=0.2, poll_interval=0.02)
    elapsed = monotonic() - start
    assert not isinstance(caught.value, LeaseHeldError)
    assert isinstance(caught.value.__cause__, LeaseHeldError)
    assert 0.15 <= elapsed < 3.0
    assert backend.count("acquire") >= 2


async def test_l5_default_poll_ends_by_the_timeout(lease: AsyncLease, rival: AsyncLease) -> None:
    """L5: with the default 2 s poll interval the wait still ends at the timeout."""
    await rival.acquire("w1")
    start = monotonic()
    with pytest.raises(TimeoutError):
        await lease.acquire("w1", wait=True, timeout=timedelta(milliseconds=200))
    assert monotonic() - start < 1.5


async def test_l5_zero_timeout_tries_once(
    lease: AsyncLease, rival: AsyncLease, backend: ScriptedBackend
) -> None:
    """L5: timeout=0 makes one attempt, then TimeoutError."""
    await rival.acquire("w1")
    backend.calls.clear()
    with pytest.raises(TimeoutError):
        await lease.acquire("w1", wait=True, timeout=0)
    assert backend.names() == ["acquire"]


@pytest.mark.parametrize(
    ("wait", "timeout", "poll"),
    [(False, 1.0, 2.0), (True, -1.0, 2.0), (True, math.nan, 2.0), (True, None, 0.0)],
)
async def test_l5_bad_wait_arguments(
    lease: AsyncLease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    wait: bool,
    timeout: float | None,
    poll: float,
) -> None:
    """L5: timeout without wait, a negative timeout or a zero poll raise ValueError, no I/O."""
    with pytest.raises(ValueError):
        await lease.acquire("w1", wait=wait, timeout=timeout, poll_interval=poll)
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
async def test_l7_bad_work_id_before_any_io(
    lease: AsyncLease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    work_id: object,
    error: type[Exception],
    wait: bool,
) -> None:
    """L7: an invalid work ID raises TypeError/ValueError with no backend call, no event;
    hold() builds a context manager, so it raises ConfigError (the argument-error rule)."""
    with pytest.raises(error):
        await lease.acquire(work_id, wait=wait)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        lease.hold(work_id, wait=wait)  # type: ignore[arg-type]
    assert backend.calls == []
    assert observer.events == []


async def test_l7_work_id_of_1024_utf8_bytes_is_accepted(lease: AsyncLease) -> None:
    """L7: the limit is inclusive: 1024 UTF-8 bytes is a valid work ID."""
    token = await lease.acquire("\u00e9" * 512)
    assert token.work_id == "\u00e9" * 512


# -- L8-L14: writes, release, read, forget ----------------------------------------------------


async def test_l8_fenced_writes(
    lease: AsyncLease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """L8: checkpoint, renew and release of a superseded token raise FencedError naming it."""
    token = await lease.acquire("job-17")
    successor = await backend.take_over("job-17", "rival", clock)
    for operation in (Operation.CHECKPOINT, Operation.RENEW, Operation.RELEASE):
        with pytest.raises(FencedError) as caught:
            await write(lease, token, operation)
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


async def test_l9_exit_mode_text() -> None:
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
async def test_l10_invalid_exit_mode(
    lease: AsyncLease,
    rival: AsyncLease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    mode: object,
) -> None:
    """L10: an undeclarable mode raises InvalidExitModeError: no I/O, no event, still held."""
    token = await lease.acquire("w1")
    backend.calls.clear()
    observer.clear()
    with pytest.raises(InvalidExitModeError) as caught:
        await lease.release(token, mode)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert backend.calls == []
    assert observer.events == []
    with pytest.raises(LeaseHeldError):
        await rival.acquire("w1")


async def test_a_misspelt_exit_mode_is_a_type_error_too(lease: AsyncLease) -> None:
    """The mode is typed (``ExitMode | DeclaredExit``): mypy --strict refuses the misspelling
    below, which is why it carries an ignore (an ignore it did not need would fail the
    type-check, so a mode typed as any string again would be caught there); at run time it
    raises InvalidExitModeError."""
    token = await lease.acquire("w1")
    with pytest.raises(InvalidExitModeError):
        await lease.release(token, "finishd")  # type: ignore[arg-type]
    await lease.release(token, "finished")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (ExitMode.FINISHED, ExitMode.FINISHED),
        (ExitMode.ABANDONED, ExitMode.ABANDONED),
        (ExitMode.RETIRED, ExitMode.RETIRED),
        ("retired", ExitMode.RETIRED),
    ],
)
async def test_l11_release_passes_the_mode(
    lease: AsyncLease,
    rival: AsyncLease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    mode: ExitMode | DeclaredExit,
    expected: ExitMode,
) -> None:
    """L11: each valid mode reaches the backend and is reported in ReleaseEvent.mode."""
    token = await lease.acquire("w1")
    await lease.release(token, mode)
    assert backend.of("release")[0].args == (token, expected)
    (event,) = observer.of_type(ReleaseEvent)
    assert (event.token, event.mode, event.error) == (token, expected, None)
    assert event.duration >= 0
    assert observer.names() == ["AcquireEvent", "ReleaseEvent"]
    successor = await rival.acquire("w1")  # released: acquirable at once
    assert (await rival.read_checkpoint(successor)).prev_exit is expected


async def test_l12_release_after_lapse(
    lease: AsyncLease, rival: AsyncLease, observer: RecordingObserver, clock: FakeClock
) -> None:
    """L12: releasing a lapsed lease raises LeaseExpiredError, one event, no FencedEvent."""
    token = await lease.acquire("w1")
    await lease.checkpoint(token, b"partial")
    clock.advance(TTL + 1)
    observer.clear()
    with pytest.raises(LeaseExpiredError) as caught:
        await lease.release(token, ExitMode.FINISHED)
    assert not isinstance(caught.value, FencedError)
    (event,) = observer.events
    assert isinstance(event, ReleaseEvent)
    assert event.error is caught.value
    assert event.mode is ExitMode.FINISHED
    successor = await rival.acquire("w1")
    prior = await rival.read_checkpoint(successor)
    assert prior == Checkpoint(b"partial", ExitMode.EXPIRED, HOLDER)


async def test_l12_second_release(lease: AsyncLease, backend: ScriptedBackend) -> None:
    """L12: a second release raises LeaseExpiredError; the first mode stands."""
    token = await lease.acquire("w1")
    await lease.release(token, ExitMode.RETIRED)
    with pytest.raises(LeaseExpiredError):
        await lease.release(token, ExitMode.ABANDONED)
    with pytest.raises(LeaseExpiredError):
        await lease.checkpoint(token, b"late")
    assert backend.inner.rows()[0].exit_mode is ExitMode.RETIRED


async def test_l13_read_checkpoint(
    lease: AsyncLease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """L13: first read is empty/NONE; later reads pass the backend's value unchanged."""
    token = await lease.acquire("w1")
    assert await lease.read_checkpoint(token) == Checkpoint(None, ExitMode.NONE, None)
    await lease.checkpoint(token, b"progress")
    assert await lease.read_checkpoint(token) == await backend.inner.read_checkpoint(token)
    assert (await lease.read_checkpoint(token)).state == b"progress"
    await backend.take_over("w1", "rival", clock)
    with pytest.raises(FencedError) as caught:
        await lease.read_checkpoint(token)
    assert "w1" in str(caught.value)
    assert HOLDER in str(caught.value)


async def test_l13_read_checkpoint_other_error(lease: AsyncLease, backend: ScriptedBackend) -> None:
    """L13: any other backend error propagates unchanged."""
    token = await lease.acquire("w1")
    boom = transient()
    backend.fail("read_checkpoint", boom)
    with pytest.raises(BackendError) as caught:
        await lease.read_checkpoint(token)
    assert caught.value is boom


async def test_l14_forget(
    lease: AsyncLease, rival: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L14: forget deletes the row, reports ForgetEvent; the next holder starts fresh."""
    token = await lease.acquire("w1")
    await lease.checkpoint(token, b"x")
    observer.clear()
    await lease.forget(token)
    (event,) = observer.events
    assert isinstance(event, ForgetEvent)
    assert (event.token, event.error) == (token, None)
    assert backend.inner.rows() == []
    successor = await rival.acquire("w1")
    assert successor.fencing_token > token.fencing_token
    assert await rival.read_checkpoint(successor) == Checkpoint()


async def test_l14_forget_after_own_release(lease: AsyncLease, backend: ScriptedBackend) -> None:
    """L14: forget works after the holder's own release."""
    token = await lease.acquire("w1")
    await lease.release(token, ExitMode.RETIRED)
    await lease.forget(token)
    assert backend.inner.rows() == []


async def test_l14_forget_fenced(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver, clock: FakeClock
) -> None:
    """L14: forgetting a superseded token: FencedError, ForgetEvent then FencedEvent."""
    token = await lease.acquire("w1")
    await backend.take_over("w1", "rival", clock)
    observer.clear()
    with pytest.raises(FencedError) as caught:
        await lease.forget(token)
    assert "w1" in str(caught.value)
    assert HOLDER in str(caught.value)
    forget, fenced = observer.events
    assert isinstance(forget, ForgetEvent)
    assert forget.error is caught.value
    assert isinstance(fenced, FencedEvent)
    assert (fenced.operation, fenced.error) == (Operation.FORGET, caught.value)
    assert backend.inner.rows()[0].holder_id == "rival"


async def test_l14_forget_other_error(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L14: another forget failure propagates unchanged with ForgetEvent, no FencedEvent."""
    token = await lease.acquire("w1")
    boom = transient()
    backend.fail("forget", boom)
    observer.clear()
    with pytest.raises(BackendError) as caught:
        await lease.forget(token)
    assert caught.value is boom
    assert observer.names() == ["ForgetEvent"]
    assert len(backend.inner.rows()) == 1


# -- L15-L21: renewal -------------------------------------------------------------------------


async def test_l15_stop_is_not_a_loss(lease: AsyncLease) -> None:
    """L15: stopping (twice) leaves no cause; the block exits normally."""
    token = await lease.acquire("w1")
    renewal = lease.renewal(token, interval=0.05)
    assert renewal.interval == 0.05
    async with renewal as r:
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
    await lease.checkpoint(token, b"after stop")  # the token still works


async def test_l15_renewal_keeps_the_lease(lease: AsyncLease, observer: RecordingObserver) -> None:
    """L15: a running renewal renews every interval; attempt 1 each cycle; no loss."""
    token = await lease.acquire("w1")
    async with lease.renewal(token, interval=0.02) as r:
        for _ in range(300):
            if len(renew_events(observer)) >= 3:
                break
            await asleep(0.01)
        assert not r.lost
    events = renew_events(observer)
    assert len(events) >= 3
    assert {(e.attempt, e.error) for e in events} == {(1, None)}


async def test_l15_default_interval_is_a_third_of_the_ttl(lease: AsyncLease) -> None:
    """L15: the renewal interval defaults to TTL/3."""
    token = await lease.acquire("w1")
    assert lease.renewal(token).interval == pytest.approx(TTL / 3)


async def test_l15_renewal_arguments(lease: AsyncLease) -> None:
    """L15: a non-positive interval or a non-Backoff backoff is refused with ConfigError
    (renewal() builds a context manager: the argument-error rule)."""
    token = await lease.acquire("w1")
    with pytest.raises(ConfigError):
        lease.renewal(token, interval=0)
    with pytest.raises(ConfigError):
        lease.renewal(token, backoff=(0.1, 5.0, 0.2))  # type: ignore[arg-type]


async def test_l15_renewal_runs_once(lease: AsyncLease) -> None:
    """L15: a renewal object cannot be entered twice."""
    token = await lease.acquire("w1")
    renewal = lease.renewal(token, interval=1)
    async with renewal:
        pass
    with pytest.raises(RuntimeError):
        async with renewal:
            pass


async def test_l16_fenced_renewal(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver, clock: FakeClock
) -> None:
    """L16: a fenced renewal loses at once: FencedError, one RenewEvent, then FencedEvent."""
    token = await lease.acquire("w1")
    await backend.take_over("w1", "rival", clock)
    observer.clear()
    start = monotonic()
    with pytest.raises(FencedError) as caught:
        async with lease.renewal(token, interval=0.02, backoff=Backoff(3600, 3600)) as r:
            await spin(r)
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


async def test_l17_window_exhausted(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L17: renewals failing until the window closes: LeaseWindowExhaustedError, attempts +1."""
    quick = AsyncLease(backend, holder_id=HOLDER, ttl=0.3, observer=observer)
    token = await quick.acquire("w1")
    backend.fail_always("renew")
    start = monotonic()
    with pytest.raises(LeaseWindowExhaustedError) as caught:
        async with quick.renewal(token, interval=0.02, backoff=FAST) as r:
            await spin(r)
    assert 0.2 < monotonic() - start < 3.0
    assert not isinstance(caught.value, LeaseExpiredError)
    assert r.cause is caught.value
    events = renew_events(observer)
    attempts = [e.attempt for e in events]
    assert len(attempts) >= 3
    assert attempts == list(range(1, len(attempts) + 1))
    assert all(isinstance(e.error, BackendError) for e in events)
    assert observer.of_type(FencedEvent) == []


async def test_l18_lapsed_renewal(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver, clock: FakeClock
) -> None:
    """L18: a renewal finding the lease lapsed loses at once with LeaseLapsedError, no retry."""
    token = await lease.acquire("w1")
    clock.advance(TTL + 1)
    observer.clear()
    start = monotonic()
    with pytest.raises(LeaseLapsedError) as caught:
        async with lease.renewal(token, interval=0.02, backoff=Backoff(3600, 3600)) as r:
            await spin(r)
    assert monotonic() - start < 3.0
    assert isinstance(caught.value, LeaseWindowExhaustedError)
    assert isinstance(caught.value, LeaseExpiredError)
    assert r.cause is caught.value
    assert backend.count("renew") == 1
    (event,) = observer.events
    assert isinstance(event, RenewEvent)
    assert event.attempt == 1
    assert isinstance(event.error, LeaseExpiredError)


async def test_l19_window_advances_past_the_original_expiry() -> None:
    """L19: a transient failure after the token's original expiry is retried, not fatal."""
    backend = ScriptedBackend()  # real clock
    observer = RecordingObserver()
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=0.5, observer=observer)
    token = await lease.acquire("w1")
    backoff = Backoff(0.01, 0.05, 0.0)
    async with lease.renewal(token, interval=0.1, backoff=backoff) as r:
        await asleep(0.7)  # past token.expires_at: only renewals keep the lease
        assert datetime.now(UTC) > token.expires_at
        backend.fail("renew", transient())
        for _ in range(40):
            assert not r.lost
            await asleep(0.01)
        for _ in range(300):  # wait for the retry to have succeeded
            if any(e.attempt == 2 and e.error is None for e in renew_events(observer)):
                break
            await asleep(0.01)
        assert not r.lost
        remaining = r.remaining()
        assert remaining is not None
        assert remaining > 0
    assert r.cause is None
    failed = [e for e in renew_events(observer) if e.error is not None]
    assert len(failed) == 1
    assert failed[0].attempt == 1
    assert any(e.attempt == 2 and e.error is None for e in renew_events(observer))


async def test_l20_backend_clock_ahead() -> None:
    """L20: backend clock 10 s ahead, renewals failing: the window closes by local time."""
    ahead = FakeClock(datetime.now(UTC) + timedelta(seconds=10))
    backend = ScriptedBackend(clock=ahead)
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=0.3)
    token = await lease.acquire("w1")
    backend.fail_always("renew")
    start = monotonic()
    with pytest.raises(LeaseWindowExhaustedError):
        async with lease.renewal(token, interval=0.02, backoff=FAST) as r:
            await spin(r, seconds=10)
    assert monotonic() - start < 3.0


async def test_l20_stalled_renewal_loses_on_time(
    backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L20: a renewal call that stalls cannot keep the lease past its window."""
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=0.4, observer=observer)
    token = await lease.acquire("w1")
    backend.delay_always("renew", 3.0)
    start = monotonic()
    with pytest.raises(LeaseWindowExhaustedError):
        async with lease.renewal(token, interval=0.05, backoff=FAST) as r:
            await spin(r, seconds=10)
    assert monotonic() - start < 2.5
    assert r.remaining() is None


async def test_renewal_body_exception_is_not_masked(
    lease: AsyncLease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """L16: the body's own exception propagates even when the lease was lost meanwhile."""
    token = await lease.acquire("w1")
    await backend.take_over("w1", "rival", clock)

    async def body(renewal: AsyncRenewal) -> None:
        try:
            for _ in range(500):
                if renewal.lost:
                    break
                await asleep(0.01)
        finally:
            raise ValueError("body failed")

    with pytest.raises(ValueError, match="body failed") as caught:
        async with lease.renewal(token, interval=0.02) as r:
            await body(r)
    assert isinstance(r.cause, FencedError)
    assert any("lost" in note for note in caught.value.__notes__)


async def test_renewal_body_exception_without_loss(lease: AsyncLease) -> None:
    """L15: a body exception with the lease intact propagates as is; the renewal stops."""
    token = await lease.acquire("w1")
    with pytest.raises(KeyError):
        async with lease.renewal(token, interval=0.02) as r:
            raise KeyError("mine")
    assert (r.cause, r.remaining()) == (None, None)


# -- writes after a loss, renewal bookkeeping ----------------------------------------------


async def test_writes_after_loss_are_refused_without_io(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver, clock: FakeClock
) -> None:
    """L18: after a loss, checkpoint/renew/release raise the cause and never reach the backend."""
    token = await lease.acquire("w1")
    clock.advance(TTL + 1)
    with pytest.raises(LeaseLapsedError):
        async with lease.renewal(token, interval=0.02, backoff=Backoff(3600, 3600)) as r:
            await spin(r)
    cause = r.cause
    assert cause is not None
    backend.calls.clear()
    observer.clear()
    with pytest.raises(LeaseLapsedError) as caught:
        await lease.checkpoint(token, b"would revive")
    assert caught.value is cause
    with pytest.raises(LeaseLapsedError):
        await lease.renew(token)
    with pytest.raises(LeaseLapsedError):
        await lease.release(token, ExitMode.FINISHED)
    with pytest.raises(LeaseLapsedError):
        lease.renewal(token)
    assert backend.calls == []
    assert observer.events == []
    (row,) = backend.inner.rows()
    assert row.expires_at < clock.now()  # not revived
    assert row.checkpoint is None
    # reading is not a write: it still reaches the backend
    assert (await lease.read_checkpoint(token)).prev_exit is ExitMode.NONE
    assert backend.names() == ["read_checkpoint"]


async def test_direct_writes_extend_the_window(backend: ScriptedBackend) -> None:
    """L19: a direct renew or checkpoint extends the renewal's remaining()."""
    quick = AsyncLease(backend, holder_id=HOLDER, ttl=0.6)
    token = await quick.acquire("w1")
    async with quick.renewal(token, interval=30) as r:
        await asleep(0.25)
        before = r.remaining()
        await quick.renew(token)
        after = r.remaining()
        assert before is not None
        assert after is not None
        assert after > before + 0.1
        assert after <= 0.6
        await asleep(0.25)
        before = r.remaining()
        await quick.checkpoint(token, b"step")
        after = r.remaining()
        assert before is not None
        assert after is not None
        assert after > before + 0.1
    assert backend.count("renew") == 1  # the renewal itself never ticked


async def after_a_renewal(observer: RecordingObserver) -> None:
    """Wait until a renewal attempt has just finished (the next one is an interval away)."""
    seen = len(renew_events(observer))
    for _ in range(500):
        if len(renew_events(observer)) > seen:
            return
        await asleep(0.002)
    raise AssertionError("no renewal attempt within 1 s")


async def test_release_stops_a_running_renewal(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L11: releasing inside a renewal stops it; the block then exits normally."""
    token = await lease.acquire("w1")
    async with lease.renewal(token, interval=0.05) as r:
        await after_a_renewal(observer)
        await lease.release(token, ExitMode.FINISHED)
        assert r.remaining() is None
        renewed = backend.count("renew")
        await asleep(0.2)
        assert backend.count("renew") == renewed
    assert (r.cause, r.lost) == (None, False)
    assert observer.of_type(ReleaseEvent)[0].error is None


async def test_forget_stops_a_running_renewal(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L14: forgetting inside a renewal stops it; no fenced renewal follows."""
    token = await lease.acquire("w1")
    async with lease.renewal(token, interval=0.05) as r:
        await after_a_renewal(observer)
        await lease.forget(token)
        assert r.remaining() is None
        renewed = backend.count("renew")
        await asleep(0.2)
        assert backend.count("renew") == renewed
    assert (r.cause, r.lost) == (None, False)
    assert observer.of_type(FencedEvent) == []


async def test_current_renewal(lease: AsyncLease) -> None:
    """L15: current_renewal() is the innermost active renewal, None outside any."""
    first = await lease.acquire("w1")
    second = await lease.acquire("w2")
    assert current_renewal() is None
    async with lease.renewal(first, interval=1) as outer:
        assert current_renewal() is outer
        async with lease.renewal(second, interval=1) as inner:
            active = current_renewal()
            assert active is inner
            assert active.token == second
            assert active.remaining() is not None
        assert current_renewal() is outer
    assert current_renewal() is None


async def test_current_renewal_reset_after_loss(
    lease: AsyncLease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """L16: a lost renewal is no longer current after its block."""
    token = await lease.acquire("w1")
    await backend.take_over("w1", "rival", clock)

    async def body(renewal: AsyncRenewal) -> None:
        assert current_renewal() is renewal
        await spin(renewal)

    with pytest.raises(FencedError):
        async with lease.renewal(token, interval=0.02) as r:
            await body(r)
    assert current_renewal() is None


# -- invalid tokens, invalid state ------------------------------------------------------------


async def _assert_refused(lease: AsyncLease, token: Token, error: type[Exception]) -> None:
    with pytest.raises(error):
        await lease.read_checkpoint(token)
    with pytest.raises(error):
        await lease.checkpoint(token, b"x")
    with pytest.raises(error):
        await lease.renew(token)
    with pytest.raises(error):
        await lease.release(token, ExitMode.FINISHED)
    with pytest.raises(error):
        await lease.forget(token)
    with pytest.raises(error):
        lease.renewal(token)


@pytest.mark.parametrize("kind", ["hand-built", "replaced-token", "replaced-holder", "foreign"])
async def test_invalid_tokens(
    lease: AsyncLease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    clock: FakeClock,
    kind: str,
) -> None:
    """L22: tokens not issued by acquire through this backend raise InvalidTokenError."""
    token = await lease.acquire("w1")
    if kind == "hand-built":
        bad = Token(token.work_id, token.holder_id, token.fencing_token, token.expires_at)
        assert bad == token  # equal values, but not sealed
    elif kind == "replaced-token":
        bad = dataclasses.replace(token, fencing_token=token.fencing_token + 1)
    elif kind == "replaced-holder":
        bad = dataclasses.replace(token, holder_id="impostor")
    else:
        other = AsyncLease(ScriptedBackend(clock=clock), holder_id=HOLDER, ttl=TTL)
        bad = await other.acquire("w1")
        assert bad == token
    backend.calls.clear()
    observer.clear()
    await _assert_refused(lease, bad, InvalidTokenError)
    assert issubclass(InvalidTokenError, ValueError)
    assert backend.calls == []
    assert observer.events == []
    await lease.renew(token)  # the genuine token still works


async def test_non_token_is_a_type_error(lease: AsyncLease, backend: ScriptedBackend) -> None:
    """L22: passing something that is not a Token raises TypeError."""
    await _assert_refused(lease, "w1", TypeError)  # type: ignore[arg-type]
    assert backend.calls == []


@pytest.mark.parametrize("state", ["text", 42, 1.5, ["b"]])
async def test_state_must_be_bytes_like(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver, state: object
) -> None:
    """L24: checkpoint state that is not bytes-like raises TypeError before any I/O."""
    token = await lease.acquire("w1")
    backend.calls.clear()
    observer.clear()
    with pytest.raises(TypeError):
        await lease.checkpoint(token, state)  # type: ignore[arg-type]
    assert backend.calls == []
    assert observer.events == []


async def test_state_is_copied_and_empty_clears(
    lease: AsyncLease, observer: RecordingObserver
) -> None:
    """L24: bytearray/memoryview state is copied; empty state clears the checkpoint."""
    token = await lease.acquire("w1")
    buffer = bytearray(b"payload")
    await lease.checkpoint(token, memoryview(buffer))
    buffer[:] = b"changed"
    assert (await lease.read_checkpoint(token)).state == b"payload"
    assert observer.of_type(CheckpointEvent)[0].size == 7
    await lease.checkpoint(token, b"")
    assert (await lease.read_checkpoint(token)).state is None


# -- L22-L26: token text and observers -----------------------------------------------------


async def test_l22_token_repr() -> None:
    """L22: the token's text form mirrors Go's, with the expiry at second precision."""
    clock = FakeClock(datetime(2026, 1, 1, 11, 59, 49, 250000, tzinfo=UTC))
    lease = AsyncLease(ScriptedBackend(clock=clock), holder_id=HOLDER, ttl=11.25)
    token = await lease.acquire("w1")
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


async def test_l23_no_observer(backend: ScriptedBackend, clock: FakeClock) -> None:
    """L23: without an observer every operation, failing or not, works."""
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=TTL)
    token = await lease.acquire("w1")
    await lease.read_checkpoint(token)
    await lease.checkpoint(token, b"x")
    await lease.renew(token)
    async with lease.renewal(token, interval=0.01):
        await asleep(0.05)
    await lease.release(token, ExitMode.FINISHED)
    await lease.forget(token)
    token = await lease.acquire("w1")
    await backend.take_over("w1", "rival", clock)
    with pytest.raises(FencedError):
        await lease.checkpoint(token, b"y")


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


async def test_l23_observer_errors_are_logged(
    backend: ScriptedBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """L23: an exception raised by an observer is logged and never breaks the operation."""
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=TTL, observer=Exploding())
    with caplog.at_level(logging.ERROR, logger="worklease"):
        token = await lease.acquire("w1")
        await lease.read_checkpoint(token)
        await lease.checkpoint(token, b"x")
        await lease.renew(token)
        await lease.release(token, ExitMode.FINISHED)
        await lease.forget(token)
    records = [r for r in caplog.records if r.name == "worklease"]
    assert len(records) == 6
    assert all("observer bug" in str(r.exc_info[1]) for r in records if r.exc_info)


@pytest.mark.parametrize("operation", [Operation.CHECKPOINT, Operation.RENEW, Operation.RELEASE])
async def test_l24_fenced_event_follows_the_operation_event(
    lease: AsyncLease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    clock: FakeClock,
    operation: Operation,
) -> None:
    """L24: a fenced write reports its own event, then FencedEvent with the operation."""
    token = await lease.acquire("w1")
    await backend.take_over("w1", "rival", clock)
    backend.delay(str(operation), 0.05)
    with pytest.raises(FencedError) as caught:
        await write(lease, token, operation)
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


async def test_l24_no_fenced_event_otherwise(
    lease: AsyncLease, backend: ScriptedBackend, observer: RecordingObserver
) -> None:
    """L24: successes and non-fencing failures report no FencedEvent."""
    token = await lease.acquire("w1")
    await lease.checkpoint(token, b"payload")
    await lease.renew(token)
    backend.fail("checkpoint", transient())
    with pytest.raises(BackendError):
        await lease.checkpoint(token, b"payload")
    backend.fail("renew", transient())
    with pytest.raises(BackendError):
        await lease.renew(token)
    await lease.release(token, ExitMode.FINISHED)
    with pytest.raises(LeaseExpiredError):
        await lease.checkpoint(token, b"late")
    with pytest.raises(LeaseExpiredError):
        await lease.renew(token)
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


async def test_l25_read_checkpoint_event(
    lease: AsyncLease,
    rival: AsyncLease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    clock: FakeClock,
) -> None:
    """L25: ReadCheckpointEvent carries the prior; zeroed on error; never a FencedEvent."""
    previous = await rival.acquire("w1")
    await rival.checkpoint(previous, b"prior")
    await rival.release(previous, ExitMode.ABANDONED)
    token = await lease.acquire("w1")
    observer.clear()
    await lease.read_checkpoint(token)
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
        await lease.read_checkpoint(token)
    (event,) = observer.events
    assert isinstance(event, ReadCheckpointEvent)
    assert (event.prev_exit, event.prev_holder_id, event.size, event.error) == (
        ExitMode.NONE,
        None,
        0,
        boom,
    )
    observer.clear()
    await backend.take_over("w1", "third", clock)
    with pytest.raises(FencedError) as caught:
        await lease.read_checkpoint(token)
    (event,) = observer.events
    assert isinstance(event, ReadCheckpointEvent)
    assert (event.prev_exit, event.prev_holder_id, event.size) == (ExitMode.NONE, None, 0)
    assert event.error is caught.value


async def test_l26_acquire_events(
    lease: AsyncLease, rival: AsyncLease, observer: RecordingObserver
) -> None:
    """L26: AcquireEvent has no token and the error on failure, the token on success."""
    await rival.acquire("busy")
    with pytest.raises(LeaseHeldError) as caught:
        await lease.acquire("busy")
    token = await lease.acquire("free")
    failed, ok = observer.of_type(AcquireEvent)
    assert (failed.work_id, failed.token, failed.error) == ("busy", None, caught.value)
    assert (ok.work_id, ok.token, ok.error) == ("free", token, None)
    assert failed.duration >= 0
    assert ok.duration >= 0


async def test_l26_one_event_per_poll(
    lease: AsyncLease, rival: AsyncLease, observer: RecordingObserver
) -> None:
    """L26: a waiting acquire reports every attempt."""
    await rival.acquire("w1")
    with pytest.raises(TimeoutError):
        await lease.acquire("w1", wait=True, timeout=0.15, poll_interval=0.03)
    events = observer.of_type(AcquireEvent)
    assert len(events) >= 2
    assert all(e.token is None and isinstance(e.error, LeaseHeldError) for e in events)


# L27 (HasWaitForLease) does not apply: waiting is the keyword argument acquire(wait=True),
# so there is no option list whose contents a caller would need to inspect.

# -- L28: vacuum --------------------------------------------------------------------------


async def test_l28_vacuum_requires_backend() -> None:
    """L28: a vacuum without a backend raises BackendRequiredError."""
    with pytest.raises(BackendRequiredError):
        AsyncVacuum(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        AsyncVacuum(ScriptedBackend(), observer=LeaseObserver())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "retention",
    [0, 0.0, -1, math.nan, math.inf, timedelta(0), timedelta(hours=-1), "0s", "soon", None],
)
async def test_l28_retention_required(retention: object) -> None:
    """L28: retention that is not a positive duration: RetentionRequiredError, no I/O."""
    backend = ScriptedBackend()
    observer = RecordingObserver()
    vacuum = AsyncVacuum(backend, observer=observer)
    with pytest.raises(RetentionRequiredError) as caught:
        await vacuum.sweep(retention)  # type: ignore[arg-type]
    assert isinstance(caught.value, ConfigError)
    assert backend.calls == []
    assert observer.events == []


async def test_l28_sweep_result(
    lease: AsyncLease, backend: ScriptedBackend, clock: FakeClock
) -> None:
    """L28: a positive retention delegates to the backend and reports one SweepEvent."""
    token = await lease.acquire("retired")
    await lease.release(token, ExitMode.RETIRED)
    await lease.acquire("lapsed")
    clock.advance(7200)
    observer = RecordingObserver()
    vacuum = AsyncVacuum(backend, observer=observer)
    assert await vacuum.sweep(timedelta(hours=1)) == 1
    assert await vacuum.sweep(3600, include_expired=True) == 1
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


async def test_l28_sweep_error_unchanged(backend: ScriptedBackend) -> None:
    """L28: a backend sweep error propagates unchanged and is reported."""
    observer = RecordingObserver()
    vacuum = AsyncVacuum(backend, observer=observer)
    boom = transient()
    backend.fail("sweep", boom)
    with pytest.raises(BackendError) as caught:
        await vacuum.sweep(60)
    assert caught.value is boom
    (event,) = observer.of_type(SweepEvent)
    assert (event.deleted, event.error) == (0, boom)


async def test_release_during_a_renewal_attempt(
    lease: AsyncLease, backend: ScriptedBackend
) -> None:
    """L11: releasing while a renewal attempt is under way ends the renewal without a loss."""
    token = await lease.acquire("w1")
    backend.delay("renew", 0.2)
    async with lease.renewal(token, interval=0.02) as r:
        for _ in range(300):
            if backend.count("renew"):
                break
            await asleep(0.01)
        await lease.release(token, ExitMode.FINISHED)
        await asleep(0.4)  # the attempt under way ends (threads) or was cancelled (asyncio)
    assert (r.cause, r.lost) == (None, False)
    await lease.forget(token)  # the token is not marked lost


async def test_release_with_a_slow_answer_inside_a_renewal(
    lease: AsyncLease, backend: ScriptedBackend, rival: AsyncLease
) -> None:
    """L11: a release stored at once but answered slowly is not reported as a lost lease."""
    token = await lease.acquire("w1")
    backend.delay_after("release", 0.2)
    async with lease.renewal(token, interval=0.02) as r:
        await lease.release(token, ExitMode.FINISHED)
    assert (r.cause, r.lost) == (None, False)
    successor = await rival.acquire("w1")
    assert (await rival.read_checkpoint(successor)).prev_exit is ExitMode.FINISHED
