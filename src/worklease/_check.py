"""``worklease check``: the findings and the judgements (no I/O; ``_async/check.py`` asks).

Each check reads server settings or tries the behaviour worklease relies on, and reports
``ok``, ``warn`` (works, with a risk to know about) or ``fail`` (worklease will not work as
documented).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ._duration import format_duration
from ._migrations import CURRENT_VERSION, SchemaState
from ._pg import (
    DIRECT_CONNECTIONS,
    FENCE,
    LEGACY_INDEX,
    LISTENER_CONNECTIONS,
    MEMBERS_INDEX,
    RENEWAL_POOL_SIZE,
    SEQUENCE,
    TABLE,
    _canonical,
    check_listen_dsn,
    check_schema_name,
    connections_per_backend,
)
from ._validation import check_ttl
from .errors import ConfigError

__all__ = ["CheckFinding", "CheckReport"]

Status = Literal["ok", "warn", "fail"]

CLOCK_OFFSET_WARN = 1.0
"""Seconds of client/server clock difference worth a warning (expiry uses the server's)."""
DEFAULT_POOL_SIZE = 4
"""psycopg_pool's ``max_size`` when neither it nor ``min_size`` is given (``max_size``
defaults to ``min_size``, whose default is 4): what ``PostgresBackend.connect(dsn)`` opens."""
NEAR_CAPACITY = 0.8
"""Above this share of a connection limit, ``connections`` warns."""
MAX_COUNT = 100_000
"""The largest ``pool_size`` or ``processes`` ``check`` takes."""


@dataclass(frozen=True)
class CheckFinding:
    """One check: its name, ``ok`` / ``warn`` / ``fail``, and what was seen."""

    name: str
    status: Status
    detail: str

    __module__ = "worklease"


@dataclass(frozen=True)
class CheckReport:
    """The findings of :func:`check_postgres`, in the order they ran."""

    findings: list[CheckFinding] = field(default_factory=list)

    __module__ = "worklease"

    @property
    def ok(self) -> bool:
        """No check failed (warnings allowed)."""
        return all(f.status != "fail" for f in self.findings)

    @property
    def clean(self) -> bool:
        """No check failed or warned."""
        return all(f.status == "ok" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "clean": self.clean,
            "findings": [asdict(f) for f in self.findings],
        }

    def __getitem__(self, name: str) -> CheckFinding:
        for finding in self.findings:
            if finding.name == name:
                return finding
        raise KeyError(name)


# -- decisions (no I/O) ---------------------------------------------------------------------


def expected_columns() -> dict[str, str]:
    """The lease table's columns and types as ``format_type`` names them, read from the
    canonical schema file (the one home of the layout)."""
    text = _canonical()
    body = text[text.index(f"TABLE IF NOT EXISTS {TABLE} (") :].split("\n);", 1)[0]
    names = {
        "TEXT": "text",
        "BIGINT": "bigint",
        "TIMESTAMPTZ": "timestamp with time zone",
        "BYTEA": "bytea",
    }
    columns: dict[str, str] = {}
    for line in body.splitlines()[1:]:
        match = re.match(r"\s+([a-z_]+)\s+([A-Z]+)\b", line)
        if match and match.group(1) != "CONSTRAINT":
            columns[match.group(1)] = names.get(match.group(2), match.group(2).lower())
    return columns


def judge_columns(found: dict[str, str]) -> CheckFinding:
    expected = expected_columns()
    missing = [c for c in expected if c not in found]
    wrong = [
        f"{c} is {found[c]}, not {t}" for c, t in expected.items() if c in found and found[c] != t
    ]
    if missing or wrong:
        parts = ([f"missing columns: {', '.join(missing)}"] if missing else []) + wrong
        return CheckFinding(
            "schema", "fail", "the lease table is not the current layout: " + "; ".join(parts)
        )
    return CheckFinding(
        "schema", "ok", f"{TABLE}, {SEQUENCE}, {FENCE}() and the members index are current"
    )


def judge_version(state: SchemaState, layout: CheckFinding) -> CheckFinding:
    """The schema finding once the version is known: a newer table fails whatever its
    columns (this worklease would misread it), an unrecorded or behind one warns; otherwise
    the layout finding (``judge_columns`` and the objects) stands."""
    if state.newer:
        return CheckFinding(
            "schema",
            "fail",
            f"the table records schema {state.describe()}: upgrade worklease before using it",
        )
    if layout.status != "ok":
        return layout
    if not state.current:
        return CheckFinding("schema", "warn", f"schema {state.describe()}: run `worklease migrate`")
    return CheckFinding("schema", "ok", f"{layout.detail} (schema version {CURRENT_VERSION})")


def judge_isolation(level: str) -> CheckFinding:
    if level.lower() == "read committed":
        return CheckFinding("isolation", "ok", "default_transaction_isolation is read committed")
    return CheckFinding(
        "isolation",
        "ok",
        f"default_transaction_isolation is {level}; worklease pins its statements to "
        "READ COMMITTED, so this only affects the application's own statements",
    )


def judge_clock(offset: float, round_trip: float) -> CheckFinding:
    detail = (
        f"server clock {'ahead of' if offset >= 0 else 'behind'} this client by "
        f"{abs(offset) * 1000:.0f} ms (±{round_trip * 500:.0f} ms)"
    )
    if abs(offset) > CLOCK_OFFSET_WARN + round_trip / 2:
        return CheckFinding(
            "clock",
            "warn",
            detail + "; expiry is decided by the database clock, but expires_at in tokens "
            "and status reads wrong against this machine's clock: run NTP on both",
        )
    return CheckFinding("clock", "ok", detail)


def judge_commit(setting: str) -> CheckFinding:
    if setting in ("off", "local"):
        return CheckFinding(
            "synchronous_commit",
            "warn",
            f"synchronous_commit is {setting}: a checkpoint acknowledged by worklease can be "
            "lost in a server crash (or, with 'local', at a failover)",
        )
    return CheckFinding("synchronous_commit", "ok", f"synchronous_commit is {setting}")


@dataclass(frozen=True)
class Standby:
    """One row of ``pg_stat_replication``: who streams from this server, and how."""

    name: str
    sync_state: str | None
    """``async``, ``sync``, ``quorum``, ``potential`` (``None``: hidden from this role)."""
    state: str | None = "streaming"
    """``streaming``, ``catchup``, ``startup``, ``backup``, ``stopping`` (``None``: hidden)."""
    slot_type: str | None = None
    """``logical`` for a logical-replication walsender (not a standby)."""


def judge_replication(
    in_recovery: bool, standbys: Sequence[Standby], inactive_slots: Sequence[str] = ()
) -> CheckFinding:
    """Is this server a primary, can anything take over from it, and would acknowledged
    checkpoints survive that (``inactive_slots``: replication slots nobody uses)."""
    if in_recovery:
        return CheckFinding(
            "replication",
            "fail",
            "this server is a standby (read-only): point the DSN at the primary, e.g. "
            "host=a,b target_session_attrs=read-write",
        )
    # base backups and logical subscribers stream from a walsender too; neither takes over
    physical = [s for s in standbys if s.state != "backup" and s.slot_type != "logical"]
    streaming = [s for s in physical if s.state in ("streaming", None)]
    lagging = [s for s in physical if s.state not in ("streaming", None)]
    notes = [f"{s.name or '?'} is connected but {s.state}, not streaming" for s in lagging]
    if inactive_slots:
        names = ", ".join(repr(slot) for slot in inactive_slots)
        notes.append(
            f"replication slot {names} is inactive (no standby uses it; it keeps WAL on this "
            "server until dropped)"
        )
    tail = "".join(f"; {note}" for note in notes)
    if not streaming:
        return CheckFinding(
            "replication",
            "warn",
            "no standby streams from this server: no failover possible (if it fails, nothing "
            "takes over and leases wait until it is back)" + tail,
        )
    modes = [s.sync_state or "unknown" for s in streaming]
    described = ", ".join(
        f"{s.name or '?'} ({mode})" for s, mode in zip(streaming, modes, strict=True)
    )
    if any(mode in ("sync", "quorum") for mode in modes):
        return CheckFinding(
            "replication",
            "warn" if notes else "ok",
            f"standbys: {described}; replication is synchronous, so checkpoints acknowledged "
            "with synchronous_commit on (or remote_*) survive a failover" + tail,
        )
    if all(mode == "unknown" for mode in modes):
        return CheckFinding(
            "replication",
            "warn",
            f"standbys: {described}; this role cannot see whether replication is synchronous "
            "(grant pg_read_all_stats to see)" + tail,
        )
    return CheckFinding(
        "replication",
        "warn",
        f"standbys: {described}; replication is asynchronous, so checkpoints acknowledged "
        "shortly before a failover may be lost (fencing tokens stay unique: ADR-0008); set "
        "synchronous_standby_names for durable checkpoints" + tail,
    )


# -- where a setting comes from ---------------------------------------------------------------


SETTING_LEVELS = ("database user", "user", "database", "global")
"""The levels of ``pg_db_role_setting``, most specific first (the order PostgreSQL applies
them in, the first one found wins); ``pg_settings.source`` names them the same way."""
SERVER_SOURCE = "server"
"""A session value set by none of the role, database or connection levels: the server's
configuration (``postgresql.conf``, ``ALTER SYSTEM`` or its command line)."""


def ident(name: str) -> str:
    """``name`` as an SQL identifier (quoted unless it is a plain lower-case name)."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def describe_source(source: str | None, role: str, database: str) -> str | None:
    """Where a session's setting came from, as a phrase (``None``: the built-in default).
    ``source`` is what ``pg_settings.source`` says (or :func:`derive_source` found)."""
    if source in (None, "default"):
        return None
    phrases = {
        "user": f"set for role {role!r}",
        "database": f"set for database {database!r}",
        "database user": f"set for role {role!r} in database {database!r}",
        "global": "set for all roles (ALTER ROLE ALL)",
        "configuration file": "set in the server's configuration",
        SERVER_SOURCE: "set in the server's configuration",
        "command line": "set on the server's command line",
        "environment variable": "set in the server's environment",
        "client": "set in this connection's options, from the DSN or PGOPTIONS",
        "session": "set in the session (by a pooler's connect_query, or a SET)",
        "override": "forced by the server",
    }
    return phrases.get(str(source), f"set at level {source!r}")


def undo_hint(name: str, source: str | None, role: str, database: str) -> str | None:
    """The statement (or step) that takes ``name`` back at its level."""
    hints = {
        "user": f"ALTER ROLE {ident(role)} RESET {name}",
        "database": f"ALTER DATABASE {ident(database)} RESET {name}",
        "database user": f"ALTER ROLE {ident(role)} IN DATABASE {ident(database)} RESET {name}",
        "global": f"ALTER ROLE ALL RESET {name}",
        "configuration file": f"ALTER SYSTEM RESET {name} (or edit postgresql.conf) and reload",
        SERVER_SOURCE: f"ALTER SYSTEM RESET {name} (or edit postgresql.conf) and reload",
        "client": f"drop -c {name}=... from the connection's options",
    }
    return hints.get(str(source))


def client_options(options: str) -> dict[str, str]:
    """The settings in a libpq ``options`` string (``-c name=value``, ``-cname=value``,
    ``--name=value``; a backslash escapes a space)."""
    tokens = [t.replace("\\ ", " ") for t in re.findall(r"(?:\\.|\S)+", options)]
    found: dict[str, str] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "-c" and index < len(tokens):
            pair = tokens[index]
            index += 1
        elif token.startswith(("--", "-c")):
            pair = token[2:]
        else:
            continue
        name, equals, value = pair.partition("=")
        if equals:
            found[name.strip().lower().replace("-", "_")] = value
    return found


def setting_levels(rows: Sequence[tuple[str, str]]) -> dict[str, dict[str, str]]:
    """``pg_db_role_setting`` rows that apply to this session, as ``(level, "name=value")``,
    by level."""
    levels: dict[str, dict[str, str]] = {}
    for level, pair in rows:
        name, _, value = str(pair).partition("=")
        levels.setdefault(str(level), {})[name.lower()] = value
    return levels


def derive_source(name: str, options: dict[str, str], levels: dict[str, dict[str, str]]) -> str:
    """Where the value a session started with came from, once the session has changed it
    (``pg_settings`` then says ``session``): the connection's options override the role and
    database levels, which override the server's configuration."""
    if name in options:
        return "client"
    for level in SETTING_LEVELS:
        if name in levels.get(level, {}):
            return level
    return SERVER_SOURCE


# -- writes ---------------------------------------------------------------------------------


TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
"""What worklease does to the lease table: acquires insert or update and read back (an
``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``), renewals, checkpoints and releases
update, ``forget`` and the vacuum (``worklease sweep``) delete."""


@dataclass(frozen=True)
class Grants:
    """What the check's role may do to the lease table and the fencing sequence."""

    role: str
    """``current_user``: whose privileges these are."""
    table: str
    """The lease table as a ``GRANT`` names it (schema-qualified)."""
    sequence: str
    held: frozenset[str]
    """Which of :data:`TABLE_PRIVILEGES` the role has on the table."""
    sequence_usage: bool | None
    """``USAGE`` (or ``UPDATE``: either lets ``nextval`` run) on the sequence (``None``: no
    sequence to ask about; the schema line says so)."""


def judge_grants(grants: Grants) -> CheckFinding | None:
    """What the role lacks: privileges an acquire needs fail, ``DELETE`` alone warns (only
    ``forget`` and the vacuum need it); ``None`` when nothing is missing. Each names the
    ``GRANT`` that gives it."""
    missing = [p for p in TABLE_PRIVILEGES if p not in grants.held]
    needed = [p for p in missing if p != "DELETE"]
    role = ident(grants.role)
    fixes = [f"GRANT {', '.join(missing)} ON {grants.table} TO {role}"] if missing else []
    lacks = [f"{', '.join(missing)} on {TABLE}"] if missing else []
    if grants.sequence_usage is False:
        fixes.append(f"GRANT USAGE ON SEQUENCE {grants.sequence} TO {role}")
        lacks.append(f"USAGE on {SEQUENCE}")
    if needed or grants.sequence_usage is False:
        return CheckFinding(
            "writes",
            "fail",
            f"role {grants.role!r} lacks {' and '.join(lacks)}: every acquire is refused (it "
            f"needs SELECT, INSERT and UPDATE on {TABLE} and USAGE on {SEQUENCE}, whose nextval "
            f"gives the fencing tokens); {'; '.join(fixes)}",
        )
    if missing:
        return CheckFinding(
            "writes",
            "warn",
            f"role {grants.role!r} lacks DELETE on {TABLE}: forget() and the vacuum (worklease "
            f"sweep) are refused, acquires, renewals and releases work; {fixes[0]}",
        )
    return None


def judge_writes(
    default_read_only: str | None,
    transaction_read_only: str | None,
    source: str | None,
    role: str,
    database: str,
    refused: str | None = None,
    tried: bool = True,
    standby: bool = False,
    grants: Grants | None = None,
) -> CheckFinding:
    """Can this session write: ``default_transaction_read_only`` (and where it is set),
    ``transaction_read_only`` (``standby``: ``in_hot_standby`` is on), the role's privileges
    on the lease table and the sequence (``grants``), and the error of a write tried in a
    rolled-back transaction (``refused``; ``tried`` is false when there was no table to try it
    on)."""
    if (default_read_only or "").lower() == "on":
        where = describe_source(source, role, database) or "set"
        undo = undo_hint("default_transaction_read_only", source, role, database)
        return CheckFinding(
            "writes",
            "fail",
            f"default_transaction_read_only is on ({where}): every acquire, renewal and "
            "checkpoint is refused ('cannot execute ... in a read-only transaction')"
            + (f"; {undo}" if undo else ""),
        )
    if (transaction_read_only or "").lower() == "on":
        why = (
            "this server is a hot standby, in recovery"
            if standby
            else "an explicit SET, or the route makes sessions read-only"
        )
        return CheckFinding(
            "writes",
            "fail",
            f"transaction_read_only is on in this session ({why}): every acquire, renewal and "
            "checkpoint is refused",
        )
    lacking = judge_grants(grants) if grants is not None else None
    if lacking is not None and lacking.status == "fail":
        return lacking
    if refused is not None:
        return CheckFinding("writes", "fail", f"a write to {TABLE} was refused: {refused}")
    if lacking is not None:
        return lacking
    if not tried:
        return CheckFinding(
            "writes", "ok", f"default_transaction_read_only is off (no {TABLE} to try a write on)"
        )
    privileges = (
        f", role {grants.role!r} has SELECT, INSERT, UPDATE and DELETE on {TABLE} and USAGE on "
        f"{SEQUENCE},"
        if grants is not None and grants.sequence_usage
        else ""
    )
    return CheckFinding(
        "writes",
        "ok",
        f"default_transaction_read_only is off{privileges} and a write to {TABLE} is accepted "
        "(tried in a rolled-back transaction)",
    )


# -- timeouts -------------------------------------------------------------------------------


TIMEOUT_FLOOR = 1.0
"""Seconds below which a statement or lock timeout may cut worklease's own work under load."""
CANCEL_FLOOR = 0.1
"""Seconds below which a statement or transaction timeout cancels worklease's statements
routinely (an acquire takes about a millisecond on an idle server, far more under load; at
1 ms, most acquires are cancelled)."""


def judge_timeouts(
    settings: dict[str, float],
    ttl: float,
    sources: dict[str, str] | None = None,
    kept: Sequence[str] = (),
) -> CheckFinding:
    """Server timeouts in seconds (0 = off) against the lease TTL; ``sources`` says where
    each one is set (phrases of :func:`describe_source`). Every timeout below the TTL is
    named with its value (and where it is set); those that may cut worklease's own work
    warn, those that cancel it routinely fail. ``kept``: the settings :func:`relaxing` would
    have lifted in the check's session, left alone because a proxy is in between."""
    sources = sources or {}
    fatal: list[str] = []
    risks: list[str] = []
    below: list[str] = []
    others: list[str] = []
    for name, value in settings.items():
        if not 0 < value < ttl:
            others.append(f"{name}={format_duration(value) if value else 'off'}")
            continue
        where = sources.get(name)
        label = f"{name}={format_duration(value)}" + (f" ({where})" if where else "")
        if name in ("statement_timeout", "transaction_timeout") and value < CANCEL_FLOOR:
            fatal.append(
                f"{label} cancels worklease's own statements routinely (acquires, "
                "checkpoints, releases): raise it to seconds, or 0"
            )
        elif name == "idle_session_timeout":
            risks.append(f"{label} cuts idle pooled connections between renewals")
        elif name == "idle_in_transaction_session_timeout":
            risks.append(f"{label} ends a lease.transaction() step that pauses longer")
        elif name == "transaction_timeout":
            risks.append(f"{label} cuts a lease.transaction() step before its lease window ends")
        elif name == "statement_timeout" and value < TIMEOUT_FLOOR:
            risks.append(f"{label} may cut a waiting acquire or a checkpoint under load")
        elif name == "lock_timeout" and value < TIMEOUT_FLOOR:
            risks.append(f"{label} fails an acquire or checkpoint that meets a renewal's row lock")
        else:
            below.append(label)
    parts = (
        fatal
        + risks
        + [
            f"{label} is below the TTL: worklease bounds its own statements, the application's "
            "own statements on this DSN are cut at it"
            for label in below
        ]
    )
    context = f"TTL {format_duration(ttl)}" + (f"; {', '.join(others)}" if others and parts else "")
    note = (
        f"; check left {', '.join(kept)} as it is in its own session (a proxy is in between, "
        "where a SET could stay behind on a pooled server connection): a question it cancelled "
        "says 'could not check'"
        if kept
        else ""
    )
    if not parts:
        return CheckFinding("timeouts", "ok", f"{', '.join(others)} ({context}){note}")
    status: Status = "fail" if fatal else "warn" if risks else "ok"
    return CheckFinding("timeouts", status, "; ".join(parts) + f" ({context}){note}")


def relaxing(values: dict[str, str | None]) -> dict[str, str]:
    """The settings ``check`` changes in its own session before asking anything else, so a
    role's tiny timeout does not cancel its questions: each one that is set and shorter than
    the value here (``0``: off). Only on a direct connection (the server process is the one
    in the cancel key): behind a proxy the session may be a pooled server connection that
    keeps a session-level change for the next client."""
    targets = {"statement_timeout": "30s", "transaction_timeout": "30s"}
    changes: dict[str, str] = {}
    for name, target in targets.items():
        seconds = seconds_setting(values.get(name) or "0")
        if 0 < seconds < seconds_setting(target):
            changes[name] = target
    if seconds_setting(values.get("idle_session_timeout") or "0") > 0:
        changes["idle_session_timeout"] = "0"
    return changes


def seconds_setting(value: str) -> float:
    """A server duration setting as ``SHOW`` prints it (``0``, ``500ms``, ``30s``, ``5min``)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(us|ms|s|min|h|d)?\s*", value)
    if match is None:
        return 0.0
    number = float(match.group(1))
    unit = match.group(2) or "ms"
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}[unit]
    return number * scale


def check_arguments(
    conninfo: object,
    schema: object,
    listen_dsn: object,
    ttl: object,
    probe_timeout: object,
    pool_size: object = DEFAULT_POOL_SIZE,
    processes: object = 1,
) -> tuple[str, str | None, str | None, float, float, int, int]:
    """The arguments of ``check_postgres``, validated before any I/O (``ConfigError``)."""
    if not isinstance(conninfo, str):
        raise ConfigError(f"conninfo must be a string, got {type(conninfo).__name__}")
    if (
        isinstance(probe_timeout, bool)
        or not isinstance(probe_timeout, int | float)
        or not 0 < probe_timeout <= 60
    ):
        raise ConfigError(
            f"probe_timeout must be a number of seconds in (0, 60], got {probe_timeout!r}"
        )
    return (
        conninfo,
        check_schema_name(schema),
        check_listen_dsn(listen_dsn, True),
        check_ttl(ttl),
        float(probe_timeout),
        _count("pool_size", pool_size),
        _count("processes", processes),
    )


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise ConfigError(f"{name} must be a whole number in [1, {MAX_COUNT}], got {value!r}")
    return value


def missing_table(schema: str | None) -> CheckFinding:
    where = f"schema {schema!r}" if schema else "the search path"
    return CheckFinding(
        "schema", "fail", f"no {TABLE} table in {where}: create it with `worklease migrate`"
    )


def missing_sequence() -> CheckFinding:
    return CheckFinding(
        "schema", "fail", f"the {SEQUENCE} sequence is missing: run `worklease migrate`"
    )


def missing_index() -> CheckFinding:
    return CheckFinding(
        "schema", "fail", f"the {MEMBERS_INDEX} index is missing: run `worklease migrate`"
    )


def legacy_index() -> CheckFinding:
    return CheckFinding(
        "schema",
        "warn",
        f"the {LEGACY_INDEX} index of earlier schemas is present: every renewal and "
        "checkpoint then writes a new index entry (no HOT update) and the table bloats; "
        "`worklease migrate` drops it (the Go library's migration creates it again: harmless, "
        "only slower)",
    )


def missing_fence() -> CheckFinding:
    return CheckFinding(
        "schema",
        "warn",
        f"the {FENCE}() function is missing (the schema predates it): run `worklease migrate`",
    )


def judge_pooler(
    same_server: bool,
    proxied: bool = False,
    *,
    mode: str | None = None,
    forwarded: bool = False,
) -> CheckFinding:
    """What is between this client and the server, and what that means for prepared
    statements: worklease's (ADR-0015: unprepared behind any proxy unless prepare=True) and
    the application's own (psycopg prepares by name after five runs).

    ``same_server``: two connections were served by one server session (or one moved between
    sessions); ``proxied``: the server process is not the one in the connection's cancel key;
    ``mode``: PgBouncer's ``pool_mode`` for this database and user, read on its admin console
    (it decides: ``transaction`` and ``statement`` share server sessions); ``forwarded``: the
    server process is the one in the cancel key, only the port differs (a port forward or
    NAT, not a pooler)."""
    if mode is not None:
        same_server, proxied = mode != "session", True
    read = f"PgBouncer in {mode} mode (pool_mode={mode}, read on its admin console)"
    if same_server:
        seen = (
            f"{read} shares server sessions between clients"
            if mode is not None
            else "two connections were served by one server session: a transaction-pooling "
            "proxy (PgBouncer in transaction mode) is in between"
        )
        works = (
            "lease operations work (worklease sends its statements unprepared there) but "
            "transactional steps (lease.transaction()) are refused"
            if mode == "statement"
            else "worklease works through it with its defaults (it sends its own statements "
            "unprepared there)"
        )
        return CheckFinding(
            "pooler",
            "warn",
            f"{seen}; {works}, but your own statements need prepare_threshold=None on the "
            "pool's connections (unless PgBouncer 1.21+ with max_prepared_statements > 0), "
            "pass schema= explicitly, and release notifications need a listen_dsn straight to "
            "the server",
        )
    if proxied:
        seen = (
            f"{read} gives each connection its own server session"
            if mode is not None
            else "a proxy is in between (the server process answering is not the one in the "
            "connection's cancel key) and two connections met two server sessions: session "
            "pooling, or a transaction pooler whose busy or round-robin pool hid the sharing "
            "(let this user read PgBouncer's admin console, stats_users, to be sure)"
        )
        return CheckFinding(
            "pooler",
            "ok",
            f"{seen}; worklease sends its statements unprepared here; prepare=True gives back "
            "the prepared path on a session pooler",
        )
    if forwarded:
        return CheckFinding(
            "pooler",
            "ok",
            "the server's port is not the one connected to, but the server process is the one "
            "in the connection's cancel key: port forwarding or NAT, not a pooler; each "
            "connection has its own server session",
        )
    return CheckFinding(
        "pooler", "ok", "each connection has its own server session (direct or session pooling)"
    )


def judge_listener(name: str, route: str, listening: bool, reason: str | None) -> CheckFinding:
    if listening:
        return CheckFinding(
            name, "ok", f"release notifications work through {route}: handoff is instant"
        )
    return CheckFinding(
        name,
        "warn",
        f"release notifications do not work through {route} ({reason}); waits fall back to polling",
    )


# -- hosts of a multi-host DSN --------------------------------------------------------------


@dataclass(frozen=True)
class HostAnswer:
    """One host of a multi-host DSN, asked on its own."""

    host: str
    """``host:port``, as the DSN names it."""
    primary: bool | None
    """``pg_is_in_recovery()`` is false (``None``: the host did not answer)."""
    identity: tuple[object, ...] | None = None
    """What tells servers apart (system identifier, postmaster start time): one server
    listed under two names answers with the same one."""
    error: str | None = None


def host_dsns(conninfo: str, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """Each host of a multi-host DSN (``host=a,b port=p1,p2`` or ``postgresql://a:p1,b:p2/``)
    as ``(label, dsn)``, the DSN reaching that host alone (``target_session_attrs=any``);
    ``[]`` for a DSN with one host. libpq's ``PGHOST``/``PGHOSTADDR``/``PGPORT`` fill in what
    the DSN leaves out."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return []
    hosts = str(params.get("host") or environ.get("PGHOST") or "")
    addrs = str(params.get("hostaddr") or environ.get("PGHOSTADDR") or "")
    ports = str(params.get("port") or environ.get("PGPORT") or "")
    host_list = hosts.split(",") if hosts else []
    addr_list = addrs.split(",") if addrs else []
    count = max(len(host_list), len(addr_list))
    if count < 2 or (host_list and addr_list and len(host_list) != len(addr_list)):
        return []
    port_list = ports.split(",")
    if len(port_list) == 1:
        port_list *= count
    if len(port_list) != count:
        return []
    default_port = environ.get("PGPORT") or "5432"
    params.pop("load_balance_hosts", None)
    found: list[tuple[str, str]] = []
    for index in range(count):
        host = host_list[index] if host_list else ""
        addr = addr_list[index] if addr_list else ""
        port = port_list[index]
        one = {k: v for k, v in params.items() if k not in ("host", "hostaddr", "port")}
        one.update({k: v for k, v in (("host", host), ("hostaddr", addr), ("port", port)) if v})
        one["target_session_attrs"] = "any"
        found.append(
            (f"{host or addr or 'localhost'}:{port or default_port}", make_conninfo("", **one))
        )
    return found


def pinned(conninfo: str, host: str, port: int | str, hostaddr: str = "") -> str:
    """``conninfo`` reaching only the host a connection reached (``conn.info``'s ``host``,
    ``port`` and ``hostaddr``): any session there (``target_session_attrs=any``), no load
    balancing."""
    params = conninfo_to_dict(conninfo)
    for key in ("hostaddr", "load_balance_hosts"):
        params.pop(key, None)
    params.update(host=host, port=str(port), target_session_attrs="any")
    if hostaddr:
        params["hostaddr"] = hostaddr
    return make_conninfo("", **params)


CONNECT_TIMEOUT = 10
"""Seconds ``check`` gives each connection attempt when the DSN (or ``PGCONNECT_TIMEOUT``)
sets no ``connect_timeout`` of its own."""


def bounded_dsn(conninfo: str, environ: Mapping[str, str]) -> str:
    """``conninfo`` with ``connect_timeout`` :data:`CONNECT_TIMEOUT` unless it (or
    ``PGCONNECT_TIMEOUT``) sets one: the DSN's own timeout is what the application gets."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return conninfo  # connecting says what is wrong with it
    if params.get("connect_timeout") is not None or environ.get("PGCONNECT_TIMEOUT"):
        return conninfo
    return make_conninfo(conninfo, connect_timeout=str(CONNECT_TIMEOUT))


def attempt_seconds(conninfo: str, environ: Mapping[str, str]) -> float:
    """How long one connection attempt of ``conninfo`` (after :func:`bounded_dsn`) may take,
    as psycopg applies ``connect_timeout`` to each host: at least 2 s, and 0 or less (no
    timeout) is psycopg's 130 s."""
    try:
        value = conninfo_to_dict(conninfo).get("connect_timeout")
    except psycopg.ProgrammingError:
        value = None
    try:
        seconds = int(float(str(value or environ.get("PGCONNECT_TIMEOUT") or CONNECT_TIMEOUT)))
    except ValueError:
        return float(CONNECT_TIMEOUT)
    return 130.0 if seconds <= 0 else float(max(seconds, 2))


def listen_deadline(probe_timeout: float, connect_seconds: float, hosts: int) -> float:
    """How long the listener check waits for the listener to listen or give up: its probe
    twice, and one connection through a route of ``hosts`` hosts, each of which may take
    ``connect_seconds`` (a host that accepts and never answers)."""
    return probe_timeout * 2 + max(10.0, connect_seconds * hosts)


def session_attrs(conninfo: str, environ: Mapping[str, str]) -> str:
    """The DSN's ``target_session_attrs`` (libpq's ``PGTARGETSESSIONATTRS``, else ``any``)."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        params = {}
    return str(params.get("target_session_attrs") or environ.get("PGTARGETSESSIONATTRS") or "any")


def load_balance(conninfo: str, environ: Mapping[str, str]) -> str:
    """The DSN's ``load_balance_hosts`` (libpq's ``PGLOADBALANCEHOSTS``, else ``disable``)."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        params = {}
    return str(params.get("load_balance_hosts") or environ.get("PGLOADBALANCEHOSTS") or "disable")


def judge_hosts(
    answers: Sequence[HostAnswer], reached: str | None, attrs: str, balance: str = "disable"
) -> CheckFinding:
    """Every host of a multi-host DSN on its own: exactly one primary, and a DSN route that
    only ever reaches a primary (``reached``: the host the DSN itself connected to;
    ``balance``: its ``load_balance_hosts``, ``random`` picks a host at random for each
    connection)."""
    primaries: list[HostAnswer] = []
    same: list[str] = []
    for answer in answers:
        if not answer.primary:
            continue
        twin = next(
            (p for p in primaries if answer.identity is not None and p.identity == answer.identity),
            None,
        )
        if twin is None:
            primaries.append(answer)
        else:
            same.append(f"{twin.host} and {answer.host} are one server")
    listed = ", ".join(
        f"{a.host} {'primary' if a.primary else 'standby' if a.primary is False else 'unreachable'}"
        for a in answers
    )
    spread = ", load_balance_hosts=random" if balance == "random" else ""
    route = f"this DSN (target_session_attrs={attrs}{spread}) reaches {reached or 'no host'}"
    if len(primaries) > 1:
        names = " and ".join(p.host for p in primaries)
        every = "both" if len(primaries) == 2 else "all"
        return CheckFinding(
            "hosts",
            "fail",
            f"split brain: {names} {every} answer as primary (pg_is_in_recovery() is false): "
            "holders reaching different ones can hold the same work ID at once; demote or stop "
            f"all but one; {route}",
        )
    if not primaries:
        return CheckFinding(
            "hosts", "fail", f"no host answers as primary ({listed}): worklease needs one; {route}"
        )
    if attrs in ("read-only", "standby", "prefer-standby"):
        return CheckFinding(
            "hosts",
            "fail",
            f"target_session_attrs={attrs} prefers a standby, but worklease writes: use "
            f"target_session_attrs=read-write ({listed}; {route})",
        )
    standbys = [a.host for a in answers if a.primary is False]
    if balance == "random" and standbys and attrs not in ("read-write", "primary"):
        share = f"{len(standbys)} in {len([a for a in answers if a.primary is not None])}"
        return CheckFinding(
            "hosts",
            "fail",
            f"load_balance_hosts=random with target_session_attrs={attrs}: each connection "
            f"takes a host at random, so about {share} of the application's connections land "
            f"on a standby ({', '.join(standbys)}) where every acquire, renewal and checkpoint "
            f"is refused; add target_session_attrs=read-write ({listed}; {route})",
        )
    notes = [f"{a.host} did not answer ({a.error})" for a in answers if a.primary is None]
    if attrs not in ("read-write", "primary"):
        notes.append(
            f"target_session_attrs={attrs} takes the first host that answers, a standby too "
            "(after a failover, the old primary's standby): add target_session_attrs=read-write"
        )
    detail = "; ".join([listed, *same, route, *notes])
    return CheckFinding("hosts", "warn" if notes else "ok", detail)


# -- connections ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerLimits:
    """What caps the server connections of this role on this database."""

    max_connections: int
    reserved: int
    """``superuser_reserved_connections``."""
    role: str
    role_limit: int = -1
    """The role's ``CONNECTION LIMIT`` (-1: none)."""
    database: str = ""
    database_limit: int = -1
    in_use: int | None = None
    role_reserved: int = 0
    """``reserved_connections`` (PostgreSQL 16: for roles with pg_use_reserved_connections)."""


@dataclass(frozen=True)
class BouncerPool:
    """PgBouncer's pool for this database and user, from its admin console."""

    database: str
    pool_mode: str
    pool_size: int
    reserve_pool: int = 0
    max_db_connections: int = 0
    """0: no limit."""
    max_user_connections: int = 0
    max_client_conn: int = 0


def bouncer_pool(
    databases: Sequence[Mapping[str, Any]],
    config: Mapping[str, str],
    users: Sequence[Mapping[str, Any]],
    database: str,
    user: str,
) -> BouncerPool:
    """The pool serving ``database`` for ``user``, from PgBouncer's ``SHOW DATABASES``,
    ``SHOW CONFIG`` (key to value) and ``SHOW USERS`` rows (as dicts by column name)."""

    def number(value: Any, default: int = 0) -> int:
        try:
            return int(value)
        except (TypeError, ValueError):
            return default

    row = next((r for r in databases if r.get("name") == database), None)
    row = row or next((r for r in databases if r.get("name") == "*"), None) or {}
    mine = next((u for u in users if u.get("name") == user), None) or {}
    mode = mine.get("pool_mode") or row.get("pool_mode") or config.get("pool_mode") or "session"
    size = number(row.get("pool_size"), -1)
    if size < 0:
        size = number(config.get("default_pool_size"), 20)
    reserve = number(row.get("reserve_pool"), -1)
    if reserve < 0:
        reserve = number(config.get("reserve_pool_size"))
    per_user = number(mine.get("max_user_connections"), 0) or number(
        config.get("max_user_connections")
    )
    return BouncerPool(
        database=database,
        pool_mode=str(mode),
        pool_size=size,
        reserve_pool=reserve,
        max_db_connections=number(row.get("max_connections"))
        or number(config.get("max_db_connections")),
        max_user_connections=per_user,
        max_client_conn=number(config.get("max_client_conn")),
    )


def sizing_rule(pool_size: int, processes: int) -> tuple[int, str]:
    """How many connections ``processes`` processes open at most, and the rule as words."""
    each = connections_per_backend(pool_size)
    need = each * processes
    unit = "process" if processes == 1 else "processes"
    return need, (
        f"{need} connections for {processes} {unit} ({each} each: pool max_size {pool_size} "
        f"+ {RENEWAL_POOL_SIZE} renewal + {DIRECT_CONNECTIONS} direct + {LISTENER_CONNECTIONS} "
        "listener)"
    )


def judge_connections(
    pool_size: int,
    processes: int,
    server: ServerLimits | None,
    bouncer: BouncerPool | None = None,
    proxy: str | None = None,
) -> CheckFinding:
    """Will the connections of ``processes`` processes, each with an application pool of
    ``pool_size``, fit: in PgBouncer's pool for this database (``bouncer``), else in what
    the server allows this role (``server``). ``proxy`` says a proxy whose settings cannot
    be read is in between (then the server's limits are all there is to compare with)."""
    need, rule = sizing_rule(pool_size, processes)
    if bouncer is not None:
        return _judge_bouncer(need, rule, bouncer)
    if server is None:
        return CheckFinding(
            "connections", "warn", f"{rule}: could not read the server's connection limits"
        )
    capacity = server.max_connections - server.reserved - server.role_reserved
    binding = (
        f"max_connections {server.max_connections}"
        + (f" - superuser_reserved_connections {server.reserved}" if server.reserved else "")
        + (f" - reserved_connections {server.role_reserved}" if server.role_reserved else "")
    )
    if 0 <= server.role_limit < capacity:
        capacity, binding = server.role_limit, f"CONNECTION LIMIT of role {server.role!r}"
    if 0 <= server.database_limit < capacity:
        capacity = server.database_limit
        binding = f"CONNECTION LIMIT of database {server.database!r}"
    in_use = f", {server.in_use} in use now" if server.in_use is not None else ""
    allows = f"the {capacity} the server allows ({binding}{in_use})"
    if need > capacity:
        status: Status = "fail"
        verdict = (
            f"{rule} exceed {allows}: connections beyond it are refused; raise the limit, or "
            "lower the pool size or the processes"
        )
    elif need > NEAR_CAPACITY * capacity:
        status, verdict = "warn", f"{rule}: near {allows}"
    else:
        status, verdict = "ok", f"{rule}, within {allows}"
    if proxy is not None:
        # what the proxy allows is unknown: never ok, and its sizing rule said
        return CheckFinding(
            "connections",
            "fail" if status == "fail" else "warn",
            f"{proxy}; in session mode its pool for this database needs {need} server "
            f"connections: {verdict}",
        )
    return CheckFinding("connections", status, verdict)


def _judge_bouncer(need: int, rule: str, pool: BouncerPool) -> CheckFinding:
    where = f"its pool for database {pool.database!r}"
    clients = ""
    if pool.max_client_conn and need > pool.max_client_conn:
        clients = (
            f"; they exceed max_client_conn {pool.max_client_conn}: PgBouncer refuses the rest"
        )
    if pool.pool_mode != "session":
        return CheckFinding(
            "connections",
            "fail" if clients else "ok",
            f"PgBouncer in {pool.pool_mode} mode: {rule} share {where} of "
            f"{pool.pool_size} server connections (a client holds one only for a transaction)"
            + clients,
        )
    capacity = pool.pool_size + pool.reserve_pool
    caps = [c for c in (pool.max_db_connections, pool.max_user_connections) if c > 0]
    capacity = min([capacity, *caps])
    size = f"{pool.pool_size}" + (f" (+{pool.reserve_pool} reserve)" if pool.reserve_pool else "")
    if caps and min(caps) < pool.pool_size + pool.reserve_pool:
        size += f", capped at {min(caps)} by max_db_connections/max_user_connections"
    if need > capacity:
        return CheckFinding(
            "connections",
            "fail",
            f"PgBouncer in session mode gives each client connection a server connection of "
            f"its own, and {where} has {size}: {rule} do not fit, so renewals and releases "
            f"wait for one and time out; raise PgBouncer's default_pool_size (or pool_size= of "
            f"this database) to {need} or more, or give each process a smaller pool" + clients,
        )
    if clients:
        return CheckFinding(
            "connections", "fail", f"PgBouncer in session mode, {where} has {size}: {rule}{clients}"
        )
    if need > pool.pool_size or need > NEAR_CAPACITY * capacity:
        return CheckFinding(
            "connections",
            "warn",
            f"PgBouncer in session mode, {where} has {size}: {rule} are near its limit"
            + (
                "; beyond pool_size clients wait reserve_pool_timeout"
                if need > pool.pool_size
                else ""
            ),
        )
    return CheckFinding(
        "connections",
        "ok",
        f"PgBouncer in session mode: {rule}, within {where} of {size} server connections",
    )


def pgbouncer_unreadable(user: str, error: str) -> str:
    """What to say of a proxy whose admin console did not answer ``user``."""
    if "not allowed" in error:
        return (
            f"PgBouncer is in between and its admin console refuses user {user!r} (add it to "
            "stats_users to let check read the pool)"
        )
    return f"a proxy is in between and its pool settings cannot be read ({error})"


# -- the DSN's password never shows ---------------------------------------------------------


_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*(?:'|$)|(?:\\.|[^\s\\])+)")
"""``password=value`` of a key/value DSN: quoted (up to the closing quote, or the end when
it is unterminated) or not (a backslash escapes a space)."""
_WORDS_AFTER = re.compile(r"(?:\s+[^\s=]+(?=\s|$))+")
"""The words after an unquoted value that are no ``key=value``: in a DSN libpq cannot parse,
the rest of a password with a space in it."""
_URI_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@/\s]+)(@)", re.IGNORECASE)
"""``scheme://user:password@`` (libpq ends the user information at the first ``@`` or ``/``)."""
SHORT_SECRET = 4
"""Passwords shorter than this are hidden only where they stand as a password (after
``password=``, or in ``user:password@``): anywhere else, "1" would be every digit 1."""


