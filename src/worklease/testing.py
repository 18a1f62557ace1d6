"""Helpers for testing code that uses worklease.

``FakeClock`` drives the in-memory backend's notion of time, so expiry can be tested without
sleeping. ``RecordingObserver`` keeps every lease event in order.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from ._validation import Duration, to_seconds
from .errors import ConfigError
from .observers import (
    AcquireEvent,
    CheckpointEvent,
    FencedEvent,
    ForgetEvent,
    LeaseObserver,
    ReadCheckpointEvent,
    ReleaseEvent,
    RenewEvent,
    SweepEvent,
    VacuumObserver,
)

__all__ = ["FakeClock", "RecordingObserver"]

E = TypeVar("E")

LeaseEvent = (
    AcquireEvent
    | CheckpointEvent
    | RenewEvent
    | ReleaseEvent
    | ReadCheckpointEvent
    | ForgetEvent
    | FencedEvent
    | SweepEvent
)


class FakeClock:
    """A clock that moves only when told to. Thread-safe.

    Starts at ``start`` (a timezone-aware datetime) or at the current UTC time, and moves
    only through :meth:`advance` and :meth:`set`. Pass it to the in-memory backend as
    ``clock=``.

    Renewals track the lease window on the real monotonic clock (the acquire call's start plus
    the TTL), so the fake clock only decides what the backend sees: expire a lease by
    advancing the clock past its TTL after acquiring.
    """

    def __init__(self, start: datetime | None = None) -> None:
        if start is None:
            start = datetime.now(UTC)
        self._lock = threading.Lock()
        try:
            self._now = _aware(start)
        except (TypeError, ValueError) as exc:  # a builder: the argument-error rule
            raise ConfigError(str(exc)) from None

    def now(self) -> datetime:
        """The current fake time (UTC)."""
        with self._lock:
            return self._now

    def advance(self, seconds: Duration) -> datetime:
        """Move forward by ``seconds`` (or a ``timedelta``); returns the new time.

        Moving backwards is refused: real clocks used by backends never do that either.
        """
        step = to_seconds(seconds, "seconds")
        if step < 0:
            raise ValueError("FakeClock.advance needs a non-negative step; use set() to go back")
        with self._lock:
            self._now += timedelta(seconds=step)
            return self._now

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (timezone-aware; any direction)."""
        with self._lock:
            self._now = _aware(when)

    def __repr__(self) -> str:
        return f"FakeClock({self.now().isoformat()})"


def _aware(value: datetime) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"expected a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("FakeClock needs a timezone-aware datetime")
    return value.astimezone(UTC)


class RecordingObserver(LeaseObserver, VacuumObserver):
    """Records every lease and vacuum event, in order, in :attr:`events`. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[LeaseEvent] = []

    def _record(self, event: LeaseEvent) -> None:
        with self._lock:
            self.events.append(event)

    def of_type(self, kind: type[E]) -> list[E]:
        """The recorded events of one type."""
        with self._lock:
            return [event for event in self.events if isinstance(event, kind)]

    def names(self) -> list[str]:
        """The recorded events' class names, in order (handy for asserting sequences)."""
        with self._lock:
            return [type(event).__name__ for event in self.events]

    def clear(self) -> None:
        with self._lock:
            self.events.clear()

    def on_acquire(self, event: AcquireEvent) -> None:
        self._record(event)

    def on_checkpoint(self, event: CheckpointEvent) -> None:
        self._record(event)

    def on_renew(self, event: RenewEvent) -> None:
        self._record(event)

    def on_release(self, event: ReleaseEvent) -> None:
        self._record(event)

    def on_read_checkpoint(self, event: ReadCheckpointEvent) -> None:
        self._record(event)

    def on_forget(self, event: ForgetEvent) -> None:
        self._record(event)

    def on_fenced(self, event: FencedEvent) -> None:
        self._record(event)

    def on_sweep(self, event: SweepEvent) -> None:
        self._record(event)
