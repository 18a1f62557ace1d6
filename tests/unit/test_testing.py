"""worklease.testing: FakeClock and RecordingObserver."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone

import pytest

from worklease import (
    AcquireEvent,
    CheckpointEvent,
    ConfigError,
    ExitMode,
    FencedError,
    FencedEvent,
    ForgetEvent,
    Lease,
    MemoryBackend,
    Operation,
    ReadCheckpointEvent,
    ReleaseEvent,
    RenewEvent,
    SweepEvent,
    Vacuum,
)
from worklease.testing import FakeClock, RecordingObserver

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

# -- FakeClock ------------------------------------------------------------------------------


def test_default_start_is_now_utc() -> None:
    before = datetime.now(UTC)
    clock = FakeClock()
    after = datetime.now(UTC)
    now = clock.now()
    assert before <= now <= after
    assert now.utcoffset() == timedelta(0)


def test_time_does_not_move_by_itself() -> None:
    clock = FakeClock(START)
    assert clock.now() == START
    assert clock.now() == START


def test_start_in_another_zone_is_converted_to_utc() -> None:
    clock = FakeClock(datetime(2026, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))))
    assert clock.now() == START
    assert clock.now().tzinfo is UTC


def test_naive_start_is_refused() -> None:
    with pytest.raises(ValueError):
        FakeClock(datetime(2026, 1, 1))


def test_non_datetime_start_is_refused() -> None:
    with pytest.raises(ConfigError):  # a builder: the argument-error rule
        FakeClock("2026-01-01T00:00:00Z")  # type: ignore[arg-type]


def test_advance_by_float_and_timedelta() -> None:
    clock = FakeClock(START)
    assert clock.advance(1.5) == START + timedelta(seconds=1.5)
    assert clock.advance(timedelta(minutes=1)) == START + timedelta(seconds=61.5)
    assert clock.advance(2) == START + timedelta(seconds=63.5)
    assert clock.advance(0) == START + timedelta(seconds=63.5)
    assert clock.advance(1e-6) == START + timedelta(seconds=63.5, microseconds=1)
    assert clock.now() == START + timedelta(seconds=63.5, microseconds=1)


@pytest.mark.parametrize("step", [-1, -0.001, timedelta(seconds=-1)])
def test_negative_advance_is_refused(step: float | timedelta) -> None:
    clock = FakeClock(START)
    with pytest.raises(ValueError):
        clock.advance(step)
    assert clock.now() == START


@pytest.mark.parametrize("step", [True, None, b"1"])
def test_non_duration_advance_is_refused(step: object) -> None:
    clock = FakeClock(START)
    with pytest.raises(TypeError):
        clock.advance(step)  # type: ignore[arg-type]
    assert clock.now() == START


def test_advance_takes_durations_as_strings() -> None:
    clock = FakeClock(START)
    assert clock.advance("1m30s") == START + timedelta(seconds=90)
    with pytest.raises(ValueError, match="seconds"):
        clock.advance("soon")
    assert clock.now() == START + timedelta(seconds=90)


def test_set_moves_either_way() -> None:
    clock = FakeClock(START)
    clock.set(START + timedelta(hours=1))
    assert clock.now() == START + timedelta(hours=1)
    clock.set(START - timedelta(days=1))
    assert clock.now() == START - timedelta(days=1)
    clock.set(datetime(2026, 1, 1, 7, 0, tzinfo=timezone(timedelta(hours=-5))))
    assert clock.now() == START
    assert clock.now().tzinfo is UTC


def test_set_naive_is_refused() -> None:
    clock = FakeClock(START)
    with pytest.raises(ValueError):
        clock.set(datetime(2030, 1, 1))
    assert clock.now() == START


def test_repr_shows_the_time() -> None:
    assert "2026-01-01T12:00:00" in repr(FakeClock(START))


def test_advance_is_thread_safe() -> None:
    clock = FakeClock(START)
    threads_count, steps = 8, 500
    barrier = threading.Barrier(threads_count)

    def run() -> None:
        barrier.wait()
        for _ in range(steps):
            clock.advance(0.001)
            clock.now()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    assert clock.now() == START + timedelta(milliseconds=threads_count * steps)


def test_memory_backend_follows_the_fake_clock() -> None:
    clock = FakeClock(START)
    backend = MemoryBackend(clock=clock)
    first = Lease(backend, holder_id="a", ttl=10)
    second = Lease(backend, holder_id="b", ttl=10)
    token = first.acquire("w1")
    assert token.expires_at == START + timedelta(seconds=10)
    clock.advance(10.001)
    taken = second.acquire("w1")
    assert taken.fencing_token > token.fencing_token
    assert second.read_checkpoint(taken).prev_exit is ExitMode.EXPIRED


# -- RecordingObserver ----------------------------------------------------------------------


def test_records_lease_events_in_order() -> None:
    clock = FakeClock(START)
    backend = MemoryBackend(clock=clock)
    observer = RecordingObserver()
    lease = Lease(backend, holder_id="a", ttl=10, observer=observer)
    token = lease.acquire("w1")
    lease.read_checkpoint(token)
    lease.checkpoint(token, b"abc")
    lease.renew(token)
    lease.release(token, ExitMode.FINISHED)
    again = lease.acquire("w1")
    lease.forget(again)
    assert observer.names() == [
        "AcquireEvent",
        "ReadCheckpointEvent",
        "CheckpointEvent",
        "RenewEvent",
        "ReleaseEvent",
        "AcquireEvent",
        "ForgetEvent",
    ]
    acquired = observer.of_type(AcquireEvent)
    assert [e.token for e in acquired] == [token, again]
    assert all(e.error is None and e.work_id == "w1" for e in acquired)
    (checkpointed,) = observer.of_type(CheckpointEvent)
    assert checkpointed.size == 3
    (renewed,) = observer.of_type(RenewEvent)
    assert renewed.attempt == 1
    (released,) = observer.of_type(ReleaseEvent)
    assert released.mode is ExitMode.FINISHED
    (read,) = observer.of_type(ReadCheckpointEvent)
    assert read.prev_exit is ExitMode.NONE
    assert len(observer.of_type(ForgetEvent)) == 1
    assert all(event.duration >= 0 for event in observer.of_type(AcquireEvent))


def test_records_fenced_after_the_operation_event() -> None:
    clock = FakeClock(START)
    backend = MemoryBackend(clock=clock)
    observer = RecordingObserver()
    old = Lease(backend, holder_id="a", ttl=1, observer=observer)
    new = Lease(backend, holder_id="b", ttl=1)
    token = old.acquire("w1")
    clock.advance(2)
    new.acquire("w1")
    observer.clear()
    assert observer.events == []
    with pytest.raises(FencedError):
        old.checkpoint(token, b"x")
    assert observer.names() == ["CheckpointEvent", "FencedEvent"]
    (fenced,) = observer.of_type(FencedEvent)
    assert fenced.operation is Operation.CHECKPOINT
    assert isinstance(fenced.error, FencedError)
    (failed,) = observer.of_type(CheckpointEvent)
    assert failed.error is fenced.error


def test_records_sweeps() -> None:
    clock = FakeClock(START)
    backend = MemoryBackend(clock=clock)
    observer = RecordingObserver()
    lease = Lease(backend, holder_id="a", ttl=1)
    lease.release(lease.acquire("w1"), ExitMode.RETIRED)
    clock.advance(100)
    assert Vacuum(backend, observer=observer).sweep(10) == 1
    (swept,) = observer.of_type(SweepEvent)
    assert (swept.retention, swept.include_expired, swept.deleted) == (10.0, False, 1)


def test_recording_is_thread_safe() -> None:
    observer = RecordingObserver()
    event = SweepEvent(1.0, False, 0, 0.0, None)

    def record() -> None:
        for _ in range(500):
            observer.on_sweep(event)

    threads = [threading.Thread(target=record) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(observer.events) == 4000
    assert len(observer.of_type(SweepEvent)) == 4000
