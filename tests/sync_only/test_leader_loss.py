"""A thread's term that raises Retire after its lease was lost: the loss wins."""

from __future__ import annotations

import time

import pytest

from worklease import Leader, Lease, LeaseLostError, MemoryBackend, Retire, Token, current_renewal
from worklease.testing import FakeClock


def test_leader_raises_the_loss_not_retire_when_the_lease_was_lost() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock)
    lease = Lease(backend, holder_id="leader-a", ttl=30)
    rival = Lease(backend, holder_id="leader-b", ttl=30)

    def term(token: Token) -> None:
        clock.advance(60)
        rival.acquire("singleton")
        renewal = current_renewal()
        assert renewal is not None
        deadline = time.monotonic() + 10
        while not renewal.lost and time.monotonic() < deadline:
            time.sleep(0.01)
        assert renewal.lost
        raise Retire()  # "done for good", but nothing can be recorded any more

    leader = Leader(lease, "singleton", backoff_interval=0.01, renewal_interval=0.05)
    with pytest.raises(LeaseLostError) as caught:
        leader.run(term)
    assert isinstance(caught.value.__cause__, Retire)
