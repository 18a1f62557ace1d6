"""A waiting acquire wakes at the holder's expiry instead of a whole poll interval later."""

from __future__ import annotations

from time import monotonic

import pytest

from worklease import AsyncBackend, AsyncLease, ExitMode, LeaseHeldError


async def test_waiter_takes_over_right_after_a_crashed_holders_expiry(
    backend: AsyncBackend,
) -> None:
    """The holder never releases (a crash): the waiter gets the lease soon after the TTL,
    although its poll interval is far longer."""
    crashed = AsyncLease(backend, holder_id="crashed", ttl=0.5)
    await crashed.acquire("handoff")
    waiter = AsyncLease(backend, holder_id="waiter", ttl=30)
    start = monotonic()
    token = await waiter.acquire("handoff", wait=True, timeout=20, poll_interval=15)
    elapsed = monotonic() - start
    assert token.holder_id == "waiter"
    assert 0.3 < elapsed < 5.0  # ~0.5 s TTL, nowhere near the 15 s poll interval
    prior = await waiter.read_checkpoint(token)
    assert (prior.prev_exit, prior.prev_holder_id) == (ExitMode.EXPIRED, "crashed")


async def test_waiter_falls_back_to_the_poll_interval_when_the_expiry_does_not_come(
    backend: AsyncBackend,
) -> None:
    """A holder that keeps renewing: the waiter polls, and the wait ends by its timeout."""
    holder = AsyncLease(backend, holder_id="holder", ttl=30)
    await holder.acquire("kept")
    waiter = AsyncLease(backend, holder_id="waiter", ttl=30)
    start = monotonic()
    with pytest.raises(TimeoutError) as caught:
        await waiter.acquire("kept", wait=True, timeout=0.4, poll_interval=0.1)
    assert isinstance(caught.value.__cause__, LeaseHeldError)
    assert caught.value.__cause__.holder_id in ("holder", None)
    assert 0.35 < monotonic() - start < 5.0
