"""A grant that arrives after its waiting acquire gave up, in the sync flavour.

A thread cannot abandon a blocking call: the attempt runs on in a helper thread, and when it
grants after all, the lease hands the grant back at once, keeping what the holder before
declared (issue 11). With asyncio the call is cancelled instead (tests/_async).
"""

from __future__ import annotations

import threading
import time

import pytest

from tests._sync.helpers import ScriptedBackend
from worklease import ExitMode, Lease
from worklease._compat import _CleanupHelpers, _CleanupJob


def test_a_late_grant_is_handed_back_keeping_the_declared_exit() -> None:
    """The previous holder retired the work ID; a waiting acquire's call commits its grant but
    answers after the deadline: the grant is released again as RETIRED (a retired work ID
    stays retired), with the checkpoint kept, long before its TTL."""
    backend = ScriptedBackend()
    first = Lease(backend, holder_id="first", ttl=60)
    token = first.acquire("job")
    first.checkpoint(token, b"all done")
    first.release(token, ExitMode.RETIRED)
    backend.delay_after("acquire", 1.0)  # the grant is stored, its answer comes late
    late = Lease(backend, holder_id="late", ttl=60)
    with pytest.raises(TimeoutError):
        late.acquire("job", wait=True, timeout=0.2)
    rival = Lease(backend, holder_id="rival", ttl=60)
    successor = rival.acquire("job", wait=True, timeout=10, poll_interval=0.05)
    prior = rival.read_checkpoint(successor)
    assert prior.prev_exit is ExitMode.RETIRED
    assert prior.state == b"all done"
    assert prior.prev_holder_id == "late"  # the late grant did happen


def test_two_quick_jobs_never_share_one_idle_helper() -> None:
    """A slow job and a quick one submitted back to back while one helper thread is idle:
    the quick one runs at once on a thread of its own instead of queueing behind the slow one
    (a waiting acquire's attempt must never wait for another call)."""
    helpers = _CleanupHelpers()
    warm = _CleanupJob(lambda: None, ())
    helpers.submit(warm)
    assert warm.done.wait(5)
    time.sleep(0.05)  # the helper is idle now
    gate = threading.Event()
    slow = _CleanupJob(gate.wait, (30,))
    quick = _CleanupJob(lambda: "quick", ())
    try:
        for _ in range(20):  # each round: the race the fix closes
            helpers.submit(slow)
            helpers.submit(quick)
            assert quick.done.wait(5), "the quick job queued behind the slow one"
            assert quick.result == "quick"
            gate.set()
            assert slow.done.wait(5)
            gate.clear()
            slow = _CleanupJob(gate.wait, (30,))
            quick = _CleanupJob(lambda: "quick", ())
            time.sleep(0.01)
    finally:
        gate.set()
