"""The shared renewal worker of a lease object, asyncio-specific cases."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from time import monotonic
from typing import Any

import pytest

from worklease import (
    AsyncLease,
    AsyncMemoryBackend,
    LeaseLostError,
    LeaseWindowExhaustedError,
    Token,
)

PROMPT = 5.0


class StallingBatches(AsyncMemoryBackend):
    """Every renewal call hangs (until cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    async def renew(self, token: Token, ttl: float) -> None:
        self.batches.append([token.work_id])
        await asyncio.sleep(3600)

    async def renew_many(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        self.batches.append([token.work_id for token in tokens])
        await asyncio.sleep(3600)
        return [None] * len(tokens)


class Counting(AsyncMemoryBackend):
    """Records the work ID of every renewal, single or batched."""

    def __init__(self) -> None:
        super().__init__()
        self.renewed: list[str] = []

    async def renew(self, token: Token, ttl: float) -> None:
        await super().renew(token, ttl)
        self.renewed.append(token.work_id)

    async def renew_many(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        outcomes = await super().renew_many(tokens, ttl)
        self.renewed.extend(t.work_id for t, lost in zip(tokens, outcomes, strict=True) if not lost)
        return outcomes


async def _renewed(backend: Counting, work_id: str) -> bool:
    for _ in range(round(PROMPT / 0.01)):
        if work_id in backend.renewed:
            return True
        await asyncio.sleep(0.01)
    return False


def _renewer_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "worklease-renewals"]


async def test_a_window_closing_during_a_shared_call_is_reported_at_once() -> None:
    """Two renewals in one stalled call: the one whose window closes first loses its lease
    (its body is cancelled) while the other's window is still open, not when the shared call
    gives up at the later window's end."""
    backend = StallingBatches()
    lease = AsyncLease(backend, holder_id="a", ttl=2.0)
    early = await lease.acquire("early")
    await asyncio.sleep(0.5)
    late = await lease.acquire("late")
    seen: dict[str, object] = {}

    async def hold_late(ready: asyncio.Event) -> None:
        async with lease.renewal(late, interval=1.2) as renewal:
            seen["late"] = renewal
            ready.set()
            await asyncio.sleep(3600)

    ready = asyncio.Event()
    late_task = asyncio.create_task(hold_late(ready))
    await ready.wait()
    late_renewal = seen["late"]
    with pytest.raises(LeaseWindowExhaustedError):
        async with lease.renewal(early, interval=1.2):
            await asyncio.sleep(3600)
    assert ["early", "late"] in [sorted(batch) for batch in backend.batches]
    # When the early lease was reported lost, the late one's window was still open.
    assert late_renewal.remaining() is not None  # type: ignore[attr-defined]
    late_task.cancel()
    with pytest.raises((asyncio.CancelledError, LeaseLostError)):
        await late_task


async def _renewer_task() -> asyncio.Task[object]:
    """The renewal worker, once it started (it starts when the first attempt is due)."""
    for _ in range(round(PROMPT / 0.005)):
        tasks = _renewer_tasks()
        if tasks:
            [task] = tasks
            return task
        await asyncio.sleep(0.005)
    raise AssertionError("no renewal worker started")


async def test_a_renewal_ended_before_its_first_attempt_starts_no_worker() -> None:
    """A short hold (a runner's cycle) costs no task: the worker starts when the first
    attempt is due, and a renewal stopped before then cancels that start."""
    backend = Counting()
    lease = AsyncLease(backend, holder_id="a", ttl=30.0)
    for work_id in ("w1", "w2", "w3"):
        token = await lease.acquire(work_id)
        async with lease.renewal(token, interval=10.0):
            await asyncio.sleep(0.01)
            assert _renewer_tasks() == []
        assert _renewer_tasks() == []
    # A renewal that lives to its first attempt gets a worker, and is renewed.
    token = await lease.acquire("w4")
    async with lease.renewal(token, interval=0.05):
        assert await _renewed(backend, "w4")
        assert len(_renewer_tasks()) == 1


async def test_short_renewals_one_after_another_share_one_pending_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runner's cycles: each renewal ends before its first attempt is due. They share one
    deferred start of the worker (one timer, one renewer), not one each."""
    import worklease._async.renewal as renewal_module
    from worklease._acompat import aspawn_after as spawn

    spawned: list[object] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        worker = spawn(*args, **kwargs)
        spawned.append(worker)
        return worker

    monkeypatch.setattr(renewal_module, "aspawn_after", counting)
    backend = Counting()
    lease = AsyncLease(backend, holder_id="a", ttl=30.0)
    for index in range(5):
        token = await lease.acquire(f"cycle-{index}")
        async with lease.renewal(token, interval=10.0):
            await asyncio.sleep(0)
    assert len(spawned) == 1
    assert _renewer_tasks() == []
    assert backend.renewed == []


async def test_a_start_due_with_nothing_left_to_renew_starts_no_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pending start comes after the renewal ended: no task starts, the renewer is
    retired, and the next renewal gets a worker of its own."""
    created: list[str] = []
    loop = asyncio.get_running_loop()
    create_task = loop.create_task

    def recording(coro: Any, **kwargs: Any) -> asyncio.Task[object]:
        created.append(str(kwargs.get("name")))
        return create_task(coro, **kwargs)

    monkeypatch.setattr(loop, "create_task", recording)
    backend = Counting()
    lease = AsyncLease(backend, holder_id="a", ttl=30.0)
    token = await lease.acquire("brief")
    async with lease.renewal(token, interval=0.05):
        pass  # ends before its first attempt: the worker's start stays due in 0.05 s
    await asyncio.sleep(0.3)  # well past the start's time
    assert "worklease-renewals" not in created
    assert lease._renewals._renewers == {}
    again = await lease.acquire("next")
    async with lease.renewal(again, interval=0.05):
        assert await _renewed(backend, "next")
    assert created.count("worklease-renewals") == 1


def test_a_renewer_left_on_a_closed_loop_is_dropped_by_the_next_loop() -> None:
    """A loop that closes while a worker's start is pending never runs it: the next loop's
    first renewal drops that renewer (and its loop) instead of keeping one per loop."""
    lease_box: list[AsyncLease] = []

    async def one_short_hold(work_id: str) -> None:
        if not lease_box:
            lease_box.append(AsyncLease(AsyncMemoryBackend(), holder_id="a", ttl=30.0))
        lease = lease_box[0]
        token = await lease.acquire(work_id)
        async with lease.renewal(token, interval=10.0):
            pass

    for index in range(5):
        asyncio.run(one_short_hold(f"w{index}"))
        assert len(lease_box[0]._renewals._renewers) == 1  # this run's, its loop now closed


async def test_an_earlier_renewal_brings_the_workers_start_forward() -> None:
    backend = Counting()
    lease = AsyncLease(backend, holder_id="a", ttl=30.0)
    slow = await lease.acquire("slow")
    fast = await lease.acquire("fast")
    async with lease.renewal(slow, interval=3600.0):
        async with lease.renewal(fast, interval=0.05):
            assert await _renewed(backend, "fast")
        assert "slow" not in backend.renewed


async def test_a_cancelled_worker_reports_its_leases_lost_and_a_new_one_takes_over() -> None:
    backend = Counting()
    lease = AsyncLease(backend, holder_id="a", ttl=30.0)
    token = await lease.acquire("w1")
    started = monotonic()
    with pytest.raises(LeaseWindowExhaustedError):  # noqa: PT012
        async with lease.renewal(token, interval=0.05):
            # Cancelled once it ran (it renewed): a task cancelled before its first step never
            # runs its body at all, which is the next test's case.
            assert await _renewed(backend, "w1")
            worker = await _renewer_task()
            worker.cancel()  # as a "cancel every task" sweep would
            await asyncio.sleep(3600)
    assert monotonic() - started < PROMPT
    # The next renewal gets a worker of its own and is renewed as usual.
    again = await lease.acquire("w2")
    async with lease.renewal(again, interval=0.02):
        assert await _renewed(backend, "w2")


async def test_a_worker_cancelled_before_it_ran_reports_its_leases_lost_and_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task cancelled before its first step never runs its coroutine, so it cannot report
    anything itself: the worker's start reports its leases lost for it (otherwise the holder
    would believe in a lease nobody renews), and the next renewal gets a new worker."""
    backend = Counting()
    lease = AsyncLease(backend, holder_id="a", ttl=30.0)
    first = await lease.acquire("w1")
    loop = asyncio.get_running_loop()
    create_task = loop.create_task
    cancelled: list[asyncio.Task[object]] = []

    def create_and_cancel_the_first_worker(coro: Any, **kwargs: Any) -> asyncio.Task[object]:
        task = create_task(coro, **kwargs)
        if kwargs.get("name") == "worklease-renewals" and not cancelled:
            task.cancel()  # never runs at all
            cancelled.append(task)
        return task

    monkeypatch.setattr(loop, "create_task", create_and_cancel_the_first_worker)
    started = monotonic()
    with pytest.raises(LeaseWindowExhaustedError):
        async with lease.renewal(first, interval=0.02):
            await asyncio.sleep(3600)  # the loss cancels the block
    assert monotonic() - started < PROMPT
    [worker] = cancelled
    assert worker.cancelled()
    second = await lease.acquire("w2")
    async with lease.renewal(second, interval=0.02):
        replacement = await _renewer_task()
        assert replacement is not worker
        assert await _renewed(backend, "w2")
