"""The judgements of ``worklease check`` (no server): what counts as ok, warn and fail."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from worklease._check import (
    DEFAULT_POOL_SIZE,
    TABLE_PRIVILEGES,
    BouncerPool,
    CheckFinding,
    Grants,
    HostAnswer,
    ServerLimits,
    Standby,
    attempt_seconds,
    bouncer_pool,
    bounded_dsn,
    check_arguments,
    client_options,
    derive_source,
    describe_source,
    expected_columns,
    host_dsns,
    ident,
    judge_clock,
    judge_columns,
    judge_commit,
    judge_connections,
    judge_hosts,
    judge_isolation,
    judge_listener,
    judge_pooler,
    judge_replication,
    judge_timeouts,
    judge_writes,
    listen_deadline,
    load_balance,
    pgbouncer_unreadable,
    pinned,
    redact,
    relaxing,
    seconds_setting,
    secrets,
    session_attrs,
    setting_levels,
    sizing_rule,
    undo_hint,
)
from worklease._pg import connections_per_backend
from worklease.errors import ConfigError


def test_expected_columns_come_from_the_schema_file() -> None:
    columns = expected_columns()
    assert columns["work_id"] == "text"
    assert columns["fencing_token"] == "bigint"
    assert columns["expires_at"] == "timestamp with time zone"
    assert columns["checkpoint"] == "bytea"
    assert len(columns) == 10
    assert judge_columns(dict(columns)).status == "ok"


def test_a_missing_or_retyped_column_fails() -> None:
    columns = expected_columns()
    del columns["prev_holder_id"]
    columns["checkpoint"] = "text"
    finding = judge_columns(columns)
    assert finding.status == "fail"
    assert "missing columns: prev_holder_id" in finding.detail
    assert "checkpoint is text, not bytea" in finding.detail


def test_isolation_is_ok_either_way_because_statements_pin_it() -> None:
    assert judge_isolation("read committed").status == "ok"
    finding = judge_isolation("serializable")
    assert finding.status == "ok"
    assert "pins" in finding.detail


@pytest.mark.parametrize(
    ("offset", "round_trip", "status"),
    [(0.0, 0.001, "ok"), (0.9, 0.001, "ok"), (-1.5, 0.001, "warn"), (1.2, 0.6, "ok")],
)
def test_clock_offset(offset: float, round_trip: float, status: str) -> None:
    assert judge_clock(offset, round_trip).status == status


@pytest.mark.parametrize(
    ("setting", "status"),
    [
        ("on", "ok"),
        ("remote_apply", "ok"),
        ("remote_write", "ok"),
        ("local", "warn"),
        ("off", "warn"),
    ],
)
def test_synchronous_commit(setting: str, status: str) -> None:
    assert judge_commit(setting).status == status


def test_replication() -> None:
    assert judge_replication(True, []).status == "fail"
    asynchronous = judge_replication(False, [Standby("standby1", "async")])
    assert asynchronous.status == "warn"
    assert "asynchronous" in asynchronous.detail
    assert judge_replication(False, [Standby("a", "async"), Standby("b", "sync")]).status == "ok"
    assert judge_replication(False, [Standby("a", "quorum")]).status == "ok"
    hidden = judge_replication(False, [Standby("a", None, None)])
    assert hidden.status == "warn"
    assert "pg_read_all_stats" in hidden.detail


def test_a_primary_with_no_standby_warns_that_no_failover_is_possible() -> None:
    finding = judge_replication(False, [])
    assert finding.status == "warn"
    assert "no failover possible" in finding.detail


def test_base_backups_and_logical_subscribers_are_not_standbys() -> None:
    walsenders = [
        Standby("pg_basebackup", "async", "backup"),
        Standby("subscription_1", "async", "streaming", "logical"),
    ]
    finding = judge_replication(False, walsenders)
    assert finding.status == "warn"
    assert "no failover possible" in finding.detail


def test_a_standby_not_streaming_and_an_inactive_slot_warn_by_name() -> None:
    catching_up = judge_replication(False, [Standby("a", "sync"), Standby("b", "async", "catchup")])
    assert catching_up.status == "warn"
    assert "b is connected but catchup, not streaming" in catching_up.detail
    assert "replication is synchronous" in catching_up.detail  # a still streams synchronously
    slot = judge_replication(False, [Standby("a", "sync")], ["old_standby"])
    assert slot.status == "warn"
    assert "replication slot 'old_standby' is inactive" in slot.detail
    alone = judge_replication(False, [Standby("b", "async", "startup")], ["b_slot"])
    assert alone.status == "warn"
    assert "no failover possible" in alone.detail
    assert "b is connected but startup" in alone.detail
    assert "'b_slot'" in alone.detail


def test_timeouts_against_the_ttl() -> None:
    off = {"statement_timeout": 0.0, "idle_session_timeout": 0.0}
    assert judge_timeouts(off, 30.0).status == "ok"
    short_idle = judge_timeouts({"idle_session_timeout": 10.0}, 30.0)
    assert short_idle.status == "warn"
    assert "idle_session_timeout" in short_idle.detail
    assert judge_timeouts({"idle_session_timeout": 60.0}, 30.0).status == "ok"
    assert judge_timeouts({"statement_timeout": 0.2}, 30.0).status == "warn"
    assert judge_timeouts({"statement_timeout": 5.0}, 30.0).status == "ok"


def test_a_timeout_that_cancels_statements_routinely_fails_naming_setting_value_and_level() -> None:
    finding = judge_timeouts(
        {"statement_timeout": 0.001, "lock_timeout": 0.0},
        30.0,
        {"statement_timeout": "set for role 'slow'"},
    )
    assert finding.status == "fail"
    assert finding.detail.startswith("statement_timeout=1ms (set for role 'slow') cancels")
    assert "TTL 30s" in finding.detail
    assert "lock_timeout=off" in finding.detail
    assert judge_timeouts({"transaction_timeout": 0.05}, 30.0).status == "fail"


def test_every_timeout_below_the_ttl_is_named() -> None:
    settings = {
        "statement_timeout": 5.0,
        "lock_timeout": 0.5,
        "idle_in_transaction_session_timeout": 10.0,
        "idle_session_timeout": 0.0,
        "transaction_timeout": 20.0,
    }
    finding = judge_timeouts(settings, 30.0)
    assert finding.status == "warn"
    for named in (
        "statement_timeout=5s is below the TTL",
        "lock_timeout=500ms fails an acquire",
        "idle_in_transaction_session_timeout=10s ends a lease.transaction() step",
        "transaction_timeout=20s cuts a lease.transaction() step",
        "idle_session_timeout=off",
    ):
        assert named in finding.detail
    # below the TTL but harmless to worklease: named, still ok
    longer = judge_timeouts({"statement_timeout": 5.0, "lock_timeout": 2.0}, 30.0)
    assert longer.status == "ok"
    assert "statement_timeout=5s is below the TTL" in longer.detail
    assert "lock_timeout=2s is below the TTL" in longer.detail
    # at or above the TTL: listed, not flagged
    at = judge_timeouts({"statement_timeout": 30.0}, 30.0)
    assert (at.status, at.detail) == ("ok", "statement_timeout=30s (TTL 30s)")


def test_check_lifts_only_the_timeouts_that_would_cancel_its_own_questions() -> None:
    assert relaxing({"statement_timeout": "1ms", "lock_timeout": "1ms"}) == {
        "statement_timeout": "30s"
    }
    assert relaxing({"statement_timeout": "0", "idle_session_timeout": "0"}) == {}
    assert relaxing({"statement_timeout": "2min", "transaction_timeout": "5s"}) == {
        "transaction_timeout": "30s"
    }
    assert relaxing({"idle_session_timeout": "1s", "transaction_timeout": None}) == {
        "idle_session_timeout": "0"
    }


@pytest.mark.parametrize(
    ("source", "where", "undo"),
    [
        ("user", "set for role 'ro'", "ALTER ROLE ro RESET default_transaction_read_only"),
        ("database", "set for database 'App'", 'ALTER DATABASE "App" RESET'),
        ("database user", "set for role 'ro' in database 'App'", 'ALTER ROLE ro IN DATABASE "App"'),
        ("global", "set for all roles", "ALTER ROLE ALL RESET"),
        ("configuration file", "the server's configuration", "ALTER SYSTEM RESET"),
        ("server", "the server's configuration", "ALTER SYSTEM RESET"),
        ("client", "this connection's options", "drop -c default_transaction_read_only="),
    ],
)
def test_a_read_only_default_fails_naming_its_level(source: str, where: str, undo: str) -> None:
    finding = judge_writes("on", "on", source, "ro", "App")
    assert finding.status == "fail"
    assert finding.name == "writes"
    assert finding.detail.startswith("default_transaction_read_only is on (")
    assert where in finding.detail
    assert undo in finding.detail
    assert "\n" not in finding.detail


def test_writes_read_only_sessions_and_refused_writes_fail() -> None:
    assert judge_writes("off", "off", None, "app", "app").status == "ok"
    session = judge_writes("off", "on", None, "app", "app")
    assert session.status == "fail"
    assert "transaction_read_only is on in this session (an explicit SET" in session.detail
    standby = judge_writes("off", "on", None, "app", "app", standby=True)
    assert "(this server is a hot standby, in recovery)" in standby.detail
    refused = judge_writes("off", "off", None, "app", "app", "permission denied for table x")
    assert refused.status == "fail"
    assert "permission denied for table x" in refused.detail
    untried = judge_writes("off", "off", None, "app", "app", tried=False)
    assert untried.status == "ok"
    assert "no worklease_leases to try a write on" in untried.detail


GRANTED = Grants(
    "app",
    "public.worklease_leases",
    "public.worklease_fencing_seq",
    frozenset(TABLE_PRIVILEGES),
    True,
)


def test_a_role_that_cannot_acquire_fails_naming_what_it_lacks_and_the_grant() -> None:
    ok = judge_writes("off", "off", None, "app", "db", grants=GRANTED)
    assert ok.status == "ok"
    assert "role 'app' has SELECT, INSERT, UPDATE and DELETE on worklease_leases" in ok.detail
    lacking = replace(GRANTED, held=frozenset({"SELECT", "UPDATE", "DELETE"}), sequence_usage=False)
    finding = judge_writes("off", "off", None, "app", "db", grants=lacking)
    assert finding.status == "fail"
    assert finding.detail.startswith(
        "role 'app' lacks INSERT on worklease_leases and USAGE on worklease_fencing_seq: every "
        "acquire is refused"
    )
    assert finding.detail.endswith(
        "; GRANT INSERT ON public.worklease_leases TO app; "
        "GRANT USAGE ON SEQUENCE public.worklease_fencing_seq TO app"
    )
    # the write tried names one missing privilege; the grants name them all
    refused = judge_writes(
        "off",
        "off",
        None,
        "app",
        "db",
        "permission denied for table worklease_leases",
        grants=replace(GRANTED, held=frozenset({"SELECT"})),
    )
    assert refused.detail.endswith("GRANT INSERT, UPDATE, DELETE ON public.worklease_leases TO app")
    # read-only sessions are said first
    assert judge_writes("on", "off", "user", "app", "db", grants=lacking).detail.startswith(
        "default_transaction_read_only is on"
    )
    quoted = replace(GRANTED, role="App User", table='"My".worklease_leases', sequence_usage=False)
    assert judge_writes("off", "off", None, "App User", "db", grants=quoted).detail.endswith(
        'GRANT USAGE ON SEQUENCE public.worklease_fencing_seq TO "App User"'
    )
    unknown = replace(GRANTED, sequence_usage=None)  # no sequence: the schema line says so
    assert judge_writes("off", "off", None, "app", "db", grants=unknown).status == "ok"


def test_a_role_without_delete_warns_that_forget_and_the_vacuum_are_refused() -> None:
    finding = judge_writes(
        "off",
        "off",
        None,
        "app",
        "db",
        grants=replace(GRANTED, held=frozenset({"SELECT", "INSERT", "UPDATE"})),
    )
    assert finding.status == "warn"
    assert finding.detail.startswith(
        "role 'app' lacks DELETE on worklease_leases: forget() and the vacuum (worklease sweep) "
        "are refused, acquires, renewals and releases work"
    )
    assert finding.detail.endswith("GRANT DELETE ON public.worklease_leases TO app")


def test_setting_sources() -> None:
    assert describe_source("default", "r", "d") is None
    assert describe_source(None, "r", "d") is None
    assert describe_source("session", "r", "d") == (
        "set in the session (by a pooler's connect_query, or a SET)"
    )
    assert undo_hint("x", "session", "r", "d") is None
    assert ident("worker") == "worker"
    assert ident('my "role"') == '"my ""role"""'
    assert ident("Worker") == '"Worker"'


