"""Group commit: concurrent writes through one lease object share one statement per round.

Leader and followers, no timer. A caller that finds a round free (two may be in flight: one
on the wire while the next gathers) leads one at once with its own write alone (the
single-item call: a lone caller pays nothing for the grouping). Callers that arrive while
every round is taken queue up. When a round ends, its leader wakes the first caller queued,
which leads the next round with everybody queued by then, in one batch call
(``checkpoint_many``): N callers waiting behind one statement share the next one.
Each caller gets its own outcome, and returns only when the round holding its write is over.

A batch round runs shielded from its leader's cancellation, so a leader given up on never
leaves its followers without an answer (its own write's outcome is then unknown, as for any
cancelled call). A round never holds two writes to one work ID: a second write to a work ID
waits for the next round, so writes to one lease keep their order.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from .._acompat import AEvent, ThreadLock, ashielded
from .._deadline import bounded_by
from .._types import AsyncWriteMany, AsyncWriteOne
from ..errors import BackendError

__all__ = ["AsyncGroupCommit"]

T = TypeVar("T")

_ROUND_LIMIT = 500
"""Most writes one round sends (one statement's arrays stay small)."""
_ROUNDS = 2
"""How many rounds may be in flight at once by default (ADR-0012): one on the wire while the
next gathers its callers. Measured against 1 and 8 in paired runs on a 2-core machine
shared with the server: 2 gains 15 to 45 % at 8 concurrent callers and loses nothing at 32
and 128; 8 rounds split the batches and cost throughput at 32."""


class _Entry(Generic[T]):
    __slots__ = ("deadline", "done", "error", "item", "key", "lead")

    def __init__(self, item: T, key: str, deadline: float | None) -> None:
        self.item = item
        self.key = key
        self.deadline = deadline
        self.done = AEvent()
        self.lead = False  # woken to lead the next round rather than with an outcome
        self.error: BaseException | None = None


class AsyncGroupCommit(Generic[T]):
    """Groups concurrent calls of one kind: ``submit(item, key, deadline)`` returns once the
    item is written (or raises its own error). ``one(item)`` writes a lone item;
    ``many(items)`` writes a round of several (distinct keys) and returns each one's error or
    ``None``; a round is bounded by its latest ``deadline`` (monotonic; ``None``: none). Up
    to ``rounds`` rounds (default ``_ROUNDS``, read when the group is made) are in flight at
    once, on as many connections; a work ID is in at most one of them."""

    def __init__(
        self,
        one: AsyncWriteOne[T],
        many: AsyncWriteMany[T],
        *,
        operation: str,
        rounds: int | None = None,
        limit: int = _ROUND_LIMIT,
    ) -> None:
        self._one = one
        self._many = many
        self._operation = operation
        self._rounds = _ROUNDS if rounds is None else rounds
        self._limit = limit
        self._lock = ThreadLock()
        self._queue: list[_Entry[T]] = []
        self._in_flight = 0
        self._keys: set[str] = set()  # the work IDs of the rounds in flight

    async def submit(self, item: T, key: str, deadline: float | None) -> None:
        entry: _Entry[T] | None = None
        with self._lock:
            if self._in_flight < self._rounds and not self._queue and key not in self._keys:
                self._in_flight += 1
                self._keys.add(key)
            else:
                entry = _Entry(item, key, deadline)
                self._queue.append(entry)
        if entry is not None:
            try:
                await entry.done.wait()
            except BaseException:  # given up on while queued (a cancellation)
                with self._lock:
                    if entry in self._queue:  # not taken yet: it never happens
                        self._queue.remove(entry)
                        raise
                if entry.lead:  # woken to lead just then: pass that on
                    self._end_round([key])
                raise
            if not entry.lead:
                if entry.error is not None:
                    raise entry.error
                return
        joining = self._take()
        if not joining:  # alone: the single-item call, nothing added
            try:
                await self._one(item)
            finally:
                self._end_round([key])
            return
        if entry is None:
            entry = _Entry(item, key, deadline)
        await ashielded(self._round, [entry, *joining])
        if entry.error is not None:
            raise entry.error

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

    async def _round(self, batch: list[_Entry[T]]) -> None:
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
                    outcomes = list(await self._many([entry.item for entry in batch]))
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
                    entry.done.set_threadsafe()
                raise
            for entry, outcome in zip(batch, outcomes, strict=True):
                entry.error = outcome
                entry.done.set_threadsafe()
        finally:
            self._end_round([entry.key for entry in batch])

    def _end_round(self, keys: list[str]) -> None:
        """A round is over: wake queued callers to lead the next rounds, as many as may be
        in flight, each with a work ID no round in flight has."""
        woken: list[_Entry[T]] = []
        with self._lock:
            self._keys.difference_update(keys)
            self._in_flight -= 1
            index = 0
            while self._in_flight < self._rounds and index < len(self._queue):
                entry = self._queue[index]
                if entry.key in self._keys:
                    index += 1
                    continue
                del self._queue[index]
                entry.lead = True
                self._in_flight += 1
                self._keys.add(entry.key)
                woken.append(entry)
        for entry in woken:
            entry.done.set_threadsafe()


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
