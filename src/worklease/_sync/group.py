# Generated from src/worklease/_async/group.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Group commit: concurrent writes through one lease object share one statement per round.

Leader and followers, no timer. A caller that finds a free lane while nobody queues sends its
own write alone at once, through the single-item call: callers that find connections free
pay nothing for the grouping and run side by side, as many as the backend runs at once
(``lanes``: the PostgreSQL backend's pool size). A caller that arrives while every lane is
taken queues, and so does every caller after it until the queue is gone: when a write or
round ends, the first caller queued is woken to lead the next round with everybody queued by
then, in one batch call (``checkpoint_many``), and callers keep queueing while such a round
is in flight. At most ``rounds`` (2) of them are in flight at once, one on the wire while the
next gathers, so a queue is batched into a few large statements rather than split over every
lane (on a server short of CPU, rows in one statement cost far less than the same rows
alone). Each caller gets its own outcome, and returns only when the write or round holding
its item is over.

A batch round runs shielded from its leader's cancellation, so a leader given up on never
leaves its followers without an answer (its own write's outcome is then unknown, as for any
cancelled call). A round never holds two writes to one work ID: a second write to a work ID
waits for the next round, so writes to one lease keep their order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .._compat import Event, ThreadLock, shielded
from .._deadline import bounded_by, cut_off
from .._types import WriteMany, WriteOne
from .._window import monotonic
from ..errors import BackendError

__all__ = ["GroupCommit"]

T = TypeVar("T")

_ROUND_LIMIT = 500
"""Most writes one round sends (one statement's arrays stay small)."""
_ROUNDS = 2
"""How many rounds led by a woken caller (batches) may be in flight at once by default
(ADR-0012): one on the wire while the next gathers its callers. Before lanes, measured against
1 and 8 in paired runs on a 2-core machine shared with the server: 2 gained 15 to 45 % at 8
concurrent callers and lost nothing at 32 and 128; 8 rounds split the batches and cost
throughput at 32."""


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
    ``None``; a round is bounded by its latest ``deadline`` (monotonic; ``None``: none).

    ``lanes()`` says how many writes the backend runs at once (read at every call; ``None``
    or no ``lanes``: ``rounds``). Up to that many lone items are in flight while nobody
    queues; once callers queue, they go in rounds led by a queued caller, at most ``rounds``
    (default ``_ROUNDS``, read when the group is made) in flight, and new callers join the
    queue until no round is left. A work ID is in at most one write in flight."""

    def __init__(
        self,
        one: WriteOne[T],
        many: WriteMany[T],
        *,
        operation: str,
        rounds: int | None = None,
        limit: int = _ROUND_LIMIT,
        lanes: Callable[[], int | None] | None = None,
    ) -> None:
        self._one = one
        self._many = many
        self._operation = operation
        self._rounds = _ROUNDS if rounds is None else rounds
        self._limit = limit
        self._lanes = lanes
        self._lock = ThreadLock()
        self._queue: list[_Entry[T]] = []
        self._in_flight = 0  # lone writes and rounds
        self._leading = 0  # of them, the rounds led by a woken caller
        self._keys: set[str] = set()  # the work IDs of the writes in flight

    def _width(self) -> int:
        """How many writes may be in flight at once: the backend's lanes, at least
        ``rounds``."""
        lanes = self._lanes() if self._lanes is not None else None
        return self._rounds if lanes is None else max(lanes, self._rounds)

    def submit(self, item: T, key: str, deadline: float | None) -> None:
        entry: _Entry[T] | None = None
        with self._lock:
            # Nothing in flight (a lone caller, the usual case): any width lets it go, and
            # the backend is not asked for its lanes (a read of its pool's size, no I/O).
            if (
                not self._leading
                and not self._queue
                and key not in self._keys
                and (not self._in_flight or self._in_flight < self._width())
            ):
                self._in_flight += 1  # a free lane, no queue: alone, at once
                self._keys.add(key)
            else:
                entry = _Entry(item, key, deadline)
                self._queue.append(entry)
        if entry is None:
            try:
                self._one(item)
            finally:
                self._end_round([key], led=False)
            return
        try:
            # A thread cannot be cancelled: it stops waiting at its own deadline instead (a
            # round is bounded by its latest caller's).
            answered = entry.done.wait(
                None if deadline is None else max(deadline - monotonic(), 0.0)
            )
        except BaseException:  # given up on while queued (a cancellation)
            self._give_up(entry)
            raise
        if not answered:
            outcome = (
                "it was never sent"
                if self._give_up(entry)
                else "a round carries it: whether it was written is unknown"
            )
            raise BackendError(
                f"{self._operation}: the call's deadline passed while its write waited in a "
                f"group commit; {outcome}",
                transient=True,
            )
        if not entry.lead:
            if entry.error is not None:
                raise entry.error
            return
        # A caller that must hand control back by a moment (a thread's final writes, see
        # _compat.cleanup) never carries others' writes: it writes its own alone and
        # passes the lead on when done.
        joining = self._take() if cut_off() is None else []
        if not joining:  # nobody else queued: the single-item call, nothing added
            try:
                self._one(item)
            finally:
                self._end_round([key], led=True)
            return
        shielded(self._round, [entry, *joining])
        if entry.error is not None:
            raise entry.error

    def _give_up(self, entry: _Entry[T]) -> bool:
        """Stop waiting for ``entry``; true when it was taken out of the queue (no round had
        it: it is never written). Woken to lead just then, the lead is passed on (it is
        never written either); in a round in flight, the round goes on without anybody
        waiting for this outcome."""
        with self._lock:
            if entry in self._queue:
                self._queue.remove(entry)
                return True
        if entry.lead:
            self._end_round([entry.key], led=True)
            return True
        return False

    def _take(self) -> list[_Entry[T]]:
        """The queued writes that join a new leader's round: to work IDs in no round in
        flight (the leader's own is), one write each, in arrival order, up to the limit."""
        with self._lock:
            if not self._queue:
                return []
            joining: list[_Entry[T]] = []
            rest: list[_Entry[T]] = []
            for entry in self._queue:
                if len(joining) + 1 < self._limit and entry.key not in self._keys:
                    joining.append(entry)
                    self._keys.add(entry.key)
                else:
                    rest.append(entry)
            self._queue = rest
        return joining

    def _round(self, batch: list[_Entry[T]]) -> None:
        try:
            # One statement cannot honour each caller's own deadline: the round is bounded by
            # the latest, so a caller near the end of its window never fails the others'
            # writes (each write stays fenced server-side; the earlier caller's renewal reports
            # its loss meanwhile), and a caller without a deadline never lifts the bound of
            # those that have one.
            deadlines = [entry.deadline for entry in batch if entry.deadline is not None]
            bound = max(deadlines) if deadlines else None
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
            self._end_round([entry.key for entry in batch], led=True)

    def _end_round(self, keys: list[str], *, led: bool) -> None:
        """A write or round is over (``led``: a round led by a woken caller): wake queued
        callers to lead the next rounds, as many as may be in flight, each with a work ID no
        write in flight has."""
        woken: list[_Entry[T]] = []
        with self._lock:
            self._keys.difference_update(keys)
            self._in_flight -= 1
            if led:
                self._leading -= 1
            if not self._queue:  # the usual end of a lone write: nobody to wake
                return
            width = self._width()
            index = 0
            while (
                self._leading < self._rounds
                and self._in_flight < width
                and index < len(self._queue)
            ):
                entry = self._queue[index]
                if entry.key in self._keys:
                    index += 1
                    continue
                del self._queue[index]
                entry.lead = True
                self._in_flight += 1
                self._leading += 1
                self._keys.add(entry.key)
                woken.append(entry)
        for entry in woken:
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