def test_client_options_are_parsed_as_libpq_sends_them() -> None:
    assert client_options("-c statement_timeout=1ms -cwork_mem=4MB --lock-timeout=2s") == {
        "statement_timeout": "1ms",
        "work_mem": "4MB",
        "lock_timeout": "2s",
    }
    assert client_options(r"-c search_path=a\ b") == {"search_path": "a b"}
    assert client_options("") == {}


def test_a_lifted_setting_s_level_is_the_most_specific_that_sets_it() -> None:
    levels = setting_levels(
        [
            ("user", "statement_timeout=1ms"),
            ("database", "statement_timeout=5s"),
            ("database user", "idle_session_timeout=1s"),
            ("global", "transaction_timeout=1s"),
        ]
    )
    assert derive_source("statement_timeout", {}, levels) == "user"
    assert derive_source("idle_session_timeout", {}, levels) == "database user"
    assert derive_source("transaction_timeout", {}, levels) == "global"
    assert derive_source("statement_timeout", {"statement_timeout": "1"}, levels) == "client"
    assert derive_source("lock_timeout", {}, levels) == "server"


def test_each_host_of_a_multi_host_dsn_gets_a_dsn_of_its_own() -> None:
    hosts = host_dsns(
        "host=a,b port=5432,5433 dbname=app user=w password=pw target_session_attrs=read-write",
        {},
    )
    assert [label for label, _ in hosts] == ["a:5432", "b:5433"]
    second = conninfo_to_dict(hosts[1][1])
    assert (second["host"], second["port"], second["target_session_attrs"]) == ("b", "5433", "any")
    assert (second["dbname"], second["user"], second["password"]) == ("app", "w", "pw")
    uri = host_dsns("postgresql://w@h1:6000,h2/app?target_session_attrs=primary", {})
    assert [label for label, _ in uri] == ["h1:6000", "h2:5432"]
    shared_port = host_dsns("host=a,b port=6432", {})
    assert [label for label, _ in shared_port] == ["a:6432", "b:6432"]
    from_environment = host_dsns("dbname=app", {"PGHOST": "x,y", "PGPORT": "7000"})
    assert [label for label, _ in from_environment] == ["x:7000", "y:7000"]
    assert host_dsns("host=a port=5432", {}) == []
    assert host_dsns("host=a,b port=1,2,3", {}) == []  # libpq refuses it; so does connection
    assert session_attrs("host=a,b target_session_attrs=read-write", {}) == "read-write"
    assert session_attrs("host=a,b", {"PGTARGETSESSIONATTRS": "primary"}) == "primary"
    assert session_attrs("host=a,b", {}) == "any"


