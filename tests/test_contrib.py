"""worklease.contrib: the logging, Prometheus and OpenTelemetry observers.

A scripted sequence of lease, vacuum and pool operations runs on the memory backend with a
fake clock, in both flavours, and the values each observer recorded are asserted exactly.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)
from prometheus_client import CollectorRegistry

import worklease.contrib
from worklease import (
    AcquireEvent,
    AsyncLease,
    AsyncMemoryBackend,
    AsyncPool,
    AsyncVacuum,
    BackendError,
    Checkpoint,
    ExitMode,
    FencedError,
    FencedEvent,
    Lease,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseObserver,
    LeaseWindowExhaustedError,
    MemoryBackend,
    Operation,
    Pool,
    PoolObserver,
    ReadCheckpointEvent,
    ReleaseEvent,
    RenewEvent,
    Retire,
    SlotBackoffEvent,
    SlotDeadEvent,
    Token,
    Vacuum,
    VacuumObserver,
    permanent,
)
from worklease.contrib import LoggingObserver, OpenTelemetryObserver, PrometheusObserver
from worklease.contrib._common import DURATION_BUCKETS, FENCEABLE, OPERATIONS, OUTCOMES
from worklease.testing import FakeClock

TTL = 10.0
POOL_TTL = 30.0
MetricsObserver = PrometheusObserver | OpenTelemetryObserver
Observer = MetricsObserver | LoggingObserver


# -- reading what an observer recorded --------------------------------------------------------


class Probe(Protocol):
    """Reads back one metrics observer's values, whatever the exporter."""

    @property
    def observer(self) -> MetricsObserver: ...

    def ops(self, operation: str, outcome: str) -> float: ...

    def durations(self, operation: str) -> float: ...

    def fenced(self, operation: str) -> float: ...

    def held(self) -> float: ...

    def renewals(self, outcome: str) -> float: ...

    def retries(self) -> float: ...

    def slots(self, event: str) -> float: ...

    def rows_deleted(self) -> float: ...


