"""``check_postgres``: ask a PostgreSQL deployment the questions of ``worklease check``.

The judgements live in ``_check``; here are the connections and the statements. The listener
check runs the backend's own release listener, so it sees exactly what a waiting acquire
would.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import AsyncClientCursor, AsyncConnection, sql
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from .._acompat import AWorker, acancel_worker, ajoin_all, asleep, aspawn
from .._check import (
    COLUMNS_QUERY,
    DEFAULT_POOL_SIZE,
    HOST_QUERY,
    IDENTITY_QUERY,
    LEVELS_QUERY,
    LIMITS_QUERY,
    REPLICATION_QUERY,
    SESSION_QUERY,
    SESSION_SETTINGS,
    SLOTS_QUERY,
    SOURCES_QUERY,
    TABLE_PRIVILEGES,
    TIMEOUT_SETTINGS,
    BouncerPool,
    CheckFinding,
    CheckReport,
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
    host_dsns,
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
    judge_version,
    judge_writes,
    legacy_index,
    listen_deadline,
    load_balance,
    missing_fence,
    missing_index,
    missing_sequence,
    missing_table,
    pgbouncer_unreadable,
    pinned,
    redact,
    relaxing,
    seconds_setting,
    secrets,
    session_attrs,
    setting_levels,
)
from .._failures import first_line
from .._pg import FENCE, LEGACY_INDEX, MEMBERS_INDEX, SEQUENCE, TABLE, check_conninfo
from ..errors import ConfigError
from .listener import AsyncReleaseListener
from .postgres import probe_schema
from .watch import AsyncReleaseHub

__all__ = ["acheck_postgres"]

_Conn = AsyncConnection[tuple[Any, ...]]

_ATTEMPTS = 5
"""How often a question that a role's tiny ``statement_timeout`` cancelled is asked again
(before ``check`` has lifted the timeout in its own session, or where it cannot)."""

_HOST_QUESTIONS = 10.0
"""Seconds a host of a multi-host DSN gets to answer, once connected."""


@dataclass
class _Session:
    """What the first questions found out about the check's own session."""

    values: dict[str, str | None]
    role: str
    database: str
    proxied: bool
    """The server process is not the one in the connection's cancel key: a proxy is in
    between, which may hand this client's statements to pooled server sessions."""
    forwarded: bool = False
    """The server process is the one in the cancel key but the server's port is not the one
    connected to: a port forward or NAT (no pooler)."""
    shared: bool = False
    """A pooler shares server sessions between clients (PgBouncer in transaction mode)."""
    shared_error: str | None = None
    """Why whether a pooler shares sessions is not known."""
    bouncer: BouncerPool | None = None
    """PgBouncer's pool for this database and user, read on its admin console."""
    bouncer_error: str = ""
    """Why the admin console could not be read (behind a proxy)."""
    kept: list[str] = field(default_factory=list)
    """Settings the check would have lifted in its own session but left alone (proxied)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each setting came from (``pg_settings.source`` words, or derived)."""


async def acheck_postgres(
    conninfo: str = "",
    *,
    schema: str | None = None,
    listen_dsn: str | None = None,
    ttl: float = 30.0,
    probe_timeout: float = 5.0,
    pool_size: int = DEFAULT_POOL_SIZE,
    processes: int = 1,
) -> CheckReport:
    """Check a PostgreSQL deployment for worklease; what it finds is reported, not raised.

    Checks, in order: the connection; each host of a multi-host DSN on its own, all at once
    (one primary, which one the DSN's route reaches, and no standby in a random
    ``load_balance_hosts`` route that takes any session); the schema (present and the current
    layout); the default isolation; whether the session can write
    (``default_transaction_read_only``, ``transaction_read_only``, the role's privileges on
    the table and the sequence, a write tried in a rolled-back transaction); the clock offset
    between this client and the server; ``synchronous_commit``; whether the server is a
    primary, has standbys and replicates synchronously; server timeouts against ``ttl``;
    whether a pooler shares server sessions between clients (PgBouncer in transaction mode,
    from its admin console when that answers); whether the connections of ``processes``
    processes, each with an application pool of ``pool_size`` (its ``max_size``), fit in
    PgBouncer's pool or the server's limits; and whether release notifications work from
    ``conninfo`` (on the host it reached) and through ``listen_dsn`` when given, by running
    the backend's own listener. Each connection attempt gets the DSN's ``connect_timeout``
    (10 s when it sets none). On a direct connection a role's short ``statement_timeout`` is
    lifted in the check's own session (after reading it) so the questions get answers;
    behind a proxy no session setting is changed. Bad arguments raise ``ConfigError`` before
    any I/O. No detail shows the DSN's password. ``worklease check`` prints the report.
    """
    conninfo, schema, listen_dsn, ttl, probe_timeout, pool_size, processes = check_arguments(
        conninfo, schema, listen_dsn, ttl, probe_timeout, pool_size, processes
    )
    findings = await _findings(
        conninfo, schema, listen_dsn, ttl, probe_timeout, pool_size, processes
    )
    return redact(findings, secrets(conninfo, listen_dsn))