def test_two_primaries_in_one_dsn_are_a_split_brain() -> None:
    answers = [
        HostAnswer("a:5432", True, (1, "t1")),
        HostAnswer("b:5432", True, (1, "t2")),
        HostAnswer("c:5432", False, (1, "t3")),
    ]
    finding = judge_hosts(answers, "a:5432", "read-write")
    assert finding.status == "fail"
    assert finding.detail.startswith("split brain: a:5432 and b:5432 both answer as primary")
    assert "this DSN (target_session_attrs=read-write) reaches a:5432" in finding.detail


def test_hosts_one_primary_and_how_the_route_reaches_it() -> None:
    good = [HostAnswer("a:5432", False, (1, "t1")), HostAnswer("b:5432", True, (1, "t2"))]
    ok = judge_hosts(good, "b:5432", "read-write")
    assert ok.status == "ok"
    assert ok.detail == (
        "a:5432 standby, b:5432 primary; this DSN (target_session_attrs=read-write) reaches b:5432"
    )
    anyone = judge_hosts(good, "a:5432", "any")
    assert anyone.status == "warn"
    assert "add target_session_attrs=read-write" in anyone.detail
    assert judge_hosts(good, "a:5432", "prefer-standby").status == "fail"
    down = [*good, HostAnswer("c:5432", None, error="Connection refused")]
    unreachable = judge_hosts(down, "b:5432", "primary")
    assert unreachable.status == "warn"
    assert "c:5432 did not answer (Connection refused)" in unreachable.detail
    twice = [HostAnswer("localhost:5432", True, (1, "t")), HostAnswer("::1:5432", True, (1, "t"))]
    same = judge_hosts(twice, "localhost:5432", "read-write")
    assert same.status == "ok"
    assert "localhost:5432 and ::1:5432 are one server" in same.detail
    nobody = judge_hosts(
        [HostAnswer("a:1", False), HostAnswer("b:1", None, error="x")], None, "any"
    )
    assert nobody.status == "fail"
    assert "no host answers as primary" in nobody.detail
    assert "reaches no host" in nobody.detail


