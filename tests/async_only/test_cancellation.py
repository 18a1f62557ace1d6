"""asyncio-only renewal behaviour: cancelling the body on loss, outside cancellation, cleanup."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import pytest

from worklease import (
    AsyncLease,
    AsyncMemoryBackend,
    AsyncRenewal,
    AsyncRunner,
    BackendError,
    Checkpoint,
    ExitMode,
    FencedError,
    LeaseWindowExhaustedError,
    RenewEvent,
    Token,
    current_renewal,
)
from worklease.testing import FakeClock, RecordingObserver

T = TypeVar("T")

PROMPT = 5.0
"""Upper bound for 'promptly' on a loaded CI box."""


class FailingBackend(AsyncMemoryBackend):
    """Every renewal fails with a transient backend error."""

    def __init__(self) -> None:
        super().__init__()
        self.renew_calls = 0

    async def renew(self, token: Token, ttl: float) -> None:
        self.renew_calls += 1
        raise BackendError("connection refused", transient=True)


class StallingBackend(AsyncMemoryBackend):
    """Every renewal hangs (far longer than any test)."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = asyncio.Event()
        self.cancelled = 0

    async def renew(self, token: Token, ttl: float) -> None:
        self.stalled.set()
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> AsyncMemoryBackend:
    return AsyncMemoryBackend(clock=clock)


@pytest.fixture
def lease(backend: AsyncMemoryBackend) -> AsyncLease:
    return AsyncLease(backend, holder_id="a", ttl=1.0)


@pytest.fixture
def rival(backend: AsyncMemoryBackend) -> AsyncLease:
    return AsyncLease(backend, holder_id="b", ttl=1.0)


@pytest.fixture
async def no_leftover_tasks() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0.01)
    left = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert [t for t in left if t is not asyncio.current_task()] == []


async def _bounded(awaitable: Awaitable[T]) -> T:
    async with asyncio.timeout(PROMPT * 2):
        return await awaitable


def _this_task() -> asyncio.Task[object]:
    task = asyncio.current_task()
    assert task is not None
    return task


# -- loss cancels the body ------------------------------------------------------------------


@pytest.mark.usefixtures("no_leftover_tasks")
async def test_fenced_cancels_the_body_and_raises_fenced(
    clock: FakeClock, lease: AsyncLease, rival: AsyncLease
) -> None:
    token = await lease.acquire("w1")
    renewal = lease.renewal(token, interval=0.02)
    reached_end = False

    async def body() -> None:
        nonlocal reached_end
        async with renewal:
            clock.advance(2)
            await rival.acquire("w1")
            await asyncio.sleep(PROMPT * 2)
            reached_end = True

    started = time.monotonic()
    with pytest.raises(FencedError) as info:
        await body()
    elapsed = time.monotonic() - started
    assert not reached_end
    assert elapsed < PROMPT
    assert renewal.cause is info.value
    assert renewal.lost
    assert renewal.remaining() is None
    assert info.value.fencing_token == token.fencing_token
    # the CancelledError used to interrupt the body is not shown as the context
    assert info.value.__suppress_context__
    # our cancellation request was withdrawn: the task is usable
    assert _this_task().cancelling() == 0
    await asyncio.sleep(0)
    # every later write with the token fails without reviving the lease
    with pytest.raises(FencedError):
        await lease.checkpoint(token, b"late")


async def test_takeover_cancels_a_body_busy_in_a_loop(
    clock: FakeClock, lease: AsyncLease, rival: AsyncLease
) -> None:
    token = await lease.acquire("w1")
    steps = 0

    async def body() -> None:
        nonlocal steps
        async with lease.renewal(token, interval=0.02):
            clock.advance(2)
            await rival.acquire("w1")
            deadline = time.monotonic() + PROMPT
            while time.monotonic() < deadline:
                steps += 1
                await asyncio.sleep(0.001)

    with pytest.raises(FencedError):
        await body()
    assert steps > 0
    assert _this_task().cancelling() == 0