async def _findings(
    conninfo: str,
    schema: str | None,
    listen_dsn: str | None,
    ttl: float,
    probe_timeout: float,
    pool_size: int,
    processes: int,
) -> list[CheckFinding]:
    try:
        check_conninfo(conninfo)  # libpq's own message may quote the password
    except ConfigError as exc:
        return [CheckFinding("connection", "fail", f"cannot connect: the DSN is {exc}")]
    findings: list[CheckFinding] = []
    conninfo = bounded_dsn(conninfo, os.environ)
    hosts = _HostSurvey(host_dsns(conninfo, os.environ))
    attrs = session_attrs(conninfo, os.environ)
    balance = load_balance(conninfo, os.environ)
    hosts.start()  # meanwhile the DSN's own route connects
    try:
        try:
            conn = await _connect(conninfo)
        except psycopg.Error as exc:
            findings.append(
                CheckFinding("connection", "fail", f"cannot connect: {first_line(exc)}")
            )
            if hosts:
                findings.append(await _guarded("hosts", hosts.finding, None, attrs, balance))
            return findings
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
            reached = f"{info.host}:{info.port}"
            if hosts:
                findings.append(await _guarded("hosts", hosts.finding, reached, attrs, balance))
            # the host reached, alone: the route's other hosts cost no more time
            here = pinned(conninfo, info.host, info.port, info.hostaddr) if hosts else conninfo
            session: _Session | str
            try:
                session = await _session(conn, conninfo, here)
            except psycopg.Error as exc:
                session = f"could not check: {first_line(exc)}"
            findings.append(await _guarded("schema", _schema, conn, schema))
            findings.append(await _guarded("isolation", _isolation, conn))
            findings.append(await _guarded("writes", _writes, conn, schema, session))
            findings.append(await _guarded("clock", _clock, conn))
            findings.append(await _guarded("synchronous_commit", _commit, conn))
            findings.append(await _guarded("replication", _replication, conn))
            findings.append(await _guarded("timeouts", _timeouts, session, ttl))
            findings.append(await _guarded("pooler", _pooler, session))
            findings.append(
                await _guarded("connections", _connections, conn, session, pool_size, processes)
            )
    finally:
        await hosts.close()
    if not isinstance(session, str) and session.values.get("in_hot_standby") == "on":
        # LISTEN is refused in recovery (the listener would retry it until the deadline)
        findings.append(
            CheckFinding(
                "listen",
                "fail",
                "this DSN reaches a hot standby, where LISTEN is refused: release "
                "notifications need the primary",
            )
        )
    else:
        findings.append(await _guarded("listen", _listen, here, None, probe_timeout))
    if listen_dsn is not None:
        findings.append(
            await _guarded(
                "listen_dsn", _listen, here, bounded_dsn(listen_dsn, os.environ), probe_timeout
            )
        )
    return findings


async def _connect(conninfo: str) -> _Conn:
    """A connection for the check's questions (``conninfo`` after ``bounded_dsn``: its own
    ``connect_timeout``)."""
    return await AsyncConnection.connect(
        conninfo, autocommit=True, row_factory=tuple_row, prepare_threshold=None
    )


