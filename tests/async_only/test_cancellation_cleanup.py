"""Cancellation around the final writes: it is never swallowed, and the writes still happen."""

from __future__ import annotations

import asyncio

import pytest

from tests._async.helpers import ScriptedBackend
from worklease import (
    AsyncLeader,
    AsyncLease,
    AsyncRunner,
    BackendError,
    Checkpoint,
    ExitMode,
    Token,
)
from worklease._acompat import acleanup
from worklease.testing import FakeClock

BOUND = 10.0


async def test_runner_final_state_survives_a_cancellation_during_its_write() -> None:
    """The state a work function returned is written even if the caller cancels meanwhile."""
    backend = ScriptedBackend()
    lease = AsyncLease(backend, holder_id="holder-a", ttl=30)

    async def work(token: Token, prior: Checkpoint) -> bytes:
        backend.delay("checkpoint", 0.3)  # the final write is slow
        return b"final"

    task = asyncio.create_task(AsyncRunner(lease, work).run("job"))
    for _ in range(200):  # wait until the final write is under way
        if backend.count("checkpoint"):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, BOUND)
    successor = AsyncLease(backend, holder_id="holder-b", ttl=30)
    token = await successor.acquire("job")
    prior = await successor.read_checkpoint(token)
    assert prior == Checkpoint(b"final", ExitMode.FINISHED, "holder-a")


async def test_hold_entry_cancelled_with_a_failing_release_still_raises_cancelled() -> None:
    backend = ScriptedBackend()
    lease = AsyncLease(backend, holder_id="holder-a", ttl=30)
    backend.delay("read_checkpoint", 5.0)
    backend.fail("release", BackendError("down", transient=True))

    async def enter() -> None:
        async with lease.hold("job"):
            pass

    task = asyncio.create_task(enter())
    for _ in range(200):
        if backend.count("read_checkpoint"):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as caught:
        await asyncio.wait_for(task, BOUND)
    assert any("releasing as abandoned failed" in note for note in caught.value.__notes__)


async def test_leader_cancelled_during_on_elected_hands_the_lease_back() -> None:
    backend = ScriptedBackend()
    lease = AsyncLease(backend, holder_id="leader-a", ttl=30)
    elected = asyncio.Event()

    async def on_elected(token: Token) -> None:
        elected.set()
        await asyncio.sleep(60)

    leader = AsyncLeader(lease, "singleton", on_elected=on_elected)
    task = asyncio.create_task(leader.run(lambda token: None))
    await asyncio.wait_for(elected.wait(), BOUND)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, BOUND)
    successor = AsyncLease(backend, holder_id="leader-b", ttl=30)
    token = await successor.acquire("singleton")  # at once: it was released, not left to lapse
    prior = await successor.read_checkpoint(token)
    assert (prior.prev_exit, prior.prev_holder_id) == (ExitMode.ABANDONED, "leader-a")


async def test_leader_cancellation_is_not_swallowed_by_a_fenced_release() -> None:
    clock = FakeClock()
    backend = ScriptedBackend(clock=clock)
    lease = AsyncLease(backend, holder_id="leader-a", ttl=30)
    started = asyncio.Event()

    async def term(token: Token) -> None:
        started.set()
        await asyncio.sleep(60)

    leader = AsyncLeader(lease, "singleton", renewal_interval=30)
    task = asyncio.create_task(leader.run_forever(term))
    await asyncio.wait_for(started.wait(), BOUND)
    await backend.take_over("singleton", "leader-b", clock)  # the release will be fenced
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, BOUND)
    assert task.cancelled()  # not turned into FencedError, not another election
    assert backend.count("release") == 1
    assert backend.count("acquire") == 1


async def test_cleanup_timeout_ends_the_wait_even_if_the_writes_are_slow_to_cancel() -> None:
    """At the deadline acleanup raises TimeoutError at once; writes that take their time to
    wind down after the cancellation (a driver cancelling a query) are left to it."""
    wound_down = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(2.0)  # slow to cancel
            wound_down.set()
            raise

    start = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await acleanup(0.1, stubborn)
    assert asyncio.get_running_loop().time() - start < 1.5
    assert not wound_down.is_set()
    await asyncio.wait_for(wound_down.wait(), 5)  # it did wind down in the background