def test_random_load_balancing_over_a_standby_fails_unless_the_route_wants_a_primary() -> None:
    hosts = [
        HostAnswer("a:5432", True, (1, "t1")),
        HostAnswer("b:5432", False, (1, "t2")),
        HostAnswer("c:5432", None, error="Connection refused"),
    ]
    anyone = judge_hosts(hosts, "a:5432", "any", "random")
    assert anyone.status == "fail"
    assert anyone.detail.startswith(
        "load_balance_hosts=random with target_session_attrs=any: each connection takes a host "
        "at random, so about 1 in 2 of the application's connections land on a standby (b:5432)"
    )
    assert "add target_session_attrs=read-write" in anyone.detail
    assert "this DSN (target_session_attrs=any, load_balance_hosts=random) reaches a:5432" in (
        anyone.detail
    )
    for attrs in ("read-write", "primary"):
        assert judge_hosts(hosts, "a:5432", attrs, "random").status == "warn"  # c is down
    assert judge_hosts(hosts[:2], "a:5432", "read-write", "random").status == "ok"
    assert judge_hosts(hosts[:2], "a:5432", "any", "disable").status == "warn"  # as before
    alone = [HostAnswer("a:5432", True, (1, "t1")), HostAnswer("b:5432", True, (2, "t1"))]
    assert judge_hosts(alone, "a:5432", "any", "random").detail.startswith("split brain")
    assert load_balance("host=a,b load_balance_hosts=random", {}) == "random"
    assert load_balance("host=a,b", {"PGLOADBALANCEHOSTS": "random"}) == "random"
    assert load_balance("host=a,b", {}) == "disable"


