# mypy: disable-error-code="untyped-decorator"
# (Celery is untyped)
"""worklease.contrib.celery against PostgreSQL: tasks run by a real Celery worker (threads,
in this process, in-memory broker) and eagerly; one run per key, a duplicate refused naming
the holder (or retried, or skipped), a failed run resumed from its checkpoint."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

celery = pytest.importorskip("celery")

from celery import Celery  # noqa: E402
from celery.contrib.testing.worker import start_worker  # noqa: E402
from psycopg_pool import ConnectionPool  # noqa: E402

import worklease  # noqa: E402
from tests import pg  # noqa: E402
from worklease import ConfigError, ExitMode, LeaseHeldError  # noqa: E402
from worklease.contrib.celery import LeasedTask, current_hold  # noqa: E402

pytestmark = pytest.mark.postgres


@pytest.fixture
def backend(postgres_dsn: str) -> Iterator[worklease.PostgresBackend]:
    with ConnectionPool(postgres_dsn, min_size=1, max_size=6, open=True) as pool:
        yield worklease.PostgresBackend(pool)


@pytest.fixture
def app() -> Celery:
    app = Celery(f"t{uuid.uuid4().hex[:6]}", broker="memory://", backend="cache+memory://")
    app.conf.task_store_eager_result = True
    app.conf.worker_hijack_root_logger = False  # pytest captures the logs
    return app


def key() -> str:
    return f"export-{uuid.uuid4().hex[:8]}"


def row(dsn: str, work_id: str) -> tuple[Any, ...]:
    rows = pg.execute(
        dsn,
        "SELECT holder_id, exit_mode, checkpoint FROM worklease_leases WHERE work_id = %s",
        (work_id,),
    )
    assert len(rows) == 1
    return rows[0]


class Failed(Exception):
    pass


def test_a_failed_run_is_resumed_from_its_checkpoint(
    app: Celery, backend: worklease.PostgresBackend, postgres_dsn: str
) -> None:
    app.conf.task_always_eager = True
    seen: list[tuple[str, int]] = []
    builds: list[int] = []

    def build() -> worklease.Lease:
        builds.append(1)
        return worklease.Lease(backend, holder_id="celery-a", ttl="30s")

    @app.task(base=LeasedTask, lease=build, lease_key="export/{report}")
    def export(report: str, fail_at: int | None = None) -> str:
        hold = current_hold()
        step = int(hold.prior.state or b"0")
        seen.append((str(hold.prior.prev_exit), step))
        while step < 4:
            step += 1
            if step == fail_at:
                raise Failed(f"step {step}")
            hold.checkpoint(str(step).encode())
        return f"{report}: done"

    report = key()
    with pytest.raises(Failed, match="step 3"):
        export.delay(report, fail_at=3).get()
    assert row(postgres_dsn, f"export/{report}") == ("celery-a", "abandoned", b"2")
    assert export.delay(report).get() == f"{report}: done"
    assert seen == [("none", 0), ("abandoned", 2)]  # the second run resumed after step 2
    assert row(postgres_dsn, f"export/{report}") == ("celery-a", "finished", b"4")
    assert builds == [1]  # the lease function ran once in this process


def test_retire_retires_the_key(
    app: Celery, backend: worklease.PostgresBackend, postgres_dsn: str
) -> None:
    app.conf.task_always_eager = True
    lease = worklease.Lease(backend, holder_id="celery-a", ttl="30s")

    @app.task(base=LeasedTask, lease=lease, lease_key=lambda report: f"once/{report}")
    def once(report: str) -> str:
        raise worklease.Retire(b"final")

    report = key()
    assert once.delay(report).get() is None
    assert row(postgres_dsn, f"once/{report}") == ("celery-a", "retired", b"final")


@pytest.mark.parametrize("on_held", ["raise", "skip"])
def test_a_duplicate_while_one_runs_is_refused_naming_the_holder(
    app: Celery,
    backend: worklease.PostgresBackend,
    postgres_dsn: str,
    on_held: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two deliveries of one key on a worker with two threads: the second does not run."""
    started, go = threading.Event(), threading.Event()
    runs: list[str] = []
    lease = worklease.Lease(backend, holder_id="worker-1", ttl="30s")

    @app.task(
        base=LeasedTask,
        lease=lease,
        lease_key="job/{n}",
        lease_on_held=on_held,
        name=f"job-{on_held}",
    )
    def job(n: str) -> str:
        runs.append(n)
        started.set()
        assert go.wait(30)
        return "ran"

    caplog.set_level(logging.INFO, logger="worklease.contrib.celery")
    n = key()
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        first = job.delay(n)
        assert started.wait(30)
        second = job.delay(n)
        if on_held == "raise":
            with pytest.raises(LeaseHeldError, match=f"work ID 'job/{n}' is held by 'worker-1'"):
                second.get(timeout=30)
        else:
            assert second.get(timeout=30) is None
        go.set()
        assert first.get(timeout=30) == "ran"
    assert runs == [n]
    assert row(postgres_dsn, f"job/{n}")[:2] == ("worker-1", "finished")
    skipped = [r.getMessage() for r in caplog.records if "not run" in r.getMessage()]
    if on_held == "skip":
        assert len(skipped) == 1
        assert skipped[0].startswith(
            f"{job.name}: not run, work ID 'job/{n}' is held by 'worker-1'"
        )
    else:
        assert skipped == []


