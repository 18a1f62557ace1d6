"""PostgreSQL statements, schema text and error mapping shared by both flavours.

Every lease operation is one SQL statement sent in one round trip on its common path, in
autocommit mode, and runs READ COMMITTED whatever the database's or role's default
(REPEATABLE READ or SERIALIZABLE would turn a contended acquire into a serialization
failure). Two ways to send it (ADR-0011):

- prepared (the default): the statement alone, with server-side parameters and a plan
  prepared once per connection, on connections whose default isolation (asked once per
  connection) is READ COMMITTED; a call with a deadline is bounded by a cancel request
  (``_cancel_watch``);
- simple protocol (``prepare=False``, for poolers that cannot keep prepared statements, and
  any connection with another default isolation): one query whose first command pins the
  transaction to READ COMMITTED and whose deadline is a ``statement_timeout`` in the same
  implicit transaction, parameters bound client-side by psycopg (``ClientCursor``).

Identifiers go through ``psycopg.sql``.

Off the common path a second statement reads what the first could not say: an owned write
that matched no row reads whether the row still carries its token (expired or released, else
fenced; under a concurrent change the answer can only move from "expired" to "fenced", the
safe direction), and a refused acquire reads who holds the work ID and until when.
"""

from __future__ import annotations

import logging
import math
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any, NamedTuple

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from ._compat import ThreadLock
from ._failures import fenced, held, lease_expired, lease_lapsed
from ._fairshare import MEMBER_PREFIX, PoolSurvey
from ._models import Checkpoint, ExitMode, Token
from .errors import BackendError, ConfigError, LeaseHeldError, LeaseLostError

__all__ = [
    "renewal_bounds",
    "Grant",
    "LeaseStatus",
    "Rows",
    "Statements",
    "map_error",
    "schema_sql",
    "statement_timeout",
]

_logger = logging.getLogger("worklease")

Rows = list[tuple[Any, ...]]
"""The rows of a statement's last result, as psycopg returns them (tuples)."""

_MAX_STATEMENT_TIMEOUT_MS = 2_147_483_647
"""PostgreSQL's largest ``statement_timeout`` (an int of milliseconds, about 24.8 days)."""


def statement_timeout(seconds: float) -> str:
    """``seconds`` as a ``statement_timeout`` value: whole milliseconds, at least 1 (0 would
    mean no timeout), at most what PostgreSQL accepts (a longer bound is no bound worth
    having for one statement)."""
    return str(min(max(int(seconds * 1000), 1), _MAX_STATEMENT_TIMEOUT_MS))


def tx_begin(limit: str) -> bytes:
    """The first statement of a transactional step: BEGIN, and both timeouts set to ``limit``
    (a ``statement_timeout`` value, or "0": no bound). The value is written into the text
    (it is a whole number, nothing to quote), so the statement goes as it is, with no
    client-side binding to pay for at every step."""
    if not (limit.isascii() and limit.isdigit()):
        raise ValueError(f"a step's bound is whole milliseconds, not {limit!r}")
    value = limit.encode()
    return (
        b"BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = "
        + value
        + b"; SET LOCAL idle_in_transaction_session_timeout = "
        + value
    )


def renewal_bounds(seconds: float) -> tuple[float | None, float | None]:
    """How long a renewal with a TTL of ``seconds`` may wait for a connection, and how long
    its statement may run: the TTL, since a renewal that takes longer is of no use. A TTL of
    zero or less (the test affordance that writes an already-expired lease) gives nothing to
    bound by: the pool's own checkout timeout, and no bound on the statement (a negative
    bound cancelled it before it could run)."""
    if seconds > 0:
        return seconds, seconds
    return None, None


_SINGLE: dict[bytes, bytes] = {}
"""Each composed statement's text without the isolation pin: what the prepared path sends."""


_ARRAY_PARAMETER = re.compile(rb"%\((\w+)\)s(::\w+\[\])")
"""A parameter cast to an array type (the batch statements' inputs)."""


def _register_single(pinned: bytes, single: bytes) -> bytes:
    # On the extended protocol the arrays go in binary: psycopg's text form quotes and
    # escapes every element in Python (for 32 checkpoint states of 256 bytes, about 220 us of
    # client CPU per statement, against 8 us in binary). The simple-query text keeps %s: a
    # client-side cursor binds no binary parameters.
    _SINGLE[pinned] = _ARRAY_PARAMETER.sub(rb"%(\1)b\2", single)
    return pinned


def single_statement(statement: bytes) -> bytes | None:
    """The one-command form of a composed statement, sent prepared on connections that read
    committed by default (``None``: the statement has none and goes as a simple query)."""
    return _SINGLE.get(statement)


CONNECTION_TRAITS = (
    b"SELECT current_setting('default_transaction_isolation'), "
    b"(SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'), "
    b"pg_backend_pid()"
)
"""What the statement path needs to know of a connection, asked once: its default isolation,
its session's ``statement_timeout`` (milliseconds, 0: none), from the role, database,
``options`` or a ``SET``, and the server process serving it (compared with the one the
connection was given at startup: a proxy in between, ADR-0015)."""


@dataclass(frozen=True, slots=True)
class ConnectionTraits:
    read_committed: bool
    statement_timeout_ms: int
    proxied: bool = False
    """The server process answering is not the one named in the connection's cancel key: a
    proxy (a pooler such as PgBouncer, which hands out keys of its own) is in between, and
    it may lend the server session to other clients between transactions."""

    def extended(self, bound: float | None) -> bool:
        """Whether a statement may go alone through the extended protocol (server-side
        parameters, prepared or not): the connection reads committed, and a bounded
        statement (``bound`` seconds) is not cut short by a shorter session
        ``statement_timeout`` (the simple query overrides it for the statement, as its
        bound)."""
        if not self.read_committed:
            return False
        if bound is None or self.statement_timeout_ms == 0:
            return True
        return self.statement_timeout_ms >= int(statement_timeout(bound))


_TRAITS: weakref.WeakKeyDictionary[Any, ConnectionTraits] = weakref.WeakKeyDictionary()


def known_traits(conn: Any) -> ConnectionTraits | None:
    """What ``learn_traits`` found for ``conn`` (``None``: not asked yet)."""
    return _TRAITS.get(conn)


