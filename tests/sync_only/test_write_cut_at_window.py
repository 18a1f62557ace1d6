"""A thread's checkpoint is bounded by its lease window: one still failing when the window has
closed reports the loss, not the transient failure that showed it (a holder paused past its
window, as in the zombie fault test, then resumed with a write cut off at the window's end)."""

from __future__ import annotations

import pytest

from worklease import BackendError, Lease, LeaseWindowExhaustedError
from worklease._window import Backoff

from .._sync.helpers import ScriptedBackend, transient


def test_a_checkpoint_failing_after_the_window_closed_raises_the_loss() -> None:
    backend = ScriptedBackend()
    lease = Lease(backend, holder_id="holder", ttl=0.3)
    token = lease.acquire("w1")
    backend.fail_always("renew")  # the window closes 0.3 s in
    backend.delay("checkpoint", 0.6)
    cut = transient("cancelled at the bound of its call (injected)")
    backend.fail("checkpoint", cut)
    with (
        pytest.raises(LeaseWindowExhaustedError),  # leaving the block raises the loss too
        lease.renewal(token, interval=0.02, backoff=Backoff(0.001, 0.005, 0.0)) as renewal,
        pytest.raises(LeaseWindowExhaustedError) as caught,
    ):
        lease.checkpoint(token, b"late")
    assert caught.value.__cause__ is cut
    assert isinstance(renewal.cause, LeaseWindowExhaustedError)


def test_a_transient_failure_inside_the_window_stays_transient() -> None:
    backend = ScriptedBackend()
    lease = Lease(backend, holder_id="holder", ttl=30)
    token = lease.acquire("w1")
    cut = transient()
    backend.fail("checkpoint", cut)
    with lease.renewal(token, interval=10):
        with pytest.raises(BackendError) as caught:
            lease.checkpoint(token, b"soon")
        assert caught.value is cut
        lease.checkpoint(token, b"again")  # the lease is still held