def _unquoted(value: str) -> str:
    """A key/value DSN's value as libpq reads it (quotes dropped, backslashes undone)."""
    if value.startswith("'"):
        value = value[1:-1] if len(value) > 1 and value.endswith("'") else value[1:]
    return re.sub(r"\\(.)", r"\1", value)


def secrets(*dsns: str | None) -> list[str]:
    """The passwords in these DSNs (as libpq reads them, and as written)."""
    found: list[str] = []
    for dsn in dsns:
        if not dsn:
            continue
        try:
            password = conninfo_to_dict(dsn).get("password")
        except psycopg.ProgrammingError:
            password = None
            # unparsable: the value after password= (and each word of it, should libpq
            # have taken its second word for a key of its own)
            for match in _KEYWORD_PASSWORD.finditer(dsn):
                value = match.group(2)
                if value.startswith("'") and len(value) > 1 and value.endswith("'"):
                    found.append(_unquoted(value))
                    continue
                more = None if value.startswith("'") else _WORDS_AFTER.match(dsn, match.end())
                value = _unquoted(value + (more.group(0) if more else ""))
                found.extend([value, *value.split()])
        if password:
            found.append(str(password))
        found.extend(match.group(2) for match in _URI_PASSWORD.finditer(dsn))
    return list(dict.fromkeys(secret for secret in found if secret))