async def _guarded(name: str, check: Any, *args: Any) -> CheckFinding:
    """``check(*args)``, or a failed finding when the server refused a question."""
    try:
        finding: CheckFinding = await check(*args)
    except psycopg.Error as exc:
        return CheckFinding(name, "fail", f"could not check: {first_line(exc)}")
    return finding


async def _rows(
    conn: _Conn, query: bytes | sql.Composed, params: Any = None
) -> list[tuple[Any, ...]]:
    """The rows of a quick question, asked again when a statement timeout cancelled it (a
    role's tiny one, which the check lifts only on a direct connection)."""
    for attempt in range(_ATTEMPTS):
        try:
            cursor = await conn.execute(query, params)
            return await cursor.fetchall()
        except pg_errors.QueryCanceled:
            if attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


async def _one(conn: _Conn, query: bytes, params: Any = None) -> Any:
    rows = await _rows(conn, query, params)
    return rows[0][0] if rows else None


async def _row(conn: _Conn, query: bytes | sql.Composed, params: Any = None) -> tuple[Any, ...]:
    """One row of a quick question (see ``_rows``)."""
    rows = await _rows(conn, query, params)
    if not rows:
        raise psycopg.DataError("the server answered no row")
    return rows[0]


async def _session(conn: _Conn, conninfo: str, here: str) -> _Session:
    """The session's settings as it started; what is between this client and the server
    (a proxy: the server process is not the one in the cancel key; PgBouncer's pool mode
    read on its admin console, else whether two connections share a server session); on a
    direct connection only, the check's own session freed of short timeouts; then where the
    settings came from. ``here``: the DSN reaching the host ``conn`` reached, alone."""
    row = await _row(conn, SESSION_QUERY)
    count = len(SESSION_SETTINGS)
    values = {
        name: (None if v is None else str(v))
        for name, v in zip(SESSION_SETTINGS, row, strict=False)
    }
    server_pid, server_port, role, database = row[count:]
    info = conn.info
    on_socket = not info.host or info.host.startswith("/")
    proxied = server_pid != info.backend_pid
    moved = (server_port is None) != on_socket or (
        server_port is not None and int(server_port) != int(info.port)
    )
    session = _Session(values, str(role), str(database), proxied, forwarded=moved and not proxied)
    if proxied:
        session.bouncer, session.bouncer_error = await _pgbouncer(conn, conninfo)
        if session.bouncer is not None:
            session.shared = session.bouncer.pool_mode != "session"
        else:
            session.shared, session.shared_error = await _shares_sessions(conn, here, server_pid)
    changes = relaxing(values)
    if proxied:
        # a session-level SET could stay behind on a pooled server connection for the next
        # client, however the probe above came out (a busy or round-robin pool hides sharing)
        session.kept, changes = list(changes), {}
    if changes:
        await _row(
            conn,
            sql.SQL("SELECT {}").format(
                sql.SQL(", ").join(
                    sql.SQL("set_config({}, {}, false)").format(sql.Literal(k), sql.Literal(v))
                    for k, v in changes.items()
                )
            ),
        )
    try:
        rows = await _rows(conn, SOURCES_QUERY, (list(SESSION_SETTINGS),))
        sources = {str(name): str(source) for name, source in rows}
        if changes:
            rows = await _rows(conn, LEVELS_QUERY)
            levels = setting_levels([(str(a), str(b)) for a, b in rows])
            options = _options(conninfo)
            for name in changes:
                sources[name] = derive_source(name, options, levels)
    except psycopg.Error:
        sources = {}  # where the settings come from is a courtesy
    session.sources = sources
    return session


async def _shares_sessions(conn: _Conn, here: str, server_pid: Any) -> tuple[bool, str | None]:
    """Two client connections on one server process, or one client moved between server
    processes: only a pooler sharing server sessions does that (a miss proves nothing)."""
    try:
        async with await _connect(here) as other:
            (theirs,) = await _row(other, b"SELECT pg_backend_pid()")
        (again,) = await _row(conn, b"SELECT pg_backend_pid()")
    except psycopg.Error as exc:
        return False, f"could not check: {first_line(exc)}"
    return theirs == server_pid or again != server_pid, None


