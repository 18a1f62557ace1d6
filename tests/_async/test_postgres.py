"""PostgreSQL backend cases (behaviour.md §4.4, P1 to P12) and failure behaviour.

The conformance suite runs against PostgreSQL through the shared ``backend`` fixture; these
cases need direct SQL, several pools, or network faults.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from time import monotonic
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from tests import pg
from tests._acompat import asleep, aspawn_all
from tests.proxy import proxied
from worklease import (
    AsyncLease,
    AsyncPostgresBackend,
    AsyncRenewal,
    AsyncRunner,
    AsyncVacuum,
    BackendError,
    BackendRequiredError,
    Checkpoint,
    ConfigError,
    ExitMode,
    FencedError,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseWindowExhaustedError,
    Token,
)
from worklease._async.postgres import check_within_cut_off
from worklease._pg import TOKEN_TIMELINE_SHIFT
from worklease.observers import ReadCheckpointEvent
from worklease.testing import RecordingObserver

from .helpers import until_lock_waiters

pytestmark = pytest.mark.postgres

TTL = 30.0


@pytest.fixture
async def pool(postgres_dsn: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pg.reset(postgres_dsn)
    async with AsyncConnectionPool(
        postgres_dsn,
        min_size=1,
        max_size=8,
        open=False,
        check=AsyncConnectionPool.check_connection,  # as production pools should
    ) as pool:
        yield pool


@pytest.fixture
async def backend(pool: AsyncConnectionPool[Any]) -> AsyncIterator[AsyncPostgresBackend]:
    async with AsyncPostgresBackend(pool) as backend:
        yield backend


def row(dsn: str, work_id: str) -> dict[str, Any]:
    rows = pg.execute(
        dsn,
        "SELECT holder_id, fencing_token, exit_mode, prev_exit_mode, prev_holder_id,"
        " checkpoint, expires_at < now() AS expired, expires_at"
        " FROM worklease_leases WHERE work_id = %s",
        (work_id,),
    )
    assert len(rows) == 1, f"expected one row for {work_id!r}, got {rows}"
    names = ("holder", "token", "exit", "prev_exit", "prev_holder", "checkpoint")
    values = dict(zip((*names, "expired", "expires_at"), rows[0], strict=True))
    return values


def force_expiry(dsn: str, work_id: str) -> None:
    pg.execute(
        dsn,
        "UPDATE worklease_leases SET expires_at = now() - interval '1 second' WHERE work_id = %s",
        (work_id,),
    )


async def test_p1_fresh_acquire(backend: AsyncPostgresBackend, postgres_dsn: str) -> None:
    """P1: a fresh acquire returns a positive token and the stored record fields."""
    token = await backend.acquire("p1", "holder-a", TTL)
    assert token.fencing_token > 0
    assert (token.work_id, token.holder_id) == ("p1", "holder-a")
    stored = row(postgres_dsn, "p1")
    assert stored["token"] == token.fencing_token
    assert stored["expires_at"] == token.expires_at
    assert stored["prev_exit"] == "none"
    assert stored["exit"] is None
    assert token.expires_at.utcoffset() is not None


async def test_p2_reacquire_after_forced_expiry(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """P2: after expiry set by SQL a new holder gets a greater token, the state, EXPIRED."""
    first = await backend.acquire("p2", "holder-a", TTL)
    await backend.checkpoint(first, b"progress", TTL)
    force_expiry(postgres_dsn, "p2")
    second = await backend.acquire("p2", "holder-b", TTL)
    assert second.fencing_token > first.fencing_token
    prior = await backend.read_checkpoint(second)
    assert prior == Checkpoint(b"progress", ExitMode.EXPIRED, "holder-a")


async def test_p3_checkpoint_extends_on_database_clock(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """P3: a checkpoint with a 45 s TTL stores the state and sets expiry to now + 45 s."""
    token = await backend.acquire("p3", "holder-a", TTL)
    await backend.checkpoint(token, b"state", 45.0)
    assert await backend.read_checkpoint(token) == Checkpoint(b"state", ExitMode.NONE, None)
    (left,) = pg.execute(
        postgres_dsn,
        "SELECT extract(epoch FROM expires_at - now()) FROM worklease_leases WHERE work_id = 'p3'",
    )[0]
    assert 40 < float(left) <= 45


async def test_p4_bumped_token_fences_every_operation(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """P4: once the stored token moved on, every operation with the old one is fenced."""
    token = await backend.acquire("p4", "holder-a", TTL)
    pg.execute(
        postgres_dsn,
        "UPDATE worklease_leases SET fencing_token = fencing_token + 1000 WHERE work_id = 'p4'",
    )
    with pytest.raises(FencedError):
        await backend.checkpoint(token, b"x", TTL)
    with pytest.raises(FencedError):
        await backend.renew(token, TTL)
    with pytest.raises(FencedError):
        await backend.release(token, ExitMode.FINISHED)
    with pytest.raises(FencedError):
        await backend.read_checkpoint(token)
    with pytest.raises(FencedError):
        await backend.forget(token)
    assert row(postgres_dsn, "p4")["checkpoint"] is None


async def test_p5_renew_after_forced_expiry(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """P5: renewing a lease whose expiry passed (database clock) raises LeaseExpiredError."""
    token = await backend.acquire("p5", "holder-a", TTL)
    force_expiry(postgres_dsn, "p5")
    with pytest.raises(LeaseExpiredError):
        await backend.renew(token, TTL)


async def test_p6_release_records_exit_and_expires_on_database_clock(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """P6: release stores the exit text and an expiry already past on the database clock."""
    token = await backend.acquire("p6", "holder-a", TTL)
    await backend.release(token, ExitMode.ABANDONED)
    stored = row(postgres_dsn, "p6")
    assert stored["exit"] == "abandoned"
    assert stored["expired"] is True


async def test_p7_checkpoint_after_release_writes_nothing(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """P7: a checkpoint after release raises LeaseExpiredError and changes nothing."""
    token = await backend.acquire("p7", "holder-a", TTL)
    await backend.release(token, ExitMode.FINISHED)
    with pytest.raises(LeaseExpiredError):
        await backend.checkpoint(token, b"late", TTL)
    stored = row(postgres_dsn, "p7")
    assert (stored["exit"], stored["expired"], stored["checkpoint"]) == ("finished", True, None)


async def test_p8_read_of_missing_row_is_fenced(backend: AsyncPostgresBackend) -> None:
    """P8: reading a row that does not exist raises FencedError."""
    token = await backend.acquire("p8", "holder-a", TTL)
    await backend.forget(token)
    with pytest.raises(FencedError):
        await backend.read_checkpoint(token)


async def test_p9_handoff_after_finished(backend: AsyncPostgresBackend) -> None:
    """P9: checkpoint, release FINISHED, re-acquire → state, prev FINISHED, prev holder."""
    token = await backend.acquire("p9", "holder-a", TTL)
    await backend.checkpoint(token, b"final", TTL)
    await backend.release(token, ExitMode.FINISHED)
    successor = await backend.acquire("p9", "holder-b", TTL)
    prior = await backend.read_checkpoint(successor)
    assert prior == Checkpoint(b"final", ExitMode.FINISHED, "holder-a")


async def test_p10_reacquire_of_retired_row(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """P10: re-acquiring a RETIRED row clears exit_mode and records prev 'retired'."""
    token = await backend.acquire("p10", "holder-a", TTL)
    await backend.release(token, ExitMode.RETIRED)
    await backend.acquire("p10", "holder-b", TTL)
    stored = row(postgres_dsn, "p10")
    assert (stored["exit"], stored["prev_exit"], stored["prev_holder"]) == (
        None,
        "retired",
        "holder-a",
    )


@pytest.mark.parametrize(
    ("column", "constraint"),
    [
        ("exit_mode", "worklease_leases_exit_mode_check"),
        ("prev_exit_mode", "worklease_leases_prev_exit_mode_check"),
    ],
)
async def test_p12_check_constraints(
    backend: AsyncPostgresBackend, postgres_dsn: str, column: str, constraint: str
) -> None:
    """P12: storing an unknown exit mode by SQL fails, naming the CHECK constraint."""
    await backend.acquire("p12", "holder-a", TTL)
    with pytest.raises(psycopg.errors.CheckViolation, match=constraint):
        pg.execute(
            postgres_dsn,
            f"UPDATE worklease_leases SET {column} = 'bogus' WHERE work_id = 'p12'",
        )


async def test_unknown_stored_prev_exit_reads_as_expired(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """A prev_exit_mode this version does not know reads as EXPIRED (forward compatibility)."""
    token = await backend.acquire("future", "holder-a", TTL)
    pg.execute(
        postgres_dsn,
        "ALTER TABLE worklease_leases DROP CONSTRAINT worklease_leases_prev_exit_mode_check",
    )
    try:
        pg.execute(
            postgres_dsn,
            "UPDATE worklease_leases SET prev_exit_mode = 'migrated' WHERE work_id = 'future'",
        )
        assert (await backend.read_checkpoint(token)).prev_exit is ExitMode.EXPIRED
    finally:
        pg.execute(postgres_dsn, "UPDATE worklease_leases SET prev_exit_mode = 'none'")
        pg.execute(
            postgres_dsn,
            "ALTER TABLE worklease_leases ADD CONSTRAINT worklease_leases_prev_exit_mode_check"
            " CHECK (prev_exit_mode IN ('none', 'expired', 'finished', 'abandoned', 'retired'))",
        )


async def test_held_error_names_holder_and_expiry(backend: AsyncPostgresBackend) -> None:
    """LeaseHeldError carries the current holder and expiry, read after the refused upsert."""
    token = await backend.acquire("held", "holder-a", TTL)
    with pytest.raises(LeaseHeldError) as caught:
        await backend.acquire("held", "holder-b", TTL)
    assert caught.value.holder_id == "holder-a"
    assert caught.value.expires_at == token.expires_at


def before_holder_reads(
    monkeypatch: pytest.MonkeyPatch, backend: AsyncPostgresBackend, dsn: str, *steps: str
) -> list[bytes]:
    """Run one SQL step (``steps``, in order) just before each read of the holder that a
    refused acquire makes; return the statements the backend ran, in order."""
    run = backend._run
    holder = backend._statements.holder
    pending = list(steps)
    ran: list[bytes] = []

    async def hooked(operation: str, statement: bytes, params: dict[str, Any], **kw: Any) -> Any:
        ran.append(statement)
        if statement == holder and pending:
            pg.execute(dsn, pending.pop(0))
        return await run(operation, statement, params, **kw)

    monkeypatch.setattr(backend, "_run", hooked)
    return ran


RELEASE_BY_SQL = (
    "UPDATE worklease_leases SET exit_mode = 'finished',"
    " expires_at = now() - interval '1 millisecond' WHERE work_id = 'race'"
)
TAKE_BY_SQL = (
    "UPDATE worklease_leases SET holder_id = 'holder-c', fencing_token = fencing_token + 1,"
    " exit_mode = NULL, expires_at = now() + interval '30 seconds' WHERE work_id = 'race'"
)


async def test_acquire_freed_after_its_refusal_is_tried_again(
    backend: AsyncPostgresBackend, monkeypatch: pytest.MonkeyPatch, postgres_dsn: str
) -> None:
    """Released between the refused upsert and the read of its holder, the work ID is free:
    the acquire tries once more and is granted instead of reporting a holder that left."""
    first = await backend.acquire("race", "holder-a", TTL)
    ran = before_holder_reads(monkeypatch, backend, postgres_dsn, RELEASE_BY_SQL)
    token = await backend.acquire("race", "holder-b", TTL)
    assert token.holder_id == "holder-b"
    assert token.fencing_token > first.fencing_token
    statements = backend._statements
    assert ran == [statements.acquire, statements.holder, statements.acquire]
    prior = await backend.read_checkpoint(token)
    assert (prior.prev_exit, prior.prev_holder_id) == (ExitMode.FINISHED, "holder-a")


async def test_acquire_refused_twice_over_a_moving_holder_names_nobody(
    backend: AsyncPostgresBackend, monkeypatch: pytest.MonkeyPatch, postgres_dsn: str
) -> None:
    """Free at the read after the refusal, taken again before the retry, and free again at
    the second read: held, but by whom is not known (no holder, no expiry); two tries
    only."""
    await backend.acquire("race", "holder-a", TTL)
    ran = before_holder_reads(monkeypatch, backend, postgres_dsn, RELEASE_BY_SQL, RELEASE_BY_SQL)
    take_before_retry(monkeypatch, backend, postgres_dsn)
    with pytest.raises(LeaseHeldError) as caught:
        await backend.acquire("race", "holder-b", TTL)
    assert (caught.value.holder_id, caught.value.expires_at) == (None, None)
    statements = backend._statements
    assert ran == [statements.acquire, statements.holder] * 2


def take_before_retry(
    monkeypatch: pytest.MonkeyPatch, backend: AsyncPostgresBackend, dsn: str
) -> None:
    """Somebody else (holder-c) takes the work ID just before the second upsert."""
    run = backend._run
    acquire = backend._statements.acquire
    upserts = 0

    async def hooked(operation: str, statement: bytes, params: dict[str, Any], **kw: Any) -> Any:
        nonlocal upserts
        if statement == acquire:
            upserts += 1
            if upserts == 2:
                pg.execute(dsn, TAKE_BY_SQL)
        return await run(operation, statement, params, **kw)

    monkeypatch.setattr(backend, "_run", hooked)


async def test_acquire_refused_names_the_holder_that_took_over_meanwhile(
    backend: AsyncPostgresBackend, monkeypatch: pytest.MonkeyPatch, postgres_dsn: str
) -> None:
    """Taken by somebody else between the refusal and the read: the error names who holds
    it now, with no retry."""
    await backend.acquire("race", "holder-a", TTL)
    ran = before_holder_reads(
        monkeypatch, backend, postgres_dsn, RELEASE_BY_SQL + "; " + TAKE_BY_SQL
    )
    with pytest.raises(LeaseHeldError) as caught:
        await backend.acquire("race", "holder-b", TTL)
    assert caught.value.holder_id == "holder-c"
    assert caught.value.expires_at is not None
    statements = backend._statements
    assert ran == [statements.acquire, statements.holder]


async def test_fifty_concurrent_acquirers_one_winner(backend: AsyncPostgresBackend) -> None:
    """50 concurrent acquirers of one work ID: exactly one wins, the rest LeaseHeldError."""

    async def contend(index: int) -> Token:
        lease = AsyncLease(backend, holder_id="contender-" + str(index), ttl=TTL)
        return await lease.acquire("contended")

    results = await aspawn_all(contend, 50)
    winners = [r for r in results if isinstance(r, Token)]
    losers = [r for r in results if isinstance(r, LeaseHeldError)]
    assert len(winners) == 1, results
    assert len(losers) == 49, [r for r in results if not isinstance(r, Token | LeaseHeldError)]


async def test_contended_acquire_under_serializable_default(postgres_dsn: str) -> None:
    """A role/database defaulting to SERIALIZABLE still yields LeaseHeldError, not 40001."""
    pg.reset(postgres_dsn)
    kwargs = {"options": "-c default_transaction_isolation=serializable"}
    async with (
        AsyncConnectionPool(
            postgres_dsn, min_size=4, max_size=8, kwargs=kwargs, open=False
        ) as pool,
        AsyncPostgresBackend(pool) as backend,
    ):
        async with pool.connection() as conn:
            level = await (await conn.execute("SHOW default_transaction_isolation")).fetchone()
        assert level == ("serializable",)

        async def contend(index: int) -> Token:
            lease = AsyncLease(backend, holder_id="s-" + str(index), ttl=TTL)
            return await lease.acquire("serial")

        results = await aspawn_all(contend, 20)
        assert sum(isinstance(r, Token) for r in results) == 1, results
        assert sum(isinstance(r, LeaseHeldError) for r in results) == 19, results


async def test_no_transaction_left_open_and_autocommit_restored(postgres_dsn: str) -> None:
    """Operations on the caller's (non-autocommit) connections leave them idle, as found."""
    pg.reset(postgres_dsn)
    async with (
        AsyncConnectionPool(postgres_dsn, min_size=1, max_size=1, open=False) as pool,
        AsyncPostgresBackend(pool) as backend,
    ):
        lease = AsyncLease(backend, holder_id="holder-a", ttl=TTL)
        token = await lease.acquire("tx")
        await lease.checkpoint(token, b"x")
        await lease.read_checkpoint(token)
        with pytest.raises(LeaseHeldError):
            await AsyncLease(backend, holder_id="holder-b", ttl=TTL).acquire("tx")
        await lease.release(token, ExitMode.FINISHED)
        async with pool.connection() as conn:
            assert conn.autocommit is False
            assert conn.info.transaction_status == TransactionStatus.IDLE


