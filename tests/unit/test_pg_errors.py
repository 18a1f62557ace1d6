"""PostgreSQL error classification (``worklease._pg.map_error``) and the schema text.

Everything here runs without a database except the one test marked ``postgres``, which
applies a schema-qualified script twice to a fresh database.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import psycopg_pool
import pytest
from psycopg import errors as pg_errors

from tests import pg
from worklease import BackendError, ConfigError, schema_sql
from worklease._pg import Statements, map_error, must_discard, single_statement

SHIPPED_SCHEMA = Path(__file__).resolve().parents[2] / "src" / "worklease" / "schema.sql"

MISSING = 'relation "worklease_leases" does not exist'


@pytest.mark.parametrize(
    "error",
    [
        psycopg.OperationalError("connection to server lost"),
        pg_errors.AdminShutdown("terminating connection due to administrator command"),
        pg_errors.QueryCanceled("canceling statement due to statement timeout"),
        pg_errors.SerializationFailure("could not serialize access"),
        pg_errors.DeadlockDetected("deadlock detected"),
        psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec"),
        psycopg.InterfaceError("the connection is closed"),
        pg_errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
        pg_errors.ObjectNotInPrerequisiteState("recovery is in progress"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_transient_errors(error: psycopg.Error) -> None:
    """Connection loss, restarts, timeouts, serialization failures, deadlocks and pool
    timeouts are transient; the message names the operation, the driver class and detail."""
    mapped = map_error(error, "renew")
    assert isinstance(mapped, BackendError)
    assert mapped.transient is True
    message = str(mapped)
    assert message.startswith("renew: ")
    assert type(error).__name__ in message
    assert str(error) in message
    assert "worklease migrate" not in message
    assert must_discard(error)  # the connection is not handed back to the pool


@pytest.mark.parametrize(
    "error",
    [
        pg_errors.InsufficientPrivilege("permission denied for table worklease_leases"),
        psycopg.DataError("invalid input syntax"),
        pg_errors.UndefinedTable('relation "some_other_table" does not exist'),
        psycopg.ProgrammingError("syntax error"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_permanent_errors(error: psycopg.Error) -> None:
    mapped = map_error(error, "checkpoint")
    assert mapped.transient is False
    assert str(mapped).startswith("checkpoint: ")
    assert type(error).__name__ in str(mapped)
    assert "worklease migrate" not in str(mapped)


@pytest.mark.parametrize(
    "message",
    [
        MISSING,
        'relation "worklease_absent.worklease_leases" does not exist',
        'relation "my schema.worklease_leases" does not exist',
    ],
)
def test_missing_table_names_the_fix(message: str) -> None:
    """UndefinedTable for the lease table (bare instance: no server diagnostics) is permanent
    and names `worklease migrate`, quoting the server's message."""
    error = pg_errors.UndefinedTable(message)
    assert error.diag.message_primary is None  # a bare instance: map_error falls back
    mapped = map_error(error, "acquire")
    assert mapped.transient is False
    assert "worklease migrate" in str(mapped)
    assert message in str(mapped)
    assert str(mapped).startswith("acquire: ")


def test_missing_table_in_a_schema_with_a_quote_names_the_fix() -> None:
    """The exact message PostgreSQL 15 sends for a missing table in schema 'Team "Leases"'."""
    error = pg_errors.UndefinedTable('relation "Team "Leases".worklease_leases" does not exist')
    assert "worklease migrate" in str(map_error(error, "acquire"))


def test_errors_without_text_still_map() -> None:
    for error in (psycopg.OperationalError(), pg_errors.UndefinedTable()):
        mapped = map_error(error, "release")
        assert str(mapped).startswith("release: ")
        assert type(error).__name__ in str(mapped)


# -- schema_sql -----------------------------------------------------------------------------


def test_default_schema_is_the_shipped_file() -> None:
    assert schema_sql() == SHIPPED_SCHEMA.read_text(encoding="utf-8")
    assert schema_sql(None) == schema_sql()


def test_named_schema_quotes_every_identifier() -> None:
    text = schema_sql("my schema")
    assert 'CREATE SCHEMA IF NOT EXISTS "my schema";' in text
    assert 'CREATE SEQUENCE IF NOT EXISTS "my schema".worklease_fencing_seq;' in text
    assert 'CREATE TABLE IF NOT EXISTS "my schema".worklease_leases (' in text
    assert "DEFAULT nextval('\"my schema\".worklease_fencing_seq')" in text
    assert 'DROP INDEX IF EXISTS "my schema".idx_worklease_leases_updated_at;' in text
    assert 'ALTER TABLE "my schema".worklease_leases SET (fillfactor = 90);' in text
    assert 'ON "my schema".worklease_leases (work_id text_pattern_ops)' in text
    assert text.index("CREATE SCHEMA") < text.index("CREATE SEQUENCE")
    assert 'FUNCTION "my schema".worklease_fence(' in text
    assert 'FROM "my schema".worklease_leases WHERE work_id = p_work_id' in text
    # No reference to the table, sequence or fence is left unqualified (comments aside).
    code = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    unqualified = r"(?<![\w.])(?:worklease_leases|worklease_fencing_seq|worklease_fence)(?!\w)"
    assert re.findall(unqualified, code) == []
    assert 'COMMENT ON TABLE "my schema".worklease_leases IS' in text
    assert code.count('"my schema".worklease_') == 9  # the record names the table twice


