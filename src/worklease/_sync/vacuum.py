# Generated from src/worklease/_async/vacuum.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Periodic clean-up of lease rows that no successor needs."""

from __future__ import annotations

from .._options import check_instance
from .._report import sweep_report
from .._validation import Duration, check_flag, positive_seconds
from ..errors import BackendRequiredError, ConfigError, RetentionRequiredError
from ..observers import VacuumObserver
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
        if observer is not None:
            check_instance(observer, VacuumObserver, "observer (subclass it)", ConfigError)
        self._backend = backend
        self._observer = observer if observer is not None else VacuumObserver()

    def sweep(self, retention: Duration, include_expired: bool = False) -> int:
        """Delete unheld rows last updated more than ``retention`` seconds ago.

        Deletes rows released RETIRED and, with ``include_expired``, rows whose lease lapsed
        with no declared exit (discarding the partial state a successor would resume from).
        Returns the number of rows deleted. ``RetentionRequiredError`` when ``retention`` is
        not a positive duration (of at most 100 years); ``TypeError`` when
        ``include_expired`` is not a ``bool``.

        On PostgreSQL it deletes in short batches, each its own transaction, and skips rows
        another transaction has locked (they are left for the next sweep). If it fails
        partway, the batches already done stay deleted.
        """
        try:
            seconds = positive_seconds(retention, "retention")
        except (TypeError, ValueError) as exc:
            raise RetentionRequiredError(str(exc)) from None
        include = check_flag(include_expired, "include_expired")
        with sweep_report(self._observer, seconds, include) as call:
            deleted = call.result = self._backend.sweep(seconds, include)
        return deleted