def _options(conninfo: str) -> dict[str, str]:
    """The settings the connection asks for at startup (``options``, else ``PGOPTIONS``)."""
    try:
        given = conninfo_to_dict(conninfo).get("options")
    except psycopg.ProgrammingError:
        given = None
    return client_options(str(given or os.environ.get("PGOPTIONS") or ""))


class _HostSurvey:
    """Each host of a multi-host DSN asked on its own, all at once: a host that accepts and
    never answers costs one connect timeout, not one per host."""

    def __init__(self, hosts: list[tuple[str, str]]) -> None:
        self._hosts = hosts
        self._answers: list[HostAnswer | None] = [None] * len(hosts)
        self._workers: list[AWorker] = []
        self._bound = (
            max((attempt_seconds(dsn, os.environ) for _, dsn in hosts), default=0.0)
            + _HOST_QUESTIONS
        )

    def __bool__(self) -> bool:
        return bool(self._hosts)

    def start(self) -> None:
        self._workers = [
            aspawn(self._ask, index, label, dsn, name=f"worklease-check-host-{index}")
            for index, (label, dsn) in enumerate(self._hosts)
        ]

    async def _ask(self, index: int, label: str, dsn: str) -> None:
        try:
            async with await _connect(dsn) as conn:
                in_recovery, started = await _row(conn, HOST_QUERY)
                try:
                    (system,) = await _row(conn, IDENTITY_QUERY)
                except psycopg.Error:
                    system = None  # pg_control_system() revoked: the start time tells apart
        except Exception as exc:
            self._answers[index] = HostAnswer(label, None, error=first_line(exc))
            return
        self._answers[index] = HostAnswer(label, not in_recovery, (system, started))

    async def finding(self, reached: str | None, attrs: str, balance: str) -> CheckFinding:
        await ajoin_all(self._workers, timeout=self._bound)
        answers = [
            answer or HostAnswer(label, None, error=f"no answer within {self._bound:g}s")
            for answer, (label, _) in zip(self._answers, self._hosts, strict=True)
        ]
        return judge_hosts(answers, reached, attrs, balance)

    async def close(self) -> None:
        """Stop asking the hosts that have not answered (a thread finishes by itself)."""
        for worker in self._workers:
            acancel_worker(worker)
        await ajoin_all(self._workers, timeout=1.0)


async def _schema(conn: _Conn, schema: str | None) -> CheckFinding:
    regclass = await _regclass(conn, schema, TABLE)
    if regclass is None:
        return missing_table(schema)
    return judge_version(await probe_schema(conn, schema), await _layout(conn, schema, regclass))


async def _layout(conn: _Conn, schema: str | None, regclass: object) -> CheckFinding:
    rows = await _rows(conn, COLUMNS_QUERY, (regclass,))
    finding = judge_columns({str(name): str(kind) for name, kind in rows})
    if finding.status == "ok":
        if await _regclass(conn, schema, SEQUENCE) is None:
            return missing_sequence()
        if await _regclass(conn, schema, MEMBERS_INDEX) is None:
            return missing_index()
        fence = sql.Identifier(schema, FENCE) if schema else sql.Identifier(FENCE)
        signature = fence.as_string(conn) + "(text, bigint)"
        if await _one(conn, b"SELECT to_regprocedure(%s)::oid", (signature,)) is None:
            return missing_fence()
        if await _regclass(conn, schema, LEGACY_INDEX) is not None:
            return legacy_index()
    return finding


async def _regclass(conn: _Conn, schema: str | None, name: str) -> object:
    """The OID of the relation ``name`` (in ``schema``, else on the search path), or None."""
    relation = sql.Identifier(schema, name) if schema else sql.Identifier(name)
    return await _one(conn, b"SELECT to_regclass(%s)::oid", (relation.as_string(conn),))


async def _isolation(conn: _Conn) -> CheckFinding:
    return judge_isolation(str(await _one(conn, b"SHOW default_transaction_isolation")))


