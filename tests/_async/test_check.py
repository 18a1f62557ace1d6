"""``check_postgres`` (``worklease check``) against real servers: direct, behind PgBouncer
(transaction and session mode, and a round-robin pool whose sharing two connections do not
show), through a plain port forward, with the schema missing, as a read-only role, a role
missing grants and a role with a tiny ``statement_timeout``, and on multi-host DSNs naming
two primaries, a standby behind random load balancing, and a host that never answers. The
judgements on their own are in ``tests/unit``."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests import pg
from tests.proxy import proxied
from worklease import AsyncPostgresBackend, CheckReport, ConfigError, acheck_postgres

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
def role(
    dsn: str,
    setting: str | None = None,
    grants: str = "SELECT, INSERT, UPDATE, DELETE",
    sequence: bool = True,
) -> Iterator[tuple[str, str]]:
    """A login role with ``grants`` on the lease table of ``dsn``'s database (and USAGE on
    the sequence unless not ``sequence``), with ``ALTER ROLE ... SET setting``; yields its
    name and its DSN; dropped afterwards."""
    name = f"worklease_check_{uuid.uuid4().hex[:10]}"
    password = uuid.uuid4().hex
    pg.execute(dsn, f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    try:
        pg.execute(dsn, f"GRANT {grants} ON worklease_leases TO {name}")
        if sequence:
            pg.execute(dsn, f"GRANT USAGE ON SEQUENCE worklease_fencing_seq TO {name}")
        if setting is not None:
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


@pytest.fixture(scope="module")
def round_robin_pgbouncer(postgres_server: str) -> Iterator[pg.PgBouncer]:
    """A PgBouncer in transaction mode that hands out its idle server connections in turn
    (``server_round_robin = 1``, set on its admin console, which the test user may read):
    two client connections in a row meet different server sessions, so a probe of two
    connections does not show that sessions are shared."""
    user = str(conninfo_to_dict(postgres_server).get("user") or "postgres")
    bouncer = pg.PgBouncer(postgres_server, pool_mode="transaction", admin_users=user)
    try:
        bouncer.start()
    except pg.Unavailable as exc:
        pytest.skip(f"PgBouncer unavailable: {exc}")  # CI=true counts the skip as a failure
    try:
        admin = make_conninfo(bouncer.route(postgres_server), dbname="pgbouncer")
        with psycopg.connect(admin, autocommit=True) as conn:
            psycopg.ClientCursor(conn).execute("SET server_round_robin = 1")
        yield bouncer
    finally:
        bouncer.stop()


async def test_behind_a_round_robin_transaction_pooler_no_session_setting_stays_behind(
    postgres_server: str, round_robin_pgbouncer: pg.PgBouncer
) -> None:
    """The role's statement_timeout (5s, for this database) is below what the check lifts on
    a direct connection; behind the pooler a session-level change would stay on a pooled
    server connection for the next client. PgBouncer's own word (pool_mode on its admin
    console) says the sessions are shared."""
    with pg.fresh_database(postgres_server) as direct:
        params = conninfo_to_dict(direct)
        user, database = params.get("user") or "postgres", params["dbname"]
        pg.execute(direct, f"ALTER ROLE {user} IN DATABASE {database} SET statement_timeout = '5s'")
        routed = round_robin_pgbouncer.route(direct)
        # two server connections in the pool, idle: the probe's two connections get one each
        first, second = psycopg.connect(routed), psycopg.connect(routed)
        for conn in (first, second):
            conn.execute("SELECT 1")  # each in a transaction: a server connection each
        for conn in (first, second):
            conn.rollback()
            conn.close()
        report = await acheck_postgres(routed, probe_timeout=2.0)
        with psycopg.connect(routed, autocommit=True, prepare_threshold=None) as conn:
            seen = {
                conn.execute("SELECT current_setting('statement_timeout')").fetchone()
                for _ in range(20)  # in turn over every server connection of the pool
            }
    assert seen == {("5s",)}, seen
    pooler = report["pooler"]
    assert pooler.status == "warn"
    assert pooler.detail.startswith(
        "PgBouncer in transaction mode (pool_mode=transaction, read on its admin console) "
        "shares server sessions between clients"
    )
    assert report["connections"].detail.startswith("PgBouncer in transaction mode")
    timeouts = report["timeouts"]
    assert "statement_timeout=5s (set for role" in timeouts.detail
    assert "check left statement_timeout as it is in its own session" in timeouts.detail


async def test_a_plain_port_forward_is_no_pooler_and_is_judged_by_the_server_s_limits(
    postgres_dsn: str,
) -> None:
    host, port = pg.address(postgres_dsn)
    with proxied(host, port) as forward:
        report = await acheck_postgres(pg.via(postgres_dsn, forward.port), probe_timeout=2.0)
    pooler = report["pooler"]
    assert pooler.status == "ok"
    assert "port forwarding or NAT, not a pooler" in pooler.detail
    connections = report["connections"]
    assert connections.status == "ok"
    assert "the server allows (max_connections" in connections.detail
    assert report["timeouts"].status == "ok"


@pytest.mark.parametrize(
    ("grants", "sequence", "status", "lacks", "fix"),
    [
        (
            "SELECT, UPDATE, DELETE",
            False,
            "fail",
            "lacks INSERT on worklease_leases and USAGE on worklease_fencing_seq: every "
            "acquire is refused",
            "GRANT INSERT ON public.worklease_leases TO {name}; GRANT USAGE ON SEQUENCE "
            "public.worklease_fencing_seq TO {name}",
        ),
        (
            "SELECT, INSERT, UPDATE",
            True,
            "warn",
            "lacks DELETE on worklease_leases: forget() and the vacuum (worklease sweep) are "
            "refused",
            "GRANT DELETE ON public.worklease_leases TO {name}",
        ),
    ],
)
async def test_a_role_missing_grants_is_told_the_grant(
    postgres_dsn: str, grants: str, sequence: bool, status: str, lacks: str, fix: str
) -> None:
    with role(postgres_dsn, grants=grants, sequence=sequence) as (name, dsn):
        report = await acheck_postgres(dsn, probe_timeout=2.0)
    writes = report["writes"]
    assert writes.status == status, writes
    assert writes.detail.startswith(f"role '{name}' {lacks}")
    assert writes.detail.endswith(fix.format(name=name))
    assert report.ok is (status != "fail")


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
def second_cluster(postgres_server: str) -> Iterator[pg.ThrowawayCluster]:
    """A private cluster, a primary of its own (as a promoted standby is after a failover
    whose old primary came back), reachable with the test server's user and database."""
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
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def second_primary(second_cluster: pg.ThrowawayCluster) -> str:
    """The second cluster's ``host:port``."""
    return f"127.0.0.1:{second_cluster.port}"


