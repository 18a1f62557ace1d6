"""``worklease check``: the findings and the judgements (no I/O; ``_async/check.py`` asks).

Each check reads server settings or tries the behaviour worklease relies on, and reports
``ok``, ``warn`` (works, with a risk to know about) or ``fail`` (worklease will not work as
documented).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ._duration import format_duration
from ._pg import FENCE, INDEX, SEQUENCE, TABLE, _canonical, check_listen_dsn, check_schema_name
from ._validation import check_ttl
from .errors import ConfigError

__all__ = ["CheckFinding", "CheckReport"]

Status = Literal["ok", "warn", "fail"]

CLOCK_OFFSET_WARN = 1.0
"""Seconds of client/server clock difference worth a warning (expiry uses the server's)."""


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
    return CheckFinding("schema", "ok", f"{TABLE}, {SEQUENCE}, {FENCE}() and the index are current")


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


def judge_replication(in_recovery: bool, standbys: list[tuple[str, str | None]]) -> CheckFinding:
    if in_recovery:
        return CheckFinding(
            "replication",
            "fail",
            "this server is a standby (read-only): point the DSN at the primary, e.g. "
            "host=a,b target_session_attrs=read-write",
        )
    if not standbys:
        return CheckFinding(
            "replication",
            "ok",
            "no standby streams from this server (if it fails, nothing takes over by itself)",
        )
    modes = [mode or "unknown" for _, mode in standbys]
    described = ", ".join(
        f"{name or '?'} ({mode})" for (name, _), mode in zip(standbys, modes, strict=True)
    )
    if any(mode in ("sync", "quorum") for mode in modes):
        return CheckFinding(
            "replication",
            "ok",
            f"standbys: {described}; replication is synchronous, so checkpoints acknowledged "
            "with synchronous_commit on (or remote_*) survive a failover",
        )
    if all(mode == "unknown" for mode in modes):
        return CheckFinding(
            "replication",
            "warn",
            f"standbys: {described}; this role cannot see whether replication is synchronous "
            "(grant pg_read_all_stats to see)",
        )
    return CheckFinding(
        "replication",
        "warn",
        f"standbys: {described}; replication is asynchronous, so checkpoints acknowledged "
        "shortly before a failover may be lost (fencing tokens stay unique: ADR-0008); set "
        "synchronous_standby_names for durable checkpoints",
    )


def judge_timeouts(settings: dict[str, float], ttl: float) -> CheckFinding:
    """Server timeouts in seconds (0 = off) against the lease TTL."""
    problems: list[str] = []
    idle = settings.get("idle_session_timeout", 0.0)
    if 0 < idle < ttl:
        problems.append(
            f"idle_session_timeout ({format_duration(idle)}) is shorter than the TTL "
            f"({format_duration(ttl)}): idle pooled connections are cut between renewals"
        )
    statement = settings.get("statement_timeout", 0.0)
    if 0 < statement < 1.0:
        problems.append(
            f"statement_timeout ({format_duration(statement)}) may cut a waiting acquire or a "
            "checkpoint under load"
        )
    described = ", ".join(
        f"{name}={format_duration(value) if value else 'off'}" for name, value in settings.items()
    )
    if problems:
        return CheckFinding("timeouts", "warn", "; ".join(problems))
    return CheckFinding("timeouts", "ok", f"{described} (TTL {format_duration(ttl)})")


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
    conninfo: object, schema: object, listen_dsn: object, ttl: object, probe_timeout: object
) -> tuple[str, str | None, str | None, float, float]:
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
    )


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
    return CheckFinding("schema", "fail", f"the {INDEX} index is missing: run `worklease migrate`")


def missing_fence() -> CheckFinding:
    return CheckFinding(
        "schema",
        "warn",
        f"the {FENCE}() function is missing (the schema predates it): run `worklease migrate`",
    )


def judge_pooler(same_server: bool) -> CheckFinding:
    if same_server:
        return CheckFinding(
            "pooler",
            "warn",
            "two connections were served by one server session: a transaction-pooling proxy "
            "(PgBouncer in transaction mode) is in between; worklease works through it (pass "
            "schema= explicitly, prepare_threshold=None for your own statements on PgBouncer "
            "before 1.21), release notifications need a listen_dsn straight to the server",
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


TIMEOUT_SETTINGS = (
    "statement_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
)
TIMEOUT_QUERY = b"SELECT setting || coalesce(unit, '') FROM pg_settings WHERE name = %s"
COLUMNS_QUERY = (
    b"SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
    b"WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
)
REPLICATION_QUERY = b"SELECT application_name, sync_state FROM pg_stat_replication"