def test_connect_timeouts_are_the_dsn_s_own_and_10s_when_it_sets_none() -> None:
    assert conninfo_to_dict(bounded_dsn("host=a", {}))["connect_timeout"] == "10"
    assert bounded_dsn("host=a connect_timeout=3", {}) == "host=a connect_timeout=3"
    assert bounded_dsn("host=a", {"PGCONNECT_TIMEOUT": "3"}) == "host=a"
    assert bounded_dsn("host='open", {}) == "host='open"  # connecting says what is wrong
    assert attempt_seconds("host=a connect_timeout=3", {}) == 3
    assert attempt_seconds("host=a connect_timeout=1", {}) == 2  # psycopg's least
    assert attempt_seconds("host=a connect_timeout=0", {}) == 130  # psycopg's "none"
    assert attempt_seconds("host=a", {"PGCONNECT_TIMEOUT": "4"}) == 4
    assert attempt_seconds("host=a", {}) == 10
    # the listener check waits for its probe twice and one connection through the route
    assert listen_deadline(2.0, 10.0, 1) == 14.0
    assert listen_deadline(2.0, 30.0, 2) == 64.0


def test_a_pinned_dsn_reaches_the_host_reached_alone() -> None:
    dsn = (
        "host=a,b port=5432,5433 user=w password=pw dbname=app load_balance_hosts=random "
        "target_session_attrs=read-write connect_timeout=3"
    )
    one = conninfo_to_dict(pinned(dsn, "b", 5433))
    assert (one["host"], one["port"], one["target_session_attrs"]) == ("b", "5433", "any")
    assert "load_balance_hosts" not in one
    assert (one["user"], one["password"], one["connect_timeout"]) == ("w", "pw", "3")
    assert conninfo_to_dict(pinned(dsn, "b", 5433, "10.0.0.2"))["hostaddr"] == "10.0.0.2"


