"""worklease.contrib.fastapi on PostgreSQL: the lifespan runs pools and leaders with the
application and hands their work over at shutdown; ``held`` holds a lease for a request."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from psycopg_pool import AsyncConnectionPool

import worklease
from worklease.contrib.fastapi import held, lifespan

TTL = 10.0


def _row(dsn: str, work_id: str) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT holder_id, exit_mode, checkpoint FROM worklease_leases WHERE work_id = %s",
            (work_id,),
        ).fetchone()


def _until(check: Callable[[], bool], seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:8]


class Service:
    """One application: its own connection pool, backend and lease (holder ``api-<run>``)."""

    def __init__(self, dsn: str, holder_id: str) -> None:
        self.connections = AsyncConnectionPool(
            dsn, min_size=1, max_size=4, open=False, kwargs={"autocommit": True}
        )
        self.backend = worklease.AsyncPostgresBackend(self.connections)
        self.lease = worklease.AsyncLease(self.backend, holder_id=holder_id, ttl=TTL)


@pytest.mark.postgres
def test_the_lifespan_runs_pools_and_leaders_and_hands_over_at_shutdown(
    postgres_dsn: str, run_id: str
) -> None:
    service = Service(postgres_dsn, f"api-{run_id}")
    work_ids = [f"fa-tenant-{run_id}-{n}" for n in range(3)]
    synced: dict[str, int] = {}
    terms: list[int] = []

    async def sync_tenant(token: worklease.Token, prior: worklease.Checkpoint) -> bytes:
        rounds = int(prior.state or b"0") + 1
        synced[token.work_id] = rounds
        await asyncio.sleep(3600)  # still working when the application stops
        return b"unreachable"

    async def schedule(token: worklease.Token) -> None:
        terms.append(token.fencing_token)
        await asyncio.sleep(3600)

    tenants = worklease.AsyncPool(service.lease, work_ids, sync_tenant, idle_interval=0.1)
    leader = worklease.AsyncLeader(service.lease, f"fa-scheduler-{run_id}")
    app = FastAPI(
        lifespan=lifespan(
            resources=[service.connections, service.backend],
            pools=[tenants],
            leaders=[(leader, schedule)],
        )
    )

    @app.get("/active")
    async def active() -> list[str]:
        return sorted(tenants.active_slots())

    with TestClient(app) as client:
        assert _until(lambda: len(synced) == 3 and len(terms) == 1)
        assert client.get("/active").json() == sorted(work_ids)
        for work_id in work_ids:
            assert _row(postgres_dsn, work_id)[:2] == (f"api-{run_id}", None)  # type: ignore[index]
    # Shut down: every tenant handed over ABANDONED (nothing written after the first round),
    # the leader's term released, the connection pool closed.
    for work_id in work_ids:
        row = _row(postgres_dsn, work_id)
        assert row is not None
        assert row[1] == "abandoned", row
    leader_row = _row(postgres_dsn, f"fa-scheduler-{run_id}")
    assert leader_row is not None
    assert leader_row[1] == "abandoned", leader_row  # the term in progress was cancelled
    assert service.connections.closed


@pytest.mark.postgres
def test_a_pool_that_fails_while_the_application_runs_is_logged(
    postgres_dsn: str, run_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    service = Service(postgres_dsn, f"api-{run_id}")

    async def never(token: worklease.Token, prior: worklease.Checkpoint) -> None:
        raise worklease.permanent(RuntimeError("cannot ever run"))

    pool = worklease.AsyncPool(service.lease, [f"fa-dead-{run_id}"], never, idle_interval=0.1)
    app = FastAPI(lifespan=lifespan(resources=[service.connections, service.backend], pools=[pool]))

    @app.get("/ping")
    async def ping() -> str:
        return "pong"

    with (
        caplog.at_level(logging.ERROR, logger="worklease.contrib.fastapi"),
        TestClient(app) as client,
    ):
        assert _until(lambda: any("ended with an error" in r.message for r in caplog.records))
        assert client.get("/ping").json() == "pong"  # the application keeps serving
    [record] = [r for r in caplog.records if r.name == "worklease.contrib.fastapi"]
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], worklease.AllSlotsDeadError)


@pytest.fixture
def reports(postgres_dsn: str, run_id: str) -> Iterator[tuple[TestClient, Service, list[str]]]:
    service = Service(postgres_dsn, f"api-{run_id}")
    calls: list[str] = []
    app = FastAPI(lifespan=lifespan(resources=[service.connections, service.backend]))
    # scope="function": the lease is released before the response goes out
    report_hold = Depends(held(service.lease, path="report_id"), scope="function")

    @app.post("/reports/{report_id}/rebuild")
    async def rebuild(
        report_id: str,
        fail: bool = False,
        hold: worklease.AsyncHold = report_hold,
    ) -> dict[str, Any]:
        calls.append(report_id)
        saved = hold.prior.state or b"0"
        step = 0 if saved == b"done" else int(saved)  # a finished report starts again
        await hold.checkpoint(str(step + 1).encode())
        if fail:
            raise RuntimeError("the rebuild failed half way")
        hold.finish_with(b"done")
        return {"token": hold.token.fencing_token, "resumed_at": step, "prev": hold.prior.prev_exit}

    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, service, calls


@pytest.mark.postgres
def test_a_route_holds_the_lease_and_releases_it_finished(
    reports: tuple[TestClient, Service, list[str]], postgres_dsn: str, run_id: str
) -> None:
    client, _, calls = reports
    report = f"fa-report-{run_id}"
    first = client.post(f"/reports/{report}/rebuild")
    assert first.status_code == 200, first.text
    assert first.json()["resumed_at"] == 0
    assert _row(postgres_dsn, report) == (f"api-{run_id}", "finished", b"done")
    again = client.post(f"/reports/{report}/rebuild")
    assert again.json()["prev"] == "finished"
    assert again.json()["token"] > first.json()["token"]
    assert calls == [report, report]


@pytest.mark.postgres
def test_a_failing_route_releases_abandoned_keeping_its_checkpoint(
    reports: tuple[TestClient, Service, list[str]], postgres_dsn: str, run_id: str
) -> None:
    client, _, _ = reports
    report = f"fa-report-{run_id}"
    failed = client.post(f"/reports/{report}/rebuild", params={"fail": "true"})
    assert failed.status_code == 500
    assert _row(postgres_dsn, report) == (f"api-{run_id}", "abandoned", b"1")
    resumed = client.post(f"/reports/{report}/rebuild")
    assert resumed.json()["resumed_at"] == 1
    assert resumed.json()["prev"] == "abandoned"


@pytest.mark.postgres
def test_a_held_work_id_answers_409_naming_the_holder(
    reports: tuple[TestClient, Service, list[str]], postgres_dsn: str, run_id: str
) -> None:
    client, _, calls = reports
    report = f"fa-report-{run_id}"
    other_backend = worklease.PostgresBackend.connect(postgres_dsn)
    other = worklease.Lease(other_backend, holder_id="batch-job", ttl=TTL)
    token = other.acquire(report)
    try:
        refused = client.post(f"/reports/{report}/rebuild")
        assert refused.status_code == 409
        detail = refused.json()["detail"]
        assert detail["work_id"] == report
        assert detail["holder_id"] == "batch-job"
        assert detail["expires_at"]
        assert calls == []  # the route never ran
    finally:
        other.release(token, worklease.ExitMode.FINISHED)
        other_backend.close()
    assert client.post(f"/reports/{report}/rebuild").status_code == 200


@pytest.mark.postgres
def test_a_request_naming_no_valid_work_id_is_a_400(
    reports: tuple[TestClient, Service, list[str]],
) -> None:
    client, _, calls = reports
    response = client.post("/reports/" + "x" * 2000 + "/rebuild")
    assert response.status_code == 400
    assert calls == []


def test_bad_arguments_are_refused_when_the_route_is_defined() -> None:
    lease = worklease.AsyncLease(worklease.AsyncMemoryBackend(), holder_id="h", ttl=TTL)
    with pytest.raises(TypeError):
        held(lease)  # neither a work ID nor a path parameter
    with pytest.raises(TypeError):
        held(lease, "a", path="b")
    with pytest.raises(worklease.ConfigError):
        held(lease, "a", timeout="soon")
    with pytest.raises(TypeError):
        held(object(), "a")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        lifespan(pools=[object()])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        lifespan(resources=[object()])  # type: ignore[list-item]


def test_importing_worklease_contrib_does_not_import_fastapi() -> None:
    code = (
        "import sys, worklease.contrib; "
        "assert 'fastapi' not in sys.modules and 'starlette' not in sys.modules; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


class Unanswering(worklease.AsyncMemoryBackend):
    """A backend whose acquires fail as a database that does not answer would."""

    async def acquire(self, work_id: str, holder_id: str, ttl: float) -> worklease.Token:
        raise worklease.BackendError("acquire: the server did not answer", transient=True)

    async def acquire_with_checkpoint(
        self, work_id: str, holder_id: str, ttl: float
    ) -> tuple[worklease.Token, worklease.Checkpoint]:
        raise worklease.BackendError("acquire: the server did not answer", transient=True)


def test_a_backend_that_does_not_answer_is_a_503_not_a_conflict() -> None:
    lease = worklease.AsyncLease(Unanswering(), holder_id="h", ttl=TTL)
    app = FastAPI()
    waiting = Depends(held(lease, "w", wait=True, timeout=0.5), scope="function")
    at_once = Depends(held(lease, "w"), scope="function")

    @app.get("/waiting")
    async def waits(hold: worklease.AsyncHold = waiting) -> str:
        return "unreachable"

    @app.get("/at-once")
    async def at_once_route(hold: worklease.AsyncHold = at_once) -> str:
        return "unreachable"

    with TestClient(app) as client:
        for path in ("/waiting", "/at-once"):
            response = client.get(path)
            assert response.status_code == 503, (path, response.text)
            assert "did not answer" in response.json()["detail"]
