"""Schema versions (ADR-0019): a table of every earlier version is upgraded by ``migrate``
(and by the SQL ``migrate --sql`` prints) to exactly what a fresh install creates, with its
rows kept; a newer table is refused, an older one warned about; ``--check`` says which.

The earlier versions are the canonical files as they shipped, kept under
``tests/schema_history/`` (from the git history of ``src/worklease/schema.sql``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from tests import pg
from tests.test_cli import run
from worklease import BackendError, ConfigError, Lease, LeaseHeldError, PostgresBackend
from worklease._migrations import (
    _MARKS,
    CURRENT_VERSION,
    SchemaState,
    pending_sql,
    pending_statements,
    steps,
)
from worklease._pg import schema_statements
from worklease._sync.postgres import probe_schema

HISTORY = Path(__file__).with_name("schema_history")
EARLIER = {1: "v1.sql", 2: "v2.sql", 3: "v3.sql", 4: "v4-unrecorded.sql"}
"""Each earlier canonical file and the version it made (the last one: version 4's objects,
before the version was recorded on the table)."""


# -- the steps, without a database ----------------------------------------------------------


def test_the_canonical_file_is_cut_into_numbered_steps_ending_with_the_record() -> None:
    assert CURRENT_VERSION == 4
    assert [step.version for step in steps()] == [1, 2, 3, 4]
    assert set(_MARKS) == {step.version for step in steps()}, "every step needs a probe mark"
    # A fresh install runs every step and the record: the whole canonical file.
    assert pending_statements(0) == schema_statements()
    assert pending_statements(0, "s p") == schema_statements("s p")
    (record,) = pending_statements(4)
    assert record.startswith("DO $$")
    assert "COMMENT ON TABLE worklease_leases IS 'worklease schema version 4'" in record
    assert pending_statements(2)[0].startswith(
        "CREATE INDEX IF NOT EXISTS idx_worklease_leases_members"
    )


def test_pending_sql_names_each_step_and_never_begins_a_transaction() -> None:
    text = pending_sql(1, "tenant a")
    assert text.startswith('-- worklease schema: from version 1 to 4 in schema "tenant a".')
    assert [line for line in text.splitlines() if line.startswith("-- step")] == [
        f"-- step {s.version}: {s.title}." for s in steps()[1:]
    ]
    assert re.search(r"(?im)^\s*(BEGIN|COMMIT|START TRANSACTION)\s*;", text) is None
    assert 'COMMENT ON TABLE "tenant a".worklease_leases' in text
    assert "only the version record" in pending_sql(4)


@pytest.mark.parametrize("bad", [-1, 5, 2.0, True, "3", None])
def test_a_version_outside_the_known_ones_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="from 0 \\(no table\\) to 4"):
        pending_sql(bad)


@pytest.mark.parametrize(
    ("row", "version", "current", "newer"),
    [
        (None, 0, False, False),  # no table: no row
        ((None, "s", False, False, False, True), 0, False, False),  # a table, no sequence
        ((None, "s", True, False, False, False), 1, False, False),
        ((None, "s", True, True, True, True), 4, False, False),  # unrecorded: migrate records it
        (("worklease schema version 4", "s", True, True, True, True), 4, True, False),
        (("worklease schema version 4", "s", True, True, True, False), 3, False, False),  # Go
        (("worklease schema version 9", "s", True, True, True, True), 9, False, True),
        (("worklease schema version 12 (x)", "s", True, True, True, True), 12, False, True),
        (("our leases", "s", True, True, False, False), 2, False, False),  # someone else's
    ],
)
def test_the_version_is_the_recorded_one_as_far_as_the_objects_agree(
    row: tuple[object, ...] | None, version: int, current: bool, newer: bool
) -> None:
    state = SchemaState.from_row(row)
    assert (state.version, state.current, state.newer) == (version, current, newer)


# -- on PostgreSQL --------------------------------------------------------------------------


@pytest.fixture
def schema(postgres_dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    name = (
        f"versions_{request.node.name[-40:]}".replace("[", "_").replace("]", "").replace("-", "_")
    )
    pg.execute(postgres_dsn, f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    yield name
    pg.execute(postgres_dsn, f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def create_earlier(dsn: str, schema: str, version: int) -> None:
    """The table as worklease ``version`` made it (its canonical file, run through psql's
    way: one script, unqualified names resolved in ``schema``), with two rows in it."""
    text = (HISTORY / EARLIER[version]).read_text(encoding="utf-8")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(text.encode())
        conn.execute(
            b"INSERT INTO worklease_leases (work_id, holder_id, expires_at, checkpoint, exit_mode,"
            b" prev_exit_mode, prev_holder_id) VALUES"
            b" ('held', 'w1', now() + interval '1 hour', '\\x0102', NULL, 'expired', 'w0'),"
            b" ('done', 'w2', now(), 'final', 'finished', 'none', NULL)"
        )


def catalog(dsn: str, schema: str) -> dict[str, Any]:
    """Everything a schema version decides, with the schema's name taken out: columns,
    constraints, indexes, storage options, the comment, the sequence, the fence function."""

    def rows(query: str) -> list[tuple[Any, ...]]:
        return [
            tuple(str(v).replace(f'"{schema}".', "").replace(f"{schema}.", "") for v in row)
            for row in pg.execute(dsn, query, (schema,))
        ]

    return {
        "columns": rows(
            "SELECT column_name, data_type, is_nullable, column_default FROM"
            " information_schema.columns WHERE table_schema = %s AND table_name ="
            " 'worklease_leases' ORDER BY ordinal_position"
        ),
        "constraints": rows(
            "SELECT conname, pg_get_constraintdef(c.oid) FROM pg_constraint c JOIN pg_namespace n"
            " ON n.oid = c.connamespace WHERE n.nspname = %s ORDER BY 1"
        ),
        "indexes": rows(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s ORDER BY 1"
        ),
        "table": rows(
            "SELECT c.reloptions, obj_description(c.oid, 'pg_class') FROM pg_class c JOIN"
            " pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname ="
            " 'worklease_leases'"
        ),
        "sequences": rows(
            "SELECT sequencename, increment_by, start_value FROM pg_sequences WHERE schemaname = %s"
        ),
        "functions": rows(
            "SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prosrc FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1"
        ),
    }


def table_rows(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return pg.execute(
        dsn,
        f"SELECT work_id, holder_id, fencing_token, expires_at, checkpoint, exit_mode,"
        f' prev_exit_mode, prev_holder_id, acquired_at, updated_at FROM "{schema}".worklease_leases'
        " ORDER BY work_id",
    )


@pytest.fixture
def fresh_catalog(postgres_dsn: str) -> Iterator[dict[str, Any]]:
    name = "versions_fresh_install"
    pg.execute(postgres_dsn, f"DROP SCHEMA IF EXISTS {name} CASCADE")
    assert run("migrate", "--dsn", postgres_dsn, "--schema", name).returncode == 0
    try:
        yield catalog(postgres_dsn, name)
    finally:
        pg.execute(postgres_dsn, f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.mark.postgres
@pytest.mark.parametrize("version", sorted(EARLIER))
def test_migrate_upgrades_a_table_of_every_earlier_version(
    postgres_dsn: str, schema: str, version: int, fresh_catalog: dict[str, Any]
) -> None:
    create_earlier(postgres_dsn, schema, version)
    before_rows = table_rows(postgres_dsn, schema)
    check = run("migrate", "--check", "--dsn", postgres_dsn, "--schema", schema)
    assert check.returncode == 1
    assert f"is behind: version {version}" in check.stdout
    assert "(not recorded on the table)" in check.stdout

    result = run("migrate", "--dsn", postgres_dsn, "--schema", schema)
    assert result.returncode == 0, result.stderr
    if version < CURRENT_VERSION:
        assert result.stdout.startswith(
            f"upgraded the worklease schema in schema '{schema}' from version {version} to 4: "
            f"step {version + 1} "
        )
    else:
        assert result.stdout == f"recorded schema version 4 on the table in schema '{schema}'\n"
    assert catalog(postgres_dsn, schema) == fresh_catalog
    assert table_rows(postgres_dsn, schema) == before_rows  # nothing lost, nothing rewritten
    assert run("migrate", "--check", "--dsn", postgres_dsn, "--schema", schema).returncode == 0
    again = run("migrate", "--dsn", postgres_dsn, "--schema", schema)
    assert again.stdout.endswith("is at version 4 (current); nothing to do\n")

    # The upgraded table works: the held row is fenced off, the finished one hands over.
    with ConnectionPool(postgres_dsn, min_size=1, max_size=2, open=True) as pool:
        lease = Lease(PostgresBackend(pool, schema=schema), holder_id="w3", ttl=30)
        token = lease.acquire("done")
        prior = lease.read_checkpoint(token)
        assert (prior.state, prior.prev_exit, prior.prev_holder_id) == (b"final", "finished", "w2")
        lease.checkpoint(token, b"resumed")
        lease.release(token, "finished")
        with pytest.raises(LeaseHeldError):
            lease.acquire("held")


@pytest.mark.postgres
@pytest.mark.parametrize("version", sorted(EARLIER))
def test_the_printed_sql_upgrades_as_migrate_does(
    postgres_dsn: str, schema: str, version: int, fresh_catalog: dict[str, Any]
) -> None:
    """The path of a team running its own migrations: ``migrate --sql`` (asked of the
    database, and offline with ``--from``) executed in one transaction of their tool."""
    create_earlier(postgres_dsn, schema, version)
    before_rows = table_rows(postgres_dsn, schema)
    asked = run("migrate", "--sql", "--dsn", postgres_dsn, "--schema", schema)
    offline = run("migrate", "--sql", "--from", str(version), "--schema", schema)
    assert asked.returncode == offline.returncode == 0, asked.stderr + offline.stderr
    assert asked.stdout == offline.stdout
    with psycopg.connect(postgres_dsn) as conn:  # not autocommit: one transaction
        conn.execute(asked.stdout.encode())
    assert catalog(postgres_dsn, schema) == fresh_catalog
    assert table_rows(postgres_dsn, schema) == before_rows
    assert run("migrate", "--check", "--dsn", postgres_dsn, "--schema", schema).returncode == 0


@pytest.mark.postgres
def test_a_table_newer_than_this_worklease_is_refused_and_left_alone(
    postgres_dsn: str, schema: str
) -> None:
    assert run("migrate", "--dsn", postgres_dsn, "--schema", schema).returncode == 0
    pg.execute(
        postgres_dsn, f"COMMENT ON TABLE {schema}.worklease_leases IS 'worklease schema version 5'"
    )
    before = catalog(postgres_dsn, schema)
    for args in ((), ("--check",), ("--sql",)):
        result = run("migrate", *args, "--dsn", postgres_dsn, "--schema", schema)
        assert result.returncode == 1, args
        assert "is at schema version 5, newer than this worklease knows (4)" in result.stderr
    assert catalog(postgres_dsn, schema) == before
    with ConnectionPool(postgres_dsn, min_size=1, max_size=2, open=True) as pool:
        with pytest.raises(BackendError, match="newer than this worklease knows") as caught:
            PostgresBackend.apply_schema(pool, schema=schema)
        assert not caught.value.transient
        lease = Lease(PostgresBackend(pool, schema=schema), holder_id="w", ttl=30)
        with pytest.raises(BackendError, match=r"^acquire: the worklease_leases table in schema"):
            lease.acquire("job")
    assert pg.execute(postgres_dsn, f"SELECT count(*) FROM {schema}.worklease_leases") == [(0,)]
    check = run("check", "--dsn", postgres_dsn, "--schema", schema)
    assert "newer than this worklease knows" in check.stdout
    assert check.returncode == 1


@pytest.mark.postgres
def test_an_older_table_is_warned_about_once_and_still_works(
    postgres_dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    create_earlier(postgres_dsn, schema, 2)
    caplog.set_level(logging.WARNING, logger="worklease")
    with ConnectionPool(postgres_dsn, min_size=1, max_size=2, open=True) as pool:
        lease = Lease(PostgresBackend(pool, schema=schema), holder_id="w3", ttl=30)
        for work_id in ("a", "b"):
            token = lease.acquire(work_id)
            lease.release(token, "finished")
    warnings = [r.getMessage() for r in caplog.records if "schema version" in r.getMessage()]
    assert warnings == [
        f"the worklease_leases table in schema '{schema}' is at schema version 2 of 4 (not "
        "recorded on the table); pending: step 3 (an index for pool memberships), step 4 "
        f"({steps()[3].title}); this worklease expects version 4: run `worklease migrate` "
        "(leases work meanwhile)"
    ]
    check = run("check", "--dsn", postgres_dsn, "--schema", schema)
    assert "idx_worklease_leases_members index is missing" in check.stdout


@pytest.mark.postgres
def test_a_current_table_is_not_warned_about(
    postgres_dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert run("migrate", "--dsn", postgres_dsn, "--schema", schema).returncode == 0
    caplog.set_level(logging.WARNING, logger="worklease")
    with ConnectionPool(postgres_dsn, min_size=1, max_size=2, open=True) as pool:
        lease = Lease(PostgresBackend(pool, schema=schema), holder_id="w", ttl=30)
        token = lease.acquire("a")
        lease.release(token, "finished")
        with pool.connection() as conn:
            assert probe_schema(conn, schema).current
    assert [r for r in caplog.records if "schema" in r.getMessage()] == []
    check = run("check", "--dsn", postgres_dsn, "--schema", schema)
    assert "(schema version 4)" in check.stdout


@pytest.mark.postgres
def test_concurrent_migrations_of_an_old_table_both_succeed(
    postgres_dsn: str, schema: str, fresh_catalog: dict[str, Any]
) -> None:
    """Two deploys migrating at once: the advisory lock serialises them; the second finds
    the table current (under the lock) and does nothing."""
    create_earlier(postgres_dsn, schema, 1)
    found: list[int] = []
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            with psycopg.connect(postgres_dsn, autocommit=True) as conn:
                found.append(PostgresBackend.apply_schema(conn, schema=schema))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(found) == [1, 4]
    assert catalog(postgres_dsn, schema) == fresh_catalog


@pytest.mark.postgres
def test_no_script_of_this_version_downgrades_a_newer_record(
    postgres_dsn: str, schema: str
) -> None:
    """``psql -f schema.sql`` and a ``--sql --from`` script run by another tool raise on a
    table a later release recorded, instead of writing version 4 over it."""
    assert run("migrate", "--dsn", postgres_dsn, "--schema", schema).returncode == 0
    table = f'"{schema}".worklease_leases'
    pg.execute(postgres_dsn, f"COMMENT ON TABLE {table} IS 'worklease schema version 5 (later)'")
    scripts = [
        run("schema", "--schema", schema).stdout,
        pending_sql(0, schema),
        pending_sql(3, schema),
    ]
    for script in scripts:
        with (
            psycopg.connect(postgres_dsn, autocommit=True) as conn,
            pytest.raises(psycopg.errors.RaiseException, match="newer than 4"),
        ):
            conn.execute(script.encode())
    comment = pg.execute(postgres_dsn, f"SELECT obj_description('{table}'::regclass, 'pg_class')")
    assert comment == [("worklease schema version 5 (later)",)]


@pytest.mark.postgres
def test_without_a_schema_the_table_is_upgraded_where_the_search_path_finds_it(
    postgres_dsn: str, schema: str, fresh_catalog: dict[str, Any]
) -> None:
    """A first-release table in the second schema of the search path: its missing objects
    go beside it (not into the first schema), and the messages name where it is."""
    first = f"{schema}_first"
    pg.execute(postgres_dsn, f'DROP SCHEMA IF EXISTS "{first}" CASCADE; CREATE SCHEMA "{first}"')
    try:
        create_earlier(postgres_dsn, schema, 1)
        dsn = f"{postgres_dsn} options='-c search_path={first},{schema}'"
        check = run("migrate", "--check", "--dsn", dsn)
        assert check.returncode == 1
        assert check.stdout.startswith(f"the worklease schema in schema '{schema}' is behind")
        result = run("migrate", "--dsn", dsn)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"upgraded the worklease schema in schema '{schema}'")
        assert catalog(postgres_dsn, schema) == fresh_catalog
        assert pg.execute(
            postgres_dsn,
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s",
            (first,),
        ) == [(0,)]
        with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
            lease = Lease(PostgresBackend(pool), holder_id="w", ttl=30)
            token = lease.acquire("done")
            assert lease.read_checkpoint(token).state == b"final"
            lease.release(token, "finished")
    finally:
        pg.execute(postgres_dsn, f'DROP SCHEMA IF EXISTS "{first}" CASCADE')


@pytest.mark.postgres
def test_calls_that_start_together_warn_once_and_leave_the_connection_idle(
    postgres_dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Eight first calls at once on an older table, through a pool whose connections are not
    in autocommit: one warning, and every connection goes back idle and not in autocommit."""
    create_earlier(postgres_dsn, schema, 2)
    caplog.set_level(logging.WARNING, logger="worklease")
    with ConnectionPool(postgres_dsn, min_size=8, max_size=8, open=True) as pool:
        pool.wait()
        backend = PostgresBackend(pool, schema=schema)
        lease = Lease(backend, holder_id="w", ttl=30)
        start = threading.Barrier(8)
        errors: list[BaseException] = []

        def call(n: int) -> None:
            try:
                start.wait(10)
                lease.release(lease.acquire(f"w{n}"), "finished")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        for _ in range(8):
            with pool.connection() as conn:
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                assert conn.autocommit is False
    warnings = [r for r in caplog.records if "schema version 2 of 4" in r.getMessage()]
    assert len(warnings) == 1