def test_the_sizing_rule_is_the_backend_s() -> None:
    assert sizing_rule(20, 1)[0] == connections_per_backend(20) == 30
    need, rule = sizing_rule(4, 3)
    assert need == 3 * connections_per_backend(4)
    assert rule == (
        "42 connections for 3 processes (14 each: pool max_size 4 + 4 renewal + 4 direct "
        "+ 2 listener)"
    )


def test_the_default_pool_size_is_psycopg_pool_s() -> None:
    parameters = inspect.signature(ConnectionPool).parameters
    assert parameters["max_size"].default is None  # then max_size is min_size
    assert parameters["min_size"].default == DEFAULT_POOL_SIZE


SESSION_POOL = BouncerPool("app", "session", 20)


def test_pgbouncer_in_session_mode_with_its_default_pool_cannot_fit_a_pool_of_20() -> None:
    finding = judge_connections(20, 1, None, SESSION_POOL)
    assert finding.status == "fail"
    assert "PgBouncer in session mode" in finding.detail
    assert "its pool for database 'app' has 20" in finding.detail
    assert "30 connections for 1 process" in finding.detail
    assert "default_pool_size" in finding.detail


@pytest.mark.parametrize(
    ("pool", "size", "processes", "status"),
    [
        (SESSION_POOL, 4, 1, "ok"),  # 14 of 20
        (SESSION_POOL, 6, 1, "ok"),  # 16 of 20
        (SESSION_POOL, 7, 1, "warn"),  # 17 of 20: near
        (SESSION_POOL, 4, 2, "fail"),  # 28 of 20
        (BouncerPool("app", "session", 20, reserve_pool=10), 14, 1, "warn"),  # 24: reserve
        (BouncerPool("app", "session", 40, max_db_connections=20), 14, 1, "fail"),
        (BouncerPool("app", "transaction", 20, max_client_conn=100), 18, 3, "ok"),
        (BouncerPool("app", "transaction", 20, max_client_conn=50), 20, 2, "fail"),
        (BouncerPool("app", "session", 100, max_client_conn=50), 20, 2, "fail"),
    ],
)
def test_pgbouncer_pool_fits(pool: BouncerPool, size: int, processes: int, status: str) -> None:
    assert judge_connections(size, processes, None, pool).status == status


SERVER = ServerLimits(100, 3, "app", database="app", in_use=5)


@pytest.mark.parametrize(
    ("server", "size", "processes", "status", "named"),
    [
        (SERVER, 4, 1, "ok", "the 97 the server allows (max_connections 100 - superuser_reserved"),
        (SERVER, 18, 3, "warn", "near the 97"),  # 84 of 97
        (SERVER, 18, 4, "fail", "112 connections for 4 processes"),
        (ServerLimits(100, 3, "app", role_limit=10), 4, 1, "fail", "LIMIT of role 'app'"),
        (ServerLimits(100, 3, "app", -1, "d", 20), 4, 1, "ok", "LIMIT of database 'd'"),
        (ServerLimits(100, 3, "app", role_reserved=5), 90, 1, "fail", "reserved_connections 5"),
    ],
)
def test_a_direct_route_fits_in_max_connections(
    server: ServerLimits, size: int, processes: int, status: str, named: str
) -> None:
    finding = judge_connections(size, processes, server)
    assert finding.status == status
    assert named in finding.detail


