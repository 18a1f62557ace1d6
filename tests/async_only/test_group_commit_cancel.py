"""Group commit under asyncio cancellation: nobody waits for ever, nothing is lost silently."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from worklease import AsyncLease, AsyncMemoryBackend, LeaseLostError, Token
from worklease._async import group as group_module

PROMPT = 10.0


@pytest.fixture(autouse=True)
def one_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """One round in flight, so the gated lone write decides who queues (the lease's default
    is two: see tests/_async/test_group_commit.py)."""
    monkeypatch.setattr(group_module, "_ROUNDS", 1)


class GatedMemory(AsyncMemoryBackend):
    """Holds the first lone checkpoint and the first batch until the test opens them."""

    def __init__(self) -> None:
        super().__init__()
        self.single_gate = asyncio.Event()
        self.batch_gate = asyncio.Event()
        self.in_single = asyncio.Event()
        self.in_batch = asyncio.Event()
        self.batches: list[list[str]] = []
        self.after_single: Any = None

    async def checkpoint(self, token: Token, state: Any, ttl: float) -> None:
        if not self.in_single.is_set():
            self.in_single.set()
            await asyncio.wait_for(self.single_gate.wait(), PROMPT)
            await super().checkpoint(token, state, ttl)
            if self.after_single is not None:
                # Runs before the round's end wakes the next leader (callbacks run in order).
                asyncio.get_running_loop().call_soon(self.after_single)
            return
        await super().checkpoint(token, state, ttl)

    async def checkpoint_many(
        self, items: Sequence[tuple[Token, Any]], ttl: float
    ) -> list[LeaseLostError | None]:
        self.batches.append([token.work_id for token, _ in items])
        if not self.in_batch.is_set():
            self.in_batch.set()
            await asyncio.wait_for(self.batch_gate.wait(), PROMPT)
        return await super().checkpoint_many(items, ttl)


def queued(lease: AsyncLease) -> list[str]:
    group: Any = lease._checkpoints  # private state, read only
    return [entry.key for entry in group._queue]


async def until(predicate: Any) -> None:
    for _ in range(round(PROMPT / 0.001)):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("timed out")


async def test_a_cancelled_leader_leaves_its_round_to_finish() -> None:
    backend = GatedMemory()
    lease = AsyncLease(backend, holder_id="h", ttl=30.0)
    tokens = [await lease.acquire(f"g{i}") for i in range(5)]
    first = asyncio.create_task(lease.checkpoint(tokens[0], b"state 0"))
    await asyncio.wait_for(backend.in_single.wait(), PROMPT)
    rest = [
        asyncio.create_task(lease.checkpoint(t, f"state {i + 1}".encode()))
        for i, t in enumerate(tokens[1:])
    ]
    await until(lambda: len(queued(lease)) == 4)
    backend.single_gate.set()
    await first
    await asyncio.wait_for(backend.in_batch.wait(), PROMPT)
    assert backend.batches == [["g1", "g2", "g3", "g4"]]
    leader = rest[0]  # the first queued leads the second round
    leader.cancel()
    await asyncio.sleep(0)
    backend.batch_gate.set()
    results = await asyncio.wait_for(asyncio.gather(*rest, return_exceptions=True), PROMPT)
    assert isinstance(results[0], asyncio.CancelledError)
    assert results[1:] == [None, None, None]
    # The round ran to its end: even the cancelled leader's write landed.
    for i, token in enumerate(tokens):
        assert (await lease.read_checkpoint(token)).state == f"state {i}".encode()


async def test_a_caller_cancelled_while_queued_is_never_written() -> None:
    backend = GatedMemory()
    backend.batch_gate.set()
    lease = AsyncLease(backend, holder_id="h", ttl=30.0)
    tokens = [await lease.acquire(f"g{i}") for i in range(4)]
    first = asyncio.create_task(lease.checkpoint(tokens[0], b"state 0"))
    await asyncio.wait_for(backend.in_single.wait(), PROMPT)
    rest = [asyncio.create_task(lease.checkpoint(t, b"later")) for t in tokens[1:]]
    await until(lambda: len(queued(lease)) == 3)
    rest[1].cancel()  # g2, still queued
    await until(lambda: len(queued(lease)) == 2)
    backend.single_gate.set()
    await first
    results = await asyncio.wait_for(asyncio.gather(*rest, return_exceptions=True), PROMPT)
    assert results[0] is None
    assert isinstance(results[1], asyncio.CancelledError)
    assert results[2] is None
    assert backend.batches == [["g1", "g3"]]
    assert (await lease.read_checkpoint(tokens[2])).state is None


async def test_a_promoted_caller_cancelled_hands_the_lead_on() -> None:
    """The first queued caller is woken to lead and cancelled before it runs: the next one
    leads instead, and every other write lands."""
    backend = GatedMemory()
    backend.batch_gate.set()
    lease = AsyncLease(backend, holder_id="h", ttl=30.0)
    tokens = [await lease.acquire(f"g{i}") for i in range(4)]
    first = asyncio.create_task(lease.checkpoint(tokens[0], b"state 0"))
    await asyncio.wait_for(backend.in_single.wait(), PROMPT)
    rest = [asyncio.create_task(lease.checkpoint(t, b"later")) for t in tokens[1:]]
    await until(lambda: len(queued(lease)) == 3)
    seen: list[list[str]] = []

    def cancel_g1() -> None:  # as g1 is woken to lead
        seen.append(queued(lease))
        rest[0].cancel()

    backend.after_single = cancel_g1
    backend.single_gate.set()
    await first
    results = await asyncio.wait_for(asyncio.gather(*rest, return_exceptions=True), PROMPT)
    assert seen == [["g2", "g3"]]  # g1 had left the queue to lead when it was cancelled
    assert isinstance(results[0], asyncio.CancelledError)
    assert results[1:] == [None, None]
    assert (await lease.read_checkpoint(tokens[1])).state is None
    for token in tokens[2:]:
        assert (await lease.read_checkpoint(token)).state == b"later"