def learn_traits(conn: Any, rows: Rows) -> ConnectionTraits:
    """Remember the result of ``CONNECTION_TRAITS`` on ``conn``."""
    isolation, timeout, pid = rows[0] if rows else (None, None, None)
    proxied = pid is not None and int(pid) != conn.pgconn.backend_pid
    traits = ConnectionTraits(isolation == "read committed", int(timeout or 0), proxied)
    _TRAITS[conn] = traits
    return traits


def check_prepare(value: object) -> bool | None:
    """The backend's ``prepare`` option: ``None`` (decide per connection), ``True`` or
    ``False``."""
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"prepare must be None, True or False, not {value!r}")
    return value


def prepares(mode: bool | None, traits: ConnectionTraits, conn: Any) -> bool:
    """Whether a statement going through the extended protocol on ``conn`` is sent as a
    named prepared statement (else unnamed: parsed and planned per call, and safe through
    any pooler). ``mode`` is the backend's ``prepare``: ``None`` prepares only on a
    connection that reaches the server directly (ADR-0015); a connection whose
    ``prepare_threshold`` is ``None`` is honoured by the driver in every mode."""
    if mode is None and traits.proxied:
        _warn_proxied(conn)
        return False
    return True


_WARNED_ROUTES: set[tuple[str, str, str]] = set()
_WARNED_LOCK = ThreadLock()

PROXIED_WARNING = (
    "worklease: {route} reaches PostgreSQL through a proxy (the server process answering is "
    "not the one the connection was given at startup, as behind PgBouncer): worklease sends "
    "its statements unprepared, safe where the pooler lends a server session to other "
    "clients. {own} If the pooler keeps prepared statements per client (PgBouncer 1.21 or "
    "later with max_prepared_statements > 0) or pools whole sessions, prepare=True gives "
    "back the prepared path."
)
_OWN_AT_RISK = (
    "Your own statements on these connections are prepared by psycopg after "
    "prepare_threshold (5) runs, which a pooler sharing server sessions mixes up between "
    "clients: give the pool kwargs={'prepare_threshold': None}."
)


def _warn_proxied(conn: Any) -> None:
    """One warning per process and route: what worklease does behind a proxy, and what the
    application's own statements need there."""
    info = conn.info
    route = (str(info.host), str(info.port), str(info.dbname))
    with _WARNED_LOCK:
        if route in _WARNED_ROUTES:
            return
        _WARNED_ROUTES.add(route)
    threshold = getattr(conn, "prepare_threshold", None)
    own = _OWN_AT_RISK if threshold is not None else ""
    where = f"the connection to {route[0]}:{route[1]} database {route[2]!r}"
    _logger.warning(" ".join(PROXIED_WARNING.format(route=where, own=own).split()))


RENEWAL_POOL_SIZE = 4
"""Connections of a backend's private pool (renewals, a pool's surveys and batches)."""
DIRECT_SLOTS = 2
"""How many calls may run on connections of their own at once, per pool of a backend (the
application's and the private one each), when the pool is failing (``PoolTrouble``)."""
DIRECT_CONNECTIONS = 2 * DIRECT_SLOTS
"""The direct slots of one backend: its two pools' together."""
LISTENER_CONNECTIONS = 2
"""The release listener's connection, and the second one its route check opens for a moment
at each (re)connect."""


class PoolTrouble:
    """Whether a pool that has no connection to give is failing, not merely busy (a
    failover, a restart, wrong credentials), so that a call may go around it on a connection
    of its own (a direct slot): psycopg_pool reconnects on a backoff that starts at 1 s and
    doubles, which would hold every write back for seconds after the server is back.

    The signs, judged when a checkout timed out: the pool never served this backend and a
    connection attempt of it failed (a pool that cannot connect at all: one direct attempt
    tells why, at once; a pool still making its first connection is waited for); the pool's
    own counters of failed connection attempts and lost connections moved since it last served
    (the baseline is refreshed at most every ``refresh`` seconds, on a checkout that was
    served); or a statement lost its connection since it last served. A pool that serves
    again is out of trouble; one that is only busy is waited for. No I/O; races between
    threads only make a judgement one call late."""

    refresh = 1.0

    def __init__(self) -> None:
        self.served = False
        self._failures: int | None = None
        self._baseline_at = -math.inf
        self._lost = False
        self._suspect = False

    @staticmethod
    def failures(stats: dict[str, int]) -> int:
        return sum(stats.get(k, 0) for k in ("connections_errors", "connections_lost"))

    def suspected(self) -> bool:
        """Judged failing, and not served since: a checkout waits only briefly before going
        around."""
        return self._suspect

    def serve(self, now: float) -> bool:
        """The pool handed out a connection; ``True`` when the caller should refresh the
        baseline (``baseline(pool.get_stats(), now)``)."""
        self.served = True
        self._suspect = self._lost = False
        return now - self._baseline_at >= self.refresh

    def baseline(self, stats: dict[str, int], now: float) -> None:
        self._failures = self.failures(stats)
        self._baseline_at = now

    def connection_lost(self) -> None:
        """A statement on one of the pool's connections lost it (``lost_connection``)."""
        self._lost = self._suspect = True

    def judge(self, stats: dict[str, int]) -> bool:
        """At a checkout that timed out: whether to go around the pool (``stats`` are
        ``pool.get_stats()``)."""
        failures = self.failures(stats)
        if not self.served:
            # Still opening: slow is not failing (a first connection takes its time on a
            # loaded machine); a failed attempt is (wrong credentials fail at once).
            troubled = failures > 0 or self._lost
        else:
            moved = self._failures is not None and failures != self._failures
            troubled = moved or self._lost
        if self._failures is None:  # first look: a baseline
            self._failures = failures
        self._suspect = troubled
        return troubled


def lost_connection(error: BaseException) -> bool:
    """Whether a statement's error means its connection is gone (the server went away,
    shut down, or turned out to be a standby), as opposed to an error of the statement
    (a cancel at its bound, a deadlock, a serialization failure), after which worklease
    itself drops the connection."""
    if type(error) in (psycopg.OperationalError, psycopg.InterfaceError):
        return True
    return isinstance(
        error,
        (
            pg_errors.AdminShutdown,
            pg_errors.CrashShutdown,
            pg_errors.CannotConnectNow,
            pg_errors.ReadOnlySqlTransaction,
        ),
    )