async def test_state_over_one_mib_round_trips(backend: AsyncPostgresBackend) -> None:
    """State larger than 1 MiB (every byte value) round-trips byte for byte."""
    state = bytes(range(256)) * (5 * 1024)  # 1.25 MiB
    token = await backend.acquire("big", "holder-a", TTL)
    await backend.checkpoint(token, bytearray(state), TTL)
    assert (await backend.read_checkpoint(token)).state == state


async def test_missing_schema_names_the_fix(pool: AsyncConnectionPool[Any]) -> None:
    """Without the tables every operation raises BackendError naming `worklease migrate`."""
    backend = AsyncPostgresBackend(pool, schema="worklease_absent")
    with pytest.raises(BackendError, match="worklease migrate") as caught:
        await backend.acquire("w", "holder-a", TTL)
    assert caught.value.transient is False
    assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedTable)


async def test_custom_schema_is_quoted_and_used(
    pool: AsyncConnectionPool[Any], postgres_dsn: str
) -> None:
    """apply_schema creates the objects in a named schema (quoted), idempotently."""
    schema = 'Team "Leases"'
    await AsyncPostgresBackend.apply_schema(pool, schema=schema)
    await AsyncPostgresBackend.apply_schema(pool, schema=schema)
    async with AsyncPostgresBackend(pool, schema=schema) as backend:
        token = await backend.acquire("custom", "holder-a", TTL)
        await backend.checkpoint(token, b"here", TTL)
    rows = pg.execute(
        postgres_dsn,
        'SELECT checkpoint FROM "Team ""Leases""".worklease_leases WHERE work_id = %s',
        ("custom",),
    )
    assert rows == [(b"here",)]
    assert pg.execute(postgres_dsn, "SELECT count(*) FROM worklease_leases") == [(0,)]
    pg.execute(postgres_dsn, 'DROP SCHEMA "Team ""Leases""" CASCADE')


