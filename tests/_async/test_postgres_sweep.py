"""The PostgreSQL sweep in bounded batches (issue 24).

The sweep runs as statements of at most ``Statements.sweep_batch`` rows each (in work_id
order), each its own transaction, skipping rows another transaction has locked. The cases set
a batch of 3 rows and build the rows with direct SQL (ages an hour old, so no case depends on
timing), then check which rows are left, how many statements ran, and that each statement
committed on its own (the rows left, read on another connection right after each one).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from tests import pg
from worklease import AsyncPostgresBackend, AsyncVacuum
from worklease._pg import LEGACY_INDEX, TABLE, Statements, schema_statements

pytestmark = pytest.mark.postgres

BATCH = 3
RETENTION = 60.0

KINDS = {
    # kind: (exit_mode, expires_at, updated_at)
    "retired": ("retired", "now() - interval '1 hour'", "now() - interval '1 hour'"),
    "finished": ("finished", "now() - interval '1 hour'", "now() - interval '1 hour'"),
    "abandoned": ("abandoned", "now() - interval '1 hour'", "now() - interval '1 hour'"),
    "lapsed": (None, "now() - interval '1 hour'", "now() - interval '1 hour'"),
    "held": (None, "now() + interval '1 hour'", "now() - interval '1 hour'"),
    "fresh": ("retired", "now() - interval '1 second'", "now()"),
}
"""The rows the cases build: only ``retired`` (and, with include_expired, ``lapsed``) rows
are sweepable with a retention of a minute."""


def table_of(schema: str | None) -> sql.Composable:
    return sql.Identifier(schema, TABLE) if schema else sql.Identifier(TABLE)


def make_rows(dsn: str, kinds: list[str], schema: str | None = None) -> list[str]:
    """One row per entry of ``kinds``, work IDs ``w-00``, ``w-01``... in that order; returns
    the work IDs."""
    ids = [f"w-{n:02d}" for n in range(len(kinds))]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for work_id, kind in zip(ids, kinds, strict=True):
            exit_mode, expires_at, updated_at = KINDS[kind]
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (work_id, holder_id, expires_at, exit_mode, updated_at)"
                    " VALUES (%s, 'holder', {}, %s, {})"
                ).format(table_of(schema), sql.SQL(expires_at), sql.SQL(updated_at)),
                (work_id, exit_mode),
            )
    return ids


def left(dsn: str, schema: str | None = None) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT work_id FROM {} ORDER BY work_id").format(table_of(schema))
        ).fetchall()
    return [row[0] for row in rows]


def expected_left(ids: list[str], kinds: list[str], *, include_expired: bool) -> list[str]:
    swept = {"retired", "lapsed"} if include_expired else {"retired"}
    return [work_id for work_id, kind in zip(ids, kinds, strict=True) if kind not in swept]


class SweepSpy:
    """Wraps a backend's ``_run``: after each sweep statement, the rows left as another
    connection reads them (so each batch committed on its own)."""

    def __init__(self, backend: AsyncPostgresBackend, dsn: str, schema: str | None) -> None:
        self.inner = backend._run
        self.dsn = dsn
        self.schema = schema
        self.after_each: list[list[str]] = []

    async def __call__(
        self, operation: str, statement: bytes, params: dict[str, Any], **kwargs: Any
    ) -> Any:
        result = await self.inner(operation, statement, params, **kwargs)
        if operation == "sweep":
            self.after_each.append(left(self.dsn, self.schema))
        return result


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Statements, "sweep_batch", BATCH)


@pytest.fixture
async def pool(postgres_dsn: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pg.reset(postgres_dsn)
    async with AsyncConnectionPool(postgres_dsn, min_size=1, max_size=4, open=False) as pool:
        yield pool


KINDS_MIXED = [
    "retired",
    "finished",
    "retired",
    "held",
    "lapsed",
    "retired",
    "retired",
    "abandoned",
    "fresh",
    "retired",
    "lapsed",
    "retired",
    "retired",
    "retired",
    "held",
    "finished",
]
"""16 rows: five batches of 3 and one of 1; sweepable rows in every batch."""


@pytest.mark.usefixtures("small_batches")
async def test_sweep_runs_in_committed_batches_and_deletes_exactly_the_sweepable(
    pool: AsyncConnectionPool[Any], postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = make_rows(postgres_dsn, KINDS_MIXED)
    async with AsyncPostgresBackend(pool) as backend:
        spy = SweepSpy(backend, postgres_dsn, None)
        monkeypatch.setattr(backend, "_run", spy)
        kept = expected_left(ids, KINDS_MIXED, include_expired=False)
        assert await AsyncVacuum(backend).sweep(RETENTION) == len(ids) - len(kept)
        assert left(postgres_dsn) == kept
        # one statement per window of 3 rows, the last one short (it reached the end)
        assert len(spy.after_each) == len(ids) // BATCH + 1
        # each statement deleted its own window's rows and committed before the next ran
        for n, seen in enumerate(spy.after_each):
            window_end = (n + 1) * BATCH
            assert seen == [w for i, w in enumerate(ids) if i >= window_end or w in kept], (
                f"after statement {n + 1}"
            )

        spy.after_each.clear()
        remaining = expected_left(ids, KINDS_MIXED, include_expired=True)
        assert await backend.sweep(RETENTION, True) == len(kept) - len(remaining)
        assert left(postgres_dsn) == remaining
        assert len(spy.after_each) == len(kept) // BATCH + 1
        # nothing sweepable is left: another sweep deletes nothing
        assert await backend.sweep(RETENTION, True) == 0


@pytest.mark.usefixtures("small_batches")
async def test_sweep_passes_a_row_locked_by_another_transaction(
    pool: AsyncConnectionPool[Any], postgres_dsn: str
) -> None:
    kinds = ["retired"] * 10
    ids = make_rows(postgres_dsn, kinds)
    locked = ids[4]  # in the second batch
    with psycopg.connect(postgres_dsn) as locker:
        # The failure guard: were the sweep to wait for this lock, the server would end the
        # locker's transaction after 30 s, the sweep would then delete the row, and the
        # assertions below would fail (no case here waits on a clock otherwise).
        locker.execute("SET idle_in_transaction_session_timeout = '30s'")
        locker.execute("SELECT 1 FROM worklease_leases WHERE work_id = %s FOR UPDATE", (locked,))
        async with AsyncPostgresBackend(pool) as backend:
            assert await backend.sweep(RETENTION, False) == len(ids) - 1
            assert left(postgres_dsn) == [locked]
            # the lock was held all along: the locking transaction is still open
            assert locker.info.transaction_status == TransactionStatus.INTRANS
            assert locker.execute("SELECT 1").fetchall() == [(1,)]
            locker.rollback()
            # once the lock is gone, the row is swept as any other
            assert await backend.sweep(RETENTION, False) == 1
            assert left(postgres_dsn) == []


@pytest.mark.usefixtures("small_batches")
async def test_sweep_in_batches_with_the_updated_at_index_of_earlier_schemas(
    pool: AsyncConnectionPool[Any], postgres_dsn: str
) -> None:
    """Correct on a table that still has the updated_at index (made by an earlier version or
    by the Go library's migration), in a schema of its own (the batch statement's table is
    schema-qualified too)."""
    schema = f"sweep_legacy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for statement in schema_statements(schema):
            conn.execute(statement.encode())
        conn.execute(
            sql.SQL("CREATE INDEX {} ON {} (updated_at)").format(
                sql.Identifier(LEGACY_INDEX), sql.Identifier(schema, TABLE)
            )
        )
    try:
        ids = make_rows(postgres_dsn, KINDS_MIXED, schema)
        async with AsyncPostgresBackend(pool, schema=schema) as backend:
            kept = expected_left(ids, KINDS_MIXED, include_expired=True)
            assert await backend.sweep(RETENTION, True) == len(ids) - len(kept)
            assert left(postgres_dsn, schema) == kept
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
