"""``check_postgres``: ask a PostgreSQL deployment the questions of ``worklease check``.

The judgements live in ``_check``; here are the connections and the statements. The listener
check runs the backend's own release listener, so it sees exactly what a waiting acquire
would.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from .._acompat import asleep
from .._check import (
    COLUMNS_QUERY,
    REPLICATION_QUERY,
    TIMEOUT_QUERY,
    TIMEOUT_SETTINGS,
    CheckFinding,
    CheckReport,
    check_arguments,
    judge_clock,
    judge_columns,
    judge_commit,
    judge_isolation,
    judge_listener,
    judge_pooler,
    judge_replication,
    judge_timeouts,
    missing_fence,
    missing_index,
    missing_sequence,
    missing_table,
    seconds_setting,
)
from .._failures import first_line
from .._pg import FENCE, INDEX, SEQUENCE, TABLE
from .listener import AsyncReleaseListener
from .watch import AsyncReleaseHub

__all__ = ["acheck_postgres"]

_Conn = AsyncConnection[tuple[Any, ...]]


async def acheck_postgres(
    conninfo: str = "",
    *,
    schema: str | None = None,
    listen_dsn: str | None = None,
    ttl: float = 30.0,
    probe_timeout: float = 5.0,
) -> CheckReport:
    """Check a PostgreSQL deployment for worklease; what it finds is reported, not raised.

    Checks, in order: the connection; the schema (present and the current layout); the
    default isolation; the clock offset between this client and the server;
    ``synchronous_commit``; whether the server is a primary, has standbys and replicates
    synchronously; server timeouts against ``ttl``; whether a pooler shares server sessions
    between clients (PgBouncer in transaction mode); and whether release notifications work
    from ``conninfo`` (and through ``listen_dsn`` when given), by running the backend's own
    listener. Bad arguments raise ``ConfigError`` before any I/O. ``worklease check`` prints
    the report.
    """
    conninfo, schema, listen_dsn, ttl, probe_timeout = check_arguments(
        conninfo, schema, listen_dsn, ttl, probe_timeout
    )
    findings: list[CheckFinding] = []
    try:
        conn = await _connect(conninfo)
    except psycopg.Error as exc:
        findings.append(CheckFinding("connection", "fail", f"cannot connect: {first_line(exc)}"))
        return CheckReport(findings)
    async with conn:
        info = conn.info
        version = info.server_version
        findings.append(
            CheckFinding(
                "connection",
                "ok",
                f"{info.host}:{info.port} database {info.dbname!r} as {info.user!r}, "
                f"PostgreSQL {version // 10000}.{version % 10000}",
            )
        )
        findings.append(await _guarded("schema", _schema, conn, schema))
        findings.append(await _guarded("isolation", _isolation, conn))
        findings.append(await _guarded("clock", _clock, conn))
        findings.append(await _guarded("synchronous_commit", _commit, conn))
        findings.append(await _guarded("replication", _replication, conn))
        findings.append(await _guarded("timeouts", _timeouts, conn, ttl))
        findings.append(await _guarded("pooler", _pooler, conn, conninfo))
    findings.append(await _guarded("listen", _listen, conninfo, None, probe_timeout))
    if listen_dsn is not None:
        findings.append(await _guarded("listen_dsn", _listen, conninfo, listen_dsn, probe_timeout))
    return CheckReport(findings)


async def _connect(conninfo: str) -> _Conn:
    return await AsyncConnection.connect(
        conninfo,
        autocommit=True,
        connect_timeout=10,
        row_factory=tuple_row,
        prepare_threshold=None,
    )


async def _guarded(name: str, check: Any, *args: Any) -> CheckFinding:
    """``check(*args)``, or a failed finding when the server refused a question."""
    try:
        finding: CheckFinding = await check(*args)
    except psycopg.Error as exc:
        return CheckFinding(name, "fail", f"could not check: {first_line(exc)}")
    return finding


async def _one(conn: _Conn, query: bytes, params: Any = None) -> Any:
    cursor = await conn.execute(query, params)
    row = await cursor.fetchone()
    return None if row is None else row[0]


async def _schema(conn: _Conn, schema: str | None) -> CheckFinding:
    table = sql.Identifier(schema, TABLE) if schema else sql.Identifier(TABLE)
    regclass = await _one(conn, b"SELECT to_regclass(%s)::oid", (table.as_string(conn),))
    if regclass is None:
        return missing_table(schema)
    cursor = await conn.execute(COLUMNS_QUERY, (regclass,))
    rows = await cursor.fetchall()
    finding = judge_columns({str(name): str(kind) for name, kind in rows})
    sequence = sql.Identifier(schema, SEQUENCE) if schema else sql.Identifier(SEQUENCE)
    if finding.status == "ok":
        found = await _one(conn, b"SELECT to_regclass(%s)::oid", (sequence.as_string(conn),))
        if found is None:
            return missing_sequence()
        index = sql.Identifier(schema, INDEX) if schema else sql.Identifier(INDEX)
        if await _one(conn, b"SELECT to_regclass(%s)::oid", (index.as_string(conn),)) is None:
            return missing_index()
        fence = sql.Identifier(schema, FENCE) if schema else sql.Identifier(FENCE)
        signature = fence.as_string(conn) + "(text, bigint)"
        if await _one(conn, b"SELECT to_regprocedure(%s)::oid", (signature,)) is None:
            return missing_fence()
    return finding


async def _isolation(conn: _Conn) -> CheckFinding:
    return judge_isolation(str(await _one(conn, b"SHOW default_transaction_isolation")))


async def _clock(conn: _Conn) -> CheckFinding:
    """The offset seen on the quickest of five round trips (the least uncertain)."""
    best: tuple[float, float] | None = None
    for _ in range(5):
        before = time.time()
        server = await _one(conn, b"SELECT clock_timestamp()")
        after = time.time()
        if not isinstance(server, datetime):
            raise TypeError(f"clock_timestamp() returned {server!r}")
        round_trip = after - before
        offset = server.astimezone(UTC).timestamp() - (before + after) / 2
        if best is None or round_trip < best[1]:
            best = (offset, round_trip)
    if best is None:
        raise TypeError("no clock reading")
    return judge_clock(*best)


async def _commit(conn: _Conn) -> CheckFinding:
    return judge_commit(str(await _one(conn, b"SHOW synchronous_commit")))


async def _replication(conn: _Conn) -> CheckFinding:
    in_recovery = bool(await _one(conn, b"SELECT pg_is_in_recovery()"))
    cursor = await conn.execute(REPLICATION_QUERY)
    rows = await cursor.fetchall()
    return judge_replication(in_recovery, [(str(name), mode) for name, mode in rows])


async def _timeouts(conn: _Conn, ttl: float) -> CheckFinding:
    settings: dict[str, float] = {}
    for name in TIMEOUT_SETTINGS:
        value = await _one(conn, TIMEOUT_QUERY, (name,))
        if value is not None:
            settings[name] = seconds_setting(str(value))
    return judge_timeouts(settings, ttl)


async def _pooler(conn: _Conn, conninfo: str) -> CheckFinding:
    """Two client connections on one server process, or one client moved between server
    processes: only a pooler sharing server sessions does that."""
    mine = await _one(conn, b"SELECT pg_backend_pid()")
    async with await _connect(conninfo) as other:
        theirs = await _one(other, b"SELECT pg_backend_pid()")
    again = await _one(conn, b"SELECT pg_backend_pid()")
    return judge_pooler(theirs == mine or again != mine)


async def _listen(conninfo: str, listen_dsn: str | None, probe_timeout: float) -> CheckFinding:
    name = "listen" if listen_dsn is None else "listen_dsn"
    route = "this DSN" if listen_dsn is None else "the listen DSN"
    # The listener takes its settings from an application pool; this one is never opened.
    settings: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo, open=False, kwargs={"prepare_threshold": None, "connect_timeout": 10}
    )
    listener = AsyncReleaseListener(settings, AsyncReleaseHub(), listen_dsn)
    listener.probe_timeout = probe_timeout
    listener.start()
    try:
        deadline = time.monotonic() + probe_timeout * 2 + 10
        while not (listener.listening or listener.fell_back):
            if time.monotonic() > deadline:
                return CheckFinding(
                    name, "fail", f"the release listener could not connect through {route}"
                )
            await asleep(0.05)
        return judge_listener(name, route, listener.listening, listener.fallback_reason)
    finally:
        await listener.stop()