async def test_write_lanes_are_the_application_pools_size(
    pool: AsyncConnectionPool[Any],
) -> None:
    """What group commit reads to let checkpoints go alone (one per free connection)."""
    backend = AsyncPostgresBackend(pool, listen=False)
    assert backend.write_lanes == pool.max_size
    await pool.resize(pool.min_size, pool.max_size + 1)
    try:
        assert backend.write_lanes == pool.max_size  # read at every call: a resize counts
    finally:
        await pool.resize(pool.min_size, pool.max_size - 1)


async def test_construction_errors(pool: AsyncConnectionPool[Any]) -> None:
    """A missing pool or a bad schema name is a configuration error."""
    with pytest.raises(BackendRequiredError):
        AsyncPostgresBackend(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        AsyncPostgresBackend("postgresql://")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        AsyncPostgresBackend(pool, schema="")


async def test_connect_owns_and_closes_its_pool_but_never_the_callers(
    pool: AsyncConnectionPool[Any], postgres_dsn: str
) -> None:
    """connect() builds a pool the backend closes; a pool passed in is left open."""
    async with AsyncPostgresBackend.connect(postgres_dsn, min_size=1, max_size=2) as owned:
        token = await owned.acquire("owned", "holder-a", TTL)
        await owned.release(token, ExitMode.FINISHED)
        owned_pool = owned.pool
        # psycopg_pool's check, bounded by a thread's cut-off (ADR-0023)
        assert owned_pool._check is check_within_cut_off
    assert owned_pool.closed
    async with AsyncPostgresBackend(pool) as borrowed:
        await borrowed.renew(await borrowed.acquire("borrowed", "holder-a", TTL), TTL)
    assert not pool.closed


async def test_renewal_survives_terminated_connections(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """pg_terminate_backend of the connections renewals use: same token, still held."""
    lease = AsyncLease(backend, holder_id="holder-a", ttl=2.0)
    token = await lease.acquire("terminated")
    async with lease.renewal(token, interval=0.2) as renewal:
        for _ in range(3):
            await renewed_since(postgres_dsn, renewal, pg_now(postgres_dsn))
            pg.execute(
                postgres_dsn,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
        await renewed_since(postgres_dsn, renewal, pg_now(postgres_dsn))
        renewal.raise_if_lost()
    assert not renewal.lost
    with pytest.raises(LeaseHeldError):
        await AsyncLease(backend, holder_id="holder-b", ttl=2.0).acquire("terminated")
    assert row(postgres_dsn, "terminated")["token"] == token.fencing_token


def pg_now(dsn: str) -> Any:
    return pg.execute(dsn, "SELECT now()")[0][0]


async def renewed_since(dsn: str, renewal: AsyncRenewal, started: Any) -> None:
    """Wait (up to 10 s) until the lease row was renewed after ``started`` (database time)."""
    for _ in range(1000):
        renewal.raise_if_lost()
        (updated,) = pg.execute(
            dsn,
            "SELECT updated_at FROM worklease_leases WHERE work_id = %s",
            (renewal.token.work_id,),
        )[0]
        if updated > started:
            return
        await asleep(0.01)
    raise AssertionError("no renewal succeeded within 10 s")


async def test_renewal_reports_loss_when_database_unreachable(postgres_dsn: str) -> None:
    """The database unreachable past the window: the loss is reported, not hidden."""
    pg.reset(postgres_dsn)
    with proxied(*pg.address(postgres_dsn)) as proxy:
        proxied_dsn = pg.via(postgres_dsn, proxy.port)
        async with (
            AsyncConnectionPool(proxied_dsn, min_size=1, max_size=2, open=False) as pool,
            AsyncPostgresBackend(pool) as backend,
        ):
            lease = AsyncLease(backend, holder_id="holder-a", ttl=1.0)
            token = await lease.acquire("unreachable")
            with pytest.raises(LeaseWindowExhaustedError):  # noqa: PT012
                async with lease.renewal(token, interval=0.2) as renewal:
                    await asleep(0.3)
                    proxy.cut()
                    for _ in range(1000):  # ends early: the loss surfaces within ~1 s
                        renewal.raise_if_lost()
                        await asleep(0.01)
            assert renewal.remaining() is None
            proxy.restore()
            with pytest.raises(LeaseWindowExhaustedError):
                await lease.checkpoint(token, b"after loss")  # refused without I/O


async def test_renewal_reports_loss_when_network_goes_silent(postgres_dsn: str) -> None:
    """A stalled connection (no bytes move): loss by window on time, no hang."""
    pg.reset(postgres_dsn)
    with proxied(*pg.address(postgres_dsn)) as proxy:
        proxied_dsn = pg.via(postgres_dsn, proxy.port)
        async with (
            AsyncConnectionPool(proxied_dsn, min_size=1, max_size=2, open=False) as pool,
            AsyncPostgresBackend(pool) as backend,
        ):
            lease = AsyncLease(backend, holder_id="holder-a", ttl=1.0)
            token = await lease.acquire("silent")
            with pytest.raises(LeaseWindowExhaustedError):  # noqa: PT012
                async with lease.renewal(token, interval=0.2) as renewal:
                    await asleep(0.3)
                    proxy.stall()
                    for _ in range(1000):
                        renewal.raise_if_lost()
                        await asleep(0.01)
            assert renewal.lost
            proxy.cut()  # unblock the stuck connections so the pools close promptly


@pytest.mark.parametrize("built_by", ["pool", "connect"])
async def test_final_writes_end_on_time_when_the_network_goes_silent(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch, built_by: str
) -> None:
    """A hold's final writes meet a stalled connection (no bytes move): ``TimeoutError`` at
    the cleanup timeout, no hang. A thread makes them itself, never in a helper thread (the
    connection is cut off at the timeout, and so is the connection check of a ``connect()``
    pool); asyncio cancels them (the patched helper is a thread's only)."""
    from worklease import _compat

    def no_helper(job: object) -> None:
        raise AssertionError("the final writes went to a helper thread")

    monkeypatch.setattr(_compat._cleanup_helpers, "submit", no_helper)
    pg.reset(postgres_dsn)
    with proxied(*pg.address(postgres_dsn)) as proxy:
        proxied_dsn = pg.via(postgres_dsn, proxy.port)
        if built_by == "connect":
            backend = AsyncPostgresBackend.connect(proxied_dsn, min_size=1, max_size=2)
        else:
            pool = AsyncConnectionPool(proxied_dsn, min_size=1, max_size=2, open=False)
            await pool.open()
            backend = AsyncPostgresBackend(pool)
        try:
            lease = AsyncLease(backend, holder_id="holder-a", ttl=30.0)
            stalled_at = 0.0
            with pytest.raises(TimeoutError):  # noqa: PT012
                async with lease.hold("silent-final", cleanup_timeout=1.0):
                    proxy.stall()
                    stalled_at = monotonic()
            waited = monotonic() - stalled_at
            # The bound is 1 s; a cut-off held up by a 2 s cancel wait would pass 2 s.
            assert 0.5 <= waited < 1.9
        finally:
            proxy.cut()  # unblock the stuck connections so the pools close promptly
            await backend.close()
            if built_by == "pool":
                await pool.close()


async def test_renewal_keeps_working_while_app_saturates_its_pool(postgres_dsn: str) -> None:
    """The application holds every connection of its pool longer than the TTL: no loss."""
    pg.reset(postgres_dsn)
    async with (
        AsyncConnectionPool(postgres_dsn, min_size=2, max_size=2, open=False) as pool,
        AsyncPostgresBackend(pool) as backend,
    ):
        lease = AsyncLease(backend, holder_id="holder-a", ttl=0.8)
        token = await lease.acquire("saturated")
        async with (
            lease.renewal(token, interval=0.2) as renewal,
            pool.connection(),
            pool.connection(),
        ):
            await asleep(2.0)  # 2.5 TTLs with no free application connection
            renewal.raise_if_lost()
        assert not renewal.lost
        with pytest.raises(LeaseHeldError):
            await AsyncLease(backend, holder_id="holder-b", ttl=1.0).acquire("saturated")


async def test_bad_input_rejected_before_the_database(postgres_dsn: str) -> None:
    """Invalid work IDs and states are refused before any statement reaches the server."""
    pg.reset(postgres_dsn)
    async with (
        AsyncConnectionPool(postgres_dsn, min_size=1, max_size=1, open=False) as pool,
        AsyncPostgresBackend(pool) as backend,
    ):
        lease = AsyncLease(backend, holder_id="holder-a", ttl=TTL)
        token = await lease.acquire("valid")
        pool_stats_before = pool.get_stats().get("requests_num", 0)
        for bad in ("", "a\x00b", "x" * 1025, "é" * 513):
            with pytest.raises(ValueError):
                await lease.acquire(bad)
            with pytest.raises(ValueError):
                await backend.acquire(bad, "holder-a", TTL)
        with pytest.raises(TypeError):
            await lease.checkpoint(token, "text")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await lease.release(token, "expired")  # type: ignore[arg-type]
        forged = dataclasses.replace(token, fencing_token=token.fencing_token + 1)
        with pytest.raises(ValueError):
            await lease.checkpoint(forged, b"x")
        assert pool.get_stats().get("requests_num", 0) == pool_stats_before
    assert pg.execute(postgres_dsn, "SELECT count(*) FROM worklease_leases") == [(1,)]


async def test_runner_on_postgres(backend: AsyncPostgresBackend) -> None:
    """The quick start's lifecycle works unchanged on PostgreSQL."""
    lease = AsyncLease(backend, holder_id="worker-1", ttl=TTL)
    seen: list[Checkpoint] = []

    async def work(token: Token, prior: Checkpoint) -> bytes:
        seen.append(prior)
        return b"step 1 done"

    runner = AsyncRunner(lease, work)
    await runner.run("billing")
    await runner.run("billing")
    assert seen == [
        Checkpoint(None, ExitMode.NONE, None),
        Checkpoint(b"step 1 done", ExitMode.FINISHED, "worker-1"),
    ]


async def test_least_privilege_role_from_the_readme(postgres_dsn: str) -> None:
    """The GRANTs the README lists are enough for every lease operation and the vacuum."""
    pg.reset(postgres_dsn)
    role = "worklease_worker_" + str(abs(hash(postgres_dsn)) % 100000)
    pg.execute(postgres_dsn, f"DROP ROLE IF EXISTS {role}")
    password = uuid.uuid4().hex  # a server that wants passwords gets one
    pg.execute(postgres_dsn, f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    try:
        pg.execute(postgres_dsn, f"GRANT USAGE ON SCHEMA public TO {role}")
        pg.execute(
            postgres_dsn,
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON worklease_leases TO {role}",
        )
        pg.execute(postgres_dsn, f"GRANT USAGE ON SEQUENCE worklease_fencing_seq TO {role}")
        worker_dsn = psycopg.conninfo.make_conninfo(postgres_dsn, user=role, password=password)
        async with (
            AsyncConnectionPool(worker_dsn, min_size=1, max_size=2, open=False) as pool,
            AsyncPostgresBackend(pool) as backend,
        ):
            lease = AsyncLease(backend, holder_id="holder-a", ttl=TTL)
            token = await lease.acquire("least")
            await lease.checkpoint(token, b"x")
            await lease.renew(token)
            await lease.read_checkpoint(token)
            await lease.release(token, ExitMode.RETIRED)
            await lease.forget(token)
            assert await AsyncVacuum(backend).sweep(1.0, include_expired=True) == 0
    finally:
        pg.execute(postgres_dsn, f"DROP OWNED BY {role}")
        pg.execute(postgres_dsn, f"DROP ROLE {role}")


async def test_renewals_follow_the_application_pools_search_path(postgres_dsn: str) -> None:
    """An application pool that sets search_path in configure: renewals hit the same table."""
    pg.reset(postgres_dsn)
    schema = "wl_search_path"
    pg.execute(postgres_dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    async def configure(conn: AsyncConnection[Any]) -> None:
        await conn.execute(f"SET search_path TO {schema}")
        await conn.commit()

    try:
        async with AsyncConnectionPool(
            postgres_dsn, min_size=1, max_size=2, open=False, configure=configure
        ) as pool:
            await AsyncPostgresBackend.apply_schema(pool, schema=schema)
            async with AsyncPostgresBackend(pool) as backend:
                lease = AsyncLease(backend, holder_id="holder-a", ttl=1.0)
                token = await lease.acquire("pathed")
                query = f"SELECT updated_at FROM {schema}.worklease_leases WHERE work_id = 'pathed'"
                (acquired_at,) = pg.execute(postgres_dsn, query)[0]
                async with lease.renewal(token, interval=0.1) as renewal:
                    await asleep(0.6)
                    renewal.raise_if_lost()
                assert not renewal.lost
                (renewed_at,) = pg.execute(postgres_dsn, query)[0]
                assert renewed_at > acquired_at
        assert pg.execute(postgres_dsn, "SELECT count(*) FROM worklease_leases") == [(0,)]
    finally:
        pg.execute(postgres_dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def test_runner_reads_the_prior_checkpoint_with_the_acquire(
    backend: AsyncPostgresBackend,
) -> None:
    """The runner's cycle is three statements: the prior checkpoint comes with the acquire."""
    observer = RecordingObserver()
    lease = AsyncLease(backend, holder_id="worker-1", ttl=TTL, observer=observer)

    async def work(token: Token, prior: Checkpoint) -> bytes:
        return b"done"

    await AsyncRunner(lease, work).run("three")
    names = observer.names()
    assert names == ["AcquireEvent", "ReadCheckpointEvent", "CheckpointEvent", "ReleaseEvent"]
    (read,) = observer.of_type(ReadCheckpointEvent)
    assert read.duration == 0.0  # answered by the acquire statement itself
    assert read.prev_exit is ExitMode.NONE


@pytest.mark.parametrize("rows", ["absent", "expired"])
async def test_concurrent_acquire_many_no_deadlock_each_id_once(
    pool: AsyncConnectionPool[Any], postgres_dsn: str, rows: str
) -> None:
    """Two backends acquire_many the same 200 work IDs at once, one in a shuffled order and
    one in the reverse of it: both finish (rows are locked in work_id order, so no deadlock)
    and every work ID is granted exactly once.

    A third transaction holds the work ID in the middle of both lists until both batches wait
    on a lock, so the two statements really overlap: locking in input order, each would hold
    one half and then need the other's.
    """
    ids = [f"bulk-{i:03d}" for i in range(200)]
    if rows == "expired":
        pg.execute(
            postgres_dsn,
            "INSERT INTO worklease_leases (work_id, holder_id, expires_at)"
            " SELECT unnest(%s::text[]), 'old', now() - interval '1 second'",
            (ids,),
        )
    shuffled = list(ids)
    random.Random(7).shuffle(shuffled)
    orders = [shuffled, shuffled[::-1]]
    middle = shuffled[100]
    async with (
        AsyncConnectionPool(postgres_dsn, min_size=1, max_size=2, open=False) as other_pool,
        AsyncPostgresBackend(pool) as first,
        AsyncPostgresBackend(other_pool) as second,
        await AsyncConnection.connect(postgres_dsn) as blocker,
        await AsyncConnection.connect(postgres_dsn, autocommit=True) as watcher,
    ):
        backends = [first, second]
        if rows == "expired":
            await blocker.execute(
                "SELECT 1 FROM worklease_leases WHERE work_id = %s FOR UPDATE", (middle,)
            )
        else:
            await blocker.execute(
                "INSERT INTO worklease_leases (work_id, holder_id, expires_at)"
                " VALUES (%s, 'blocker', now() + interval '1 hour')",
                (middle,),
            )

        async def take(index: int) -> list[tuple[Token, Checkpoint]]:
            if index < 2:
                holder = "bulk-holder-" + str(index)
                return await backends[index].acquire_many(orders[index], holder, TTL)
            await until_lock_waiters(watcher, 2, "the two batches")
            await blocker.commit()
            return []

        results = await aspawn_all(take, 3)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, failures
    grants = [grant for result in results if isinstance(result, list) for grant in result]
    granted = [token.work_id for token, _ in grants]
    # "absent": the blocker's insert committed, so it holds the middle work ID
    free = ids if rows == "expired" else [w for w in ids if w != middle]
    assert sorted(granted) == free  # each free work ID exactly once
    for index, result in enumerate(results[:2]):
        assert isinstance(result, list)
        assert all(token.holder_id == "bulk-holder-" + str(index) for token, _ in result)
        mine = {token.work_id for token, _ in result}
        assert [t.work_id for t, _ in result] == [w for w in orders[index] if w in mine]
        prev = ExitMode.EXPIRED if rows == "expired" else ExitMode.NONE
        assert all(prior.prev_exit is prev for _, prior in result)
    stored = pg.execute(postgres_dsn, "SELECT work_id, holder_id FROM worklease_leases")
    expected = [(t.work_id, t.holder_id) for t, _ in grants]
    if rows == "absent":
        expected.append((middle, "blocker"))
    assert sorted(stored) == sorted(expected)


async def test_batch_methods_validate_before_any_io(postgres_dsn: str) -> None:
    """Bad batches raise TypeError/ValueError and empty ones return [] without touching the
    database: the backend's pool is never opened here."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(postgres_dsn, open=False)
    backend = AsyncPostgresBackend(pool)
    token = Token("w1", "h", 1, datetime(2026, 1, 1, tzinfo=UTC))
    assert await backend.acquire_many([], "h", TTL) == []
    assert await backend.find_available([]) == []
    assert await backend.renew_many([], TTL) == []
    with pytest.raises(ValueError):
        await backend.acquire_many(["w1", "w1"], "h", TTL)
    with pytest.raises(TypeError):
        await backend.acquire_many("w1", "h", TTL)
    with pytest.raises(ValueError):
        await backend.find_available(["w1", ""])
    with pytest.raises(ValueError):
        await backend.renew_many([token, token], TTL)
    assert pool.closed
    await backend.close()


@pytest.mark.parametrize("many", [False, True], ids=["renew", "renew_many"])
async def test_a_renewal_waiting_on_the_row_never_extends_a_release_committed_meanwhile(
    backend: AsyncPostgresBackend, postgres_dsn: str, many: bool
) -> None:
    """A renewal sent just before the holder's release waits for the release's row lock;
    once the release commits, the renewal finds the lease released (not extended). The
    release began after the renewal, so the released expiry (its start less 1 ms) is later
    than the renewal's now(): an expiry check alone passed it, and the released lease was
    extended for a TTL (a successor was refused for that long)."""
    token = await backend.acquire("renew-vs-release", "holder", TTL)
    async with (
        await AsyncConnection.connect(postgres_dsn) as releaser,
        await AsyncConnection.connect(postgres_dsn, autocommit=True) as watcher,
    ):
        await releaser.execute(
            "SELECT 1 FROM worklease_leases WHERE work_id = %s FOR UPDATE", (token.work_id,)
        )

        async def step(index: int) -> object:
            if index == 0:
                if many:
                    return await backend.renew_many([token], TTL)
                await backend.renew(token, TTL)
                return None
            await until_lock_waiters(watcher, 1, "the renewal")
            await asleep(0.05)  # the release's clock is now past the renewal's now()
            await releaser.execute(
                "UPDATE worklease_leases SET exit_mode = 'finished',"
                " expires_at = clock_timestamp() - interval '1 millisecond'"
                " WHERE work_id = %s",
                (token.work_id,),
            )
            await releaser.commit()
            return None

        renewed, _ = await aspawn_all(step, 2)
    if many:
        assert isinstance(renewed, list)
        assert len(renewed) == 1
        assert isinstance(renewed[0], LeaseExpiredError), renewed
    else:
        assert isinstance(renewed, LeaseExpiredError), renewed
    stored = row(postgres_dsn, "renew-vs-release")
    assert (stored["exit"], stored["expired"]) == ("finished", True)
    successor = await backend.acquire("renew-vs-release", "next", TTL)
    assert successor.fencing_token > token.fencing_token


async def test_concurrent_renew_many_no_deadlock(
    pool: AsyncConnectionPool[Any], postgres_dsn: str
) -> None:
    """Two backends renew_many the same 200 tokens at once, in a shuffled order and its
    reverse, while a third transaction holds the row in the middle until both wait: both
    finish and renew every token (rows are locked in work_id order)."""
    ids = [f"bulk-{i:03d}" for i in range(200)]
    async with (
        AsyncConnectionPool(postgres_dsn, min_size=1, max_size=2, open=False) as other_pool,
        AsyncPostgresBackend(pool) as first,
        AsyncPostgresBackend(other_pool) as second,
        await AsyncConnection.connect(postgres_dsn) as blocker,
        await AsyncConnection.connect(postgres_dsn, autocommit=True) as watcher,
    ):
        tokens = [token for token, _ in await first.acquire_many(ids, "holder", TTL)]
        assert len(tokens) == 200
        random.Random(7).shuffle(tokens)
        orders = [tokens, tokens[::-1]]
        backends = [first, second]
        await blocker.execute(
            "SELECT 1 FROM worklease_leases WHERE work_id = %s FOR UPDATE",
            (tokens[100].work_id,),
        )

        async def renew(index: int) -> list[Any]:
            if index < 2:
                return await backends[index].renew_many(orders[index], TTL)
            await until_lock_waiters(watcher, 2, "the two batches")
            await blocker.commit()
            return []

        results = await aspawn_all(renew, 3)
    assert results[:2] == [[None] * 200, [None] * 200], results


async def test_tokens_carry_the_timeline_and_never_go_back(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """ADR-0008: a token is the server's WAL timeline shifted by 40 bits plus the sequence;
    a sequence that went back (a restore into a new cluster) still yields a greater token
    for an existing row, as does a row written with an old bare-sequence token."""
    name = pg.execute(postgres_dsn, "SELECT pg_walfile_name(pg_current_wal_lsn())")[0][0]
    timeline = int(str(name)[:8], 16)
    lease = AsyncLease(backend, holder_id="h", ttl=TTL)
    first = await lease.acquire("timeline")
    assert first.fencing_token >> TOKEN_TIMELINE_SHIFT == timeline
    await lease.release(first, ExitMode.FINISHED)
    pg.execute(postgres_dsn, "ALTER SEQUENCE worklease_fencing_seq RESTART WITH 1")
    second = await lease.acquire("timeline")
    assert second.fencing_token > first.fencing_token
    pg.execute(
        postgres_dsn,
        "INSERT INTO worklease_leases (work_id, holder_id, fencing_token, expires_at)"
        " VALUES ('legacy', 'old', 5, now() - interval '1 second')",
    )
    upgraded = await lease.acquire("legacy")
    assert upgraded.fencing_token > 5


async def test_a_write_inside_a_renewal_never_outlives_its_window(
    backend: AsyncPostgresBackend, postgres_dsn: str
) -> None:
    """Another session holds the lease row locked (as a hung synchronous standby or a long
    transaction would stall a write): a checkpoint inside the renewal ends around the end of
    the lease window instead of waiting for the lock: with asyncio the renewal cancels the
    block, with threads the statement is bounded server-side (statement timeout). The
    blocker lets go after 10 s in any case, so a regression fails on the elapsed time
    instead of hanging."""
    ttl = 2.0
    lease = AsyncLease(backend, holder_id="h", ttl=ttl)
    token = await lease.acquire("stuck")
    outcome: dict[str, Any] = {}
    async with await AsyncConnection.connect(postgres_dsn) as blocker:
        await blocker.execute("SELECT 1 FROM worklease_leases WHERE work_id = 'stuck' FOR UPDATE")

        async def side(index: int) -> None:
            if index == 1:  # the blocker lets go after 10 s at the latest
                for _ in range(1000):
                    if "elapsed" in outcome:
                        break
                    await asleep(0.01)
                await blocker.rollback()
                return
            start = monotonic()
            try:
                async with lease.renewal(token):  # its renewals block on the lock too
                    try:
                        await lease.checkpoint(token, b"blocked")
                    except Exception as exc:
                        outcome["error"] = exc
                    outcome["elapsed"] = monotonic() - start
            except Exception as exc:  # the loss, when the window closed meanwhile
                outcome["loss"] = exc
            outcome.setdefault("elapsed", monotonic() - start)

        await aspawn_all(side, 2)
    assert outcome["elapsed"] < ttl + 1.5, outcome
    assert "error" in outcome or "loss" in outcome, outcome
