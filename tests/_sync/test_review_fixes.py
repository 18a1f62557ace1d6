# Generated from tests/_async/test_review_fixes.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Corner cases of the leader, the renewal and the pool found in review."""

from __future__ import annotations

from time import monotonic

import pytest

from tests._compat import sleep, spawn_all
from worklease import (
    Checkpoint,
    FencedError,
    Leader,
    Lease,
    MemoryBackend,
    Pool,
    Token,
)
from worklease.testing import FakeClock

BOUND = 10.0


def test_renewal_entered_after_the_window_closed_renews_at_once() -> None:
    """A slow step between acquire and renewal: the first renewal runs at once and finds the
    lease taken over, instead of pretending for a whole interval."""
    clock = FakeClock()
    backend = MemoryBackend(clock)
    lease = Lease(backend, holder_id="slow", ttl=0.2)
    token = lease.acquire("job")
    sleep(0.3)  # longer than the TTL on the real monotonic clock: the window closed
    clock.advance(1)
    Lease(backend, holder_id="fast", ttl=30).acquire("job")
    renewal = lease.renewal(token, interval=60)  # no attempt would come for a minute
    start = monotonic()
    with pytest.raises(FencedError):  # noqa: PT012
        with renewal:
            for _ in range(1000):
                renewal.raise_if_lost()
                sleep(0.01)
    assert monotonic() - start < BOUND
    assert renewal.remaining() is None


def test_leader_acquire_wait_ends_on_stop() -> None:
    backend = MemoryBackend()
    Lease(backend, holder_id="incumbent", ttl=30).acquire("singleton")
    leader = Leader(
        Lease(backend, holder_id="standby", ttl=30),
        "singleton",
        acquire_wait=True,
        poll_interval=0.05,
        idle_interval=0.05,
    )

    def contend(index: int) -> None:
        if index == 0:
            leader.run_forever(lambda token: None)
        else:
            sleep(0.3)
            leader.stop()

    start = monotonic()
    results = spawn_all(contend, 2)
    assert results == [None, None]
    assert monotonic() - start < BOUND


def test_stopped_pool_cannot_run_again() -> None:
    lease = Lease(MemoryBackend(), holder_id="holder", ttl=30)

    def work(token: Token, prior: Checkpoint) -> None:
        return None

    pool = Pool(lease, ["a"], work)
    pool.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        pool.run()
