# Generated from src/worklease/_async/vacuum.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Periodic clean-up of lease rows that no successor needs."""

from __future__ import annotations

import math
from datetime import timedelta

from .._validation import to_seconds
from .._window import monotonic
from ..errors import BackendRequiredError, ConfigError, RetentionRequiredError
from ..observers import SweepEvent, VacuumObserver, notify
from .backend import Backend

__all__ = ["Vacuum"]


class Vacuum:
    """Deletes retired (and optionally lapsed) lease rows older than a retention period.

    Rows released FINISHED or ABANDONED, and held rows, are never deleted: successors resume
    from them. After a row is deleted the next holder sees ExitMode.NONE.
    """

    __module__ = "worklease"

    def __init__(self, backend: Backend, observer: VacuumObserver | None = None) -> None:
        if backend is None:
            raise BackendRequiredError("a backend is required")
        if observer is not None and not isinstance(observer, VacuumObserver):
            raise ConfigError("observer must be a VacuumObserver (subclass it)")
        self._backend = backend
        self._observer = observer if observer is not None else VacuumObserver()

    def sweep(self, retention: float | timedelta, include_expired: bool = False) -> int:
        """Delete unheld rows last updated more than ``retention`` seconds ago.

        Deletes rows released RETIRED and, with ``include_expired``, rows whose lease lapsed
        with no declared exit (discarding the partial state a successor would resume from).
        Returns the number of rows deleted. ``RetentionRequiredError`` when ``retention`` is
        not a positive duration.
        """
        try:
            seconds = to_seconds(retention, "retention")
        except TypeError as exc:
            raise RetentionRequiredError(str(exc)) from None
        if not math.isfinite(seconds) or seconds <= 0:
            raise RetentionRequiredError(
                f"retention must be a finite positive duration, got {retention!r}"
            )
        include = bool(include_expired)
        start = monotonic()
        try:
            deleted = self._backend.sweep(seconds, include)
        except Exception as exc:
            notify(
                self._observer.on_sweep,
                SweepEvent(seconds, include, 0, monotonic() - start, exc),
            )
            raise
        notify(
            self._observer.on_sweep,
            SweepEvent(seconds, include, deleted, monotonic() - start, None),
        )
        return deleted