def test_schema_names_with_quotes_are_escaped() -> None:
    text = schema_sql('it\'s "odd"')
    assert 'CREATE SCHEMA IF NOT EXISTS "it\'s ""odd""";' in text
    assert 'CREATE TABLE IF NOT EXISTS "it\'s ""odd""".worklease_leases (' in text
    # The sequence name is a string literal inside nextval(): the single quote is doubled.
    assert 'DEFAULT nextval(\'"it\'\'s ""odd""".worklease_fencing_seq\')' in text


@pytest.mark.parametrize("bad", ["", "a\x00b"])
def test_bad_schema_names_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError):
        schema_sql(schema=bad)


def test_non_string_schema_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        schema_sql(schema=42)  # type: ignore[arg-type]


@pytest.mark.postgres
@pytest.mark.parametrize("schema", ["my schema", 'it\'s "odd"'])
def test_named_schema_applies_twice_to_a_fresh_database(postgres_server: str, schema: str) -> None:
    """The whole script runs (as ``psql -f`` would) twice on a fresh database: the second run
    changes nothing, the objects live in the named schema and the token default works."""
    quoted = '"' + schema.replace('"', '""') + '"'
    with pg.fresh_database(postgres_server) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(schema_sql(schema).encode())
        conn.execute(
            f"INSERT INTO {quoted}.worklease_leases (work_id, holder_id, expires_at)"
            " VALUES ('w', 'h', now())".encode()
        )
        conn.execute(schema_sql(schema).encode())  # idempotent: no error, data kept
        rows = conn.execute(
            f"SELECT work_id, fencing_token FROM {quoted}.worklease_leases".encode()
        ).fetchall()
        assert rows == [("w", 1)]
        tables = conn.execute(
            "SELECT table_schema FROM information_schema.tables"
            " WHERE table_name = 'worklease_leases' ORDER BY table_schema"
        ).fetchall()
        assert tables == sorted([("public",), (schema,)])
        sequences = conn.execute(
            "SELECT sequence_schema FROM information_schema.sequences"
            " WHERE sequence_name = 'worklease_fencing_seq' ORDER BY sequence_schema"
        ).fetchall()
        assert sequences == sorted([("public",), (schema,)])
        indexes = conn.execute(
            "SELECT schemaname, indexname FROM pg_indexes"
            " WHERE tablename = 'worklease_leases' ORDER BY schemaname, indexname"
        ).fetchall()
        assert indexes == sorted(
            (where, name)
            for where in ("public", schema)
            for name in ("idx_worklease_leases_members", "worklease_leases_pkey")
        )
        options = conn.execute(
            "SELECT n.nspname, c.reloptions FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relname = 'worklease_leases' ORDER BY n.nspname"
        ).fetchall()
        assert options == sorted([("public", ["fillfactor=90"]), (schema, ["fillfactor=90"])])
        # The named schema's table draws tokens from its own sequence, not public's.
        (public_next,) = conn.execute("SELECT nextval('worklease_fencing_seq')").fetchone() or ()
        assert public_next == 1


def test_batch_statements_send_their_arrays_in_binary_on_the_extended_protocol() -> None:
    """psycopg's text form escapes every array element in Python; the prepared text binds
    the arrays in binary, the simple-query text (a client-side cursor) keeps %s."""
    statements = Statements(None)
    for name in ("checkpoint_many", "renew_many", "release_many", "acquire_many"):
        simple = getattr(statements, name)
        single = single_statement(simple)
        assert single is not None, name
        assert b"%(work_ids)b::text[]" in single, name
        assert b"%(work_ids)s::text[]" in simple, name
        assert re.search(rb"%\(\w+\)s::\w+\[\]", single) is None, name  # no text array left
    single = single_statement(statements.checkpoint_many)
    assert single is not None
    assert b"%(states)b::bytea[]" in single
    # Scalar parameters stay as they were.
    checkpoint = single_statement(statements.checkpoint)
    assert checkpoint is not None
    assert b"%(state)s" in checkpoint


def test_a_renewal_is_bounded_by_its_ttl_unless_the_ttl_writes_an_expired_lease() -> None:
    """A negative bound had the statement cancelled before it ran (the conformance case that
    renews with an already-expired TTL failed now and then)."""
    from worklease._pg import renewal_bounds

    assert renewal_bounds(10.0) == (10.0, 10.0)
    assert renewal_bounds(0.0) == (None, None)
    assert renewal_bounds(-1.0) == (None, None)
