# Generated from tests/_async/test_wait.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""A waiting acquire wakes at the holder's expiry instead of a whole poll interval later."""

from __future__ import annotations

from time import monotonic

import pytest

from worklease import AcquireEvent, Backend, ExitMode, Lease, LeaseHeldError
from worklease.testing import RecordingObserver


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


class _TimedAttempts(RecordingObserver):
    """Records the lease's events, and when each acquire attempt ended."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []

    def on_acquire(self, event: AcquireEvent) -> None:
        self.ends.append(monotonic())
        super().on_acquire(event)

    def pauses(self) -> list[float]:
        """How long the lease waited between one attempt's end and the next one's start."""
        attempts = self.of_type(AcquireEvent)
        starts = [end - event.duration for end, event in zip(self.ends, attempts, strict=True)]
        return [start - end for end, start in zip(self.ends[:-1], starts[1:], strict=True)]


def test_waiter_falls_back_to_the_poll_interval_when_the_expiry_does_not_come(
    backend: Backend,
) -> None:
    """A holder that keeps renewing: the waiter polls, and the wait ends by its timeout."""
    holder = Lease(backend, holder_id="holder", ttl=30)
    holder.acquire("kept")
    attempts = _TimedAttempts()
    waiter = Lease(backend, holder_id="waiter", ttl=30, observer=attempts)
    start = monotonic()
    with pytest.raises(TimeoutError) as caught:
        waiter.acquire("kept", wait=True, timeout=2.0, poll_interval=0.1)
    assert 1.95 < monotonic() - start < 15.0
    events = attempts.of_type(AcquireEvent)
    errors = [event.error for event in events]
    # It polled every 0.1 s: never a pause anywhere near the timeout (a waiter that slept
    # until the timeout, woken at most once when it starts listening for releases, would
    # pause at least 1 s once)...
    assert len(errors) >= 3, errors
    assert max(attempts.pauses()) < 0.75, attempts.pauses()
    # ...each refused because the lease is held, but perhaps the last: it may still have
    # been running when the timeout came, and ended by it (how depends on the backend).
    assert all(isinstance(error, LeaseHeldError) for error in errors[:-1]), errors
    held = [error for error in errors if isinstance(error, LeaseHeldError)]
    assert all(error.holder_id in ("holder", None) for error in held), held
    # The wait ended with that last attempt: its outcome is the timeout's cause.
    assert caught.value.__cause__ is errors[-1]
    assert all(event.token is None for event in events)
