# Generated from tests/_async/test_release_watch.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Release watches: the hub and its watches, and the memory backend waking waiters at once.

The PostgreSQL listener is covered in ``test_postgres_listen.py``. Upper time bounds are
generous (a few seconds against poll and idle intervals of 30 s): they tell a wake-up at the
release from one at the next poll, not how fast it is.
"""

from __future__ import annotations

from time import monotonic
from typing import Any

import pytest

from tests._compat import sleep, spawn_all
from worklease import (
    ExitMode,
    FencedError,
    Leader,
    Lease,
    MemoryBackend,
    Token,
)
from worklease._sync.watch import ReleaseWatch

from .helpers import handed_over

LONG = 30.0
"""A poll or idle interval no test may sit out."""
PROMPT = 5.0
"""Upper bound for a wake-up that should come at the release."""


def watching(memory: MemoryBackend, work_ids: Any) -> ReleaseWatch:
    watch = memory.watch_releases(work_ids)
    assert watch is not None  # an open memory backend always watches
    return watch


@pytest.fixture
def memory() -> Any:
    with MemoryBackend() as backend:
        yield backend


def test_a_release_published_before_wait_is_reported_once(
    memory: MemoryBackend,
) -> None:
    hub = memory._hub
    with watching(memory, ["a", "b"]) as watch:
        hub.publish("b")
        assert watch.wait(LONG) is True  # already there: no waiting
        assert watch.wait(0.05) is False  # consumed by the previous wait


def test_other_work_ids_do_not_wake_a_watch(memory: MemoryBackend) -> None:
    with watching(memory, ["a"]) as watch:
        memory._hub.publish("c")
        memory._hub.publish("A")
        assert watch.wait(0.1) is False


def test_a_publish_wakes_a_pending_wait_and_every_watch_on_the_id(
    memory: MemoryBackend,
) -> None:
    first = watching(memory, ["a", "x"])
    second = watching(memory, ["y", "a"])
    outcomes: list[tuple[bool, float]] = []

    def step(index: int) -> None:
        if index < 2:
            start = monotonic()
            woke = (first, second)[index].wait(LONG)
            outcomes.append((woke, monotonic() - start))
        else:
            sleep(0.2)
            memory._hub.publish("a")

    assert spawn_all(step, 3) == [None, None, None]
    assert [woke for woke, _ in outcomes] == [True, True]
    assert all(elapsed < PROMPT for _, elapsed in outcomes)
    first.close()
    second.close()


def test_close_unregisters_and_is_idempotent(memory: MemoryBackend) -> None:
    hub = memory._hub
    watch = watching(memory, ["a", "b", "a"])
    other = watching(memory, ["b"])
    assert watch.work_ids == ("a", "b")
    assert hub.watched() == 2
    watch.close()
    watch.close()
    assert watch.closed
    assert hub.watched() == 1  # "b" is still watched by the other watch
    hub.publish("a")
    start = monotonic()
    assert watch.wait(LONG) is False  # closed: returns at once, no release reported
    assert monotonic() - start < PROMPT
    with other:
        pass
    assert other.closed
    assert hub.watched() == 0


def test_close_ends_a_pending_wait(memory: MemoryBackend) -> None:
    watch = watching(memory, ["a"])
    outcomes: list[tuple[bool, float]] = []

    def step(index: int) -> None:
        if index == 0:
            start = monotonic()
            outcomes.append((watch.wait(LONG), monotonic() - start))
        else:
            sleep(0.2)
            watch.close()

    assert spawn_all(step, 2) == [None, None]
    ((woke, elapsed),) = outcomes
    assert woke is False
    assert elapsed < PROMPT


def test_one_string_is_refused(memory: MemoryBackend) -> None:
    with pytest.raises(TypeError):
        watching(memory, "abc")


def test_a_watch_on_ten_thousand_work_ids(memory: MemoryBackend) -> None:
    ids = [f"job-{i:05d}" for i in range(10_000)]
    with watching(memory, ids) as watch:
        assert memory._hub.watched() == 10_000
        memory._hub.publish("job-07777")
        assert watch.wait(LONG) is True
    assert memory._hub.watched() == 0


# -- the memory backend -------------------------------------------------------------------------


def test_release_and_forget_publish_only_when_they_happen(
    memory: MemoryBackend,
) -> None:
    """A watch opened before a release still reports it when ``wait`` comes later; a refused
    release or forget reports nothing."""
    lease = Lease(memory, holder_id="a", ttl=LONG)
    stale = lease.acquire("job")
    lease.release(stale, ExitMode.FINISHED)
    token = lease.acquire("job")
    with watching(memory, ["job"]) as watch:
        with pytest.raises(FencedError):
            memory.release(stale, ExitMode.FINISHED)
        with pytest.raises(FencedError):
            memory.forget(stale)
        assert watch.wait(0.1) is False
        lease.release(token, ExitMode.FINISHED)
        assert watch.wait(LONG) is True
        again = lease.acquire("job")
        lease.forget(again)
        assert watch.wait(LONG) is True


@pytest.mark.parametrize("release", ["release", "forget"])
def test_a_waiting_acquire_wakes_at_the_release(memory: MemoryBackend, release: str) -> None:
    token, after = handed_over(memory, memory, release)
    assert token.holder_id == "waiter"
    assert after < PROMPT  # not the 30 s poll interval


def test_a_leader_waiting_out_another_term_takes_over_at_the_release(
    memory: MemoryBackend,
) -> None:
    rival = Lease(memory, holder_id="rival", ttl=LONG)
    rival_token = rival.acquire("lead")
    lease = Lease(memory, holder_id="leader", ttl=LONG)
    leader = Leader(lease, "lead", idle_interval=LONG, backoff_interval=LONG)
    elected: list[float] = []
    released: list[float] = []

    def fn(token: Token) -> None:
        elected.append(monotonic())
        leader.stop()

    def step(index: int) -> None:
        if index == 0:
            leader.run_forever(fn)
        else:
            sleep(0.3)  # the leader is waiting out the rival's term by now
            rival.release(rival_token, ExitMode.FINISHED)
            released.append(monotonic())
            deadline = monotonic() + LONG / 2
            while not elected and monotonic() < deadline:
                sleep(0.02)
            leader.stop()  # a watchdog: the test fails below if it had to stop it

    assert spawn_all(step, 2) == [None, None]
    assert len(elected) == 1
    assert elected[0] - released[0] < PROMPT


def test_a_leader_with_acquire_wait_takes_over_at_the_release(
    memory: MemoryBackend,
) -> None:
    rival = Lease(memory, holder_id="rival", ttl=LONG)
    rival_token = rival.acquire("lead")
    lease = Lease(memory, holder_id="leader", ttl=LONG)
    leader = Leader(lease, "lead", acquire_wait=True, poll_interval=LONG, backoff_interval=0.01)
    elected: list[float] = []
    released: list[float] = []

    def step(index: int) -> None:
        if index == 0:
            leader.run(lambda token: elected.append(monotonic()))
        else:
            sleep(0.3)
            rival.release(rival_token, ExitMode.FINISHED)
            released.append(monotonic())

    assert spawn_all(step, 2) == [None, None]
    assert len(elected) == 1
    assert elected[0] - released[0] < PROMPT
