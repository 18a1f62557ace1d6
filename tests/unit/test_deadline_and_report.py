"""The call deadline's context and the lease reporter's quiet path (shared by both flavours)."""

from __future__ import annotations

from unittest import mock

import pytest

from worklease import ExitMode, FencedError, Lease, LeaseObserver, MemoryBackend
from worklease._deadline import bounded_by, current_deadline, seconds_left
from worklease._report import LeaseReporter
from worklease.observers import (
    AcquireEvent,
    CheckpointEvent,
    ReadCheckpointEvent,
    ReleaseEvent,
)


def test_a_deadline_holds_inside_its_block_only() -> None:
    assert seconds_left() is None
    with bounded_by(1e12):
        left = seconds_left()
        assert left is not None
        assert left > 0
    assert seconds_left() is None


def test_no_deadline_inside_a_deadline_unbounds_the_inner_block() -> None:
    with bounded_by(1e12):
        with bounded_by(None):
            assert seconds_left() is None
        left = seconds_left()
        assert left is not None
        assert left > 1e11
    assert seconds_left() is None


def test_nested_deadlines_restore_the_outer_one() -> None:
    with bounded_by(1e12):
        with bounded_by(1e6):
            left = seconds_left()
            assert left is not None
            assert left < 1e7
        left = seconds_left()
        assert left is not None
        assert left > 1e11


def test_the_deadline_is_restored_when_the_block_raises() -> None:
    try:
        with bounded_by(1e12):
            raise KeyError("boom")
    except KeyError:
        pass
    assert seconds_left() is None


def test_one_bound_guards_one_block() -> None:
    bound = bounded_by(1e12)
    with bound, pytest.raises(RuntimeError, match="one block"):
        bound.__enter__()
    assert seconds_left() is None


def test_a_block_whose_deadline_is_already_in_force_shares_one_object_and_sets_nothing() -> None:
    assert bounded_by(None) is bounded_by(None)  # none inside none
    with bounded_by(1e12):
        same = bounded_by(1e12)
        assert same is bounded_by(1e12)
        with same:
            assert current_deadline() == 1e12
        assert current_deadline() == 1e12  # leaving it restored nothing it had not set
        other = bounded_by(1e6)
        assert other is not bounded_by(1e6)  # a change gets an object of its own
        with other:
            assert current_deadline() == 1e6
        assert current_deadline() == 1e12
    assert current_deadline() is None


def test_a_write_nobody_listens_to_gives_its_start_and_builds_no_report() -> None:
    reporter = LeaseReporter(LeaseObserver())
    lease = Lease(MemoryBackend(), holder_id="h", ttl=30)
    token = lease.acquire("quiet write")
    with reporter.checkpoint(token, b"abc") as start:
        assert isinstance(start, float)
    assert reporter.checkpoint(token, b"abc") is reporter.release(token, ExitMode.FINISHED)
    with pytest.raises(KeyError), reporter.release(token, ExitMode.FINISHED):
        raise KeyError("not swallowed")


def test_an_observer_hears_the_size_of_a_checkpoint_and_a_checkpoint_read() -> None:
    heard: list[object] = []

    class Writes(LeaseObserver):
        def on_checkpoint(self, event: CheckpointEvent) -> None:
            heard.append(event)

        def on_read_checkpoint(self, event: ReadCheckpointEvent) -> None:
            heard.append(event)

    lease = Lease(MemoryBackend(), holder_id="h", ttl=30, observer=Writes())
    token = lease.acquire("sizes")
    lease.checkpoint(token, memoryview(b"12345"))
    lease.read_checkpoint(token)
    written, read = heard
    assert isinstance(written, CheckpointEvent)
    assert written.size == 5
    assert written.error is None
    assert isinstance(read, ReadCheckpointEvent)
    assert read.size == 5


def test_an_observer_method_patched_on_the_class_is_heard() -> None:
    lease = Lease(MemoryBackend(), holder_id="h", ttl=30)  # the default observer
    with (
        mock.patch.object(LeaseObserver, "on_acquire") as on_acquire,
        mock.patch.object(LeaseObserver, "on_fenced") as on_fenced,
    ):
        token = lease.acquire("patched")
        lease.forget(token)
        with pytest.raises(FencedError):
            lease.checkpoint(token, b"late")
    assert on_acquire.call_count == 1
    assert on_fenced.call_count == 1
    lease.release(lease.acquire("quiet again"), ExitMode.FINISHED)  # unpatched: no error


def test_a_plain_observer_patched_after_the_lease_was_built_hears_every_call() -> None:
    """The default observer builds no events; one whose methods are set on the instance
    (after the lease exists) is heard all the same."""
    observer = LeaseObserver()
    lease = Lease(MemoryBackend(), holder_id="h", ttl=30, observer=observer)
    lease.release(lease.acquire("quiet"), ExitMode.FINISHED)  # nobody listens: no error
    heard: list[object] = []
    observer.on_acquire = heard.append  # type: ignore[method-assign,assignment]
    observer.on_release = heard.append  # type: ignore[method-assign,assignment]
    token = lease.acquire("loud")
    lease.release(token, ExitMode.FINISHED)
    assert [type(event) for event in heard] == [AcquireEvent, ReleaseEvent]
    acquired = heard[0]
    assert isinstance(acquired, AcquireEvent)
    assert acquired.token == token


def test_a_subclassed_observer_hears_its_events() -> None:
    heard: list[ReleaseEvent] = []

    class Releases(LeaseObserver):
        def on_release(self, event: ReleaseEvent) -> None:
            heard.append(event)

    lease = Lease(MemoryBackend(), holder_id="h", ttl=30, observer=Releases())
    lease.release(lease.acquire("w"), ExitMode.RETIRED)
    assert [event.mode for event in heard] == [ExitMode.RETIRED]