def test_a_proxy_that_cannot_be_read_warns_with_the_rule_and_never_passes() -> None:
    note = pgbouncer_unreadable("app", "FATAL:  not allowed")
    assert "stats_users" in note
    finding = judge_connections(20, 1, SERVER, proxy=note)
    assert finding.status == "warn"
    assert finding.detail.startswith("PgBouncer is in between and its admin console refuses")
    assert "needs 30 server connections" in finding.detail
    assert judge_connections(90, 1, SERVER, proxy=note).status == "fail"  # not even the server
    other = pgbouncer_unreadable("app", 'database "pgbouncer" does not exist')
    assert other.startswith("a proxy is in between")
    assert judge_connections(4, 1, None).status == "warn"  # limits unreadable


def test_the_pgbouncer_pool_is_read_from_its_show_commands() -> None:
    databases = [
        {"name": "pgbouncer", "pool_size": 2, "pool_mode": "statement", "reserve_pool": 0},
        {"name": "app", "pool_size": 20, "pool_mode": None, "reserve_pool": 0,
         "max_connections": 0},
        {"name": "other", "pool_size": 50, "pool_mode": "transaction", "reserve_pool": 5},
    ]  # fmt: skip
    config = {
        "pool_mode": "session",
        "default_pool_size": "20",
        "max_client_conn": "500",
        "max_db_connections": "0",
        "max_user_connections": "0",
        "reserve_pool_size": "0",
    }
    assert bouncer_pool(databases, config, [], "app", "w") == BouncerPool(
        "app", "session", 20, 0, 0, 0, 500
    )
    assert bouncer_pool(databases, config, [], "other", "w").pool_mode == "transaction"
    users = [{"name": "w", "pool_mode": "transaction"}]
    assert bouncer_pool(databases, config, users, "app", "w").pool_mode == "transaction"
    unknown = bouncer_pool([], {"default_pool_size": "7"}, [], "app", "w")
    assert (unknown.pool_mode, unknown.pool_size) == ("session", 7)


def test_the_dsn_s_password_never_shows() -> None:
    findings = [CheckFinding("connection", "fail", 'invalid percent-encoded token: "hun%zz"')]
    assert secrets("postgresql://u:hun%zz@h/db") == ["hun%zz"]
    assert redact(findings, ["hun%zz"]).findings[0].detail == (
        'invalid percent-encoded token: "***"'
    )
    assert secrets("host=h password='se cret' oops", None) == ["se cret"]
    assert secrets("host=h password=pw", "host=l password=other") == ["pw", "other"]
    assert secrets("host=h") == []


def test_a_password_with_a_space_is_found_whole_in_a_dsn_libpq_cannot_parse() -> None:
    def shown(dsn: str, text: str) -> str:
        return redact([CheckFinding("connection", "fail", text)], secrets(dsn)).findings[0].detail

    # an unterminated quote: the rest of the string
    assert "Sekr3t PartTwo" in secrets("host=h password='Sekr3t PartTwo")
    assert shown("host=h password='Sekr3t PartTwo", 'at "Sekr3t PartTwo"') == 'at "***"'
    # unquoted, a backslash escapes the space
    assert "Part" not in shown("host=h password=Sekr3t\\ PartTwo oops", '"Sekr3t PartTwo"')
    # unquoted with a space: libpq complains about the word after it, which is hidden too
    text = 'missing "=" after "PartTwo" in connection info string'
    assert shown("host=h password=Sekr3t PartTwo port=5432", text) == (
        'missing "=" after "***" in connection info string'
    )