def redact(findings: Sequence[CheckFinding], hidden: Sequence[str]) -> CheckReport:
    """The report, the passwords in ``hidden`` replaced by ``***`` where they show: any value
    of ``password=`` or ``user:password@``, and each password of :data:`SHORT_SECRET`
    characters or more standing as a token of its own (not inside a longer word)."""
    tokens = [
        re.compile(r"(?<![A-Za-z0-9])" + re.escape(secret) + r"(?![A-Za-z0-9])")
        for secret in sorted(set(hidden), key=len, reverse=True)
        if len(secret) >= SHORT_SECRET
    ]

    def scrub(text: str) -> str:
        text = _KEYWORD_PASSWORD.sub(r"\1***", text)
        text = _URI_PASSWORD.sub(r"\1***\3", text)
        for token in tokens:
            text = token.sub("***", text)
        return text

    return CheckReport([replace(f, detail=scrub(f.detail)) for f in findings])


TIMEOUT_SETTINGS = (
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "transaction_timeout",
)
"""The server timeouts compared with the TTL (``transaction_timeout`` from PostgreSQL 17)."""
SESSION_SETTINGS = (
    *TIMEOUT_SETTINGS,
    "default_transaction_read_only",
    "transaction_read_only",
    "in_hot_standby",
)
SESSION_QUERY = (
    b"SELECT "
    + b", ".join(b"current_setting('%s', true)" % name.encode() for name in SESSION_SETTINGS)
    + b", pg_backend_pid(), inet_server_port(), session_user, current_database()"
)
"""The session's settings as it started (nothing cheaper to ask: ``pg_settings`` takes
longer than a 1 ms ``statement_timeout``), its server process and port, role and database."""
SOURCES_QUERY = b"SELECT name, source FROM pg_settings WHERE name = ANY(%s)"
LEVELS_QUERY = (
    b"SELECT CASE WHEN setdatabase <> 0 AND setrole <> 0 THEN 'database user' "
    b"WHEN setrole <> 0 THEN 'user' WHEN setdatabase <> 0 THEN 'database' ELSE 'global' END, "
    b"unnest(setconfig) FROM pg_db_role_setting "
    b"WHERE setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database())) "
    b"AND setrole IN (0, (SELECT oid FROM pg_roles WHERE rolname = session_user))"
)
"""The ``ALTER ROLE`` / ``ALTER DATABASE`` settings that apply to this session, by level."""
COLUMNS_QUERY = (
    b"SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
    b"WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
)
REPLICATION_QUERY = (
    b"SELECT r.application_name, r.sync_state, r.state, s.slot_type FROM pg_stat_replication r "
    b"LEFT JOIN pg_replication_slots s ON s.active_pid = r.pid"
)
SLOTS_QUERY = b"SELECT slot_name FROM pg_replication_slots WHERE NOT active ORDER BY slot_name"
HOST_QUERY = b"SELECT pg_is_in_recovery(), pg_postmaster_start_time()"
IDENTITY_QUERY = b"SELECT system_identifier FROM pg_control_system()"
LIMITS_QUERY = (
    b"SELECT current_setting('max_connections')::int, "
    b"current_setting('superuser_reserved_connections')::int, "
    b"(SELECT rolconnlimit FROM pg_roles WHERE rolname = session_user), "
    b"(SELECT datconnlimit FROM pg_database WHERE datname = current_database()), "
    b"(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'), "
    b"coalesce(current_setting('reserved_connections', true), '0')::int"
)
