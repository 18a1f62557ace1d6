"""Corner cases of the leader, the renewal and the pool found in review."""

from __future__ import annotations

from time import monotonic

import pytest

from tests._acompat import asleep, aspawn_all
from worklease import (
    AsyncLeader,
    AsyncLease,
    AsyncMemoryBackend,
    AsyncPool,
    Checkpoint,
    FencedError,
    Token,
)
from worklease.testing import FakeClock

BOUND = 10.0


async def test_renewal_entered_after_the_window_closed_renews_at_once() -> None:
    """A slow step between acquire and renewal: the first renewal runs at once and finds the
    lease taken over, instead of pretending for a whole interval."""
    clock = FakeClock()
    backend = AsyncMemoryBackend(clock)
    lease = AsyncLease(backend, holder_id="slow", ttl=0.2)
    token = await lease.acquire("job")
    await asleep(0.3)  # longer than the TTL on the real monotonic clock: the window closed
    clock.advance(1)
    await AsyncLease(backend, holder_id="fast", ttl=30).acquire("job")
    renewal = lease.renewal(token, interval=60)  # no attempt would come for a minute
    start = monotonic()
    with pytest.raises(FencedError):  # noqa: PT012
        async with renewal:
            for _ in range(1000):
                renewal.raise_if_lost()
                await asleep(0.01)
    assert monotonic() - start < BOUND
    assert renewal.remaining() is None


async def test_leader_acquire_wait_ends_on_stop() -> None:
    backend = AsyncMemoryBackend()
    await AsyncLease(backend, holder_id="incumbent", ttl=30).acquire("singleton")
    leader = AsyncLeader(
        AsyncLease(backend, holder_id="standby", ttl=30),
        "singleton",
        acquire_wait=True,
        poll_interval=0.05,
        idle_interval=0.05,
    )

    async def contend(index: int) -> None:
        if index == 0:
            await leader.run_forever(lambda token: None)
        else:
            await asleep(0.3)
            leader.stop()

    start = monotonic()
    results = await aspawn_all(contend, 2)
    assert results == [None, None]
    assert monotonic() - start < BOUND


async def test_stopped_pool_cannot_run_again() -> None:
    lease = AsyncLease(AsyncMemoryBackend(), holder_id="holder", ttl=30)

    def work(token: Token, prior: Checkpoint) -> None:
        return None

    pool = AsyncPool(lease, ["a"], work)
    pool.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        await pool.run()
