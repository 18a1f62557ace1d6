# Generated from tests/_async/test_check.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""``check_postgres`` (``worklease check``) against real servers: direct, behind PgBouncer,
and with the schema missing. The judgements on their own are in ``tests/unit``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import pg
from worklease import CheckReport, ConfigError, check_postgres

pytestmark = pytest.mark.postgres

NAMES = [
    "connection",
    "schema",
    "isolation",
    "clock",
    "synchronous_commit",
    "replication",
    "timeouts",
    "pooler",
    "listen",
]


def statuses(report: CheckReport) -> dict[str, str]:
    return {f.name: f.status for f in report.findings}


def test_a_direct_connection_to_a_ready_database_is_clean(postgres_dsn: str) -> None:
    report = check_postgres(postgres_dsn, probe_timeout=2.0)
    assert [f.name for f in report.findings] == NAMES
    assert statuses(report) == dict.fromkeys(NAMES, "ok"), report.findings
    assert report.ok
    assert report.clean
    assert "handoff is instant" in report["listen"].detail
    assert report.to_dict()["findings"][0]["name"] == "connection"


def test_behind_transaction_pooling_the_pooler_and_listener_warn(
    postgres_dsn: str, pgbouncer_dsn: str
) -> None:
    report = check_postgres(pgbouncer_dsn, listen_dsn=postgres_dsn, probe_timeout=2.0)
    found = statuses(report)
    assert found["pooler"] == "warn"
    assert "transaction-pooling proxy" in report["pooler"].detail
    assert found["listen"] == "warn"
    assert "fall back to polling" in report["listen"].detail
    assert found["listen_dsn"] == "ok"  # the direct route works
    assert found["schema"] == "ok"
    assert report.ok
    assert not report.clean


@pytest.fixture
def empty_database(postgres_server: str) -> Iterator[str]:
    with pg.fresh_database(postgres_server) as dsn:
        pg.execute(dsn, "DROP TABLE worklease_leases; DROP SEQUENCE worklease_fencing_seq")
        yield dsn


def test_a_missing_schema_fails(empty_database: str) -> None:
    report = check_postgres(empty_database, probe_timeout=2.0)
    assert report["schema"].status == "fail"
    assert "worklease migrate" in report["schema"].detail
    assert not report.ok


def test_an_outdated_table_fails(empty_database: str) -> None:
    pg.execute(
        empty_database,
        "CREATE SEQUENCE worklease_fencing_seq; CREATE TABLE worklease_leases "
        "(work_id TEXT PRIMARY KEY, holder_id TEXT, fencing_token INTEGER)",
    )
    report = check_postgres(empty_database, probe_timeout=2.0)
    detail = report["schema"].detail
    assert report["schema"].status == "fail"
    assert "missing columns: expires_at" in detail
    assert "fencing_token is integer, not bigint" in detail


def test_an_unreachable_server_is_one_failed_finding() -> None:
    port = pg._free_port()
    report = check_postgres(f"host=127.0.0.1 port={port} user=postgres connect_timeout=2")
    assert [(f.name, f.status) for f in report.findings] == [("connection", "fail")]
    assert "cannot connect" in report.findings[0].detail


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl": 0}, "ttl"),
        ({"ttl": float("inf")}, "ttl"),
        ({"probe_timeout": 0}, "probe_timeout"),
        ({"probe_timeout": True}, "probe_timeout"),
        ({"schema": ""}, "schema"),
        ({"listen_dsn": "host='open"}, "listen_dsn"),
    ],
)
def test_bad_arguments_raise_before_any_io(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_postgres("host=nowhere.invalid", **kwargs)  # type: ignore[arg-type]
