"""Reporting backend calls to observers: one helper times a call, builds its event, sends it
(and ``on_fenced`` after a fenced write). Shared by both flavours.

A call is reported with ``with reporter.checkpoint(token, state) as start: await backend...``:
the block is timed, and when it ends the event goes out with the block's duration and its
exception, if any. A ``BaseException`` that is not an ``Exception`` (a cancellation, an
interrupt) is not reported: the call did not end, it was abandoned. A write nobody listens to
gets one shared object that only gives the start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Generic, TypeVar

from ._models import Checkpoint, ExitMode, Operation, Token
from ._validation import StateLike, state_size
from ._window import monotonic
from .errors import FencedError
from .observers import (
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
    SweepEvent,
    VacuumObserver,
    notify,
)

__all__ = ["LeaseReporter", "Reported", "reported", "scan_report", "sweep_report"]

_R = TypeVar("_R")

_OBSERVER_METHODS = LeaseObserver.__dict__
"""The observer class's own attributes (a live view: a method patched on the class shows)."""
_QUIET = {
    name: _OBSERVER_METHODS[name]
    for name in (
        "on_acquire", "on_read_checkpoint", "on_checkpoint", "on_renew", "on_release",
        "on_fenced",
    )
}  # fmt: skip
"""The do-nothing methods it ships with."""


class Reported(Generic[_R]):
    """Times the ``with`` block it guards and reports it when the block ends.

    Set ``result`` inside the block when the report needs the call's result.
    """

    __slots__ = ("_finish", "result", "start")

    def __init__(self, finish: Callable[[float, Exception | None, _R | None], None] | None) -> None:
        self._finish = finish  # None: nobody listens, the block is only timed
        self.result: _R | None = None
        self.start = 0.0

    def __enter__(self) -> Reported[_R]:
        self.start = monotonic()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._finish is not None:
            _finished(self._finish, self.start, exc, self.result)


def _finished(
    finish: Callable[[float, Exception | None, _R | None], None],
    start: float,
    exc: BaseException | None,
    result: _R | None,
) -> None:
    """Report a block that began at ``start`` and ended with ``exc`` (``None``: ``result``);
    a ``BaseException`` that is not an ``Exception`` (cancelled, interrupted) is not."""
    if exc is None:
        finish(monotonic() - start, None, result)
    elif isinstance(exc, Exception):
        finish(monotonic() - start, exc, None)


class ReportedWrite:
    """Times a write (which returns nothing) and reports it when the block ends; ``with ...
    as start`` gives the monotonic instant the block began."""

    __slots__ = ("_finish", "_start")

    def __init__(self, finish: Callable[[float, Exception | None, None], None]) -> None:
        self._finish = finish
        self._start = 0.0

    def __enter__(self) -> float:
        self._start = start = monotonic()
        return start

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _finished(self._finish, self._start, exc, None)


class _Unheard:
    """A write nobody listens to: only its start is taken. One object serves every call
    (it keeps nothing): a write costs no object of its own for its report."""

    __slots__ = ()

    def __enter__(self) -> float:
        return monotonic()

    def __exit__(self, *_: object) -> None:
        return None


_UNHEARD = _Unheard()


def reported(finish: Callable[[float, Exception | None, _R | None], None]) -> Reported[_R]:
    """A ``Reported`` block calling ``finish(duration, error, result)`` when it ends."""
    return Reported(finish)