def connections_per_backend(pool_max_size: int) -> int:
    """The most server connections one backend opens: its application pool's ``max_size``,
    its private pool, the direct slots of both and its listener (the sizing rule of the
    guide)."""
    return pool_max_size + RENEWAL_POOL_SIZE + DIRECT_CONNECTIONS + LISTENER_CONNECTIONS


TABLE = "worklease_leases"
RELEASE_CHANNEL = "worklease_release"
"""The NOTIFY channel a release or forget announces its work ID on (at commit)."""
SEQUENCE = "worklease_fencing_seq"
LEGACY_INDEX = "idx_worklease_leases_updated_at"
"""The index on ``updated_at`` of earlier schemas (and of the Go library's): ``migrate`` drops it,
since an index on a column every write changes makes every lease write a non-HOT update."""
MEMBERS_INDEX = "idx_worklease_leases_members"
FENCE = "worklease_fence"
"""The SQL function guarding a user's own statements by a lease (schema.sql)."""
_PIN = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; "
_BOUND = "SELECT set_config('statement_timeout', %(statement_timeout)s, true); "
"""Bounds the statements after it (in the same implicit transaction) server-side."""

TOKEN_TIMELINE_SHIFT = 40
"""Fencing tokens are ``timeline << 40`` plus a sequence value (see ADR-0008)."""

_TOKEN = (
    "((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint << "
    + str(TOKEN_TIMELINE_SHIFT)
    + ") + nextval({sequence}))"
)
"""A new fencing token: the server's WAL timeline in the high bits (every promotion starts a
higher timeline, so a promoted standby whose sequence lags still issues greater tokens than
any the old primary issued), the sequence in the low 40 bits. An acquire never issues less
than the row's token + 1 either (a restore into a new cluster restarts the timeline)."""
_MISSING_SCHEMA_HINT = (
    "the worklease schema is missing ({detail}); create it with "
    "`worklease migrate --dsn DSN` (or PostgresBackend.apply_schema(pool))"
)


def check_schema_name(schema: object) -> str | None:
    if schema is None:
        return None
    if not isinstance(schema, str) or not schema or "\x00" in schema or "%" in schema:
        raise ConfigError(f"schema must be a non-empty string without NUL or '%', got {schema!r}")
    return schema


def check_conninfo(conninfo: object) -> str:
    """A conninfo string (key/value or URL) libpq can parse, checked before any I/O; the
    message never repeats the string (it may hold a password)."""
    if not isinstance(conninfo, str):
        raise ConfigError(f"conninfo must be a string, got {type(conninfo).__name__}")
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        # libpq quotes the text around the error, which may be part of a password: only an
        # unknown parameter's name is repeated.
        named = re.search(r'invalid (?:connection option|URI query parameter):? "[^"]*"', str(exc))
        detail = named.group(0) if named else "libpq cannot parse it"
        raise ConfigError(
            f"not a valid conninfo string ({detail}; look for a missing '=', an unterminated "
            "quote or a misspelt parameter)"
        ) from None
    return conninfo


def check_listen_dsn(listen_dsn: object, listen: bool) -> str | None:
    """A conninfo string for the release listener, checked before any I/O."""
    if listen_dsn is None:
        return None
    if not isinstance(listen_dsn, str):
        raise ConfigError(f"listen_dsn must be a conninfo string, got {type(listen_dsn).__name__}")
    if not listen:
        raise ConfigError("listen_dsn was given with listen=False: nothing would listen on it")
    try:
        check_conninfo(listen_dsn)  # never repeats the string: it may hold a password
    except ConfigError as exc:
        raise ConfigError(f"listen_dsn is {exc}") from None
    return listen_dsn


def _canonical() -> str:
    return resources.files("worklease").joinpath("schema.sql").read_text(encoding="utf-8")


def _qualify(text: str, quoted: str) -> str:
    """Put the canonical DDL's objects into the (already quoted) schema ``quoted``."""
    replacements = [
        (f"SEQUENCE IF NOT EXISTS {SEQUENCE};", f"SEQUENCE IF NOT EXISTS {quoted}.{SEQUENCE};"),
        (f"TABLE IF NOT EXISTS {TABLE} (", f"TABLE IF NOT EXISTS {quoted}.{TABLE} ("),
        (f"nextval('{SEQUENCE}')", f"nextval({_quote_literal(quoted + '.' + SEQUENCE)})"),
        (f"INDEX IF EXISTS {LEGACY_INDEX};", f"INDEX IF EXISTS {quoted}.{LEGACY_INDEX};"),
        (f"ALTER TABLE {TABLE} SET", f"ALTER TABLE {quoted}.{TABLE} SET"),
        (
            f"ON {TABLE} (work_id text_pattern_ops)",
            f"ON {quoted}.{TABLE} (work_id text_pattern_ops)",
        ),
        (f"FUNCTION {FENCE}(", f"FUNCTION {quoted}.{FENCE}("),
        (f"COMMENT ON TABLE {TABLE} IS", f"COMMENT ON TABLE {quoted}.{TABLE} IS"),
        # inside the version record's DO block, a string literal
        (
            f"obj_description('{TABLE}'::regclass",
            f"obj_description('{_in_literal(quoted)}.{TABLE}'::regclass",
        ),
        # inside the function's body, a string literal
        (
            f"FROM {TABLE} WHERE work_id = p_work_id",
            f"FROM {_in_literal(quoted)}.{TABLE} WHERE work_id = p_work_id",
        ),
    ]
    for old, new in replacements:
        if old in text:
            text = text.replace(old, new)
    return text


def schema_sql(schema: str | None = None) -> str:
    """The DDL that creates the worklease table, sequence, index and fence function, drops
    the index of earlier schemas and records the schema version on the table (idempotent).

    With ``schema``, the objects are created in (and the script first creates) that PostgreSQL
    schema; identifiers are quoted.
    """
    text = _canonical()
    name = check_schema_name(schema)
    if name is None:
        return text
    quoted = sql.Identifier(name).as_string()
    header, rest = _qualify(text, quoted).split("\n-- step 1:", 1)
    return f"{header}\nCREATE SCHEMA IF NOT EXISTS {quoted};\n\n-- step 1:{rest}"


def _in_literal(value: str) -> str:
    return value.replace("'", "''")


