# Generated from src/worklease/_async/group.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Group commit: concurrent writes through one lease object share one statement per round.

Leader and followers, no timer. A caller that finds no round in flight leads one at once with
its own write alone (the single-item call: a lone caller pays nothing for the grouping).
Callers that arrive while a round is in flight queue up. When a round ends, its leader wakes
the first caller queued, which leads the next round with everybody queued by then, in one
batch call (``checkpoint_many``): N callers waiting behind one statement share the next one.
Each caller gets its own outcome, and returns only when the round holding its write is over.

A batch round runs shielded from its leader's cancellation, so a leader given up on never
leaves its followers without an answer (its own write's outcome is then unknown, as for any
cancelled call). A round never holds two writes to one work ID: a second write to a work ID
waits for the next round, so writes to one lease keep their order.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from .._acompat import Event, ThreadLock, shielded
from .._deadline import bounded_by
from .._types import WriteMany, WriteOne
from ..errors import BackendError

__all__ = ["GroupCommit"]

T = TypeVar("T")

_ROUND_LIMIT = 500
"""Most writes one round sends (one statement's arrays stay small)."""


class _Entry(Generic[T]):
    __slots__ = ("deadline", "done", "error", "item", "key", "lead")

    def __init__(self, item: T, key: str, deadline: float | None) -> None:
        self.item = item
        self.key = key
        self.deadline = deadline
        self.done = Event()
        self.lead = False  # woken to lead the next round rather than with an outcome
        self.error: BaseException | None = None


class GroupCommit(Generic[T]):
    """Groups concurrent calls of one kind: ``submit(item, key, deadline)`` returns once the
    item is written (or raises its own error). ``one(item)`` writes a lone item;
    ``many(items)`` writes a round of several (distinct keys) and returns each one's error or
    ``None``; a round is bounded by its latest ``deadline`` (monotonic; ``None``: none)."""

    def __init__(
        self,
        one: WriteOne[T],
        many: WriteMany[T],
        *,
        operation: str,
        limit: int = _ROUND_LIMIT,
    ) -> None:
        self._one = one
        self._many = many
        self._operation = operation
        self._limit = limit
        self._lock = ThreadLock()
        self._queue: list[_Entry[T]] = []
        self._busy = False

    def submit(self, item: T, key: str, deadline: float | None) -> None:
        entry: _Entry[T] | None = None
        with self._lock:
            lead = not self._busy
            if lead:
                self._busy = True
            else:
                entry = _Entry(item, key, deadline)
                self._queue.append(entry)
        if entry is not None:
            try:
                entry.done.wait()
            except BaseException:  # given up on while queued (a cancellation)
                with self._lock:
                    if entry in self._queue:  # not taken yet: it never happens
                        self._queue.remove(entry)
                        raise
                if entry.lead:  # woken to lead just then: pass that on
                    self._hand_on()
                raise
            if not entry.lead:
                if entry.error is not None:
                    raise entry.error
                return
        joining = self._take(key)
        if not joining:  # alone: the single-item call, nothing added
            try:
                self._one(item)
            finally:
                self._hand_on()
            return
        if entry is None:
            entry = _Entry(item, key, deadline)
        shielded(self._round, [entry, *joining])
        if entry.error is not None:
            raise entry.error

    def _take(self, key: str) -> list[_Entry[T]]:
        """The queued writes that join the leader's round: to other work IDs than its own
        and each other's, in arrival order, up to the round's limit."""
        with self._lock:
            if not self._queue:
                return []
            keys = {key}
            joining: list[_Entry[T]] = []
            rest: list[_Entry[T]] = []
            for entry in self._queue:
                if len(joining) + 1 < self._limit and entry.key not in keys:
                    joining.append(entry)
                    keys.add(entry.key)
                else:
                    rest.append(entry)
            self._queue = rest
        return joining

    def _round(self, batch: list[_Entry[T]]) -> None:
        try:
            # One statement cannot honour each caller's own deadline: the round is bounded by
            # the latest, so a caller near the end of its window never fails the others'
            # writes (each write stays fenced server-side; the earlier caller's renewal reports
            # its loss meanwhile). No deadline at all when one caller has none.
            deadlines = [entry.deadline for entry in batch]
            bound = None if None in deadlines else max(d for d in deadlines if d is not None)
            try:
                with bounded_by(bound):
                    outcomes = list(self._many([entry.item for entry in batch]))
                if len(outcomes) != len(batch):
                    raise BackendError(
                        f"{self._operation}_many returned {len(outcomes)} outcomes for "
                        f"{len(batch)} items"
                    )
            except Exception as exc:  # the round failed as a whole: each caller hears of it
                outcomes = [_each(exc) for _ in batch]
            except BaseException as exc:  # interrupted: nobody may wait for ever
                for entry in batch:
                    entry.error = _interrupted(self._operation, exc)
                    entry.done.set()
                raise
            for entry, outcome in zip(batch, outcomes, strict=True):
                entry.error = outcome
                entry.done.set()
        finally:
            self._hand_on()

    def _hand_on(self) -> None:
        """The round is over: wake the first queued caller to lead the next one."""
        with self._lock:
            if not self._queue:
                self._busy = False
                return
            entry = self._queue.pop(0)
            entry.lead = True
        entry.done.set()


def _each(error: Exception) -> BaseException:
    """One caller's copy of a whole round's failure (an exception object is raised in one
    place at a time)."""
    if isinstance(error, BackendError):
        copy = BackendError(str(error), transient=error.transient)
        copy.__cause__ = error
        return copy
    return error


def _interrupted(operation: str, cause: BaseException) -> BackendError:
    error = BackendError(
        f"{operation}: the grouped write this call joined was interrupted ({cause!r}); "
        "whether it was written is unknown",
        transient=False,
    )
    error.__cause__ = cause
    return error
