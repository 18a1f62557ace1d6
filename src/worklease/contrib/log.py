"""``LoggingObserver``: one stdlib ``logging`` record per lease, pool and vacuum event."""

from __future__ import annotations

import logging
from typing import Any

from .._models import Token
from ..errors import LeaseHeldError, LeaseLostError
from ..observers import (
    AcquireEvent,
    BalanceEvent,
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
from ._common import outcome

__all__ = ["DEFAULT_LOGGER", "LoggingObserver"]

DEFAULT_LOGGER = "worklease.events"


class LoggingObserver(LeaseObserver, VacuumObserver, PoolObserver):
    """Logs every lease, pool and vacuum event to a stdlib logger (default ``worklease.events``).

    One object is a ``LeaseObserver``, a ``VacuumObserver`` and a ``PoolObserver``. Levels:

    - ``level`` (INFO): successful acquire, checkpoint, release, forget and sweep; a slot
      that acquired or retired; and an operation whose outcome is ``fenced`` (the
      ``on_fenced`` record that follows it is the warning);
    - ``detail_level`` (DEBUG): successful renewals and checkpoint reads, and acquires that
      found the lease held (a waiting acquire or a pool logs one per poll);
    - ``problem_level`` (WARNING): fenced events, leases found lapsed (outcome ``expired``),
      any other failure, and pool slots that lost their lease or back off;
    - ERROR: a pool slot that failed permanently.

    Each record carries these ``extra`` attributes (``None`` where the event has no value):
    ``worklease_work_id``, ``worklease_holder_id``, ``worklease_fencing_token``,
    ``worklease_operation``, ``worklease_outcome``, ``worklease_duration`` (seconds),
    ``worklease_error`` (the message) and ``worklease_error_type`` (the class name); some
    events add ``worklease_held_by`` (acquire: the current holder, when known),
    ``worklease_exit_mode``, ``worklease_size``, ``worklease_attempt``,
    ``worklease_prev_exit``, ``worklease_prev_holder_id``, ``worklease_deleted``,
    ``worklease_retention``, ``worklease_include_expired`` or ``worklease_delay``.

    Safe from any thread and from the event loop, as far as the configured handlers are.
    """

    __module__ = "worklease.contrib"

    def __init__(
        self,
        logger: logging.Logger | str | None = None,
        *,
        level: int = logging.INFO,
        detail_level: int = logging.DEBUG,
        problem_level: int = logging.WARNING,
    ) -> None:
        if logger is None or isinstance(logger, str):
            logger = logging.getLogger(logger or DEFAULT_LOGGER)
        self._logger = logger
        self._level = level
        self._detail_level = detail_level
        self._problem_level = problem_level

    @property
    def logger(self) -> logging.Logger:
        """The logger the records go to."""
        return self._logger

    # -- helpers ------------------------------------------------------------------------------

    def _operation(
        self,
        operation: str,
        work_id: str,
        token: Token | None,
        duration: float,
        error: BaseException | None,
        *,
        quiet: bool = False,
        **fields: Any,
    ) -> None:
        result = outcome(error)
        if result == "ok":
            level = self._detail_level if quiet else self._level
        elif result == "held":
            level = self._detail_level
        elif result == "fenced":
            level = self._level
        else:
            level = self._problem_level
        if not self._logger.isEnabledFor(level):
            return
        extra = _extra(operation, work_id, token, error, result, duration, fields)
        if token is None:
            who = f"work ID {work_id!r}"
        else:
            who = f"work ID {work_id!r} holder {token.holder_id!r} token {token.fencing_token}"
        if error is None:
            self._logger.log(
                level, "worklease %s ok: %s (%.3f ms)", operation, who, duration * 1e3, extra=extra
            )
        else:
            self._logger.log(
                level,
                "worklease %s %s: %s (%.3f ms): %s: %s",
                operation,
                result,
                who,
                duration * 1e3,
                type(error).__name__,
                error,
                extra=extra,
            )

    # -- LeaseObserver ------------------------------------------------------------------------

    def on_acquire(self, event: AcquireEvent) -> None:
        error = event.error
        held_by = error.holder_id if isinstance(error, LeaseHeldError) else None
        self._operation(
            "acquire",
            event.work_id,
            event.token,
            event.duration,
            error,
            worklease_held_by=held_by,
        )

    def on_read_checkpoint(self, event: ReadCheckpointEvent) -> None:
        self._operation(
            "read_checkpoint",
            event.token.work_id,
            event.token,
            event.duration,
            event.error,
            quiet=True,
            worklease_prev_exit=str(event.prev_exit),
            worklease_prev_holder_id=event.prev_holder_id,
            worklease_size=event.size,
        )

    def on_checkpoint(self, event: CheckpointEvent) -> None:
        self._operation(
            "checkpoint",
            event.token.work_id,
            event.token,
            event.duration,
            event.error,
            worklease_size=event.size,
        )

    def on_renew(self, event: RenewEvent) -> None:
        self._operation(
            "renew",
            event.token.work_id,
            event.token,
            event.duration,
            event.error,
            quiet=True,
            worklease_attempt=event.attempt,
        )

    def on_release(self, event: ReleaseEvent) -> None:
        self._operation(
            "release",
            event.token.work_id,
            event.token,
            event.duration,
            event.error,
            worklease_exit_mode=str(event.mode),
        )

    def on_forget(self, event: ForgetEvent) -> None:
        self._operation("forget", event.token.work_id, event.token, event.duration, event.error)

    def on_fenced(self, event: FencedEvent) -> None:
        level = self._problem_level
        if not self._logger.isEnabledFor(level):
            return
        token = event.token
        operation = str(event.operation)
        extra = _extra(operation, token.work_id, token, event.error, "fenced", None, {})
        self._logger.log(
            level,
            "worklease lease fenced on %s: work ID %r holder %r token %d: %s",
            operation,
            token.work_id,
            token.holder_id,
            token.fencing_token,
            event.error,
            extra=extra,
        )

    # -- VacuumObserver -----------------------------------------------------------------------

    def on_sweep(self, event: SweepEvent) -> None:
        result = outcome(event.error)
        level = self._level if event.error is None else self._problem_level
        if not self._logger.isEnabledFor(level):
            return
        fields = {
            "worklease_deleted": event.deleted,
            "worklease_retention": event.retention,
            "worklease_include_expired": event.include_expired,
        }
        extra = _extra("sweep", None, None, event.error, result, event.duration, fields)
        if event.error is None:
            self._logger.log(
                level,
                "worklease sweep ok: %d row(s) deleted (retention %gs%s, %.3f ms)",
                event.deleted,
                event.retention,
                ", expired too" if event.include_expired else "",
                event.duration * 1e3,
                extra=extra,
            )
        else:
            self._logger.log(
                level,
                "worklease sweep %s (%.3f ms): %s: %s",
                result,
                event.duration * 1e3,
                type(event.error).__name__,
                event.error,
                extra=extra,
            )

    # -- PoolObserver -------------------------------------------------------------------------

    def _slot(
        self,
        level: int,
        name: str,
        work_id: str,
        token: Token | None,
        error: BaseException | None,
        message: str,
        **fields: Any,
    ) -> None:
        if not self._logger.isEnabledFor(level):
            return
        result = "ok" if error is None else outcome(error)
        extra = _extra(f"pool.{name}", work_id, token, error, result, None, fields)
        if token is None and isinstance(error, LeaseLostError):
            extra["worklease_holder_id"] = error.holder_id
            extra["worklease_fencing_token"] = error.fencing_token
        if error is None:
            self._logger.log(level, "worklease pool slot %r %s", work_id, message, extra=extra)
        else:
            self._logger.log(
                level,
                "worklease pool slot %r %s: %s: %s",
                work_id,
                message,
                type(error).__name__,
                error,
                extra=extra,
            )

    def on_slot_acquired(self, event: SlotAcquiredEvent) -> None:
        token = event.token
        self._slot(
            self._level,
            "slot_acquired",
            event.work_id,
            token,
            None,
            f"acquired (holder {token.holder_id!r} token {token.fencing_token})",
        )

    def on_slot_lost(self, event: SlotLostEvent) -> None:
        self._slot(
            self._problem_level,
            "slot_lost",
            event.work_id,
            None,
            event.error,
            "lost its lease; re-acquiring",
        )

    def on_slot_backoff(self, event: SlotBackoffEvent) -> None:
        self._slot(
            self._problem_level,
            "slot_backoff",
            event.work_id,
            None,
            event.error,
            f"failed; retrying in {event.delay:g}s",
            worklease_delay=event.delay,
        )

    def on_slot_dead(self, event: SlotDeadEvent) -> None:
        self._slot(
            logging.ERROR,
            "slot_dead",
            event.work_id,
            None,
            event.error,
            "failed permanently and stopped",
        )

    def on_slot_retired(self, event: SlotRetiredEvent) -> None:
        self._slot(self._level, "slot_retired", event.work_id, None, None, "retired its work ID")

    def on_slot_shed(self, event: SlotShedEvent) -> None:
        self._slot(
            self._level,
            "slot_shed",
            event.work_id,
            None,
            None,
            "hands its work ID to another member (fair share)",
        )

    def on_balance(self, event: BalanceEvent) -> None:
        # One per scan: routine unless it moved something or leaves work uncovered.
        if event.uncovered:
            level = self._problem_level
        else:
            level = self._level if event.took or event.shed else self._detail_level
        if not self._logger.isEnabledFor(level):
            return
        fields = {
            "worklease_group": event.group,
            "worklease_members": event.members,
            "worklease_target": event.target,
            "worklease_held": event.held,
            "worklease_took": len(event.took),
            "worklease_shed": len(event.shed),
            "worklease_uncovered": event.uncovered,
        }
        extra = _extra("pool.balance", None, None, None, "ok", None, fields)
        self._logger.log(
            level,
            "worklease pool %s: %d member(s), target %d, held %d, took %d, shed %d%s",
            event.group,
            event.members,
            event.target,
            event.held,
            len(event.took),
            len(event.shed),
            f", {event.uncovered} uncovered" if event.uncovered else "",
            extra=extra,
        )

    def on_scan(self, event: ScanEvent) -> None:
        # A scan that found nothing is routine (one per idle interval): detail level only.
        if event.error is not None:
            level = self._problem_level
        else:
            level = self._level if event.acquired else self._detail_level
        if not self._logger.isEnabledFor(level):
            return
        result = outcome(event.error)
        fields = {"worklease_candidates": event.candidates, "worklease_acquired": event.acquired}
        extra = _extra("pool.scan", None, None, event.error, result, event.duration, fields)
        if event.error is None:
            self._logger.log(
                level,
                "worklease pool scan ok: acquired %d of %d candidate work ID(s) (%.3f ms)",
                len(event.acquired),
                event.candidates,
                event.duration * 1e3,
                extra=extra,
            )
        else:
            self._logger.log(
                level,
                "worklease pool scan %s over %d candidate work ID(s) (%.3f ms): %s: %s",
                result,
                event.candidates,
                event.duration * 1e3,
                type(event.error).__name__,
                event.error,
                extra=extra,
            )


def _extra(
    operation: str,
    work_id: str | None,
    token: Token | None,
    error: BaseException | None,
    result: str,
    duration: float | None,
    fields: dict[str, Any],
) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "worklease_work_id": work_id,
        "worklease_holder_id": token.holder_id if token is not None else None,
        "worklease_fencing_token": token.fencing_token if token is not None else None,
        "worklease_operation": operation,
        "worklease_outcome": result,
        "worklease_duration": duration,
        "worklease_error": str(error) if error is not None else None,
        "worklease_error_type": type(error).__name__ if error is not None else None,
    }
    extra.update(fields)
    return extra
