"""What the contrib observers share: outcome labels and the held-lease bookkeeping."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from .._compat import ThreadLock
from .._models import Token
from ..errors import FencedError, LeaseExpiredError, LeaseHeldError, LeaseLostError
from ..observers import (
    AcquireEvent,
    CheckpointEvent,
    FencedEvent,
    ForgetEvent,
    LeaseObserver,
    PoolObserver,
    ReadCheckpointEvent,
    ReleaseEvent,
    RenewEvent,
    ScanEvent,
    SlotAcquiredEvent,
    SlotBackoffEvent,
    SlotDeadEvent,
    SlotLostEvent,
    SlotRetiredEvent,
    SlotShedEvent,
    SweepEvent,
    VacuumObserver,
)

__all__ = [
    "DURATION_BUCKETS",
    "FENCEABLE",
    "OPERATIONS",
    "OUTCOMES",
    "RENEWAL_OUTCOMES",
    "SLOT_EVENTS",
    "HeldLeases",
    "MetricsObserver",
    "outcome",
]

ACQUIRE: Final = "acquire"
CHECKPOINT: Final = "checkpoint"
RENEW: Final = "renew"
RELEASE: Final = "release"
READ_CHECKPOINT: Final = "read_checkpoint"
FORGET: Final = "forget"
SWEEP: Final = "sweep"
SCAN: Final = "scan"

OPERATIONS: Final = (ACQUIRE, CHECKPOINT, RENEW, RELEASE, READ_CHECKPOINT, FORGET, SWEEP, SCAN)
"""Every value of the ``operation`` label."""

FENCEABLE: Final = (CHECKPOINT, RENEW, RELEASE, FORGET)
"""The operations a ``FencedEvent`` can report (``worklease.Operation``)."""

OUTCOMES: Final = ("ok", "held", "fenced", "expired", "error")
"""Every value of the ``outcome`` label."""

RENEWAL_OUTCOMES: Final = ("ok", "fenced", "expired", "error")
"""The outcomes a renewal attempt can have."""

SLOT_EVENTS: Final = ("acquired", "lost", "backoff", "dead", "retired", "shed")
"""Every value of the pool ``event`` label."""

DURATION_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Histogram bucket bounds in seconds, suited to database round trips."""


def outcome(error: BaseException | None) -> str:
    """The outcome label of an event's ``error``: ok, held, fenced, expired or error."""
    if error is None:
        return "ok"
    if isinstance(error, LeaseHeldError):
        return "held"
    if isinstance(error, FencedError):
        return "fenced"
    if isinstance(error, LeaseExpiredError):
        return "expired"
    return "error"


_Key = tuple[str, str, int]


class HeldLeases:
    """The tokens this process acquired and has not yet given up or lost. Thread-safe.

    Keyed by (work ID, holder ID, fencing token), so a token is counted at most once and
    removed at most once, whichever event reports its end first. ``on_change(+1 / -1)`` is
    called under the lock, so a gauge fed by it never dips below zero, even for a moment.
    """

    def __init__(self, on_change: Callable[[int], None]) -> None:
        self._on_change = on_change
        self._lock = ThreadLock()
        self._keys: set[_Key] = set()

    def add(self, token: Token) -> bool:
        """Count ``token``; False when it was counted already."""
        key = (token.work_id, token.holder_id, token.fencing_token)
        with self._lock:
            if key in self._keys:
                return False
            self._keys.add(key)
            self._on_change(1)
            return True

    def discard(self, token: Token) -> bool:
        """Stop counting ``token``; False when it was not counted."""
        return self._discard((token.work_id, token.holder_id, token.fencing_token))

    def discard_lost(self, error: BaseException) -> bool:
        """Stop counting the token named by a ``LeaseLostError`` in ``error``'s chain."""
        lost = _lost_in_chain(error)
        if lost is None or lost.work_id is None or lost.holder_id is None:
            return False
        if lost.fencing_token is None:
            return False
        return self._discard((lost.work_id, lost.holder_id, lost.fencing_token))

    def _discard(self, key: _Key) -> bool:
        with self._lock:
            if key not in self._keys:
                return False
            self._keys.remove(key)
            self._on_change(-1)
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)


