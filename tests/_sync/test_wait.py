# Generated from tests/_async/test_wait.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""A waiting acquire wakes at the holder's expiry instead of a whole poll interval later."""

from __future__ import annotations

from time import monotonic

import pytest

from worklease import Backend, ExitMode, Lease, LeaseHeldError


def test_waiter_takes_over_right_after_a_crashed_holders_expiry(
    backend: Backend,
) -> None:
    """The holder never releases (a crash): the waiter gets the lease soon after the TTL,
    although its poll interval is far longer."""
    crashed = Lease(backend, holder_id="crashed", ttl=0.5)
    crashed.acquire("handoff")
    waiter = Lease(backend, holder_id="waiter", ttl=30)
    start = monotonic()
    token = waiter.acquire("handoff", wait=True, timeout=20, poll_interval=15)
    elapsed = monotonic() - start
    assert token.holder_id == "waiter"
    assert 0.3 < elapsed < 5.0  # ~0.5 s TTL, nowhere near the 15 s poll interval
    prior = waiter.read_checkpoint(token)
    assert (prior.prev_exit, prior.prev_holder_id) == (ExitMode.EXPIRED, "crashed")


def test_waiter_falls_back_to_the_poll_interval_when_the_expiry_does_not_come(
    backend: Backend,
) -> None:
    """A holder that keeps renewing: the waiter polls, and the wait ends by its timeout."""
    holder = Lease(backend, holder_id="holder", ttl=30)
    holder.acquire("kept")
    waiter = Lease(backend, holder_id="waiter", ttl=30)
    start = monotonic()
    with pytest.raises(TimeoutError) as caught:
        waiter.acquire("kept", wait=True, timeout=0.4, poll_interval=0.1)
    assert isinstance(caught.value.__cause__, LeaseHeldError)
    assert caught.value.__cause__.holder_id in ("holder", None)
    assert 0.35 < monotonic() - start < 5.0
