"""``PrometheusObserver``: lease, pool and vacuum metrics with ``prometheus_client``."""

from __future__ import annotations

from collections.abc import Sequence

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "PrometheusObserver needs prometheus_client: pip install prometheus_client "
        "(worklease's prometheus extra)",
        name=exc.name,
    ) from exc

from ._common import (
    DURATION_BUCKETS,
    FENCEABLE,
    OPERATIONS,
    OUTCOMES,
    RENEWAL_OUTCOMES,
    SLOT_EVENTS,
    MetricsObserver,
)

__all__ = ["PrometheusObserver"]


class PrometheusObserver(MetricsObserver):
    """Exports worklease metrics to a Prometheus ``CollectorRegistry``.

    One object is a ``LeaseObserver``, a ``VacuumObserver`` and a ``PoolObserver``: pass the
    same observer to every lease, vacuum and pool of the process. Its metrics are registered
    on ``registry`` (default: ``prometheus_client.REGISTRY``), named with ``namespace``
    (default ``worklease``):

    - ``<ns>_operations_total{operation, outcome}`` (counter)
    - ``<ns>_operation_duration_seconds{operation}`` (histogram, ``buckets``)
    - ``<ns>_fenced_total{operation}`` (counter)
    - ``<ns>_leases_held`` (gauge)
    - ``<ns>_renewal_attempts_total{outcome}`` and ``<ns>_renewal_retries_total`` (counters)
    - ``<ns>_pool_slot_events_total{event}`` (counter)
    - ``<ns>_vacuum_rows_deleted_total`` (counter)

    Every known label combination is exported from the start (at 0). A registry takes one
    observer per namespace: a second one raises ``ValueError`` (share the first instead).
    Safe to call from any thread and from the event loop; nothing blocks.
    """

    __module__ = "worklease.contrib"

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "worklease",
        buckets: Sequence[float] = DURATION_BUCKETS,
    ) -> None:
        target = REGISTRY if registry is None else registry
        self._operations = Counter(
            "operations",
            "worklease operations by operation and outcome (ok, held, fenced, expired, error).",
            ("operation", "outcome"),
            namespace=namespace,
            registry=None,
        )
        self._durations = Histogram(
            "operation_duration_seconds",
            "Duration of the backend call of each worklease operation, in seconds.",
            ("operation",),
            namespace=namespace,
            buckets=tuple(buckets),
            registry=None,
        )
        self._fenced = Counter(
            "fenced",
            "Writes rejected because a newer token exists or the lease row is gone.",
            ("operation",),
            namespace=namespace,
            registry=None,
        )
        self._held_gauge = Gauge(
            "leases_held",
            "Leases this process acquired and has not yet released, forgotten or lost.",
            namespace=namespace,
            registry=None,
        )
        self._renewals = Counter(
            "renewal_attempts",
            "Renewal attempts (direct and background) by outcome.",
            ("outcome",),
            namespace=namespace,
            registry=None,
        )
        self._retries = Counter(
            "renewal_retries",
            "Background renewal attempts that retried a failed one within the same cycle.",
            namespace=namespace,
            registry=None,
        )
        self._slots = Counter(
            "pool_slot_events",
            "Pool slot events (acquired, lost, backoff, dead, retired, shed).",
            ("event",),
            namespace=namespace,
            registry=None,
        )
        self._rows_deleted = Counter(
            "vacuum_rows_deleted",
            "Lease rows deleted by vacuum sweeps.",
            namespace=namespace,
            registry=None,
        )
        for operation in OPERATIONS:
            self._durations.labels(operation)
            for result in OUTCOMES:
                self._operations.labels(operation, result)
        for operation in FENCEABLE:
            self._fenced.labels(operation)
        for result in RENEWAL_OUTCOMES:
            self._renewals.labels(result)
        for event in SLOT_EVENTS:
            self._slots.labels(event)
        self._register(target, namespace)
        self._registry = target
        super().__init__()

    def _collectors(self) -> tuple[Counter | Gauge | Histogram, ...]:
        return (
            self._operations,
            self._durations,
            self._fenced,
            self._held_gauge,
            self._renewals,
            self._retries,
            self._slots,
            self._rows_deleted,
        )

    def _register(self, registry: CollectorRegistry, namespace: str) -> None:
        done: list[Counter | Gauge | Histogram] = []
        for collector in self._collectors():
            try:
                registry.register(collector)
            except ValueError as exc:
                for registered in done:
                    registry.unregister(registered)
                raise ValueError(
                    f"this registry already has worklease metrics with namespace {namespace!r} "
                    "(another PrometheusObserver?): share one observer between every lease, "
                    "vacuum and pool, or pass another registry or namespace"
                ) from exc
            done.append(collector)

    @property
    def registry(self) -> CollectorRegistry:
        """The registry the metrics are registered on."""
        return self._registry

    def unregister(self) -> None:
        """Remove this observer's metrics from its registry (it keeps counting, unexported)."""
        for collector in self._collectors():
            try:
                self._registry.unregister(collector)
            except KeyError:
                pass

    # -- recording ----------------------------------------------------------------------------

    def _record_operation(
        self, operation: str, result: str, duration: float, error: BaseException | None
    ) -> None:
        self._operations.labels(operation, result).inc()
        self._durations.labels(operation).observe(duration)

    def _record_fenced(self, operation: str) -> None:
        self._fenced.labels(operation).inc()

    def _record_held(self, delta: int) -> None:
        self._held_gauge.inc(delta)

    def _record_renewal(self, result: str, attempt: int, error: BaseException | None) -> None:
        self._renewals.labels(result).inc()
        if attempt > 1:
            self._retries.inc()

    def _record_slot(self, event: str) -> None:
        self._slots.labels(event).inc()

    def _record_rows_deleted(self, deleted: int) -> None:
        self._rows_deleted.inc(deleted)