@pytest.fixture(scope="module")
def standby(second_cluster: pg.ThrowawayCluster) -> Iterator[str]:
    """A streaming standby of the second cluster; yields its ``host:port``."""
    cluster = pg.ThrowawayCluster(second_cluster.bindir)
    try:
        cluster.start_as_standby(second_cluster)
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


async def test_random_load_balancing_over_a_standby_fails_unless_the_route_wants_a_primary(
    postgres_server: str, second_primary: str, standby: str
) -> None:
    (host, port), (_, standby_port) = second_primary.split(":"), standby.split(":")
    dsn = make_conninfo(
        postgres_server,
        host=f"{host},{host}",
        port=f"{port},{standby_port}",
        load_balance_hosts="random",
    )
    anyone = (await acheck_postgres(dsn, probe_timeout=2.0))["hosts"]
    assert anyone.status == "fail", anyone
    assert anyone.detail.startswith(
        "load_balance_hosts=random with target_session_attrs=any: each connection takes a host "
        f"at random, so about 1 in 2 of the application's connections land on a standby ({standby})"
    )
    primary = make_conninfo(dsn, target_session_attrs="read-write")
    writing = (await acheck_postgres(primary, probe_timeout=2.0))["hosts"]
    assert writing.status == "ok", writing
    assert (
        "this DSN (target_session_attrs=read-write, load_balance_hosts=random) reaches "
        f"{second_primary}" in writing.detail
    )


