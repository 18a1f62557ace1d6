"""Transactional steps (issue 14): the holder's own rows and its checkpoint commit together,
only while its token is current. On PostgreSQL (direct and behind PgBouncer) the steps
insert into a table of their own; on the memory backend only the checkpoint is fenced."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from tests import pg
from tests._acompat import asleep, aspawn_all
from worklease import (
    AsyncBackend,
    AsyncLease,
    AsyncMemoryBackend,
    AsyncPostgresBackend,
    AsyncRunner,
    BackendError,
    Checkpoint,
    ExitMode,
    FencedError,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLapsedError,
    LeaseLostError,
    Token,
)

from .conftest import BACKENDS

# etcd has no transactional steps (no rows of the user's live beside its keys)
pytestmark = pytest.mark.not_on("etcd", "redis", "redis-cluster")

EFFECTS = "worklease_test_effects"


def empty_effects(dsn: str) -> None:
    """The steps' own table, created if needed and empty."""
    pg.execute(
        dsn,
        f"CREATE TABLE IF NOT EXISTS {EFFECTS} "
        "(work_id TEXT, fencing_token BIGINT, step INT, PRIMARY KEY (work_id, step))",
    )
    pg.execute(dsn, f"TRUNCATE {EFFECTS}")


@pytest.fixture
def effects(request: pytest.FixtureRequest, backend: AsyncBackend) -> Iterator[str | None]:
    """The direct DSN of the database with an empty user table (None on memory)."""
    if isinstance(backend, AsyncMemoryBackend):
        yield None
        return
    dsn: str = request.getfixturevalue("postgres_dsn")
    empty_effects(dsn)
    yield dsn


async def write_effect(tx: Any, step: int) -> None:
    """The step's own row (PostgreSQL), on the transaction's connection."""
    if tx.connection is None:
        return
    await tx.connection.execute(
        f"INSERT INTO {EFFECTS} VALUES (%s, %s, %s)".encode(),
        (tx.token.work_id, tx.token.fencing_token, step),
    )


def stored_effects(dsn: str | None, work_id: str) -> list[tuple[int, int]]:
    if dsn is None:
        return []
    rows = pg.execute(
        dsn,
        f"SELECT fencing_token, step FROM {EFFECTS} WHERE work_id = %s ORDER BY step",
        (work_id,),
    )
    return [(int(token), int(step)) for token, step in rows]


async def test_rows_and_checkpoint_commit_together(
    backend: AsyncBackend, effects: str | None
) -> None:
    lease = AsyncLease(backend, holder_id="worker", ttl=30)
    token = await lease.acquire("invoices")
    for step in (1, 2):
        async with lease.transaction(token) as tx:
            await write_effect(tx, step)
            tx.checkpoint(f"step {step}".encode())
            assert tx.staged == f"step {step}".encode()
    assert (await lease.read_checkpoint(token)).state == b"step 2"
    if effects is not None:
        assert stored_effects(effects, "invoices") == [
            (token.fencing_token, 1),
            (token.fencing_token, 2),
        ]
    rival = AsyncLease(backend, holder_id="rival", ttl=30)
    with pytest.raises(LeaseHeldError):
        await rival.acquire("invoices")


async def test_an_exception_in_the_block_writes_nothing(
    backend: AsyncBackend, effects: str | None
) -> None:
    lease = AsyncLease(backend, holder_id="worker", ttl=30)
    token = await lease.acquire("invoices")
    await lease.checkpoint(token, b"before")

    async def failing_step() -> None:
        async with lease.transaction(token) as tx:
            await write_effect(tx, 1)
            tx.checkpoint(b"never")
            _ = 1 / 0

    with pytest.raises(ZeroDivisionError):
        await failing_step()
    assert (await lease.read_checkpoint(token)).state == b"before"
    assert stored_effects(effects, "invoices") == []
    async with lease.transaction(token) as tx:  # the connection went back clean
        await write_effect(tx, 1)
    assert len(stored_effects(effects, "invoices")) == (0 if effects is None else 1)