class PrometheusProbe:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.observer = PrometheusObserver(self.registry)

    def _value(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.registry.get_sample_value(name, labels or {})
        assert value is not None, f"{name}{labels or ''} is not exported"
        return value

    def ops(self, operation: str, outcome: str) -> float:
        return self._value(
            "worklease_operations_total", {"operation": operation, "outcome": outcome}
        )

    def durations(self, operation: str) -> float:
        return self._value("worklease_operation_duration_seconds_count", {"operation": operation})

    def fenced(self, operation: str) -> float:
        return self._value("worklease_fenced_total", {"operation": operation})

    def held(self) -> float:
        return self._value("worklease_leases_held")

    def renewals(self, outcome: str) -> float:
        return self._value("worklease_renewal_attempts_total", {"outcome": outcome})

    def retries(self) -> float:
        return self._value("worklease_renewal_retries_total")

    def slots(self, event: str) -> float:
        return self._value("worklease_pool_slot_events_total", {"event": event})

    def rows_deleted(self) -> float:
        return self._value("worklease_vacuum_rows_deleted_total")


class OtelProbe:
    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.observer = OpenTelemetryObserver(self.provider)

    def points(self, name: str) -> list[NumberDataPoint | HistogramDataPoint]:
        data = self.reader.get_metrics_data()
        found: list[NumberDataPoint | HistogramDataPoint] = []
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                assert scope.scope.name == "worklease"
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            assert isinstance(point, NumberDataPoint | HistogramDataPoint)
                            found.append(point)
        return found

    def _value(self, name: str, **attributes: str) -> float:
        total = 0.0
        for point in self.points(name):
            labels = dict(point.attributes or {})
            if all(labels.get(key) == value for key, value in attributes.items()):
                if isinstance(point, HistogramDataPoint):
                    total += point.count
                else:
                    total += point.value
        return total

    def ops(self, operation: str, outcome: str) -> float:
        return self._value(
            "worklease.operations",
            **{"worklease.operation": operation, "worklease.outcome": outcome},
        )

    def durations(self, operation: str) -> float:
        return self._value("worklease.operation.duration", **{"worklease.operation": operation})

    def fenced(self, operation: str) -> float:
        return self._value("worklease.fenced", **{"worklease.operation": operation})

    def held(self) -> float:
        return self._value("worklease.leases.held")

    def renewals(self, outcome: str) -> float:
        return self._value("worklease.renewal.attempts", **{"worklease.outcome": outcome})

    def retries(self) -> float:
        return self._value("worklease.renewal.retries")

    def slots(self, event: str) -> float:
        return self._value("worklease.pool.slot.events", **{"worklease.pool.slot.event": event})

    def rows_deleted(self) -> float:
        return self._value("worklease.vacuum.rows_deleted")


@pytest.fixture(params=["prometheus", "otel"])
def probe(request: pytest.FixtureRequest) -> Iterator[Probe]:
    if request.param == "prometheus":
        yield PrometheusProbe()
        return
    otel = OtelProbe()
    yield otel
    otel.provider.shutdown()


def assert_operations(probe: Probe, expected: dict[tuple[str, str], int]) -> None:
    """Every (operation, outcome) counter: the expected ones, all others zero."""
    actual = {
        (operation, outcome): probe.ops(operation, outcome)
        for operation in OPERATIONS
        for outcome in OUTCOMES
    }
    wanted = {key: float(expected.get(key, 0)) for key in actual}
    assert actual == wanted
    for operation in OPERATIONS:
        calls = sum(count for (op, _), count in expected.items() if op == operation)
        assert probe.durations(operation) == calls, operation


# -- the scripted sequence, once per flavour ---------------------------------------------------

Check = Callable[[int], None]


def no_check(expected: int) -> None:
    pass


def sync_scenario(observer: Observer, held: Check = no_check) -> None:
    """acquire, read, checkpoint, renew, a held acquire, a takeover and a fenced checkpoint,
    release, a renewal that finds its lease lapsed, forget, and a vacuum sweep."""
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    a = Lease(backend, holder_id="a", ttl=TTL, observer=observer)
    b = Lease(backend, holder_id="b", ttl=TTL, observer=observer)
    first = a.acquire("job")
    held(1)
    assert a.read_checkpoint(first) == Checkpoint()
    a.checkpoint(first, b"12345")
    a.renew(first)
    with pytest.raises(LeaseHeldError):
        b.acquire("job")
    clock.advance(TTL + 1)
    second = b.acquire("job")
    held(2)  # a has not noticed yet that it lost its lease
    with pytest.raises(FencedError):
        a.checkpoint(first, b"late")
    held(1)
    b.release(second, ExitMode.FINISHED)
    held(0)
    other = a.acquire("other")
    held(1)
    clock.advance(TTL + 1)
    with pytest.raises(LeaseExpiredError):
        a.renew(other)
    held(0)
    a.forget(other)
    held(0)  # never decremented twice
    old = a.acquire("old")
    a.release(old, ExitMode.RETIRED)
    clock.advance(120)
    assert Vacuum(backend, observer).sweep(60) == 1
    held(0)


async def async_scenario(observer: Observer, held: Check = no_check) -> None:
    """The same sequence as ``sync_scenario``, with the asyncio flavour."""
    clock = FakeClock()
    backend = AsyncMemoryBackend(clock=clock)
    a = AsyncLease(backend, holder_id="a", ttl=TTL, observer=observer)
    b = AsyncLease(backend, holder_id="b", ttl=TTL, observer=observer)
    first = await a.acquire("job")
    held(1)
    assert await a.read_checkpoint(first) == Checkpoint()
    await a.checkpoint(first, b"12345")
    await a.renew(first)
    with pytest.raises(LeaseHeldError):
        await b.acquire("job")
    clock.advance(TTL + 1)
    second = await b.acquire("job")
    held(2)
    with pytest.raises(FencedError):
        await a.checkpoint(first, b"late")
    held(1)
    await b.release(second, ExitMode.FINISHED)
    held(0)
    other = await a.acquire("other")
    held(1)
    clock.advance(TTL + 1)
    with pytest.raises(LeaseExpiredError):
        await a.renew(other)
    held(0)
    await a.forget(other)
    held(0)
    old = await a.acquire("old")
    await a.release(old, ExitMode.RETIRED)
    clock.advance(120)
    assert await AsyncVacuum(backend, observer).sweep(60) == 1
    held(0)


SCENARIO_OPERATIONS = {
    ("acquire", "ok"): 4,
    ("acquire", "held"): 1,
    ("read_checkpoint", "ok"): 1,
    ("checkpoint", "ok"): 1,
    ("checkpoint", "fenced"): 1,
    ("renew", "ok"): 1,
    ("renew", "expired"): 1,
    ("release", "ok"): 2,
    ("forget", "ok"): 1,
    ("sweep", "ok"): 1,
}


def assert_scenario(probe: Probe) -> None:
    assert_operations(probe, SCENARIO_OPERATIONS)
    assert {op: probe.fenced(op) for op in FENCEABLE} == {
        "checkpoint": 1,
        "renew": 0,
        "release": 0,
        "forget": 0,
    }
    assert probe.held() == 0
    assert {o: probe.renewals(o) for o in ("ok", "fenced", "expired", "error")} == {
        "ok": 1,
        "fenced": 0,
        "expired": 1,
        "error": 0,
    }
    assert probe.retries() == 0
    assert probe.rows_deleted() == 1
    assert {e: probe.slots(e) for e in ("acquired", "lost", "backoff", "dead", "retired")} == {
        "acquired": 0,
        "lost": 0,
        "backoff": 0,
        "dead": 0,
        "retired": 0,
    }
    assert probe.observer.leases_held == 0


def held_check(probe: Probe) -> Check:
    def check(expected: int) -> None:
        assert probe.held() == expected
        assert probe.observer.leases_held == expected

    return check


def test_scenario_sync(probe: Probe) -> None:
    sync_scenario(probe.observer, held_check(probe))
    assert_scenario(probe)


async def test_scenario_async(probe: Probe) -> None:
    await async_scenario(probe.observer, held_check(probe))
    assert_scenario(probe)


# -- pools ------------------------------------------------------------------------------------


def pool_work(token: Token, prior: Checkpoint) -> bytes | None:
    if token.work_id == "retire-me":
        raise Retire(b"done")
    raise permanent(ValueError("broken beyond repair"))


async def async_pool_work(token: Token, prior: Checkpoint) -> bytes | None:
    return pool_work(token, prior)


POOL_OPERATIONS = {
    ("acquire", "ok"): 2,
    ("read_checkpoint", "ok"): 2,
    ("checkpoint", "ok"): 1,  # the retiring slot's final state
    ("release", "ok"): 2,  # RETIRED and ABANDONED
    ("scan", "ok"): 1,  # one scan found both work IDs free; then every work ID was done
}


def assert_pool(probe: Probe) -> None:
    assert {e: probe.slots(e) for e in ("acquired", "lost", "backoff", "dead", "retired")} == {
        "acquired": 2,
        "lost": 0,
        "backoff": 0,
        "dead": 1,
        "retired": 1,
    }
    assert_operations(probe, POOL_OPERATIONS)
    assert probe.held() == 0


def test_pool_sync(probe: Probe) -> None:
    lease = Lease(
        MemoryBackend(clock=FakeClock()), holder_id="p", ttl=POOL_TTL, observer=probe.observer
    )
    Pool(lease, ["retire-me", "broken"], pool_work, observer=probe.observer, fair_share=False).run()
    assert_pool(probe)


async def test_pool_async(probe: Probe) -> None:
    lease = AsyncLease(
        AsyncMemoryBackend(clock=FakeClock()), holder_id="p", ttl=POOL_TTL, observer=probe.observer
    )
    await AsyncPool(
        lease, ["retire-me", "broken"], async_pool_work, observer=probe.observer, fair_share=False
    ).run()
    assert_pool(probe)


# -- events the scenario cannot produce deterministically --------------------------------------


def token(work_id: str, fencing_token: int = 1) -> Token:
    return Token(work_id, "h", fencing_token, datetime.now(UTC))


def test_retries_errors_and_losses_without_a_release(probe: Probe) -> None:
    observer = probe.observer
    renewed = token("renewed")
    observer.on_acquire(AcquireEvent("renewed", renewed, 0.001, None))
    observer.on_acquire(AcquireEvent("renewed", renewed, 0.001, None))  # the same token again
    assert probe.held() == 1
    reset = BackendError("connection reset", transient=True)
    observer.on_renew(RenewEvent(renewed, 1, 0.002, reset))
    observer.on_renew(RenewEvent(renewed, 2, 0.002, reset))
    observer.on_renew(RenewEvent(renewed, 3, 0.002, None))
    assert probe.renewals("error") == 2
    assert probe.renewals("ok") == 1
    assert probe.retries() == 2
    assert probe.held() == 1  # transient failures do not lose the lease
    # A pool slot reports the renewal window closing: the lease is gone.
    closed = LeaseWindowExhaustedError("window closed", token=renewed)
    observer.on_slot_backoff(SlotBackoffEvent("renewed", closed, 1.0))
    assert probe.held() == 0
    # ... also when the loss is wrapped as a permanent failure.
    dead = token("dead", 2)
    observer.on_acquire(AcquireEvent("dead", dead, 0.001, None))
    observer.on_slot_dead(
        SlotDeadEvent("dead", permanent(LeaseWindowExhaustedError("x", token=dead)))
    )
    assert probe.held() == 0
    # A hold whose checkpoint read failed lets the lease lapse.
    unread = token("unread", 3)
    observer.on_acquire(AcquireEvent("unread", unread, 0.001, None))
    observer.on_read_checkpoint(
        ReadCheckpointEvent(unread, ExitMode.NONE, None, 0, 0.001, BackendError("down"))
    )
    assert probe.held() == 0
    # Release and a fenced report of a token already gone change nothing.
    observer.on_release(ReleaseEvent(unread, ExitMode.FINISHED, 0.001, None))
    observer.on_fenced(FencedEvent(unread, Operation.RELEASE, FencedError("gone")))
    assert probe.held() == 0
    assert probe.fenced("release") == 1
    assert probe.ops("read_checkpoint", "error") == 1
    assert probe.slots("backoff") == 1
    assert probe.slots("dead") == 1


def test_observers_are_every_kind_of_observer(probe: Probe) -> None:
    for observer in (probe.observer, LoggingObserver()):
        assert isinstance(observer, LeaseObserver)
        assert isinstance(observer, VacuumObserver)
        assert isinstance(observer, PoolObserver)
        assert type(observer).__module__ == "worklease.contrib"


def test_threads_leave_the_gauge_at_zero(probe: Probe) -> None:
    lease = Lease(MemoryBackend(), holder_id="t", ttl=30.0, observer=probe.observer)
    threads, rounds = 8, 50
    failures: list[BaseException] = []
    start = threading.Barrier(threads)

    def worker(n: int) -> None:
        try:
            start.wait()
            for _ in range(rounds):
                own = lease.acquire(f"own-{n}")
                lease.checkpoint(own, b"x")
                lease.release(own, ExitMode.FINISHED)
                try:
                    shared = lease.acquire("shared")
                except LeaseHeldError:
                    continue
                lease.release(shared, ExitMode.FINISHED)
        except BaseException as exc:
            failures.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(60)
    assert not failures
    assert not any(thread.is_alive() for thread in pool)
    assert probe.held() == 0
    acquired = probe.ops("acquire", "ok")
    assert acquired + probe.ops("acquire", "held") == 2 * threads * rounds
    assert probe.ops("release", "ok") == acquired
    assert probe.ops("checkpoint", "ok") == threads * rounds
    assert probe.durations("acquire") == 2 * threads * rounds


# -- exporter specifics -----------------------------------------------------------------------


def test_prometheus_one_observer_per_registry_and_namespace() -> None:
    registry = CollectorRegistry()
    first = PrometheusObserver(registry)
    with pytest.raises(ValueError, match="share one observer"):
        PrometheusObserver(registry)
    # the failed attempt left nothing behind, and another namespace is fine
    assert registry.get_sample_value("worklease_leases_held") == 0
    other = PrometheusObserver(registry, namespace="batch")
    other.on_acquire(AcquireEvent("w", token("w"), 0.01, None))
    assert registry.get_sample_value("batch_leases_held") == 1
    assert registry.get_sample_value("worklease_leases_held") == 0
    first.unregister()
    assert registry.get_sample_value("worklease_leases_held") is None
    PrometheusObserver(registry)  # the namespace is free again
    assert first.registry is registry


def test_prometheus_buckets_and_defaults() -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    observer.on_acquire(AcquireEvent("w", token("w"), 0.003, None))
    bucket = "worklease_operation_duration_seconds_bucket"
    labels = {"operation": "acquire"}
    assert registry.get_sample_value(bucket, {**labels, "le": "0.0025"}) == 0
    assert registry.get_sample_value(bucket, {**labels, "le": "0.005"}) == 1
    assert registry.get_sample_value(bucket, {**labels, "le": "10.0"}) == 1
    assert registry.get_sample_value(bucket, {**labels, "le": "+Inf"}) == 1
    sum_ = registry.get_sample_value("worklease_operation_duration_seconds_sum", labels)
    assert sum_ == pytest.approx(0.003)
    # every known label combination exists from the start
    assert (
        registry.get_sample_value(
            "worklease_operations_total", {"operation": "sweep", "outcome": "error"}
        )
        == 0
    )


def test_otel_instruments_units_and_error_type() -> None:
    probe = OtelProbe()
    observer = probe.observer
    fenced = token("w")
    observer.on_acquire(AcquireEvent("w", fenced, 0.003, None))
    error = FencedError("fenced", token=fenced)
    observer.on_renew(RenewEvent(fenced, 1, 0.001, error))
    observer.on_fenced(FencedEvent(fenced, Operation.RENEW, error))
    data = probe.reader.get_metrics_data()
    assert data is not None
    units = {
        metric.name: metric.unit
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert units == {
        "worklease.operations": "{operation}",
        "worklease.operation.duration": "s",
        "worklease.fenced": "{event}",
        "worklease.leases.held": "{lease}",
        "worklease.renewal.attempts": "{attempt}",
    }
    renew_points = [
        point
        for point in probe.points("worklease.operations")
        if dict(point.attributes or {}).get("worklease.operation") == "renew"
    ]
    assert [dict(point.attributes or {}) for point in renew_points] == [
        {"worklease.operation": "renew", "worklease.outcome": "fenced", "error.type": "FencedError"}
    ]
    acquire_points = [
        point
        for point in probe.points("worklease.operation.duration")
        if dict(point.attributes or {}).get("worklease.operation") == "acquire"
    ]
    assert len(acquire_points) == 1
    point = acquire_points[0]
    assert isinstance(point, HistogramDataPoint)
    assert dict(point.attributes or {}) == {
        "worklease.operation": "acquire",
        "worklease.outcome": "ok",
    }
    assert tuple(point.explicit_bounds) == DURATION_BUCKETS
    assert point.sum == pytest.approx(0.003)
    assert probe.held() == 0
    probe.provider.shutdown()


def test_otel_default_global_provider() -> None:
    observer = OpenTelemetryObserver()  # the global (no-op until configured) provider
    observer.on_acquire(AcquireEvent("w", token("w"), 0.001, None))
    assert observer.leases_held == 1


def test_importing_contrib_needs_no_extras() -> None:
    script = """
import sys
sys.modules["prometheus_client"] = None
sys.modules["opentelemetry"] = None
import worklease.contrib
from worklease.contrib import LoggingObserver
for name, extra in (("PrometheusObserver", "prometheus"), ("OpenTelemetryObserver", "otel")):
    try:
        getattr(worklease.contrib, name)
    except ImportError as exc:
        assert f"worklease's {extra} extra" in str(exc), exc
        assert "pip install " in str(exc), exc
    else:
        raise AssertionError(name + " imported without its extra")
try:
    worklease.contrib.Nothing
except AttributeError:
    pass
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "PrometheusObserver" in dir(worklease.contrib)


# -- logging ----------------------------------------------------------------------------------


def ex(record: logging.LogRecord) -> dict[str, Any]:
    """A record's attributes, ``extra`` fields included."""
    return record.__dict__


def summary(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    return [
        (record.levelname, ex(record)["worklease_operation"], ex(record)["worklease_outcome"])
        for record in caplog.records
        if record.name == "worklease.events"
    ]


SCENARIO_LOG = [
    ("INFO", "acquire", "ok"),
    ("DEBUG", "read_checkpoint", "ok"),
    ("INFO", "checkpoint", "ok"),
    ("DEBUG", "renew", "ok"),
    ("DEBUG", "acquire", "held"),
    ("INFO", "acquire", "ok"),
    ("INFO", "checkpoint", "fenced"),
    ("WARNING", "checkpoint", "fenced"),  # on_fenced
    ("INFO", "release", "ok"),
    ("INFO", "acquire", "ok"),
    ("WARNING", "renew", "expired"),
    ("INFO", "forget", "ok"),
    ("INFO", "acquire", "ok"),
    ("INFO", "release", "ok"),
    ("INFO", "sweep", "ok"),
]


def test_logging_sync(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="worklease.events")
    sync_scenario(LoggingObserver())
    assert summary(caplog) == SCENARIO_LOG
    records = [r for r in caplog.records if r.name == "worklease.events"]
    for record in records:
        record.getMessage()  # every record formats
        for key in (
            "worklease_work_id",
            "worklease_holder_id",
            "worklease_fencing_token",
            "worklease_duration",
            "worklease_error",
            "worklease_error_type",
        ):
            assert hasattr(record, key), (key, record.getMessage())
    first = records[0]
    assert (ex(first)["worklease_work_id"], ex(first)["worklease_holder_id"]) == ("job", "a")
    assert ex(first)["worklease_fencing_token"] == 1
    assert ex(first)["worklease_duration"] >= 0
    assert ex(first)["worklease_error"] is None
    checkpoint = records[2]
    assert ex(checkpoint)["worklease_size"] == 5
    held = records[4]
    assert ex(held)["worklease_holder_id"] is None  # the acquirer has no token
    assert ex(held)["worklease_held_by"] == "a"
    assert ex(held)["worklease_error_type"] == "LeaseHeldError"
    fenced = records[7]
    assert ex(fenced)["worklease_work_id"] == "job"
    assert ex(fenced)["worklease_holder_id"] == "a"
    assert ex(fenced)["worklease_fencing_token"] == 1
    assert ex(fenced)["worklease_duration"] is None
    assert ex(fenced)["worklease_error_type"] == "FencedError"
    assert "fenced" in ex(fenced)["worklease_error"]
    assert "fenced on checkpoint" in fenced.getMessage()
    lapsed = records[10]
    assert ex(lapsed)["worklease_attempt"] == 1
    assert ex(lapsed)["worklease_error_type"] == "LeaseExpiredError"
    release = records[8]
    assert ex(release)["worklease_exit_mode"] == "finished"
    assert ex(release)["worklease_holder_id"] == "b"
    sweep = records[-1]
    assert ex(sweep)["worklease_deleted"] == 1
    assert ex(sweep)["worklease_retention"] == 60
    assert ex(sweep)["worklease_work_id"] is None
    assert "1 row(s) deleted" in sweep.getMessage()


async def test_logging_async(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="worklease.events")
    await async_scenario(LoggingObserver())
    assert summary(caplog) == SCENARIO_LOG


def test_logging_levels_and_logger(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="custom")
    sync_scenario(LoggingObserver("custom"))
    got = [
        (r.levelname, ex(r)["worklease_operation"], ex(r)["worklease_outcome"])
        for r in caplog.records
        if r.name == "custom"
    ]
    assert got == [("WARNING", "checkpoint", "fenced"), ("WARNING", "renew", "expired")]
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="quiet")
    quiet = logging.getLogger("quiet")
    observer = LoggingObserver(quiet, level=logging.DEBUG, problem_level=logging.ERROR)
    assert observer.logger is quiet
    sync_scenario(observer)
    levels = {r.levelname for r in caplog.records if r.name == "quiet"}
    assert levels == {"DEBUG", "ERROR"}


def test_logging_pool(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="worklease.events")
    observer = LoggingObserver()
    lease = Lease(MemoryBackend(clock=FakeClock()), holder_id="p", ttl=POOL_TTL, observer=observer)
    Pool(lease, ["retire-me", "broken"], pool_work, observer=observer).run()
    slots = sorted(
        (r.levelname, ex(r)["worklease_operation"], ex(r)["worklease_work_id"])
        for r in caplog.records
        if r.name == "worklease.events" and ex(r)["worklease_operation"].startswith("pool.")
    )
    assert slots == [
        ("ERROR", "pool.slot_dead", "broken"),
        ("INFO", "pool.balance", None),  # the fair-share scan that took both
        ("INFO", "pool.scan", None),
        ("INFO", "pool.slot_acquired", "broken"),
        ("INFO", "pool.slot_acquired", "retire-me"),
        ("INFO", "pool.slot_retired", "retire-me"),
    ]
    balance = next(r for r in caplog.records if ex(r)["worklease_operation"] == "pool.balance")
    assert (ex(balance)["worklease_members"], ex(balance)["worklease_target"]) == (1, 2)
    assert ex(balance)["worklease_took"] == 2
    scan = next(r for r in caplog.records if ex(r)["worklease_operation"] == "pool.scan")
    assert ex(scan)["worklease_candidates"] == 2
    assert sorted(ex(scan)["worklease_acquired"]) == ["broken", "retire-me"]
    events = [r for r in caplog.records if r.name == "worklease.events"]
    dead = next(r for r in events if ex(r)["worklease_operation"] == "pool.slot_dead")
    assert ex(dead)["worklease_error_type"] == "PermanentError"
    caplog.clear()
    lost = LeaseWindowExhaustedError("window closed", token=token("w", 9))
    observer.on_slot_backoff(SlotBackoffEvent("w", lost, 2.5))
    [record] = [r for r in caplog.records if r.name == "worklease.events"]
    assert record.levelname == "WARNING"
    assert ex(record)["worklease_delay"] == 2.5
    assert (ex(record)["worklease_holder_id"], ex(record)["worklease_fencing_token"]) == ("h", 9)