async def test_a_standby_fails_writes_replication_and_listen_without_waiting(
    postgres_server: str, standby: str
) -> None:
    host, port = standby.split(":")
    report = await acheck_postgres(make_conninfo(postgres_server, host=host, port=port))
    found = statuses(report)
    assert (found["writes"], found["replication"], found["listen"]) == ("fail",) * 3
    assert "transaction_read_only is on" in report["writes"].detail
    # LISTEN is refused in recovery: said at once, not after the listener's deadline
    assert report["listen"].detail.startswith("this DSN reaches a hot standby")


async def test_a_host_that_never_answers_costs_one_connect_timeout_of_the_dsn_s_own(
    postgres_dsn: str,
) -> None:
    """A host that accepts connections and never answers, first in a multi-host DSN with
    connect_timeout=2: the check takes the DSN's timeout (not 10 s) once for the route and
    once for all the hosts asked at once, and the listener runs on the host reached."""
    host, port = pg.address(postgres_dsn)
    with proxied(host, port) as hung:
        hung.stall()
        dsn = make_conninfo(
            postgres_dsn,
            host=f"127.0.0.1,{host}",
            port=f"{hung.port},{port}",
            connect_timeout="2",
            target_session_attrs="read-write",
        )
        started = time.monotonic()
        report = await acheck_postgres(dsn, probe_timeout=2.0)
        elapsed = time.monotonic() - started
    hosts = report["hosts"]
    assert hosts.status == "warn", hosts
    assert f"127.0.0.1:{hung.port} did not answer (connection timeout expired)" in hosts.detail
    assert report["listen"].status == "ok", report["listen"]
    assert report.ok, report.findings
    assert elapsed < 15, elapsed  # sequential 10 s timeouts took about 50 s


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


@pytest.fixture
def legacy_database(postgres_server: str) -> Iterator[str]:
    """A database migrated by an earlier version: the index on updated_at is there."""
    with pg.fresh_database(postgres_server) as dsn:
        pg.execute(
            dsn,
            "CREATE INDEX idx_worklease_leases_updated_at ON worklease_leases (updated_at); "
            "ALTER TABLE worklease_leases RESET (fillfactor)",
        )
        yield dsn


async def test_the_index_of_earlier_schemas_is_a_warning_until_migrate_drops_it(
    legacy_database: str,
) -> None:
    pg.execute(
        legacy_database,
        "INSERT INTO worklease_leases (work_id, holder_id, expires_at) VALUES ('w', 'h', now())",
    )
    report = await acheck_postgres(legacy_database, probe_timeout=2.0)
    finding = report["schema"]
    assert finding.status == "warn", finding
    assert "idx_worklease_leases_updated_at" in finding.detail
    assert "worklease migrate" in finding.detail
    assert report.ok, report.findings  # a warning: slower, not broken

    async with await psycopg.AsyncConnection.connect(legacy_database, autocommit=True) as conn:
        await AsyncPostgresBackend.apply_schema(conn)
    indexes = pg.execute(
        legacy_database,
        "SELECT indexname FROM pg_indexes WHERE tablename = 'worklease_leases' ORDER BY 1",
    )
    assert indexes == [("idx_worklease_leases_members",), ("worklease_leases_pkey",)]
    assert pg.execute(
        legacy_database, "SELECT reloptions FROM pg_class WHERE relname = 'worklease_leases'"
    ) == [(["fillfactor=90"],)]
    assert pg.execute(legacy_database, "SELECT work_id FROM worklease_leases") == [("w",)]
    report = await acheck_postgres(legacy_database, probe_timeout=2.0)
    assert report["schema"].status == "ok", report["schema"]


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
