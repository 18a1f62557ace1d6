"""Transactional steps interrupted by a cancellation (asyncio): the connection always goes
back to the pool, no transaction is left open, and a cancellation stays a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from tests import pg
from worklease import AsyncLease, AsyncPostgresBackend

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pool(postgres_dsn: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pg.reset(postgres_dsn)
    async with AsyncConnectionPool(postgres_dsn, min_size=2, max_size=2, open=False) as opened:
        await opened.wait()
        yield opened


def open_transactions(dsn: str) -> int:
    (count,) = pg.execute(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND state LIKE 'idle in transaction%%'",
    )[0]
    return int(count)


async def settled(pool: AsyncConnectionPool[Any]) -> None:
    """Wait (bounded) for the pool to have both connections idle again."""
    for _ in range(200):
        stats = pool.get_stats()
        if stats.get("pool_available", 0) == 2 and stats.get("requests_waiting", 0) == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the pool did not get its connections back: {pool.get_stats()}")


async def test_a_cancelled_step_gives_its_connection_back_and_leaves_nothing_open(
    pool: AsyncConnectionPool[Any], postgres_dsn: str
) -> None:
    backend = AsyncPostgresBackend(pool, listen=False)
    lease = AsyncLease(backend, holder_id="worker", ttl=30)
    token = await lease.acquire("job")
    inside = asyncio.Event()

    async def step() -> None:
        async with lease.transaction(token) as tx:
            await tx.connection.execute(b"SELECT 1")
            tx.checkpoint(b"never")
            inside.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(step())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settled(pool)
    assert open_transactions(postgres_dsn) == 0
    assert (await lease.read_checkpoint(token)).state is None
    for _ in range(4):  # both connections work
        async with lease.transaction(token) as tx:
            tx.checkpoint(b"next")
    assert (await lease.read_checkpoint(token)).state == b"next"


async def test_a_cancellation_during_commit_stays_a_cancellation(
    pool: AsyncConnectionPool[Any], postgres_dsn: str
) -> None:
    pg.install_slow_commit(postgres_dsn, 2.0)
    backend = AsyncPostgresBackend(pool, listen=False)
    lease = AsyncLease(backend, holder_id="worker", ttl=30)
    token = await lease.acquire("job")

    async def step() -> None:
        async with lease.transaction(token) as tx:
            await tx.connection.execute(
                f"INSERT INTO {pg.SLOW_COMMIT_TABLE} VALUES (1)".encode()
            )  # the COMMIT that follows takes 2 s (its deferred trigger)

    task = asyncio.create_task(step())
    for _ in range(500):  # until the server is inside that COMMIT
        if pg.committing(postgres_dsn):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the step never reached its COMMIT")
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as caught:
        await task
    assert any("unknown" in note for note in getattr(caught.value, "__notes__", []))
    await settled(pool)
    # The connection was dropped (its outcome unknown) and replaced; the pool works.
    async with lease.transaction(token) as tx:
        tx.checkpoint(b"after")
    assert (await lease.read_checkpoint(token)).state == b"after"