@pytest.mark.usefixtures("no_leftover_tasks")
async def test_window_exhaustion_on_backend_errors() -> None:
    backend = FailingBackend()
    observer = RecordingObserver()
    ttl = 0.3
    lease = AsyncLease(backend, holder_id="a", ttl=ttl, observer=observer)
    started = time.monotonic()
    token = await lease.acquire("w1")
    with pytest.raises(LeaseWindowExhaustedError) as info:
        async with lease.renewal(token, interval=0.02):
            await asyncio.sleep(PROMPT * 2)
    elapsed = time.monotonic() - started
    assert type(info.value) is LeaseWindowExhaustedError
    # transient errors are never reported as loss before the window closes
    assert elapsed >= ttl * 0.9
    assert elapsed < ttl + PROMPT
    assert isinstance(info.value.__cause__, BackendError)
    assert backend.renew_calls >= 2
    attempts = [e.attempt for e in observer.of_type(RenewEvent)]
    assert attempts[:2] == [1, 2]
    assert attempts == sorted(attempts)
    assert all(e.error is not None for e in observer.of_type(RenewEvent))
    assert _this_task().cancelling() == 0


@pytest.mark.usefixtures("no_leftover_tasks")
async def test_window_exhaustion_on_a_stalled_renew() -> None:
    backend = StallingBackend()
    ttl = 0.3
    lease = AsyncLease(backend, holder_id="a", ttl=ttl)
    started = time.monotonic()
    token = await lease.acquire("w1")
    with pytest.raises(LeaseWindowExhaustedError) as info:
        async with lease.renewal(token, interval=0.02) as renewal:
            await asyncio.sleep(PROMPT * 2)
    elapsed = time.monotonic() - started
    assert type(info.value) is LeaseWindowExhaustedError
    assert backend.stalled.is_set()
    assert ttl * 0.9 <= elapsed < ttl + PROMPT
    assert renewal.remaining() is None
    # the stuck call was abandoned (cancelled), not left running
    assert backend.cancelled == 1


# -- outside cancellation -------------------------------------------------------------------


@pytest.mark.usefixtures("no_leftover_tasks")
async def test_outside_cancel_raises_cancelled_error(lease: AsyncLease) -> None:
    token = await lease.acquire("w1")
    inside = asyncio.Event()
    seen: list[AsyncRenewal] = []

    async def body() -> None:
        async with lease.renewal(token, interval=0.02) as renewal:
            seen.append(renewal)
            inside.set()
            await asyncio.sleep(PROMPT * 2)

    task = asyncio.create_task(body())
    await _bounded(inside.wait())
    await asyncio.sleep(0.1)  # let a few renewals succeed
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await _bounded(task)
    assert time.monotonic() - started < PROMPT
    assert task.cancelled()
    (renewal,) = seen
    assert renewal.cause is None
    assert not renewal.lost
    assert renewal.remaining() is None
    # the lease is still ours (nobody released it) and still writable
    await lease.checkpoint(token, b"after")


async def test_body_exception_is_not_masked_by_the_loss(
    clock: FakeClock, lease: AsyncLease, rival: AsyncLease
) -> None:
    token = await lease.acquire("w1")
    renewal = lease.renewal(token, interval=0.02)
    cancelled_in_body = False

    async def body() -> None:
        nonlocal cancelled_in_body
        async with renewal:
            clock.advance(2)
            await rival.acquire("w1")
            try:
                await asyncio.sleep(PROMPT * 2)
            except asyncio.CancelledError:
                cancelled_in_body = True
                raise ValueError("body failed") from None

    with pytest.raises(ValueError, match="body failed") as info:
        await body()
    assert cancelled_in_body
    cause = renewal.cause
    assert isinstance(cause, FencedError)
    error = info.value
    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    notes = " ".join(getattr(error, "__notes__", []))
    assert cause in chain or "lost" in notes, "the loss must be attached to the body's error"
    assert _this_task().cancelling() == 0


# -- acquire, hold and runner under cancellation --------------------------------------------


@pytest.mark.usefixtures("no_leftover_tasks")
async def test_cancel_a_waiting_acquire(
    backend: AsyncMemoryBackend, lease: AsyncLease, rival: AsyncLease
) -> None:
    held = await rival.acquire("w1")
    task = asyncio.create_task(lease.acquire("w1", wait=True, poll_interval=0.05))
    await asyncio.sleep(0.2)
    assert not task.done()
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await _bounded(task)
    assert time.monotonic() - started < PROMPT
    (row,) = backend.rows()
    assert (row.holder_id, row.fencing_token) == ("b", held.fencing_token)
    # nothing was acquired behind our back: once released, the work ID is free for anybody
    await rival.release(held, ExitMode.FINISHED)
    await asyncio.sleep(0.2)
    (row,) = backend.rows()
    assert (row.holder_id, row.fencing_token) == ("b", held.fencing_token)
    token = await lease.acquire("w1")
    assert token.fencing_token == held.fencing_token + 1