class LeaseReporter:
    """Builds and sends the events of one lease's observer."""

    __slots__ = ("observer",)

    def __init__(self, observer: LeaseObserver) -> None:
        self.observer = observer

    def _silent(self, callback: str, other: str) -> bool:
        """Whether the observer's ``callback`` and ``other`` do nothing (the default observer,
        patched neither on the instance nor on the class): then no event is built. Asked at
        every call, so an observer patched later is heard."""
        observer = self.observer
        if type(observer) is not LeaseObserver or observer.__dict__:
            return False
        methods = _OBSERVER_METHODS
        return methods[callback] is _QUIET[callback] and methods[other] is _QUIET[other]

    def _fenced(self, token: Token, operation: Operation, error: Exception | None) -> None:
        if isinstance(error, FencedError):
            notify(self.observer.on_fenced, FencedEvent(token, operation, error))

    # -- single calls ---------------------------------------------------------------------

    def acquire(self, work_id: str) -> Reported[tuple[Token, Checkpoint | None]]:
        """An acquire; set ``result`` to ``(token, prior)`` (``prior``: read with it, or
        ``None``)."""
        if self._silent("on_acquire", "on_read_checkpoint"):
            return Reported(None)

        def finish(
            duration: float, error: Exception | None, result: tuple[Token, Checkpoint | None] | None
        ) -> None:
            token, prior = result if result is not None else (None, None)
            notify(self.observer.on_acquire, AcquireEvent(work_id, token, duration, error))
            if token is not None and prior is not None:
                self.read_with_acquire(token, prior)

        return Reported(finish)

    def read_with_acquire(self, token: Token, prior: Checkpoint) -> None:
        """A checkpoint read in the same call as the acquire: it takes no time of its own."""
        notify(
            self.observer.on_read_checkpoint,
            ReadCheckpointEvent(
                token, prior.prev_exit, prior.prev_holder_id, state_size(prior.state), 0.0, None
            ),
        )

    def read(self, token: Token) -> Reported[Checkpoint]:
        """A checkpoint read; set ``result`` to the checkpoint."""
        if self._silent("on_read_checkpoint", "on_read_checkpoint"):
            return Reported(None)

        def finish(duration: float, error: Exception | None, prior: Checkpoint | None) -> None:
            if prior is None:
                event = ReadCheckpointEvent(token, ExitMode.NONE, None, 0, duration, error)
            else:
                event = ReadCheckpointEvent(
                    token,
                    prior.prev_exit,
                    prior.prev_holder_id,
                    state_size(prior.state),
                    duration,
                    error,
                )
            notify(self.observer.on_read_checkpoint, event)

        return Reported(finish)

    def checkpoint(self, token: Token, state: StateLike | None) -> ReportedWrite | _Unheard:
        """A checkpoint of ``state`` (its size is reported); ``as`` gives the start."""
        if self._silent("on_checkpoint", "on_fenced"):
            return _UNHEARD
        size = state_size(state)

        def finish(duration: float, error: Exception | None, _: None) -> None:
            notify(self.observer.on_checkpoint, CheckpointEvent(token, size, duration, error))
            self._fenced(token, Operation.CHECKPOINT, error)

        return ReportedWrite(finish)

    def renew(self, token: Token, attempt: int) -> ReportedWrite | _Unheard:
        """A renewal attempt; ``as`` gives the start."""
        if self._silent("on_renew", "on_fenced"):
            return _UNHEARD

        def finish(duration: float, error: Exception | None, _: None) -> None:
            self.renewed(token, attempt, duration, error)

        return ReportedWrite(finish)

    def renewed(self, token: Token, attempt: int, duration: float, error: Exception | None) -> None:
        """One token's renewal attempt (alone, or its share of a batch)."""
        notify(self.observer.on_renew, RenewEvent(token, attempt, duration, error))
        self._fenced(token, Operation.RENEW, error)

    def release(self, token: Token, mode: ExitMode) -> ReportedWrite | _Unheard:
        """A release with ``mode``; ``as`` gives the start."""
        if self._silent("on_release", "on_fenced"):
            return _UNHEARD

        def finish(duration: float, error: Exception | None, _: None) -> None:
            self.released(token, mode, duration, error)

        return ReportedWrite(finish)

    def released(
        self, token: Token, mode: ExitMode, duration: float, error: Exception | None
    ) -> None:
        """One token's release (alone, or its share of a batch)."""
        notify(self.observer.on_release, ReleaseEvent(token, mode, duration, error))
        self._fenced(token, Operation.RELEASE, error)

    def forget(self, token: Token) -> Reported[None]:
        def finish(duration: float, error: Exception | None, _: None) -> None:
            notify(self.observer.on_forget, ForgetEvent(token, duration, error))
            self._fenced(token, Operation.FORGET, error)

        return Reported(finish)

    # -- batches --------------------------------------------------------------------------

    def acquire_many(
        self, work_ids: Sequence[str]
    ) -> Reported[list[tuple[Token, Checkpoint | None]]]:
        """A batched acquire of ``work_ids``: each grant is reported like a single acquire and
        read; a failure is reported once per work ID asked for."""

        def finish(
            duration: float,
            error: Exception | None,
            grants: list[tuple[Token, Checkpoint | None]] | None,
        ) -> None:
            if error is not None or grants is None:
                for work_id in work_ids:
                    notify(self.observer.on_acquire, AcquireEvent(work_id, None, duration, error))
                return
            for token, prior in grants:
                notify(self.observer.on_acquire, AcquireEvent(token.work_id, token, duration, None))
                if prior is not None:
                    self.read_with_acquire(token, prior)

        return Reported(finish)


def scan_report(
    observer: PoolObserver, candidates: int
) -> Reported[list[tuple[Token, Checkpoint | None]]]:
    """A pool scan over ``candidates`` work IDs; set ``result`` to the grants."""

    def finish(
        duration: float,
        error: Exception | None,
        grants: list[tuple[Token, Checkpoint | None]] | None,
    ) -> None:
        acquired = tuple(token.work_id for token, _ in grants or ())
        notify(observer.on_scan, ScanEvent(candidates, acquired, duration, error))

    return Reported(finish)


def sweep_report(observer: VacuumObserver, retention: float, include: bool) -> Reported[int]:
    """A vacuum sweep; set ``result`` to the number of rows deleted."""

    def finish(duration: float, error: Exception | None, deleted: int | None) -> None:
        notify(
            observer.on_sweep,
            SweepEvent(retention, include, deleted or 0, duration, error),
        )

    return Reported(finish)
