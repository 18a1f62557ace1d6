"""Observer base classes and their event dataclasses, shared by both flavours.

Observers are called synchronously, right after the operation they report, from whatever task
or thread performed it (the renewal task or thread for background renewals). Keep them fast
and thread-safe: a slow observer slows the lease and can eat into the renewal window. An
exception raised by an observer is logged to the ``worklease`` logger and otherwise ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ._models import ExitMode, Operation, Token

__all__ = [
    "AcquireEvent",
    "BalanceEvent",
    "CheckpointEvent",
    "FencedEvent",
    "ForgetEvent",
    "LeaseObserver",
    "PoolObserver",
    "ReadCheckpointEvent",
    "ReleaseEvent",
    "RenewEvent",
    "SlotAcquiredEvent",
    "ScanEvent",
    "SlotBackoffEvent",
    "SlotDeadEvent",
    "SlotLostEvent",
    "SlotRetiredEvent",
    "SlotShedEvent",
    "SweepEvent",
    "VacuumObserver",
]

logger = logging.getLogger("worklease")


@dataclass(frozen=True, slots=True)
class AcquireEvent:
    """One backend acquire attempt (each poll of a waiting acquire is one event)."""

    __module__ = "worklease"

    work_id: str
    token: Token | None
    duration: float
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class CheckpointEvent:
    """One checkpoint write; ``size`` is the length of the state passed in."""

    __module__ = "worklease"

    token: Token
    size: int
    duration: float
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class RenewEvent:
    """One renewal attempt; ``attempt`` counts retries within a renewal cycle from 1."""

    __module__ = "worklease"

    token: Token
    attempt: int
    duration: float
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class ReleaseEvent:
    """One release that reached the backend."""

    __module__ = "worklease"

    token: Token
    mode: ExitMode
    duration: float
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class ReadCheckpointEvent:
    """One checkpoint read; the prior fields are zeroed (NONE, None, 0) when it failed."""

    __module__ = "worklease"

    token: Token
    prev_exit: ExitMode
    prev_holder_id: str | None
    size: int
    duration: float
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class ForgetEvent:
    """One forget (row deletion)."""

    __module__ = "worklease"

    token: Token
    duration: float
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class FencedEvent:
    """A write was rejected because the token was superseded or its row is gone.

    Reported in addition to, and after, the event of the operation itself.
    """

    __module__ = "worklease"

    token: Token
    operation: Operation
    error: BaseException


@dataclass(frozen=True, slots=True)
class SweepEvent:
    """One vacuum sweep that reached the backend."""

    __module__ = "worklease"

    retention: float
    include_expired: bool
    deleted: int
    duration: float
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class SlotAcquiredEvent:
    """A pool slot acquired its work ID and is about to run the work function."""

    __module__ = "worklease"

    work_id: str
    token: Token


@dataclass(frozen=True, slots=True)
class SlotLostEvent:
    """A pool slot lost its lease to fencing; it tries to re-acquire at once."""

    __module__ = "worklease"

    work_id: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class SlotBackoffEvent:
    """A pool slot failed and waits ``delay`` seconds before trying again."""

    __module__ = "worklease"

    work_id: str
    error: BaseException
    delay: float


@dataclass(frozen=True, slots=True)
class ScanEvent:
    """A pool looked for free work IDs among ``candidates`` (those it neither holds nor has
    retired or given up) and acquired ``acquired`` of them; ``error`` when the scan failed
    (the pool then waits ``backoff_interval``)."""

    __module__ = "worklease"

    candidates: int
    acquired: tuple[str, ...]
    duration: float
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class BalanceEvent:
    """One fair-share scan of a pool: the live ``members`` of its group (itself included),
    its ``target`` and the work IDs it ``held`` before the scan, the free ones it ``took`` and
    those it began to ``shed``, and how many are ``uncovered`` because every member is at its
    ``max_work_ids``."""

    __module__ = "worklease"

    group: str
    members: int
    target: int
    held: int
    took: tuple[str, ...]
    shed: tuple[str, ...]
    uncovered: int


@dataclass(frozen=True, slots=True)
class SlotShedEvent:
    """A pool slot is handing its work ID to another member (fair share): its work is told
    to stop, its final checkpoint written and the lease released ABANDONED."""

    __module__ = "worklease"

    work_id: str


@dataclass(frozen=True, slots=True)
class SlotDeadEvent:
    """A pool slot failed permanently and stopped."""

    __module__ = "worklease"

    work_id: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class SlotRetiredEvent:
    """A pool slot retired its work ID and stopped."""

    __module__ = "worklease"

    work_id: str


class LeaseObserver:
    """Receives one event after every lease operation. Every method does nothing by default.

    Subclass it and override what you need; later releases may add methods, which will do
    nothing here too.
    """

    __module__ = "worklease"

    def on_acquire(self, event: AcquireEvent) -> None:
        """After every backend acquire attempt."""

    def on_checkpoint(self, event: CheckpointEvent) -> None:
        """After every checkpoint."""

    def on_renew(self, event: RenewEvent) -> None:
        """After every renewal attempt, direct or from a background renewal."""

    def on_release(self, event: ReleaseEvent) -> None:
        """After every release that reached the backend (never for an invalid mode)."""

    def on_read_checkpoint(self, event: ReadCheckpointEvent) -> None:
        """After every checkpoint read."""

    def on_forget(self, event: ForgetEvent) -> None:
        """After every forget."""

    def on_fenced(self, event: FencedEvent) -> None:
        """In addition, after a checkpoint, renew, release or forget was fenced."""


class VacuumObserver:
    """Receives one event per sweep that reached the backend. Methods do nothing by default."""

    __module__ = "worklease"

    def on_sweep(self, event: SweepEvent) -> None:
        """After every sweep that reached the backend."""


class PoolObserver:
    """Receives pool slot lifecycle events. Every method does nothing by default."""

    __module__ = "worklease"

    def on_slot_acquired(self, event: SlotAcquiredEvent) -> None:
        """A slot acquired its work ID and enters the work function."""

    def on_slot_lost(self, event: SlotLostEvent) -> None:
        """A slot was fenced."""

    def on_slot_backoff(self, event: SlotBackoffEvent) -> None:
        """A slot failed and backs off before its next attempt."""

    def on_slot_dead(self, event: SlotDeadEvent) -> None:
        """A slot failed permanently."""

    def on_slot_retired(self, event: SlotRetiredEvent) -> None:
        """A slot retired its work ID."""

    def on_scan(self, event: ScanEvent) -> None:
        """The pool scanned for free work IDs (once per idle interval, or on a release)."""

    def on_balance(self, event: BalanceEvent) -> None:
        """A fair-share scan computed this member's target and moves (after ``on_scan``)."""

    def on_slot_shed(self, event: SlotShedEvent) -> None:
        """A slot began handing its work ID to another member."""


_E = TypeVar("_E")


def notify(callback: Callable[[_E], None], event: _E) -> None:
    """Call an observer method, logging (never raising) anything it raises."""
    try:
        callback(event)
    except Exception:
        logger.exception("worklease observer %s raised; the event was dropped", callback)