def _quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def split_statements(text: str) -> list[str]:
    """The statements of a script, without their ``;`` and comment lines; a ``;`` inside a
    ``$$``-quoted body (a ``DO`` block) does not end a statement."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    statements: list[str] = []
    for index, part in enumerate("\n".join(lines).split("$$")):
        if index % 2:  # inside $$ ... $$: kept whole
            statements[-1] += f"$${part}$$"
            continue
        pieces = part.split(";")
        if statements and index:  # what follows the closing $$ ends that statement
            statements[-1] += pieces.pop(0)
        statements.extend(pieces)
    return [statement.strip() for statement in statements if statement.strip()]


def schema_statements(schema: str | None = None) -> list[str]:
    """The statements of ``schema_sql(schema)``, one by one.

    The canonical file (which quotes nothing) is split first and the schema put in afterwards,
    so a schema name containing ``;`` or ``--`` stays one quoted identifier.
    """
    canonical = split_statements(_canonical())
    name = check_schema_name(schema)
    if name is None:
        return canonical
    quoted = sql.Identifier(name).as_string()
    qualified = [_qualify(statement + ";", quoted)[:-1] for statement in canonical]
    return [f"CREATE SCHEMA IF NOT EXISTS {quoted}", *qualified]


_INTERVALS: dict[float, timedelta] = {}
"""The intervals of the TTLs seen so far (building one costs more than the rest of the
parameters of a call)."""
_INTERVALS_KEPT = 64


class Statements:
    """The composed statements for one schema (``None``: the connection's search_path)."""

    def __init__(self, schema: str | None) -> None:
        self.schema = check_schema_name(schema)
        table = sql.Identifier(self.schema, TABLE) if self.schema else sql.Identifier(TABLE)
        sequence = sql.Identifier(self.schema, SEQUENCE).as_string() if self.schema else SEQUENCE
        token = sql.SQL(_TOKEN).format(sequence=sql.Literal(sequence))
        pin = sql.SQL(_PIN)

        def build(text: str) -> bytes:
            # Rendered once: composing on every call costs more than a cheap read itself.
            single = sql.SQL(text).format(table=table, token=token)
            return _register_single((pin + single).as_bytes(None), single.as_bytes(None))

        owned = "work_id = %(work_id)s AND holder_id = %(holder_id)s AND fencing_token = %(token)s"
        # How an acquire takes over an expired or released row: one text for the single and
        # the batched acquire, so they cannot drift apart.
        takeover = """ON CONFLICT (work_id) DO UPDATE SET
        holder_id = EXCLUDED.holder_id,
        fencing_token = GREATEST(EXCLUDED.fencing_token, l.fencing_token + 1),
        expires_at = EXCLUDED.expires_at,
        exit_mode = NULL,
        prev_exit_mode = COALESCE(l.exit_mode, 'expired'),
        prev_holder_id = l.holder_id,
        updated_at = now()
    WHERE l.expires_at < now()"""
        # One flat upsert: it returns a row only when it grants. A refused acquire reads the
        # holder afterwards (``holder``), on that path only: a branch reading it in the same
        # statement cost every grant about a tenth more server time (ADR-0024).
        acquire = (
            """INSERT INTO {{table}} AS l (work_id, holder_id, expires_at, fencing_token)
VALUES (%(work_id)s, %(holder_id)s, now() + %(ttl)s, {{token}})
"""
            + takeover
            + """
RETURNING l.fencing_token, l.expires_at, current_schema(){extra}"""
        )
        self.acquire = build(acquire.format(extra=""))
        # The same upsert returning what the new holder reads first: the runner's cycle then
        # needs no separate read.
        self.acquire_reading = build(
            acquire.format(extra=", l.checkpoint, l.prev_exit_mode, l.prev_holder_id")
        )
        # Who holds a work ID an acquire was refused, and until when (nothing for a row no
        # longer held: it was freed after the refusal).
        self.holder = build(
            """SELECT holder_id, expires_at FROM {table}
WHERE work_id = %(work_id)s AND expires_at >= now()"""
        )
        self._bounded: dict[bytes, bytes] = {}
        # Batch statements: rows are locked in work_id order, so concurrent batches over
        # overlapping work IDs (from any number of processes) cannot deadlock; results come
        # back in input order (the ordinality of the input array).
        self.find_available = build(
            """SELECT w.work_id
FROM unnest(%(work_ids)s::text[]) WITH ORDINALITY AS w(work_id, n)
LEFT JOIN {table} AS l ON l.work_id = w.work_id
WHERE l.work_id IS NULL OR l.expires_at < now()
ORDER BY w.n"""
        )
        # acquire_reading for many work IDs, with the single acquire's takeover.
        self.acquire_many = build(
            """WITH granted AS (
    INSERT INTO {table} AS l (work_id, holder_id, expires_at, fencing_token)
    SELECT w.work_id, %(holder_id)s, now() + %(ttl)s, {token}
    FROM unnest(%(work_ids)s::text[]) AS w(work_id)
    ORDER BY w.work_id
    """
            + takeover
            + """
    RETURNING work_id, fencing_token, expires_at, checkpoint, prev_exit_mode, prev_holder_id
)
SELECT g.work_id, g.fencing_token, g.expires_at, g.checkpoint, g.prev_exit_mode,
       g.prev_holder_id, current_schema()
FROM granted AS g
JOIN unnest(%(work_ids)s::text[]) WITH ORDINALITY AS w(work_id, n) ON w.work_id = g.work_id
ORDER BY w.n"""
        )

        # Statements changing many owned rows (renew_many, release_many): per input token one
        # (changed, expired) pair, as the single operation's. Rows are locked in work_id
        # order; the locking CTE reads each row's latest version, so a row superseded while
        # waiting for its lock drops out (fenced), the safe direction.
        def per_token(
            change: str, *, guard: str = "l.expires_at > now()", state: bool = False
        ) -> str:
            # ``state``: a bytea per token too (checkpoint_many), as i.state
            arrays = "%(work_ids)s::text[], %(holder_ids)s::text[], %(tokens)s::bigint[]"
            columns = "work_id, holder_id, fencing_token"
            if state:
                arrays += ", %(states)s::bytea[]"
                columns += ", state"
            return (
                f"""WITH input AS (
    SELECT * FROM unnest({arrays})
        WITH ORDINALITY AS i({columns}, n)
), locked AS ("""
                + """
    SELECT l.work_id, l.exit_mode, l.expires_at
    FROM {table} AS l
    JOIN input AS i ON l.work_id = i.work_id AND l.holder_id = i.holder_id
        AND l.fencing_token = i.fencing_token
    ORDER BY l.work_id
    FOR UPDATE OF l
), changed AS (
    UPDATE {table} AS l SET """
                + change
                + """
    FROM input AS i
    WHERE l.work_id = i.work_id AND l.holder_id = i.holder_id
        AND l.fencing_token = i.fencing_token AND """
                + guard
                + """
        AND l.work_id IN (SELECT work_id FROM locked)
    RETURNING l.work_id"""
                + (
                    ""
                    if "exit_mode" not in change
                    else f", pg_notify('{RELEASE_CHANNEL}', l.work_id)"
                )
                + """
)
SELECT r.work_id IS NOT NULL,
       k.exit_mode IS NOT NULL OR k.expires_at <= now()
FROM input AS i
LEFT JOIN locked AS k ON k.work_id = i.work_id
LEFT JOIN changed AS r ON r.work_id = i.work_id
ORDER BY i.n"""
            )

        # A renewal never extends a released lease (see renew).
        self.renew_many = build(
            per_token(
                "expires_at = now() + %(ttl)s, updated_at = now()",
                guard="l.expires_at > now() AND l.exit_mode IS NULL",
            )
        )
        # A release wakes the waiters on its work ID (NOTIFY at commit), as release does.
        self.release_many = build(
            per_token(
                "exit_mode = %(mode)s, expires_at = now() - interval '1 millisecond', "
                "updated_at = now()"
            )
        )
        # checkpoint's guard (no exit declared; expiry unchecked: it revives a lapsed lease
        # nobody took), per token; a row locked but unchanged was released: expired.
        self.checkpoint_many = build(
            per_token(
                "checkpoint = i.state, expires_at = now() + %(ttl)s, updated_at = now()",
                guard="l.exit_mode IS NULL",
                state=True,
            )
        )
        # A pool's view of its group in one read: the free work IDs (input order), how many
        # each holder holds, and the live memberships with their checkpoints. Few rows once
        # everything is held, however many work IDs the pool has.
        survey = """WITH input AS (
    SELECT w.work_id, w.n, l.holder_id, l.expires_at >= now() AS held
    FROM unnest(%(work_ids)s::text[]) WITH ORDINALITY AS w(work_id, n)
    LEFT JOIN {table} AS l ON l.work_id = w.work_id
)
SELECT 'free' AS kind, work_id, NULL::text, NULL::bigint, NULL::bytea, n
FROM input WHERE held IS NOT TRUE
UNION ALL
SELECT 'held', NULL, holder_id, count(*), NULL, NULL
FROM input WHERE held GROUP BY holder_id
UNION ALL
SELECT 'member', NULL, holder_id, NULL, checkpoint, NULL
FROM {table}
WHERE MEMBERS starts_with(work_id, %(prefix)s) AND expires_at >= now()
ORDER BY 1, 6"""
        self._survey_any = build(survey.replace("MEMBERS ", ""))
        # A pool's group (its prefix under MEMBER_PREFIX): the LIKE matches the partial
        # index of the membership rows (schema.sql), so with no work IDs (a pool's look at
        # its members only) the statement reads a few index entries.
        self._survey_members = build(
            survey.replace("MEMBERS ", "work_id LIKE '" + MEMBER_PREFIX + "%%' AND ")
        )
        # The owned writes: one plain guarded UPDATE each, a row back meaning done (the cost
        # of the statement a user would write by hand). No row: ``owned_row`` then tells
        # fenced from expired (see ``written``).
        self.checkpoint = build(
            f"""UPDATE {{table}}
SET checkpoint = %(state)s, expires_at = now() + %(ttl)s, updated_at = now()
WHERE {owned} AND exit_mode IS NULL
RETURNING true"""
        )
        # Renewals are bounded by one TTL (see bounded()). The exit check is not redundant:
        # now() is the statement's start, so a renewal that waited on the row lock while the
        # holder's release committed would find the released expiry (the release's now()
        # less 1 ms) still after its own now(), and extend a released lease.
        self.renew = build(
            f"""UPDATE {{table}} SET expires_at = now() + %(ttl)s, updated_at = now()
WHERE {owned} AND expires_at > now() AND exit_mode IS NULL
RETURNING true"""
        )
        self.release = build(
            f"""UPDATE {{table}}
SET exit_mode = %(mode)s, expires_at = now() - interval '1 millisecond', updated_at = now()
WHERE {owned} AND expires_at > now()
RETURNING true, pg_notify('{RELEASE_CHANNEL}', work_id)"""
        )
        self.owned_row = build(f"SELECT true FROM {{table}} WHERE {owned}")
        # A transactional step (lease.transaction): the user's statements run between these,
        # in one READ COMMITTED transaction bounded server-side by the lease window. The guard
        # runs just before COMMIT: it locks the lease row (a successor's takeover waits for
        # the COMMIT, then sees the extended lease), writes the staged checkpoint, and
        # succeeds only while the token is the current grant and the lease has not lapsed at
        # that moment (clock_timestamp(): now() would be the transaction's start).
        # One plain UPDATE (cheap to plan on the simple protocol): a row means the step may
        # commit; no row means it may not, and tx_status (read after the rollback) says why.
        self.tx_guard = (
            sql.SQL(
                f"""UPDATE {{table}}
SET checkpoint = CASE WHEN %(write)s THEN %(state)s ELSE checkpoint END,
    expires_at = clock_timestamp() + %(ttl)s, updated_at = clock_timestamp()
WHERE {owned} AND exit_mode IS NULL AND expires_at > clock_timestamp()"""
            )
            .format(table=table)
            .as_bytes(None)
        )
        self.tx_status = build(
            f"""SELECT false, exit_mode, expires_at <= now()
FROM (SELECT 1) AS one LEFT JOIN {{table}} ON {owned}"""
        )
        self.read_checkpoint = build(
            """SELECT fencing_token, checkpoint, prev_exit_mode, prev_holder_id
FROM {table} WHERE work_id = %(work_id)s"""
        )
        # Waiters listening on RELEASE_CHANNEL wake at once (RETURNING runs only for a row
        # actually released or deleted; the notification goes out at commit).
        self.forget = build(
            f"DELETE FROM {{table}} WHERE {owned}\n"
            f"RETURNING 1, pg_notify('{RELEASE_CHANNEL}', work_id)"
        )
        # An operator's expire: the grant ends now and its token is replaced by a new one
        # nobody holds (the holder's next write is fenced; the next acquire issues a greater
        # one still, and reads the previous exit 'expired' by that holder).
        self.expire = build(
            """UPDATE {table} AS l
SET fencing_token = GREATEST({token}, l.fencing_token + 1),
    expires_at = now() - interval '1 millisecond', updated_at = now()
WHERE work_id = %(work_id)s AND exit_mode IS NULL AND expires_at >= now()
RETURNING true, pg_notify('"""
            + RELEASE_CHANNEL
            + """', work_id)"""
        )
        sweepable = """updated_at < now() - %(retention)s
  AND expires_at < now()
  AND (exit_mode = 'retired' OR (%(include_expired)s AND exit_mode IS NULL))"""
        # One batch of a sweep (see sweep_batch): the next at most %(batch)s rows in work_id
        # order after the cursor %(after)s (the primary key: bounded with or without the
        # updated_at index, however few of the rows are sweepable); of those, the sweepable
        # ones nobody else has locked are locked (SKIP LOCKED: an acquire, step or fence in
        # progress is never waited for) and deleted, re-checked. Rows are found again by
        # ctid (the statement's snapshot keeps its tuples from being vacuumed away); a row
        # changed since is re-checked on its latest version when locked, as the single
        # DELETE did. Each batch is one statement, in autocommit: its locks last one batch.
        # It returns the deleted count, the last work ID it examined (the next cursor) and
        # whether it reached the end of the table.
        self.sweep = build(
            """WITH scanned AS (
    SELECT ctid, work_id, ("""
            + sweepable
            + """) AS doomed
    FROM {table}
    WHERE work_id > %(after)s
    ORDER BY work_id
    LIMIT %(batch)s
), locked AS (
    SELECT ctid FROM {table}
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM scanned WHERE doomed))
      AND """
            + sweepable
            + """
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM {table}
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM locked))
      AND """
            + sweepable
            + """
    RETURNING 1
)
SELECT (SELECT count(*) FROM deleted), (SELECT max(work_id) FROM scanned),
       (SELECT count(*) FROM scanned) < %(batch)s"""
        )
        self.count_sweepable = build("SELECT count(*) FROM {table}\nWHERE " + sweepable)
        # Leases held per holder: the work IDs it holds (memberships apart) and the pool
        # groups it belongs to (held membership leases).
        self.status_by_holder = build(
            f"""SELECT holder_id,
       count(*) FILTER (WHERE NOT starts_with(work_id, '{MEMBER_PREFIX}')) AS held,
       count(*) FILTER (WHERE starts_with(work_id, '{MEMBER_PREFIX}')) AS groups
FROM {{table}}
WHERE expires_at >= now() AND exit_mode IS NULL
  AND (%(pattern)s::text IS NULL OR work_id ~ %(pattern)s
       OR starts_with(work_id, '{MEMBER_PREFIX}'))
GROUP BY holder_id
ORDER BY held DESC, holder_id"""
        )
        self.status = build(
            """SELECT * FROM (
    SELECT work_id, holder_id, fencing_token,
           CASE WHEN exit_mode IS NOT NULL THEN 'released'
                WHEN expires_at >= now() THEN 'held'
                ELSE 'expired' END AS state,
           exit_mode, prev_exit_mode, prev_holder_id, expires_at,
           octet_length(checkpoint) AS checkpoint_size, updated_at,
           extract(epoch FROM expires_at - now())::float8 AS expires_in
    FROM {table}
    WHERE %(pattern)s::text IS NULL OR work_id ~ %(pattern)s
) AS leases
WHERE %(state)s::text IS NULL OR state = %(state)s
ORDER BY work_id"""
        )

    # -- sweep in batches ---------------------------------------------------------------------

    sweep_batch: int = 1000
    """How many rows (in work_id order) one sweep statement examines at most: the bound on
    how long its locks last, so an acquire of a row being swept waits one short batch at
    most (about 6 ms at 1,000 rows, all sweepable; benchmarks/bench_sweep.py)."""
    SWEEP_START = ""
    """The cursor of a sweep's first batch (work IDs are never empty)."""

    def sweep_window(self, after: str) -> dict[str, Any]:
        """The parameters placing a sweep batch: the rows after work ID ``after``."""
        return {"after": after, "batch": self.sweep_batch}

    @staticmethod
    def swept(rows: Rows) -> tuple[int, str | None]:
        """From a sweep batch: how many rows it deleted, and the cursor of the next batch
        (``None``: this one reached the end of the table, the sweep is done)."""
        deleted, last, done = rows[0]
        return int(deleted), None if done or last is None else str(last)

    # -- parameters -------------------------------------------------------------------------

    @staticmethod
    def ttl(seconds: float) -> timedelta:
        """A TTL as an interval; a non-positive one yields an already-expired lease."""
        interval = _INTERVALS.get(seconds)
        if interval is None:
            interval = timedelta(seconds=min(seconds, -1e-6) if seconds <= 0 else seconds)
            if len(_INTERVALS) < _INTERVALS_KEPT:  # a process uses a few TTLs, over and over
                _INTERVALS[seconds] = interval
        return interval

    @staticmethod
    def owned(token: Token) -> dict[str, Any]:
        return {
            "work_id": token.work_id,
            "holder_id": token.holder_id,
            "token": token.fencing_token,
        }

    # -- results ------------------------------------------------------------------------------

    def survey_statement(self, prefix: str) -> bytes:
        """The survey statement for members under ``prefix``: the index-friendly one for a
        pool group's prefix, the general one for any other."""
        return self._survey_members if prefix.startswith(MEMBER_PREFIX) else self._survey_any

    def acquire_statement(self, *, reading: bool) -> bytes:
        """The acquire statement, returning the checkpoint too with ``reading``."""
        return self.acquire_reading if reading else self.acquire

    def bounded(self, statement: bytes) -> bytes:
        """``statement`` bounded server-side by a ``statement_timeout`` parameter (a call
        with a deadline: a waiting acquire's timeout, a write inside a lease window, a
        renewal), for the simple protocol."""
        found = self._bounded.get(statement)
        if found is None:
            pin = _PIN.encode()
            assert statement.startswith(pin)
            found = self._bounded[statement] = pin + _BOUND.encode() + statement[len(pin) :]
        return found

    @staticmethod
    def acquired(rows: Rows, work_id: str, holder_id: str, *, reading: bool) -> Grant | None:
        """The grant of an acquire statement; ``None`` when it was refused (the work ID is
        held: ``holder`` then says by whom)."""
        if not rows:
            return None
        row = rows[0]  # fencing_token, expires_at, schema[, checkpoint, prev_exit, prev_holder]
        token = Token(work_id, holder_id, int(row[0]), _utc(row[1]))
        prior = _checkpoint(row[3], row[4], row[5]) if reading else None
        return Grant(token, prior, row[2])

    @staticmethod
    def held_by(rows: Rows, work_id: str) -> LeaseHeldError | None:
        """What a refused acquire raises, from ``holder`` read after it: the holder and its
        expiry; ``None`` when the work ID is no longer held (released, expired or forgotten
        since the refusal)."""
        if not rows:
            return None
        holder_id, expires_at = rows[0]
        return held(work_id, holder_id, _utc(expires_at))

    @staticmethod
    def held_meanwhile(work_id: str) -> LeaseHeldError:
        """A refused acquire whose work ID was free again when its holder was read, and
        taken by somebody else before the retry: held, by whom unknown."""
        return held(work_id, None, None)

    @staticmethod
    def current_schema(rows: Rows) -> str | None:
        """The result of the ``SELECT current_schema()`` probe."""
        return rows[0][0] if rows else None

    @staticmethod
    def written(rows: Rows) -> bool:
        """Whether an owned write (checkpoint, renew, release) changed its row."""
        return bool(rows)

    @staticmethod
    def not_written(owned_rows: Rows, token: Token, operation: str) -> LeaseLostError:
        """Why an owned write changed nothing, from ``owned_row`` read after it: the row
        still carries this token (so it expired or was released: tokens never return), or
        it does not (fenced: superseded or forgotten). Read after the write, a concurrent
        change can only move the answer from expired to fenced, the safe direction."""
        if owned_rows:
            return lease_expired(token, operation, "the lease expired or was released")
        return fenced(token, operation)

    @staticmethod
    def step_loss(rows: list[tuple[Any, ...]], token: Token) -> LeaseLostError | None:
        """From ``tx_status``: why ``token`` can no longer commit a step, or ``None`` while
        it still could."""
        _, exit_mode, lapsed = rows[0] if rows else (False, None, None)
        return Statements.loss(exit_mode, lapsed, token)

    @staticmethod
    def loss(exit_mode: str | None, lapsed: bool | None, token: Token) -> LeaseLostError | None:
        if lapsed is None:  # no row with this holder and token
            return fenced(token, "transaction")
        if exit_mode is not None:
            return lease_expired(
                token, "transaction", f"the holder already released it ({exit_mode})"
            )
        return lease_lapsed(token, "transaction") if lapsed else None

    @staticmethod
    def granted_many(
        rows: Rows, holder_id: str
    ) -> tuple[list[tuple[Token, Checkpoint]], str | None]:
        """The grants of an ``acquire_many`` statement, in input order, and the schema the
        statement resolved its table in (``None`` when nothing was granted)."""
        grants: list[tuple[Token, Checkpoint]] = []
        schema: str | None = None
        for row in map(_GrantedRow._make, rows):
            token = Token(row.work_id, holder_id, int(row.fencing_token), _utc(row.expires_at))
            grants.append(
                (token, _checkpoint(row.checkpoint, row.prev_exit_mode, row.prev_holder_id))
            )
            schema = row.schema
        return grants, schema

    @staticmethod
    def renewed_many(
        rows: Rows, tokens: Sequence[Token], operation: str = "renew"
    ) -> list[LeaseLostError | None]:
        """Per token of a ``renew_many`` or ``release_many`` statement: ``None`` or the error
        the single operation raises."""
        if len(rows) != len(tokens):
            raise BackendError(f"{operation}_many: {len(rows)} results for {len(tokens)} tokens")
        outcomes: list[LeaseLostError | None] = []
        for token, (done, expired) in zip(tokens, rows, strict=True):
            if done:
                outcomes.append(None)
            elif expired:
                outcomes.append(
                    lease_expired(token, operation, "the lease expired or was released")
                )
            else:
                outcomes.append(fenced(token, operation))
        return outcomes

    @staticmethod
    def surveyed(rows: Rows) -> PoolSurvey:
        """The result of a ``survey`` statement."""
        free: list[str] = []
        held: dict[str, int] = {}
        members: dict[str, bytes | None] = {}
        for row in map(_SurveyRow._make, rows):
            if row.kind == "free":
                assert row.work_id is not None
                free.append(row.work_id)
            elif row.kind == "held":
                assert row.holder_id is not None
                held[row.holder_id] = int(row.held or 0)
            else:
                assert row.holder_id is not None
                members[row.holder_id] = bytes(row.checkpoint) if row.checkpoint else None
        return PoolSurvey(tuple(free), held, members)

    @staticmethod
    def batch_params(tokens: Sequence[Token]) -> dict[str, Any]:
        """The parameters that name a batch of tokens (``renew_many``, ``release_many``)."""
        return {
            "work_ids": [token.work_id for token in tokens],
            "holder_ids": [token.holder_id for token in tokens],
            "tokens": [token.fencing_token for token in tokens],
        }

    @staticmethod
    def checkpoint_row(rows: Rows, token: Token) -> Checkpoint:
        if not rows:
            raise fenced(token, "read_checkpoint")
        # fencing_token, checkpoint, prev_exit_mode, prev_holder_id: read by index, as the
        # acquire's row (a row type built per read costs more than the rest of the parsing)
        row = rows[0]
        if int(row[0]) != token.fencing_token:
            raise fenced(token, "read_checkpoint")
        return _checkpoint(row[1], row[2], row[3])

    @staticmethod
    def status_rows(rows: Rows) -> list[LeaseStatus]:
        """The rows of a ``status`` statement."""
        return [LeaseStatus(*row) for row in rows]


# -- row layouts ----------------------------------------------------------------------------
# One per statement result, in the column order of the statement above: parse by name, never
# by position.


class _GrantedRow(NamedTuple):
    work_id: str
    fencing_token: int
    expires_at: datetime
    checkpoint: bytes | None
    prev_exit_mode: str | None
    prev_holder_id: str | None
    schema: str | None


class _SurveyRow(NamedTuple):
    kind: str
    work_id: str | None
    holder_id: str | None
    held: int | None
    checkpoint: bytes | None
    position: int | None


class Grant(NamedTuple):
    """An acquire's grant: the token, the checkpoint read with it (``None`` unless asked
    for), and the schema the statement resolved its table in."""

    token: Token
    prior: Checkpoint | None
    schema: str | None


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    """One lease row as ``worklease status`` shows it."""

    work_id: str
    holder_id: str
    fencing_token: int
    state: str
    """``held`` (expiry ahead), ``released`` (an exit was declared), ``expired``."""
    exit_mode: str | None
    prev_exit: str
    prev_holder_id: str | None
    expires_at: datetime
    checkpoint_size: int | None
    updated_at: datetime
    expires_in: float
    """Seconds until expiry (negative: since)."""


def _checkpoint(state: bytes | None, prev_exit: str | None, prev_holder: str | None) -> Checkpoint:
    return Checkpoint(
        bytes(state) if state is not None else None, ExitMode.from_stored(prev_exit), prev_holder
    )


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


_TRANSIENT = (
    psycopg.OperationalError,  # connection loss, restarts, AdminShutdown, QueryCanceled,
    # serialization failures and deadlocks (TransactionRollback), PoolTimeout, and "recovery
    # is in progress" (ObjectNotInPrerequisiteState) on a standby
    psycopg.InterfaceError,  # the connection was closed under us
    # Connected to a server that is (or just became) a standby, as during a failover: the
    # connection must go so the pool reconnects, to the new primary with a multi-host DSN.
    pg_errors.ReadOnlySqlTransaction,
)

_SCHEMA_ERROR = re.compile(r'worklease_leases" does not exist')

_PERMANENT_CONNECT = re.compile(
    r"password authentication failed|"
    r'role "[^"]*" does not exist|database "[^"]*" does not exist|'
    r"no pg_hba\.conf entry|pg_hba\.conf rejects|no password supplied|password is required|"
    r"is not permitted to log in|permission denied for database|"
    r"server does not support SSL|SSL (?:is )?required|certificate verify failed|"
    r"invalid (?:connection option|sslmode value|integer value)|missing \"=\" after|"
    r"invalid URI query parameter|invalid port number"
)
"""What libpq and the server say when connecting can never work with these settings (the
server's words are English unless its lc_messages says otherwise; psycopg gives no SQLSTATE
for a failed connection attempt). LDAP, RADIUS and PAM failures are left out: the server
reports an unreachable authentication service with the same words as a wrong password."""
_EACH_HOST = re.compile(r"^- host: .*$", re.MULTILINE)
"""One line per host of libpq's message when every host of a multi-host DSN failed."""


def permanent_connect_failure(error: psycopg.Error) -> bool:
    """Whether a failed connection attempt fails for good: wrong credentials, an unknown
    role or database, a refused ``pg_hba.conf`` entry, a TLS requirement not met, or
    settings libpq cannot parse; with a multi-host DSN, only when every host failed so. A
    refused or timed-out connection, a server starting up, shutting down or in recovery, or
    out of connection slots may come back: transient."""
    if isinstance(error, psycopg.ProgrammingError):  # the conninfo itself is malformed
        return True
    if not isinstance(error, psycopg.OperationalError):
        return False
    text = str(error)
    hosts = _EACH_HOST.findall(text)
    if hosts:
        return all(_PERMANENT_CONNECT.search(line) for line in hosts)
    return _PERMANENT_CONNECT.search(text) is not None


def connection_error(error: psycopg.Error, operation: str) -> BackendError:
    """A failed connection attempt as ``BackendError``: permanent (``transient`` unset) when
    it can never work, naming the cause; transient otherwise."""
    detail = " ".join(str(error).split()) or type(error).__name__
    if permanent_connect_failure(error):
        return BackendError(
            f"{operation}: cannot connect to PostgreSQL (permanent, fix the connection "
            f"settings): {detail}"
        )
    return BackendError(
        f"{operation}: cannot connect to PostgreSQL (transient): {detail}", transient=True
    )


READ_ONLY_CAUSE = (
    b"SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only'), "
    b"(SELECT source FROM pg_settings WHERE name = 'default_transaction_read_only')"
)
"""Asked after a write was refused as read-only: a standby (a failover in progress: the
pool must reconnect, to the new primary) or a read-only role or database (for good)."""


def read_only_error(operation: str, rows: Rows) -> BackendError | None:
    """From ``READ_ONLY_CAUSE``: a permanent ``BackendError`` when the server is a primary
    and ``default_transaction_read_only`` is on by a setting every session of this role gets
    (role, database, server configuration, the connection's options), else ``None``: the
    refusal stays transient (a standby during a failover, a server promoted since, or a
    ``SET`` left behind on a session a pooler shares)."""
    if not rows:
        return None
    in_recovery, default_read_only, source = rows[0]
    if in_recovery or default_read_only != "on" or source == "session":
        return None
    return BackendError(
        f"{operation}: PostgreSQL refused the write (permanent): the server is a primary, not "
        f"in recovery, but default_transaction_read_only = on (from {source or 'unknown'}: "
        "the role, the database, the server's configuration or the connection's options); "
        "worklease needs a role and database that may write (`worklease check` names the "
        "setting)"
    )


def map_error(error: psycopg.Error, operation: str) -> BackendError:
    """Wrap a driver error in ``BackendError`` (the caller chains it with ``from``)."""
    if isinstance(error, pg_errors.UndefinedTable) and _SCHEMA_ERROR.search(str(error)):
        detail = error.diag.message_primary or str(error).splitlines()[0]
        return BackendError(f"{operation}: " + _MISSING_SCHEMA_HINT.format(detail=detail))
    transient = isinstance(error, _TRANSIENT)
    kind = "transient" if transient else "permanent"
    detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return BackendError(
        f"{operation}: PostgreSQL error ({kind}): {type(error).__name__}: {detail}",
        transient=transient,
    )


def must_discard(error: BaseException) -> bool:
    """Whether the connection a failed call used may be in an unknown state."""
    return not isinstance(error, psycopg.Error) or isinstance(error, _TRANSIENT)