def test_a_refused_run_is_retried_once_the_holder_is_done(
    app: Celery, backend: worklease.PostgresBackend, postgres_dsn: str
) -> None:
    """Another worker holds the key: the run is retried (countdown 0.2 s) and runs once the
    holder released it ABANDONED, resuming from its checkpoint."""
    other = worklease.Lease(backend, holder_id="other-worker", ttl="30s")
    lease = worklease.Lease(backend, holder_id="worker-1", ttl="30s")
    priors: list[tuple[str, bytes | None]] = []

    @app.task(
        base=LeasedTask,
        bind=True,
        lease=lease,
        lease_key="sync/{tenant}",
        lease_on_held="retry",
        lease_retry_countdown=0.2,
        max_retries=100,
    )
    def sync(self: LeasedTask, tenant: str) -> int:
        priors.append((str(self.hold.prior.prev_exit), self.hold.prior.state))
        return int(self.request.retries)

    tenant = key()
    token = other.acquire(f"sync/{tenant}")
    other.checkpoint(token, b"half")
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        result = sync.delay(tenant)
        # Until the worker has refused a run at least once (Celery records the retry), on a
        # loaded machine however long that takes; then the holder lets go.
        deadline = time.monotonic() + 60
        while result.state != "RETRY":
            assert time.monotonic() < deadline, f"no refused run within 60 s ({result.state})"
            time.sleep(0.02)
        other.release(token, ExitMode.ABANDONED)
        retries = result.get(timeout=60)
    assert retries >= 1
    assert priors == [("abandoned", b"half")]
    assert row(postgres_dsn, f"sync/{tenant}")[:2] == ("worker-1", "finished")


def test_a_refused_run_past_max_retries_fails_naming_the_holder(
    app: Celery, backend: worklease.PostgresBackend
) -> None:
    app.conf.task_always_eager = True
    other = worklease.Lease(backend, holder_id="other-worker", ttl="30s")

    @app.task(
        base=LeasedTask,
        lease=worklease.Lease(backend, holder_id="worker-1", ttl="30s"),
        lease_key="k/{x}",
        lease_on_held="retry",
        lease_retry_countdown=0,
        max_retries=2,
    )
    def task(x: str) -> None:
        raise AssertionError("never runs")  # pragma: no cover

    x = key()
    token = other.acquire(f"k/{x}")
    try:
        with pytest.raises(LeaseHeldError, match="is held by 'other-worker'"):
            task.apply(args=(x,)).get()
    finally:
        other.release(token, ExitMode.FINISHED)