async def test_a_zombie_whose_lease_lapsed_and_was_taken_writes_nothing(
    backend: AsyncBackend, effects: str | None
) -> None:
    zombie = AsyncLease(backend, holder_id="zombie", ttl=0.5)
    successor = AsyncLease(backend, holder_id="successor", ttl=30)
    token = await zombie.acquire("invoices")
    taken: list[Token] = []

    async def zombie_step() -> None:
        async with zombie.transaction(token) as tx:
            await write_effect(tx, 1)
            tx.checkpoint(b"zombie")
            await asleep(0.8)  # past the TTL (a pause, a GC, a SIGSTOP)
            taken.append(await successor.acquire("invoices"))
            await successor.checkpoint(taken[0], b"successor")

    with pytest.raises(FencedError):
        await zombie_step()
    assert (await successor.read_checkpoint(taken[0])).state == b"successor"
    assert stored_effects(effects, "invoices") == []


async def test_a_lapse_nobody_took_still_does_not_commit(
    backend: AsyncBackend, effects: str | None
) -> None:
    lease = AsyncLease(backend, holder_id="worker", ttl=0.5)
    token = await lease.acquire("invoices")

    async def late_step() -> None:
        async with lease.transaction(token) as tx:
            await write_effect(tx, 1)
            tx.checkpoint(b"late")
            await asleep(0.8)

    with pytest.raises(LeaseLapsedError):
        await late_step()
    assert stored_effects(effects, "invoices") == []
    assert (await lease.read_checkpoint(token)).state is None


async def test_the_successor_commits_while_the_zombies_transaction_is_open(
    backend: AsyncBackend, effects: str | None
) -> None:
    zombie = AsyncLease(backend, holder_id="zombie", ttl=0.5)
    successor = AsyncLease(backend, holder_id="successor", ttl=30)
    old = await zombie.acquire("invoices")
    outcome: list[BaseException | None] = []
    taken: list[Token] = []

    async def step(index: int) -> None:
        if index == 0:  # the zombie: opens its step, stalls past its TTL, tries to commit
            try:
                async with zombie.transaction(old) as tx:
                    await write_effect(tx, 1)
                    tx.checkpoint(b"zombie")
                    while not taken:
                        await asleep(0.05)
                    await asleep(0.3)  # the successor's own step commits meanwhile
            except BaseException as exc:
                outcome.append(exc)
            else:
                outcome.append(None)
        else:  # the successor: takes over after the lapse and commits its step at once
            await asleep(0.8)
            token = await successor.acquire("invoices")
            async with successor.transaction(token) as tx:
                await write_effect(tx, 1)
                tx.checkpoint(b"successor step 1")
            taken.append(token)

    assert await aspawn_all(step, 2) == [None, None]
    assert isinstance(outcome[0], FencedError)
    (token,) = taken
    assert (await successor.read_checkpoint(token)).state == b"successor step 1"
    if effects is not None:
        assert stored_effects(effects, "invoices") == [(token.fencing_token, 1)]


async def test_the_renewal_keeps_the_lease_through_a_long_transaction(
    backend: AsyncBackend, effects: str | None
) -> None:
    lease = AsyncLease(backend, holder_id="worker", ttl=1.5)  # renews every 0.5 s
    async with lease.hold("invoices") as held:
        interval = held.renewal.interval
        async with held.transaction() as tx:
            for step in range(1, 5):  # 4 x 0.3 s = 2.4 renewal intervals
                await write_effect(tx, step)
                await asleep(interval * 0.6)
            tx.checkpoint(b"after a long step")
        assert not held.renewal.lost
        rival = AsyncLease(backend, holder_id="rival", ttl=30)
        with pytest.raises(LeaseHeldError):
            await rival.acquire("invoices")
        token = held.token
    assert (await lease.read_checkpoint(token)).state == b"after a long step"
    assert len(stored_effects(effects, "invoices")) == (0 if effects is None else 4)


async def test_after_release_a_step_is_refused(backend: AsyncBackend) -> None:
    lease = AsyncLease(backend, holder_id="worker", ttl=30)
    token = await lease.acquire("invoices")
    await lease.release(token, ExitMode.FINISHED)
    with pytest.raises(LeaseExpiredError):
        async with lease.transaction(token) as tx:
            tx.checkpoint(b"x")