async def _writes(conn: _Conn, schema: str | None, session: _Session | str) -> CheckFinding:
    """The settings that make a session read-only, the role's privileges on the lease table
    and the sequence, then a write tried for real: an UPDATE of no row, in a transaction
    rolled back (as a lease write, it needs a writable session and the UPDATE privilege)."""
    if isinstance(session, str):
        return CheckFinding("writes", "fail", session)
    values = session.values
    finding = judge_writes(
        values.get("default_transaction_read_only"),
        values.get("transaction_read_only"),
        session.sources.get("default_transaction_read_only"),
        session.role,
        session.database,
        standby=values.get("in_hot_standby") == "on",
    )
    if finding.status != "ok":
        return finding
    table = sql.Identifier(schema, TABLE) if schema else sql.Identifier(TABLE)
    regclass = await _one(conn, b"SELECT to_regclass(%s)::oid", (table.as_string(conn),))
    if regclass is None:
        return judge_writes("off", "off", None, session.role, session.database, tried=False)
    grants = await _grants(conn, regclass)
    refused: str | None = None
    try:
        async with conn.transaction(force_rollback=True):
            await conn.execute(b"SET LOCAL lock_timeout = '2s'")
            await conn.execute(
                sql.SQL("UPDATE {} SET holder_id = holder_id WHERE false").format(table)
            )
    except (pg_errors.ReadOnlySqlTransaction, pg_errors.InsufficientPrivilege) as exc:
        refused = first_line(exc)
    return judge_writes("off", "off", None, session.role, session.database, refused, grants=grants)


_GRANTS_QUERY = (
    b"SELECT current_user, c.relnamespace::regnamespace::text, "
    + b", ".join(b"has_table_privilege(c.oid, '%s')" % p.encode() for p in TABLE_PRIVILEGES)
    + b", has_sequence_privilege(s.oid, 'USAGE, UPDATE') FROM pg_class c "
    b"LEFT JOIN pg_class s ON s.relnamespace = c.relnamespace AND s.relname = %s "
    b"AND s.relkind = 'S' WHERE c.oid = %s"
)
"""The check's role, the lease table's schema, the role's privileges on the table, and
whether it may take ``nextval`` of the sequence beside it (``USAGE`` or ``UPDATE``)."""


async def _grants(conn: _Conn, regclass: Any) -> Grants:
    row = await _row(conn, _GRANTS_QUERY, (SEQUENCE, regclass))
    role, namespace, *held, usage = row
    return Grants(
        role=str(role),
        table=f"{namespace}.{TABLE}",
        sequence=f"{namespace}.{SEQUENCE}",
        held=frozenset(p for p, has in zip(TABLE_PRIVILEGES, held, strict=True) if has),
        sequence_usage=None if usage is None else bool(usage),
    )


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
    standbys = [
        Standby(str(name or ""), mode, state, kind)
        for name, mode, state, kind in await _rows(conn, REPLICATION_QUERY)
    ]
    try:
        inactive = [str(name) for (name,) in await _rows(conn, SLOTS_QUERY)]
    except pg_errors.InsufficientPrivilege:
        inactive = []
    return judge_replication(in_recovery, standbys, inactive)


async def _timeouts(session: _Session | str, ttl: float) -> CheckFinding:
    if isinstance(session, str):
        return CheckFinding("timeouts", "fail", session)
    settings: dict[str, float] = {}
    sources: dict[str, str] = {}
    for name in TIMEOUT_SETTINGS:
        value = session.values.get(name)
        if value is None:  # not in this version
            continue
        settings[name] = seconds_setting(value)
        where = describe_source(session.sources.get(name), session.role, session.database)
        if where is not None:
            sources[name] = where
    return judge_timeouts(settings, ttl, sources, session.kept)


async def _pooler(session: _Session | str) -> CheckFinding:
    if isinstance(session, str):
        return CheckFinding("pooler", "fail", session)
    if session.bouncer is not None:
        return judge_pooler(session.shared, True, mode=session.bouncer.pool_mode)
    if session.shared_error is not None:
        return CheckFinding("pooler", "fail", session.shared_error)
    return judge_pooler(session.shared, session.proxied, forwarded=session.forwarded)


