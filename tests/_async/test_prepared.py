"""How statements reach the server (ADR-0011): prepared on READ COMMITTED connections, as
pinned simple queries elsewhere and with ``prepare=False``, and correct either way."""

from __future__ import annotations

from typing import Any

import pytest

from tests import pg
from tests._acompat import aspawn_all
from worklease import AsyncLease, BackendError, ConfigError, ExitMode, LeaseHeldError

from .helpers import close_backend, open_backend

pytestmark = pytest.mark.postgres

REPEATABLE_READ = {"options": "-c default_transaction_isolation=repeatable\\ read"}


async def prepared_statements(backend: Any) -> list[str]:
    """The statements prepared on the connections of the backend's pool."""
    found: list[str] = []
    for _ in range(4):  # every connection of the pool, whichever one is handed out
        async with backend.pool.connection() as conn:
            cursor = await conn.execute("SELECT statement FROM pg_prepared_statements")
            found += [row[0] for row in await cursor.fetchall()]
    return found


async def exercise(backend: Any, work_id: str) -> None:
    lease = AsyncLease(backend, holder_id="h", ttl=30.0)
    token = await lease.acquire(work_id)
    await lease.checkpoint(token, b"state")
    assert (await lease.read_checkpoint(token)).state == b"state"
    await lease.renew(token)
    await lease.release(token, ExitMode.FINISHED)


async def test_statements_are_prepared_on_read_committed_connections(postgres_dsn: str) -> None:
    pg.reset(postgres_dsn)
    backend = await open_backend(postgres_dsn)
    try:
        assert backend.prepare is None  # decided per connection: this one is direct
        await exercise(backend, "prepared")
        prepared = await prepared_statements(backend)
        assert any("worklease_leases" in text for text in prepared), prepared
    finally:
        await close_backend(backend)


@pytest.mark.parametrize("how", ["prepare=False", "repeatable read by default"])
async def test_other_connections_get_simple_queries(postgres_dsn: str, how: str) -> None:
    pg.reset(postgres_dsn)
    if how == "prepare=False":
        backend = await open_backend(postgres_dsn, prepare=False)
    else:
        backend = await open_backend(postgres_dsn, pool_kwargs=REPEATABLE_READ)
    try:
        await exercise(backend, "simple")
        prepared = await prepared_statements(backend)
        assert not any("worklease_leases" in text for text in prepared), prepared
    finally:
        await close_backend(backend)


async def test_contended_acquires_under_repeatable_read_never_fail_to_serialize(
    postgres_dsn: str,
) -> None:
    """The isolation is pinned per statement where the default is not READ COMMITTED: 16
    acquirers racing for one work ID get a grant or LeaseHeldError, never a serialization
    failure."""
    pg.reset(postgres_dsn)
    backend = await open_backend(postgres_dsn, pool_kwargs=REPEATABLE_READ)
    try:

        async def race(index: int) -> str:
            lease = AsyncLease(backend, holder_id=f"h{index}", ttl=0.05)
            outcomes = []
            for _ in range(20):
                try:
                    await lease.acquire("contended")
                    outcomes.append("granted")
                except LeaseHeldError:
                    outcomes.append("held")
            return ",".join(outcomes)

        results = await aspawn_all(race, 16)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors
        assert any("granted" in str(r) for r in results)
    finally:
        await close_backend(backend)


async def test_prepare_must_be_a_flag(postgres_dsn: str) -> None:
    with pytest.raises(ConfigError):
        await open_backend(postgres_dsn, prepare="yes")


async def test_a_cancelled_overrun_says_it_was_worklease(postgres_dsn: str) -> None:
    """A prepared statement still running at its bound is cancelled by worklease's watch,
    and the error says so (transient)."""
    from worklease._async.postgres import run_statement
    from worklease._pg import single_statement

    backend = await open_backend(postgres_dsn)
    try:
        statements = backend._statements
        sleeper = b"SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SELECT pg_sleep(5)"
        single = b"SELECT pg_sleep(5)"
        assert single_statement(statements.checkpoint) is not None
        async with backend.pool.connection() as conn:
            with pytest.raises(BackendError) as caught:
                await run_statement(conn, "sleep", sleeper, {}, 0.2, single)
        assert caught.value.transient
        assert "cancelled by worklease" in str(caught.value)
    finally:
        await close_backend(backend)
