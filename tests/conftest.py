"""Configuration shared by every test directory: the PostgreSQL test database.

PostgreSQL tests are marked ``postgres``. Without any PostgreSQL they skip with a loud reason;
with ``CI=true`` a skipped PostgreSQL test fails the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests import pg

_IN_CI = os.environ.get("CI", "").lower() == "true"
_state: dict[str, object] = {"postgres_skips": 0}


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The DSN of a reachable PostgreSQL server (found or started for this run)."""
    try:
        with pg.server() as dsn:
            yield dsn
    except pg.Unavailable as exc:
        reason = f"PostgreSQL unavailable, PostgreSQL tests skipped: {exc}"
        if _IN_CI:
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_dsn(postgres_server: str) -> Iterator[str]:
    """The DSN of this run's own database, with the worklease schema applied."""
    with pg.fresh_database(postgres_server) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def pgbouncer(postgres_server: str) -> Iterator[pg.PgBouncer]:
    """A PgBouncer in transaction mode (its other settings PgBouncer's defaults) in front of
    the test server, for this run."""
    try:
        bouncer = pg.PgBouncer(postgres_server, pool_mode="transaction")
        bouncer.start()
    except pg.Unavailable as exc:
        reason = f"PgBouncer unavailable, PgBouncer tests skipped: {exc}"
        if _IN_CI:
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="session")
def pgbouncer_dsn(pgbouncer: pg.PgBouncer, postgres_dsn: str) -> Iterator[str]:
    """This run's database reached through the transaction-mode PgBouncer. At the end of the
    run no LISTEN may be left on any of its server connections (every listener that went
    through it either never listened or took its LISTEN back)."""
    routed = pgbouncer.route(postgres_dsn)
    yield routed
    leaked = pg.pooled_listeners(routed, postgres_dsn)
    assert leaked == 0, f"{leaked} PgBouncer server connection(s) left LISTENing"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and "postgres" in report.keywords:
        _state["postgres_skips"] = int(str(_state["postgres_skips"])) + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = int(str(_state["postgres_skips"]))
    if skipped:
        terminalreporter.write_sep(
            "!", f"{skipped} PostgreSQL test(s) were SKIPPED: no database was reachable", red=True
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _IN_CI and int(str(_state["postgres_skips"])) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