@pytest.mark.usefixtures("no_leftover_tasks")
async def test_cancelled_hold_releases_abandoned_keeping_the_checkpoint(
    lease: AsyncLease, rival: AsyncLease
) -> None:
    inside = asyncio.Event()

    async def body() -> None:
        async with lease.hold("w1", interval=0.02) as held:
            await held.checkpoint(b"first")
            await held.checkpoint(b"second")
            inside.set()
            await asyncio.sleep(PROMPT * 2)

    task = asyncio.create_task(body())
    await _bounded(inside.wait())
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await _bounded(task)
    assert time.monotonic() - started < PROMPT
    token = await rival.acquire("w1")  # released: acquirable at once
    prior = await rival.read_checkpoint(token)
    assert prior == Checkpoint(b"second", ExitMode.ABANDONED, "a")


@pytest.mark.usefixtures("no_leftover_tasks")
async def test_cancelled_runner_releases_abandoned_keeping_the_checkpoint(
    lease: AsyncLease, rival: AsyncLease
) -> None:
    inside = asyncio.Event()

    async def work(token: Token, prior: Checkpoint) -> bytes | None:
        assert prior == Checkpoint()
        await lease.checkpoint(token, b"progress")
        inside.set()
        await asyncio.sleep(PROMPT * 2)
        return b"never written"

    runner = AsyncRunner(lease, work, renewal_interval=0.02)
    task = asyncio.create_task(runner.run("w1"))
    await _bounded(inside.wait())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await _bounded(task)
    token = await rival.acquire("w1")
    prior = await rival.read_checkpoint(token)
    assert prior == Checkpoint(b"progress", ExitMode.ABANDONED, "a")


# -- stop and current_renewal ---------------------------------------------------------------


@pytest.mark.usefixtures("no_leftover_tasks")
async def test_stop_returns_at_once_while_a_renew_is_stalled() -> None:
    backend = StallingBackend()
    lease = AsyncLease(backend, holder_id="a", ttl=30.0)
    token = await lease.acquire("w1")
    async with lease.renewal(token, interval=0.02) as renewal:
        await _bounded(backend.stalled.wait())
        started = time.monotonic()
        renewal.stop()
        renewal.stop()  # idempotent
        assert time.monotonic() - started < 0.5
        assert renewal.remaining() is None
        assert renewal.cause is None
        await asyncio.sleep(0.05)
        assert backend.cancelled == 1  # the stuck call was abandoned
        await asyncio.sleep(0.1)  # the body is not cancelled by a plain stop
    assert renewal.cause is None
    assert _this_task().cancelling() == 0


async def test_leaving_the_block_while_a_renew_is_stalled_is_prompt() -> None:
    backend = StallingBackend()
    lease = AsyncLease(backend, holder_id="a", ttl=30.0)
    token = await lease.acquire("w1")
    started = time.monotonic()
    async with lease.renewal(token, interval=0.02):
        await _bounded(backend.stalled.wait())
    assert time.monotonic() - started < PROMPT
    await lease.release(token, ExitMode.FINISHED)


async def test_current_renewal_is_per_task(lease: AsyncLease) -> None:
    token = await lease.acquire("w1")
    other_token = await lease.acquire("w2")
    entered = asyncio.Event()
    checked = asyncio.Event()
    seen_by_other: list[object] = []

    async def other() -> None:
        await entered.wait()
        seen_by_other.append(current_renewal())
        checked.set()

    watcher = asyncio.create_task(other())  # created outside the block
    assert current_renewal() is None
    async with lease.renewal(token, interval=0.02) as renewal:
        assert current_renewal() is renewal
        entered.set()
        await _bounded(checked.wait())
        async with lease.renewal(other_token, interval=0.02) as inner:
            assert current_renewal() is inner
            remaining = current_renewal()
            assert remaining is not None
            left = remaining.remaining()
            assert left is not None
            assert 0 < left <= 1.0
        assert current_renewal() is renewal
    assert current_renewal() is None
    await watcher
    assert seen_by_other == [None]