async def _connections(
    conn: _Conn, session: _Session | str, pool_size: int, processes: int
) -> CheckFinding:
    """The server's limits for this role and database; behind a proxy, PgBouncer's pool for
    this database when its admin console answered (``SHOW`` works for admin_users and
    stats_users). A port forward is no proxy: the server's limits are what counts."""
    server: ServerLimits | None = None
    try:
        limits = await _row(conn, LIMITS_QUERY)
        server = ServerLimits(
            int(limits[0]),
            int(limits[1]),
            conn.info.user,
            int(limits[2]) if limits[2] is not None else -1,
            conn.info.dbname,
            int(limits[3]) if limits[3] is not None else -1,
            int(limits[4]),
            int(limits[5]),
        )
    except psycopg.Error:
        pass
    if isinstance(session, str) or not session.proxied:
        return judge_connections(pool_size, processes, server)
    if session.bouncer is not None:
        return judge_connections(pool_size, processes, server, session.bouncer)
    return judge_connections(
        pool_size,
        processes,
        server,
        proxy=pgbouncer_unreadable(conn.info.user, session.bouncer_error),
    )


async def _pgbouncer(conn: _Conn, conninfo: str) -> tuple[BouncerPool | None, str]:
    """PgBouncer's pool for this connection's database and user, read on its admin console
    (database ``pgbouncer`` at the host and port this connection reached), or why not."""
    info = conn.info
    params = conninfo_to_dict(pinned(conninfo, info.host, info.port, info.hostaddr))
    params.pop("options", None)
    params["dbname"] = "pgbouncer"
    try:
        admin = await AsyncConnection.connect(
            make_conninfo("", **params), autocommit=True, connect_timeout=5
        )
    except psycopg.Error as exc:
        return None, first_line(exc)
    async with admin:
        try:
            databases = await _show(admin, "DATABASES")
            config = {str(r["key"]): str(r["value"]) for r in await _show(admin, "CONFIG")}
        except psycopg.Error as exc:
            return None, f"not a PgBouncer admin console: {first_line(exc)}"
        try:
            users = await _show(admin, "USERS")
        except psycopg.Error:
            users = []
    return bouncer_pool(databases, config, users, info.dbname, info.user), ""


async def _show(admin: AsyncConnection[Any], what: str) -> list[dict[str, Any]]:
    """One ``SHOW`` of PgBouncer's admin console (simple query protocol), as dicts."""
    cursor = AsyncClientCursor(admin)
    await cursor.execute(f"SHOW {what}".encode())
    names = [column.name for column in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in await cursor.fetchall()]


async def _listen(conninfo: str, listen_dsn: str | None, probe_timeout: float) -> CheckFinding:
    """The backend's own listener, its settings from ``conninfo`` (for a multi-host DSN, the
    host the check reached), listening on ``listen_dsn`` when given."""
    name = "listen" if listen_dsn is None else "listen_dsn"
    route = "this DSN" if listen_dsn is None else "the listen DSN"
    # The listener takes its settings from an application pool; this one is never opened.
    settings: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo, open=False, kwargs={"prepare_threshold": None}
    )
    listener = AsyncReleaseListener(settings, AsyncReleaseHub(), listen_dsn)
    listener.probe_timeout = probe_timeout
    listening_on = listen_dsn or conninfo
    wait = listen_deadline(
        probe_timeout,
        attempt_seconds(listening_on, os.environ),
        max(len(host_dsns(listening_on, os.environ)), 1),
    )
    listener.start()
    try:
        deadline = time.monotonic() + wait
        while not (listener.listening or listener.fell_back):
            if time.monotonic() > deadline:
                return CheckFinding(
                    name,
                    "fail",
                    f"the release listener could not connect through {route} in {wait:g}s",
                )
            await asleep(0.05)
        return judge_listener(name, route, listener.listening, listener.fallback_reason)
    finally:
        await listener.stop()