def test_a_retry_from_the_body_is_never_refused_by_its_own_run(
    app: Celery, backend: worklease.PostgresBackend, postgres_dsn: str
) -> None:
    """``self.retry()`` sends the retry at once: the lease is released (ABANDONED, with its
    checkpoint) before, so the retry, on a broker polled every 0.5 ms and a worker with
    spare threads, finds the key free and resumes."""
    app.conf.broker_transport_options = {"polling_interval": 0.0005}
    lease = worklease.Lease(backend, holder_id="w", ttl="30s")
    seen: list[tuple[str, str, bytes | None]] = []

    @app.task(base=LeasedTask, bind=True, lease=lease, lease_key="r/{n}", max_retries=3)
    def flaky(self: LeasedTask, n: str) -> str:
        seen.append((n, str(self.hold.prior.prev_exit), self.hold.prior.state))
        if self.request.retries == 0:
            self.hold.checkpoint(b"half")
            raise self.retry(countdown=0)
        return "done"

    names = [key() for _ in range(20)]
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        results = [flaky.delay(n) for n in names]
        assert [r.get(timeout=60) for r in results] == ["done"] * 20
    for n in names:
        assert (n, "abandoned", b"half") in seen  # the retry resumed after the checkpoint
        assert row(postgres_dsn, f"r/{n}") == ("w", "finished", b"half")


def test_one_lease_function_is_built_once_for_all_its_tasks(
    app: Celery, backend: worklease.PostgresBackend
) -> None:
    app.conf.task_always_eager = True
    builds: list[int] = []

    def build() -> worklease.Lease:
        builds.append(1)
        return worklease.Lease(backend, holder_id="w", ttl="30s")

    @app.task(base=LeasedTask, lease=build, lease_key="a/{x}")
    def first(x: str) -> None: ...

    @app.task(base=LeasedTask, lease=build, lease_key="b/{x}")
    def second(x: str) -> None: ...

    first.delay("1").get()
    second.delay("1").get()
    first.delay("2").get()
    assert builds == [1]


def test_misconfigured_tasks_say_what_is_wrong(
    app: Celery, backend: worklease.PostgresBackend
) -> None:
    app.conf.task_always_eager = True
    lease = worklease.Lease(backend, holder_id="w", ttl="30s")

    @app.task(base=LeasedTask, lease=lease, lease_key="r/{missing}")
    def wrong_key(report: str) -> None: ...

    @app.task(base=LeasedTask, lease_key="r/{report}")
    def no_lease(report: str) -> None: ...

    @app.task(base=LeasedTask, lease=lambda: "nope", lease_key="r/{report}")
    def bad_factory(report: str) -> None: ...

    @app.task(base=LeasedTask, lease=lease, lease_key="r/{report}", lease_on_held="wait")
    def bad_mode(report: str) -> None: ...

    @app.task(base=LeasedTask, lease=lease)
    def no_key(report: str) -> None: ...

    for task, message in (
        (
            wrong_key,
            "lease_key 'r/{missing}' names 'missing', which is not an argument of the task "
            "(report)",
        ),
        (no_lease, "LeasedTask needs the lease option"),
        (bad_factory, "the lease function returned str, not a worklease.Lease"),
        (bad_mode, "lease_on_held must be one of raise, retry, skip, got 'wait'"),
        (no_key, "LeasedTask needs the lease_key option"),
    ):
        with pytest.raises(
            ConfigError,
            match=message.replace("(", r"\(")
            .replace(")", r"\)")
            .replace("{", r"\{")
            .replace("}", r"\}"),
        ):
            task.delay("x").get()
    with pytest.raises(RuntimeError, match="only available inside a LeasedTask run"):
        current_hold()