def test_a_short_password_is_hidden_only_where_it_stands_as_a_password() -> None:
    detail = (
        "127.0.0.1:5432 database 'app' as 'u1', PostgreSQL 15.1; host=h password=1 port=5; "
        "postgresql://u1:1@h/db"
    )
    scrubbed = redact([CheckFinding("connection", "ok", detail)], ["1"]).findings[0].detail
    assert scrubbed == (
        "127.0.0.1:5432 database 'app' as 'u1', PostgreSQL 15.1; host=h password=*** port=5; "
        "postgresql://u1:***@h/db"
    )
    # a longer one wherever it stands as a token, not inside a longer word
    detail = 'hunter2 in "hunter2", not in hunter22 or xhunter2'
    assert redact([CheckFinding("x", "ok", detail)], ["hunter2"]).findings[0].detail == (
        '*** in "***", not in hunter22 or xhunter2'
    )


def test_a_listen_dsn_libpq_cannot_parse_is_refused_without_repeating_it() -> None:
    for bad in ("postgresql://u:Sekr3t%zzXY@h/db", "host=h password='Sekr3t PartTwo"):
        with pytest.raises(ConfigError, match="listen_dsn is not a valid conninfo") as caught:
            check_arguments("", None, bad, 30, 5)
        assert "Sekr3t" not in str(caught.value)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "4", 100_001])
def test_pool_size_and_processes_are_whole_numbers(bad: object) -> None:
    with pytest.raises(ConfigError, match="pool_size"):
        check_arguments("", None, None, 30, 5, bad, 1)
    with pytest.raises(ConfigError, match="processes"):
        check_arguments("", None, None, 30, 5, 4, bad)
    assert check_arguments("", None, None, 30, 5, 20, 3)[5:] == (20, 3)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("500ms", 0.5), ("30s", 30.0), ("5min", 300.0), ("1h", 3600.0), ("250", 0.25)],
)
def test_server_duration_settings(text: str, seconds: float) -> None:
    assert seconds_setting(text) == pytest.approx(seconds)


def test_pgbouncer_s_pool_mode_decides_the_pooler_line() -> None:
    transaction = judge_pooler(False, True, mode="transaction")  # the probe missed it
    assert transaction.status == "warn"
    assert transaction.detail.startswith(
        "PgBouncer in transaction mode (pool_mode=transaction, read on its admin console) "
        "shares server sessions between clients"
    )
    statement = judge_pooler(False, True, mode="statement")
    assert statement.status == "warn"
    assert "transactional steps (lease.transaction()) are refused" in statement.detail
    session = judge_pooler(True, True, mode="session")
    assert session.status == "ok"
    assert session.detail.startswith("PgBouncer in session mode (pool_mode=session")


def test_a_port_forward_is_no_pooler() -> None:
    forward = judge_pooler(False, False, forwarded=True)
    assert forward.status == "ok"
    assert "port forwarding or NAT, not a pooler" in forward.detail
    assert "proxy" not in forward.detail


def test_timeouts_say_which_settings_the_check_left_alone_behind_a_proxy() -> None:
    finding = judge_timeouts({"statement_timeout": 0.001}, 30.0, kept=["statement_timeout"])
    assert finding.status == "fail"
    assert finding.detail.endswith(
        "; check left statement_timeout as it is in its own session (a proxy is in between, "
        "where a SET could stay behind on a pooled server connection): a question it "
        "cancelled says 'could not check'"
    )
    assert "check left" not in judge_timeouts({"statement_timeout": 0.001}, 30.0).detail


def test_pooler_and_listener() -> None:
    assert judge_pooler(True).status == "warn"
    assert judge_pooler(False).status == "ok"
    # the whole truth about prepared statements: worklease's and the application's own
    shared = judge_pooler(True, proxied=True).detail
    assert "unprepared" in shared
    assert "prepare_threshold=None" in shared
    session = judge_pooler(False, proxied=True)
    assert session.status == "ok"
    assert "prepare=True" in session.detail
    assert "unprepared" not in judge_pooler(False).detail
    assert judge_listener("listen", "this DSN", True, None).status == "ok"
    fallen = judge_listener("listen", "this DSN", False, "LISTEN failed")
    assert fallen.status == "warn"
    assert "LISTEN failed" in fallen.detail
