"""Schema versions shared by both flavours and the CLI (ADR-0019): which steps of the canonical
schema a table has, what ``migrate`` runs, what the backend says about a table it meets.

The canonical file (``schema.sql``) is cut into steps by its ``-- step N:`` lines; the last
statement records the version on the table, as its comment. A table made before versions were
recorded has no such comment: its version is read off the objects it has (each step leaves one
a probe can see). A recorded version is trusted only as far as the objects agree, so a table
whose earlier step was undone (the Go library's migration recreates the ``updated_at`` index)
is behind again and ``migrate`` repairs it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from psycopg import sql

from ._pg import (
    FENCE,
    LEGACY_INDEX,
    MEMBERS_INDEX,
    SEQUENCE,
    TABLE,
    _canonical,
    _qualify,
    check_schema_name,
    split_statements,
)
from .errors import BackendError, ConfigError

__all__ = [
    "CURRENT_VERSION",
    "SchemaState",
    "Step",
    "pending_sql",
    "pending_statements",
    "probe_statement",
    "steps",
]

_STEP_LINE = re.compile(r"^-- step (\d+): (.*)$", re.MULTILINE)
_RECORDED = re.compile(r"^worklease schema version (\d+)\b")
"""A comment recording a version (a later release may say more after the number)."""
_RECORD_PREFIX = "DO $$"
MIGRATE_LOCK = "SELECT pg_advisory_xact_lock(hashtext('worklease schema'))"
"""Taken by every migration, in its transaction: two migrations never interleave."""


@dataclass(frozen=True)
class Step:
    """The statements (canonical, unqualified) that took a table from ``version - 1`` to
    ``version``, and what they do in a few words."""

    version: int
    title: str
    statements: tuple[str, ...]


@functools.cache
def _parsed() -> tuple[tuple[Step, ...], str]:
    text = _canonical()
    marks = list(_STEP_LINE.finditer(text))
    found: list[Step] = []
    record = ""
    for index, mark in enumerate(marks):
        end = marks[index + 1].start() if index + 1 < len(marks) else len(text)
        statements = split_statements(text[mark.end() : end])
        if index + 1 == len(marks):
            # The last statement of the file records the version; it belongs to no step.
            *statements, record = statements
        found.append(Step(int(mark.group(1)), mark.group(2).rstrip("."), tuple(statements)))
    versions = [step.version for step in found]
    if versions != list(range(1, len(found) + 1)) or not record.startswith(_RECORD_PREFIX):
        raise RuntimeError("schema.sql: steps must be numbered 1, 2, ... and end with the record")
    return tuple(found), record


def steps() -> tuple[Step, ...]:
    """Every step of the canonical schema, in order."""
    return _parsed()[0]


CURRENT_VERSION = len(steps())
"""The schema version this worklease creates and expects."""


def _record_statement() -> str:
    """The record: sets the comment, or raises if the table records a newer version (so a
    script of this version's, however it is run, never downgrades the record)."""
    record = _parsed()[1]
    if (
        f"COMMENT ON TABLE {TABLE} IS 'worklease schema version {CURRENT_VERSION}'" not in record
        or f")::int > {CURRENT_VERSION} THEN" not in record
    ):
        raise RuntimeError("schema.sql: the recorded version is not the last step's")
    return record


def check_version(value: object) -> int:
    """A schema version given by a caller (``migrate --sql --from``): 0 (no table) to current."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= CURRENT_VERSION:
        raise ConfigError(
            f"a schema version is a whole number from 0 (no table) to {CURRENT_VERSION}, "
            f"got {value!r}"
        )
    return value


def pending_statements(version: int, schema: str | None = None) -> list[str]:
    """The statements that take a table at ``version`` (0: none yet) to the current version,
    qualified for ``schema``: the missing steps in order, then the record. Every one is
    idempotent and none drops data; all of them run in one transaction."""
    check_version(version)
    name = check_schema_name(schema)
    canonical = [s for step in steps()[version:] for s in step.statements]
    canonical.append(_record_statement())
    if name is None:
        return canonical
    quoted = sql.Identifier(name).as_string()
    qualified = [_qualify(statement + ";", quoted)[:-1] for statement in canonical]
    return [f"CREATE SCHEMA IF NOT EXISTS {quoted}", *qualified]


def pending_sql(version: int, schema: str | None = None) -> str:
    """``pending_statements`` as a script for a team's own migration tool (Django's
    ``RunSQL``, Alembic's ``op.execute``): each step under a comment, no ``BEGIN``/``COMMIT``
    (the tool runs its migration in a transaction)."""
    check_version(version)
    name = check_schema_name(schema)
    quoted = sql.Identifier(name).as_string() if name else None
    header = (
        f"-- worklease schema: from version {version} to {CURRENT_VERSION}"
        + (f" in schema {quoted}" if quoted else "")
        + ". Run it in one transaction."
    )
    if version == CURRENT_VERSION:
        header += "\n-- Every step is in place: only the version record (idempotent)."
    blocks = [header + (f"\nCREATE SCHEMA IF NOT EXISTS {quoted};" if quoted else "")]
    for step in steps()[version:]:
        body = "\n\n".join(_render(s, quoted) for s in step.statements)
        blocks.append(f"-- step {step.version}: {step.title}.\n{body}")
    blocks.append("-- The version, recorded on the table.\n" + _render(_record_statement(), quoted))
    return "\n\n".join(blocks) + "\n"


def _render(statement: str, quoted: str | None) -> str:
    return _qualify(statement + ";", quoted) if quoted else statement + ";"


# -- what a table has -------------------------------------------------------------------------


def probe_statement(schema: str | None) -> sql.Composed:
    """One query reading what a table has: no row without the table; else its comment (the
    recorded version), the PostgreSQL schema holding it, then whether each step's mark
    exists, in step order, looked for in the table's own schema (the table is found in
    ``schema``, else on the search path, as the backend's statements find it)."""
    table = sql.Identifier(schema, TABLE) if schema else sql.Identifier(TABLE)

    def beside(object_name: str, signature: str = "") -> sql.Composed:
        return sql.SQL("format('%I.%I{}', t.nspname, {})").format(
            sql.SQL(signature), sql.Literal(object_name)
        )

    return sql.SQL(
        "SELECT obj_description(t.oid, 'pg_class'), t.nspname,"
        " to_regclass({sequence}) IS NOT NULL,"
        " to_regprocedure({fence}) IS NOT NULL,"
        " to_regclass({members}) IS NOT NULL,"
        " to_regclass({legacy}) IS NULL"
        " FROM (SELECT c.oid, n.nspname::text FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass({table})) t"
    ).format(
        table=sql.Literal(table.as_string()),
        sequence=beside(SEQUENCE),
        fence=beside(FENCE, "(text, bigint)"),
        members=beside(MEMBERS_INDEX),
        legacy=beside(LEGACY_INDEX),
    )


_MARKS = {
    1: f"the {TABLE} table and the {SEQUENCE} sequence",
    2: f"the {FENCE}() function",
    3: f"the {MEMBERS_INDEX} index",
    4: f"no {LEGACY_INDEX} index",
}
"""What the probe sees of each step (one column of ``probe_statement`` each, in order)."""


@dataclass(frozen=True)
class SchemaState:
    """What a table has: the version its comment records (``None``: none recorded) and, per
    step, whether the step's mark is there."""

    recorded: int | None
    marks: tuple[bool, ...]
    namespace: str | None = None
    """The PostgreSQL schema holding the table (``None``: no table)."""

    @classmethod
    def from_row(cls, row: tuple[object, ...] | None) -> SchemaState:
        """From a row of ``probe_statement`` (``None``: it returned none, no table)."""
        if row is None:
            return cls(None, (False,) * CURRENT_VERSION)
        comment, namespace, *marks = row
        match = _RECORDED.match(comment) if isinstance(comment, str) else None
        # The row says the table is there: step 1's mark is then its sequence.
        return cls(int(match.group(1)) if match else None, tuple(map(bool, marks)), str(namespace))

    @property
    def exists(self) -> bool:
        """Whether the table is there (its sequence may still be missing)."""
        return self.namespace is not None

    @property
    def applied(self) -> int:
        """The last step before the first whose mark is missing (0: no table)."""
        for index, present in enumerate(self.marks):
            if not present:
                return index
        return len(self.marks)

    @property
    def newer(self) -> bool:
        """The table records a version this worklease does not know."""
        return self.recorded is not None and self.recorded > CURRENT_VERSION

    @property
    def version(self) -> int:
        """The version the table is at: the recorded one, as far as the objects agree."""
        if self.recorded is None:
            return self.applied
        if self.newer:
            return self.recorded
        return min(self.recorded, self.applied)

    @property
    def current(self) -> bool:
        """At the current version, recorded: ``migrate`` has nothing to do."""
        return self.recorded == CURRENT_VERSION and self.applied == CURRENT_VERSION

    def missing(self) -> list[str]:
        """The marks of the steps ``migrate`` would run, in words."""
        return [_MARKS[step.version] for step in steps()[self.version :]]

    def describe(self) -> str:
        if self.newer:
            return f"version {self.recorded}, newer than this worklease knows ({CURRENT_VERSION})"
        if self.current:
            return f"version {CURRENT_VERSION} (current)"
        if not self.exists:
            return "no table"
        unrecorded = " (not recorded on the table)" if self.recorded is None else ""
        if self.version == CURRENT_VERSION:
            return f"version {CURRENT_VERSION}{unrecorded}"
        return f"version {self.version} of {CURRENT_VERSION}{unrecorded}; pending: " + ", ".join(
            f"step {s.version} ({s.title})" for s in steps()[self.version :]
        )


def where(schema: str | None) -> str:
    return f"schema {schema!r}" if schema else "the search path"


def newer_error(state: SchemaState, schema: str | None, operation: str) -> BackendError:
    """The refusal of a table newer than this worklease: its layout or rules may have
    changed in ways this version would break."""
    return BackendError(
        f"{operation}: the {TABLE} table in {where(schema)} is at schema version "
        f"{state.recorded}, newer than this worklease knows ({CURRENT_VERSION}): upgrade "
        "worklease to the version that migrated it"
    )


def older_warning(state: SchemaState, schema: str | None) -> str:
    """What the backend logs once on a table behind the current version (it still works)."""
    return (
        f"the {TABLE} table in {where(schema)} is at schema {state.describe()}; this worklease "
        f"expects version {CURRENT_VERSION}: run `worklease migrate` (leases work meanwhile)"
    )
