"""asyncio cancellation of the leader and the pool: the caller cancels, the lease is released
ABANDONED (bounded by cleanup_timeout) before the cancellation propagates (behaviour.md P14,
§7.3 "On ctx cancellation ...")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from tests import pg
from tests._async.helpers import settle_listener
from worklease import (
    AsyncBackend,
    AsyncLeader,
    AsyncLease,
    AsyncMemoryBackend,
    AsyncPool,
    AsyncPostgresBackend,
    Checkpoint,
    ExitMode,
    Token,
)
from worklease.observers import PoolObserver, SlotAcquiredEvent

TTL = 30.0
BOUND = 10.0
"""Upper bound for waiting on something that should happen soon, on a loaded CI box."""
PROMPT = 3.0
"""Upper bound for anything that should happen 'at once'."""
LONG = 60.0
"""An interval no test may sit out."""


@pytest.fixture
def dsn(postgres_dsn: str) -> str:
    pg.reset(postgres_dsn)
    return postgres_dsn


@pytest.fixture
async def postgres(dsn: str) -> AsyncIterator[AsyncPostgresBackend]:
    async with (
        AsyncConnectionPool(dsn, min_size=1, max_size=6, open=False) as pool,
        AsyncPostgresBackend(pool) as backend,
    ):
        yield backend


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[AsyncBackend]:
    if request.param == "memory":
        yield AsyncMemoryBackend()
        return
    dsn: str = request.getfixturevalue("dsn")
    async with (
        AsyncConnectionPool(dsn, min_size=1, max_size=6, open=False) as pool,
        AsyncPostgresBackend(pool) as backend,
    ):
        yield backend


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def successor_reads(backend: AsyncBackend, work_id: str) -> Checkpoint:
    """A fail-fast successor: the row must be free at once."""
    successor = AsyncLease(backend, holder_id="successor", ttl=TTL)
    token = await successor.acquire(work_id)
    return await successor.read_checkpoint(token)


class Log:
    def __init__(self) -> None:
        self.names: list[str] = []

    def elected(self, token: Token) -> None:
        self.names.append("elected")

    def lost(self, token: Token) -> None:
        self.names.append("lost")

    def relinquished(self, token: Token) -> None:
        self.names.append("relinquished")


def leader_for(lease: AsyncLease, log: Log, work_id: str, **options: Any) -> AsyncLeader:
    return AsyncLeader(
        lease,
        work_id,
        on_elected=log.elected,
        on_lost=log.lost,
        on_relinquished=log.relinquished,
        **options,
    )


# -- leader -------------------------------------------------------------------------------------


@pytest.mark.postgres
async def test_p14_leader_cancelled_mid_fn(postgres: AsyncPostgresBackend, dsn: str) -> None:
    """P14: the caller cancels mid-fn: run raises CancelledError at once (no backoff pause),
    the lease is released ABANDONED (a successor acquires at once, prev ABANDONED, holder
    leader-a), no on_lost and no on_relinquished."""
    lease = AsyncLease(postgres, holder_id="leader-a", ttl=TTL)
    log = Log()
    leader = leader_for(lease, log, "p14", backoff_interval=LONG, idle_interval=LONG)
    started = asyncio.Event()
    finished: list[bool] = []

    async def fn(token: Token) -> None:
        await lease.checkpoint(token, b"leader state")
        started.set()
        await asyncio.sleep(LONG)
        finished.append(True)

    task = asyncio.create_task(leader.run(fn))
    await asyncio.wait_for(started.wait(), BOUND)
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), BOUND)
    assert task.cancelled()
    assert time.monotonic() - cancelled_at < PROMPT
    assert finished == []
    assert log.names == ["elected"]
    rows = pg.execute(
        dsn,
        "SELECT holder_id, exit_mode, checkpoint, expires_at < now() FROM worklease_leases"
        " WHERE work_id = 'p14'",
    )
    assert rows == [("leader-a", "abandoned", b"leader state", True)]
    prior = await successor_reads(postgres, "p14")
    assert prior == Checkpoint(b"leader state", ExitMode.ABANDONED, "leader-a")


async def test_leader_cancelled_while_waiting_idle(backend: AsyncBackend) -> None:
    """Cancelled during the idle wait after LeaseHeldError: CancelledError at once."""
    rival = AsyncLease(backend, holder_id="rival", ttl=TTL)
    await rival.acquire("job")
    await settle_listener(backend)
    lease = AsyncLease(backend, holder_id="leader-a", ttl=TTL)
    log = Log()
    leader = leader_for(lease, log, "job", idle_interval=LONG, backoff_interval=LONG)
    task = asyncio.create_task(leader.run(lambda token: None))
    await asyncio.sleep(0.2)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), PROMPT)
    assert log.names == []


async def test_leader_cancelled_during_backoff_pause(backend: AsyncBackend) -> None:
    """Cancelled during the backoff pause after a clean term: CancelledError at once; the term
    had already been released FINISHED."""
    lease = AsyncLease(backend, holder_id="leader-a", ttl=TTL)
    log = Log()
    leader = leader_for(lease, log, "job", idle_interval=LONG, backoff_interval=LONG)
    task = asyncio.create_task(leader.run(lambda token: None))
    await until(lambda: "relinquished" in log.names, "the term to end")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), PROMPT)
    assert (await successor_reads(backend, "job")).prev_exit is ExitMode.FINISHED


async def test_run_forever_cancelled(backend: AsyncBackend) -> None:
    """run_forever ends with CancelledError when cancelled mid-term (released ABANDONED)."""
    lease = AsyncLease(backend, holder_id="leader-a", ttl=TTL)
    log = Log()
    leader = leader_for(lease, log, "job", idle_interval=0.05, backoff_interval=0.05)
    terms: list[Token] = []

    async def fn(token: Token) -> None:
        terms.append(token)
        if len(terms) >= 2:
            await asyncio.sleep(LONG)

    task = asyncio.create_task(leader.run_forever(fn))
    await until(lambda: len(terms) >= 2, "the second term")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), PROMPT)
    assert log.names == ["elected", "relinquished", "elected"]
    assert await successor_reads(backend, "job") == Checkpoint(None, ExitMode.ABANDONED, "leader-a")


# -- pool ---------------------------------------------------------------------------------------


class Acquired(PoolObserver):
    def __init__(self) -> None:
        self.work_ids: list[str] = []

    def on_slot_acquired(self, event: SlotAcquiredEvent) -> None:
        self.work_ids.append(event.work_id)


async def test_pool_run_cancelled_releases_every_slot(
    backend: AsyncBackend, request: pytest.FixtureRequest
) -> None:
    """pool.run() cancelled: every active slot is released ABANDONED keeping its last
    checkpoint before the cancellation propagates; active_slots() is empty after."""
    ids = ["c1", "c2", "c3"]
    lease = AsyncLease(backend, holder_id="pool-a", ttl=TTL)

    async def work(token: Token, prior: Any) -> bytes | None:
        await lease.checkpoint(token, b"state of " + token.work_id.encode())
        await asyncio.sleep(LONG)
        return b"never written"

    observer = Acquired()
    pool = AsyncPool(lease, ids, work, observer=observer, rerun_interval=LONG)
    task = asyncio.create_task(pool.run())
    await until(lambda: pool.active_slots() == frozenset(ids), "every slot to run")
    await asyncio.sleep(0.05)  # past the checkpoints
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), BOUND)
    assert task.cancelled()
    assert pool.active_slots() == frozenset()
    # Right after the cancellation propagated, every row is already released (no waiting).
    if isinstance(backend, AsyncMemoryBackend):
        memory_rows = [(r.work_id, r.holder_id, r.exit_mode, r.checkpoint) for r in backend.rows()]
        assert memory_rows == [
            (work_id, "pool-a", ExitMode.ABANDONED, b"state of " + work_id.encode())
            for work_id in ids
        ]
    else:
        assert isinstance(backend, AsyncPostgresBackend)
        table = pg.execute(
            request.getfixturevalue("dsn"),
            "SELECT work_id, holder_id, exit_mode, checkpoint, expires_at < now()"
            " FROM worklease_leases ORDER BY work_id",
        )
        assert table == [
            (work_id, "pool-a", "abandoned", b"state of " + work_id.encode(), True)
            for work_id in ids
        ]
    for work_id in ids:
        assert await successor_reads(backend, work_id) == Checkpoint(
            b"state of " + work_id.encode(), ExitMode.ABANDONED, "pool-a"
        )
    assert sorted(observer.work_ids) == ids
