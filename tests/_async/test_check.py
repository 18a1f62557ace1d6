"""``check_postgres`` (``worklease check``) against real servers: direct, behind PgBouncer
(transaction and session mode), with the schema missing, as a read-only role and a role with a
tiny ``statement_timeout``, and on a multi-host DSN naming two primaries. The judgements on
their own are in ``tests/unit``."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests import pg
from worklease import CheckReport, ConfigError, acheck_postgres

pytestmark = pytest.mark.postgres

NAMES = [
    "connection",
    "schema",
    "isolation",
    "writes",
    "clock",
    "synchronous_commit",
    "replication",
    "timeouts",
    "pooler",
    "connections",
    "listen",
]


def statuses(report: CheckReport) -> dict[str, str]:
    return {f.name: f.status for f in report.findings}


@contextlib.contextmanager
def role(dsn: str, setting: str) -> Iterator[tuple[str, str]]:
    """A login role that may use the lease table of ``dsn``'s database, with ``ALTER ROLE
    ... SET setting``; yields its name and its DSN; dropped afterwards."""
    name = f"worklease_check_{uuid.uuid4().hex[:10]}"
    password = uuid.uuid4().hex
    pg.execute(dsn, f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    try:
        pg.execute(dsn, f"GRANT SELECT, INSERT, UPDATE, DELETE ON worklease_leases TO {name}")
        pg.execute(dsn, f"GRANT USAGE ON SEQUENCE worklease_fencing_seq TO {name}")
        pg.execute(dsn, f"ALTER ROLE {name} SET {setting}")
        yield name, make_conninfo(dsn, user=name, password=password)
    finally:
        pg.execute(dsn, f"DROP OWNED BY {name}")
        pg.execute(dsn, f"DROP ROLE {name}")


async def test_a_ready_primary_without_a_standby_is_ok_but_warns_no_failover_is_possible(
    postgres_dsn: str,
) -> None:
    standbys = pg.execute(postgres_dsn, "SELECT count(*) FROM pg_stat_replication")
    assert standbys == [(0,)], "the test server is expected to have no standby"
    report = await acheck_postgres(postgres_dsn, probe_timeout=2.0)
    assert [f.name for f in report.findings] == NAMES
    expected = {**dict.fromkeys(NAMES, "ok"), "replication": "warn"}
    assert statuses(report) == expected, report.findings
    assert "no failover possible" in report["replication"].detail
    assert report.ok
    assert not report.clean
    assert "a write to worklease_leases is accepted" in report["writes"].detail
    assert "14 connections for 1 process" in report["connections"].detail
    assert "handoff is instant" in report["listen"].detail
    assert report.to_dict()["findings"][0]["name"] == "connection"


async def test_behind_transaction_pooling_the_pooler_and_listener_warn(
    postgres_dsn: str, pgbouncer_dsn: str
) -> None:
    report = await acheck_postgres(pgbouncer_dsn, listen_dsn=postgres_dsn, probe_timeout=2.0)
    found = statuses(report)
    assert found["pooler"] == "warn"
    assert "transaction-pooling proxy" in report["pooler"].detail
    assert found["listen"] == "warn"
    assert "fall back to polling" in report["listen"].detail
    assert found["listen_dsn"] == "ok"  # the direct route works
    assert found["schema"] == "ok"
    # this PgBouncer has no admin_users: its pool cannot be read, the rule is said instead
    assert found["connections"] == "warn"
    assert "admin console refuses user" in report["connections"].detail
    assert "needs 14 server connections" in report["connections"].detail
    assert report.ok
    assert not report.clean


@pytest.fixture(scope="module")
def session_pgbouncer(postgres_server: str) -> Iterator[pg.PgBouncer]:
    """A PgBouncer in session mode (default pool size 20) whose admin console lets the test
    user read its settings."""
    user = str(conninfo_to_dict(postgres_server).get("user") or "postgres")
    bouncer = pg.PgBouncer(postgres_server, pool_mode="session", admin_users=user)
    try:
        bouncer.start()
    except pg.Unavailable as exc:
        pytest.skip(f"PgBouncer unavailable: {exc}")  # CI=true counts the skip as a failure
    try:
        yield bouncer
    finally:
        bouncer.stop()


async def test_behind_pgbouncer_in_session_mode_a_pool_of_20_does_not_fit_its_default_pool(
    postgres_dsn: str, session_pgbouncer: pg.PgBouncer
) -> None:
    routed = session_pgbouncer.route(postgres_dsn)
    database = conninfo_to_dict(postgres_dsn)["dbname"]
    default = await acheck_postgres(routed, probe_timeout=2.0)
    assert default["connections"].status == "ok"
    assert default["connections"].detail.startswith("PgBouncer in session mode: 14 connections")
    assert default["pooler"].status == "ok"  # session pooling shares no sessions
    twenty = await acheck_postgres(routed, pool_size=20, probe_timeout=2.0)
    finding = twenty["connections"]
    assert finding.status == "fail"
    assert f"its pool for database '{database}' has 20" in finding.detail
    assert "30 connections for 1 process (30 each: pool max_size 20 + 4 renewal" in finding.detail
    assert not twenty.ok


async def test_a_read_only_role_fails_naming_the_setting_and_the_role(postgres_dsn: str) -> None:
    with role(postgres_dsn, "default_transaction_read_only = on") as (name, dsn):
        report = await acheck_postgres(dsn, probe_timeout=2.0)
    writes = report["writes"]
    assert writes.status == "fail"
    assert writes.detail.startswith(f"default_transaction_read_only is on (set for role '{name}')")
    assert f"ALTER ROLE {name} RESET default_transaction_read_only" in writes.detail
    assert report["schema"].status == "ok"
    assert not report.ok


async def test_a_read_only_database_fails_naming_the_database(postgres_server: str) -> None:
    with pg.fresh_database(postgres_server) as dsn:
        database = conninfo_to_dict(dsn)["dbname"]
        pg.execute(dsn, f"ALTER DATABASE {database} SET default_transaction_read_only = on")
        report = await acheck_postgres(dsn, probe_timeout=2.0)
    writes = report["writes"]
    assert writes.status == "fail"
    assert f"(set for database '{database}')" in writes.detail
    assert f"ALTER DATABASE {database} RESET default_transaction_read_only" in writes.detail


async def test_a_role_s_1ms_statement_timeout_is_named_and_the_check_still_answers(
    postgres_dsn: str,
) -> None:
    with role(postgres_dsn, "statement_timeout = '1ms'") as (name, dsn):
        report = await acheck_postgres(dsn, probe_timeout=2.0)
    assert not [f for f in report.findings if "could not check" in f.detail], report.findings
    timeouts = report["timeouts"]
    assert timeouts.status == "fail"
    assert timeouts.detail.startswith(
        f"statement_timeout=1ms (set for role '{name}') cancels worklease's own statements"
    )
    assert "TTL 30s" in timeouts.detail
    found = statuses(report)
    assert (found["schema"], found["writes"], found["connections"]) == ("ok", "ok", "ok")


@pytest.fixture(scope="module")
def second_primary(postgres_server: str) -> Iterator[str]:
    """A private cluster, a primary of its own (as a promoted standby is after a failover
    whose old primary came back), reachable with the test server's user and database;
    yields its ``host:port``."""
    bindir = pg.find_bindir()
    if bindir is None:
        pytest.fail("no PostgreSQL server binaries for a second primary", pytrace=False)
    cluster = pg.ThrowawayCluster(bindir)
    try:
        cluster.start()
        params = conninfo_to_dict(postgres_server)
        user, database = params.get("user") or "postgres", params.get("dbname") or "postgres"
        if user != "postgres":
            pg.execute(cluster.dsn, f'CREATE ROLE "{user}" LOGIN SUPERUSER')
        if database != "postgres":
            pg.execute(cluster.dsn, f'CREATE DATABASE "{database}"')
        yield f"127.0.0.1:{cluster.port}"
    finally:
        cluster.stop()


async def test_two_primaries_in_a_multi_host_dsn_fail_as_a_split_brain(
    postgres_server: str, second_primary: str
) -> None:
    host, port = pg.address(postgres_server)
    other_host, other_port = second_primary.split(":")
    dsn = make_conninfo(
        postgres_server,
        host=f"{host},{other_host}",
        port=f"{port},{other_port}",
        target_session_attrs="read-write",
    )
    report = await acheck_postgres(dsn, probe_timeout=2.0)
    assert [f.name for f in report.findings][:2] == ["connection", "hosts"]
    hosts = report["hosts"]
    assert hosts.status == "fail"
    assert hosts.detail.startswith(
        f"split brain: {host}:{port} and {second_primary} both answer as primary"
    )
    assert f"this DSN (target_session_attrs=read-write) reaches {host}:{port}" in hosts.detail
    assert not report.ok


@pytest.fixture
def empty_database(postgres_server: str) -> Iterator[str]:
    with pg.fresh_database(postgres_server) as dsn:
        pg.execute(dsn, "DROP TABLE worklease_leases; DROP SEQUENCE worklease_fencing_seq")
        yield dsn


async def test_a_missing_schema_fails(empty_database: str) -> None:
    report = await acheck_postgres(empty_database, probe_timeout=2.0)
    assert report["schema"].status == "fail"
    assert "worklease migrate" in report["schema"].detail
    assert not report.ok


async def test_an_outdated_table_fails(empty_database: str) -> None:
    pg.execute(
        empty_database,
        "CREATE SEQUENCE worklease_fencing_seq; CREATE TABLE worklease_leases "
        "(work_id TEXT PRIMARY KEY, holder_id TEXT, fencing_token INTEGER)",
    )
    report = await acheck_postgres(empty_database, probe_timeout=2.0)
    detail = report["schema"].detail
    assert report["schema"].status == "fail"
    assert "missing columns: expires_at" in detail
    assert "fencing_token is integer, not bigint" in detail


async def test_an_unreachable_server_is_one_failed_finding() -> None:
    port = pg._free_port()
    report = await acheck_postgres(f"host=127.0.0.1 port={port} user=postgres connect_timeout=2")
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
        ({"pool_size": 0}, "pool_size"),
        ({"processes": True}, "processes"),
    ],
)
async def test_bad_arguments_raise_before_any_io(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        await acheck_postgres("host=nowhere.invalid", **kwargs)  # type: ignore[arg-type]
