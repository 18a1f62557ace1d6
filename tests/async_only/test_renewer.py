"""The shared renewal worker of a lease object, asyncio-specific cases."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from time import monotonic

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
    """Records the work ID of every single renewal."""

    def __init__(self) -> None:
        super().__init__()
        self.renewed: list[str] = []

    async def renew(self, token: Token, ttl: float) -> None:
        await super().renew(token, ttl)
        self.renewed.append(token.work_id)


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


async def test_a_cancelled_worker_reports_its_leases_lost_and_a_new_one_takes_over() -> None:
    backend = Counting()
    lease = AsyncLease(backend, holder_id="a", ttl=30.0)
    token = await lease.acquire("w1")
    started = monotonic()
    with pytest.raises(LeaseWindowExhaustedError):  # noqa: PT012
        async with lease.renewal(token, interval=10.0):
            await asyncio.sleep(0)  # let the worker start waiting
            [worker] = _renewer_tasks()
            worker.cancel()  # as a "cancel every task" sweep would
            await asyncio.sleep(3600)
    assert monotonic() - started < PROMPT
    # The next renewal gets a worker of its own and is renewed as usual.
    again = await lease.acquire("w2")
    async with lease.renewal(again, interval=0.02):
        assert await _renewed(backend, "w2")


async def test_a_worker_cancelled_before_it_ran_is_replaced() -> None:
    backend = Counting()
    lease = AsyncLease(backend, holder_id="a", ttl=30.0)
    first = await lease.acquire("w1")
    async with lease.renewal(first, interval=10.0):
        [worker] = _renewer_tasks()
        worker.cancel()  # never runs at all
        await asyncio.sleep(0.05)
        assert worker.done()
        second = await lease.acquire("w2")
        async with lease.renewal(second, interval=0.02):
            [replacement] = _renewer_tasks()
            assert replacement is not worker
            assert await _renewed(backend, "w2")
