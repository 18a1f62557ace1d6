"""``OpenTelemetryObserver``: lease, pool and vacuum metrics through the OpenTelemetry API."""

from __future__ import annotations

from collections.abc import Sequence

try:
    from opentelemetry import metrics
    from opentelemetry.metrics import MeterProvider
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "OpenTelemetryObserver needs opentelemetry-api: pip install opentelemetry-api "
        "(worklease's otel extra)",
        name=exc.name,
    ) from exc

from .. import __version__
from ._common import DURATION_BUCKETS, MetricsObserver

__all__ = ["OpenTelemetryObserver"]

ATTR_OPERATION = "worklease.operation"
ATTR_OUTCOME = "worklease.outcome"
ATTR_ERROR_TYPE = "error.type"
ATTR_SLOT_EVENT = "worklease.pool.slot.event"

_Attributes = dict[str, str]


class OpenTelemetryObserver(MetricsObserver):
    """Records worklease metrics with the OpenTelemetry metrics API.

    One object is a ``LeaseObserver``, a ``VacuumObserver`` and a ``PoolObserver``: pass the
    same observer to every lease, vacuum and pool of the process. The instruments come from
    a meter named ``worklease`` of ``meter_provider`` (default: the global provider, also when
    it is configured later):

    - ``worklease.operations`` (counter, ``{operation}``) and ``worklease.operation.duration``
      (histogram, ``s``) with ``worklease.operation``, ``worklease.outcome`` and, on
      failures, ``error.type`` (the exception class name)
    - ``worklease.fenced`` (counter, ``{event}``) with ``worklease.operation``
    - ``worklease.leases.held`` (up-down counter, ``{lease}``)
    - ``worklease.renewal.attempts`` (counter, ``{attempt}``) with ``worklease.outcome`` and
      ``error.type``; ``worklease.renewal.retries`` (counter, ``{attempt}``)
    - ``worklease.pool.slot.events`` (counter, ``{event}``) with ``worklease.pool.slot.event``
    - ``worklease.vacuum.rows_deleted`` (counter, ``{row}``)

    The duration histogram advises ``buckets`` as its explicit bucket boundaries. Safe to
    call from any thread and from the event loop; nothing blocks.
    """

    __module__ = "worklease.contrib"

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        *,
        buckets: Sequence[float] = DURATION_BUCKETS,
    ) -> None:
        meter = metrics.get_meter("worklease", __version__, meter_provider)
        self._operations = meter.create_counter(
            "worklease.operations",
            unit="{operation}",
            description="worklease operations by operation and outcome.",
        )
        self._durations = meter.create_histogram(
            "worklease.operation.duration",
            unit="s",
            description="Duration of the backend call of each worklease operation.",
            explicit_bucket_boundaries_advisory=list(buckets),
        )
        self._fenced = meter.create_counter(
            "worklease.fenced",
            unit="{event}",
            description="Writes rejected because a newer token exists or the lease row is gone.",
        )
        self._held_counter = meter.create_up_down_counter(
            "worklease.leases.held",
            unit="{lease}",
            description="Leases this process acquired and has not yet released, forgotten or lost.",
        )
        self._renewals = meter.create_counter(
            "worklease.renewal.attempts",
            unit="{attempt}",
            description="Renewal attempts (direct and background) by outcome.",
        )
        self._retries = meter.create_counter(
            "worklease.renewal.retries",
            unit="{attempt}",
            description="Background renewal attempts that retried a failed one in the same cycle.",
        )
        self._slots = meter.create_counter(
            "worklease.pool.slot.events",
            unit="{event}",
            description="Pool slot events (acquired, lost, backoff, dead, retired, shed).",
        )
        self._rows_deleted = meter.create_counter(
            "worklease.vacuum.rows_deleted",
            unit="{row}",
            description="Lease rows deleted by vacuum sweeps.",
        )
        super().__init__()

    # -- recording ----------------------------------------------------------------------------

    def _record_operation(
        self, operation: str, result: str, duration: float, error: BaseException | None
    ) -> None:
        attributes = _with_error({ATTR_OPERATION: operation, ATTR_OUTCOME: result}, error)
        self._operations.add(1, attributes)
        self._durations.record(duration, attributes)

    def _record_fenced(self, operation: str) -> None:
        self._fenced.add(1, {ATTR_OPERATION: operation})

    def _record_held(self, delta: int) -> None:
        self._held_counter.add(delta)

    def _record_renewal(self, result: str, attempt: int, error: BaseException | None) -> None:
        self._renewals.add(1, _with_error({ATTR_OUTCOME: result}, error))
        if attempt > 1:
            self._retries.add(1)

    def _record_slot(self, event: str) -> None:
        self._slots.add(1, {ATTR_SLOT_EVENT: event})

    def _record_rows_deleted(self, deleted: int) -> None:
        self._rows_deleted.add(deleted)


def _with_error(attributes: _Attributes, error: BaseException | None) -> _Attributes:
    if error is not None:
        attributes[ATTR_ERROR_TYPE] = type(error).__qualname__
    return attributes