def _lost_in_chain(error: BaseException) -> LeaseLostError | None:
    """The first ``LeaseLostError`` in ``error`` and its causes / contexts."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, LeaseLostError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class MetricsObserver(LeaseObserver, VacuumObserver, PoolObserver):
    """Turns every event into a few metric updates; subclasses say how each is recorded.

    The held-lease count goes up on a successful acquire and down, once per token, when the
    holder releases or forgets it (whatever the outcome: either way it stops renewing), when a
    write or read is fenced or finds the lease lapsed, when reading the checkpoint fails (a
    hold then lets the lease lapse), and when a pool slot reports the loss of its lease.
    """

    def __init__(self) -> None:
        self._held = HeldLeases(self._record_held)

    # -- what subclasses record ---------------------------------------------------------------

    def _record_operation(
        self, operation: str, result: str, duration: float, error: BaseException | None
    ) -> None:
        raise NotImplementedError

    def _record_fenced(self, operation: str) -> None:
        raise NotImplementedError

    def _record_held(self, delta: int) -> None:
        raise NotImplementedError

    def _record_renewal(self, result: str, attempt: int, error: BaseException | None) -> None:
        raise NotImplementedError

    def _record_slot(self, event: str) -> None:
        raise NotImplementedError

    def _record_rows_deleted(self, deleted: int) -> None:
        raise NotImplementedError

    # -- held-lease bookkeeping ---------------------------------------------------------------

    @property
    def leases_held(self) -> int:
        """How many leases this observer currently counts as held by this process."""
        return len(self._held)

    def _gained(self, token: Token) -> None:
        self._held.add(token)

    def _gone(self, token: Token) -> None:
        self._held.discard(token)

    def _gone_by(self, error: BaseException) -> None:
        self._held.discard_lost(error)

    # -- LeaseObserver ------------------------------------------------------------------------

    def on_acquire(self, event: AcquireEvent) -> None:
        self._record_operation(ACQUIRE, outcome(event.error), event.duration, event.error)
        if event.error is None and event.token is not None:
            self._gained(event.token)

    def on_read_checkpoint(self, event: ReadCheckpointEvent) -> None:
        self._record_operation(READ_CHECKPOINT, outcome(event.error), event.duration, event.error)
        if event.error is not None:
            self._gone(event.token)

    def on_checkpoint(self, event: CheckpointEvent) -> None:
        result = outcome(event.error)
        self._record_operation(CHECKPOINT, result, event.duration, event.error)
        if result in ("fenced", "expired"):
            self._gone(event.token)

    def on_renew(self, event: RenewEvent) -> None:
        result = outcome(event.error)
        self._record_operation(RENEW, result, event.duration, event.error)
        self._record_renewal(result, event.attempt, event.error)
        if result in ("fenced", "expired"):
            self._gone(event.token)

    def on_release(self, event: ReleaseEvent) -> None:
        self._record_operation(RELEASE, outcome(event.error), event.duration, event.error)
        self._gone(event.token)

    def on_forget(self, event: ForgetEvent) -> None:
        self._record_operation(FORGET, outcome(event.error), event.duration, event.error)
        self._gone(event.token)

    def on_fenced(self, event: FencedEvent) -> None:
        self._record_fenced(str(event.operation))
        self._gone(event.token)

    # -- VacuumObserver -----------------------------------------------------------------------

    def on_sweep(self, event: SweepEvent) -> None:
        self._record_operation(SWEEP, outcome(event.error), event.duration, event.error)
        if event.error is None and event.deleted:
            self._record_rows_deleted(event.deleted)

    # -- PoolObserver -------------------------------------------------------------------------

    def on_slot_acquired(self, event: SlotAcquiredEvent) -> None:
        self._record_slot("acquired")

    def on_slot_lost(self, event: SlotLostEvent) -> None:
        self._record_slot("lost")
        self._gone_by(event.error)

    def on_slot_backoff(self, event: SlotBackoffEvent) -> None:
        self._record_slot("backoff")
        self._gone_by(event.error)

    def on_slot_dead(self, event: SlotDeadEvent) -> None:
        self._record_slot("dead")
        self._gone_by(event.error)

    def on_slot_retired(self, event: SlotRetiredEvent) -> None:
        self._record_slot("retired")

    def on_slot_shed(self, event: SlotShedEvent) -> None:
        self._record_slot("shed")  # its release, counted when it happens, ends the lease

    def on_scan(self, event: ScanEvent) -> None:
        self._record_operation(SCAN, outcome(event.error), event.duration, event.error)