async def test_a_transaction_object_is_used_once(backend: AsyncBackend) -> None:
    lease = AsyncLease(backend, holder_id="worker", ttl=30)
    token = await lease.acquire("invoices")
    tx = lease.transaction(token)
    async with tx:
        pass
    with pytest.raises(RuntimeError):
        async with tx:
            pass
    with pytest.raises(TypeError):
        tx.checkpoint("not bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "backend", [p for p in BACKENDS if p.id != "memory"], indirect=True
)  # a connection to lose
async def test_a_connection_lost_during_commit_is_reported_unknown(
    backend: AsyncBackend, effects: str | None
) -> None:
    assert effects is not None
    pg.install_slow_commit(effects, 3.0)
    lease = AsyncLease(backend, holder_id="worker", ttl=30)
    token = await lease.acquire("invoices")
    pids: list[int] = []
    caught: list[BaseException] = []

    async def step(index: int) -> None:
        if index == 0:
            try:
                async with lease.transaction(token) as tx:
                    cursor = await tx.connection.execute(b"SELECT pg_backend_pid()")
                    pids.append(int((await cursor.fetchone())[0]))
                    # its deferred trigger makes the COMMIT take 3 s
                    await tx.connection.execute(
                        f"INSERT INTO {pg.SLOW_COMMIT_TABLE} VALUES (1)".encode()
                    )
                    tx.checkpoint(b"maybe")
            except BaseException as exc:
                caught.append(exc)
        else:
            while not pids or pids[0] not in pg.committing(effects):  # inside the COMMIT
                await asleep(0.02)
            pg.execute(effects, "SELECT pg_terminate_backend(%s)", (pids[0],))

    assert await aspawn_all(step, 2) == [None, None]
    (error,) = caught
    assert isinstance(error, BackendError)
    assert error.transient is False
    assert "unknown" in str(error)
    # The outcome was in fact a rollback (the server died before committing); the next step
    # through the same lease works on a fresh connection.
    assert (await lease.read_checkpoint(token)).state is None
    async with lease.transaction(token) as tx:
        tx.checkpoint(b"next")
    assert (await lease.read_checkpoint(token)).state == b"next"


async def test_a_runner_work_function_commits_its_steps_transactionally(
    backend: AsyncBackend, effects: str | None
) -> None:
    lease = AsyncLease(backend, holder_id="worker", ttl=30)

    async def work(token: Token, prior: Checkpoint) -> None:
        done = int(prior.state or b"0")
        for step in range(done + 1, 4):
            async with lease.transaction(token) as tx:
                await write_effect(tx, step)
                tx.checkpoint(str(step).encode())
        return  # keep the last checkpoint the steps wrote

    await AsyncRunner(lease, work).run("batch")
    await AsyncRunner(lease, work).run("batch")  # resumes after step 3: nothing to do
    rival = AsyncLease(backend, holder_id="rival", ttl=30)
    token = await rival.acquire("batch")
    prior = await rival.read_checkpoint(token)
    assert prior.state == b"3"
    assert prior.prev_exit is ExitMode.FINISHED
    if effects is not None:
        assert [step for _, step in stored_effects(effects, "batch")] == [1, 2, 3]


class FailingRenewals(AsyncPostgresBackend):
    """Renewals fail (as in a network partition) while other statements go through."""

    async def renew(self, token: Token, ttl: float) -> None:
        raise BackendError("renew: partitioned", transient=True)

    async def renew_many(self, tokens: Any, ttl: float) -> Any:
        raise BackendError("renew_many: partitioned", transient=True)


@pytest.mark.postgres
async def test_a_step_open_when_the_window_closes_rolls_back(postgres_dsn: str) -> None:
    """The renewal cannot extend the lease; when its window closes the step is abandoned
    (asyncio: the block is cancelled; threads: the exit sees the loss) and rolls back."""
    pg.reset(postgres_dsn)
    empty_effects(postgres_dsn)
    async with (
        AsyncConnectionPool(postgres_dsn, min_size=1, max_size=4, open=False) as pool,
        FailingRenewals(pool, listen=False) as backend,
    ):
        lease = AsyncLease(backend, holder_id="worker", ttl=0.8)

        async def step() -> None:
            async with lease.hold("invoices") as held, held.transaction() as tx:
                await write_effect(tx, 1)
                tx.checkpoint(b"never")
                while not held.renewal.lost:  # asyncio: cancelled here at the loss
                    await asleep(0.02)

        with pytest.raises(LeaseLostError):
            await step()
        assert stored_effects(postgres_dsn, "invoices") == []
        rows = pg.execute(
            postgres_dsn, "SELECT checkpoint FROM worklease_leases WHERE work_id = 'invoices'"
        )
        assert rows == [(None,)]
