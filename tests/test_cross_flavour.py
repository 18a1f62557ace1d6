"""Both flavours on one PostgreSQL table at the same time (SPEC §6).

A sync ``Lease`` (``PostgresBackend`` on a ``ConnectionPool``) runs in worker threads while an
``AsyncLease`` (``AsyncPostgresBackend`` on an ``AsyncConnectionPool``) runs on the event loop,
both on this run's database: they contend, hand work over in both directions, and never hold
one work ID at the same time.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from tests import pg
from worklease import (
    AcquireEvent,
    AsyncLease,
    AsyncPostgresBackend,
    Checkpoint,
    ExitMode,
    FencedError,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    PostgresBackend,
    Token,
)
from worklease.testing import RecordingObserver

pytestmark = pytest.mark.postgres

T = TypeVar("T")

TTL = 30.0
SYNC = "sync-holder"
ASYNC = "async-holder"
BOUND = 30.0
"""Upper bound for anything that should happen 'at once' on a loaded CI box."""


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def dsn(postgres_dsn: str) -> str:
    """This run's database, with an empty lease table."""
    pg.reset(postgres_dsn)
    return postgres_dsn


@pytest.fixture
def sync_backend(dsn: str) -> Iterator[PostgresBackend]:
    with (
        ConnectionPool(
            dsn, min_size=1, max_size=4, open=False, check=ConnectionPool.check_connection
        ) as pool,
        PostgresBackend(pool) as backend,
    ):
        yield backend


@pytest.fixture
async def async_backend(dsn: str) -> AsyncIterator[AsyncPostgresBackend]:
    async with (
        AsyncConnectionPool(
            dsn, min_size=1, max_size=4, open=False, check=AsyncConnectionPool.check_connection
        ) as pool,
        AsyncPostgresBackend(pool) as backend,
    ):
        yield backend


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a sync call in a worker thread, bounded so a hang fails the test."""
    return await asyncio.wait_for(asyncio.to_thread(functools.partial(fn, *args, **kwargs)), BOUND)


class Side(Protocol):
    """One flavour's lease behind one awaitable interface (the sync one runs in a thread)."""

    holder_id: str

    async def acquire(self, work_id: str, **options: Any) -> Token: ...
    async def read(self, token: Token) -> Checkpoint: ...
    async def checkpoint(self, token: Token, state: bytes) -> None: ...
    async def release(self, token: Token, mode: ExitMode) -> None: ...


class SyncSide:
    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.holder_id = lease.holder_id

    async def acquire(self, work_id: str, **options: Any) -> Token:
        return await in_thread(self.lease.acquire, work_id, **options)

    async def read(self, token: Token) -> Checkpoint:
        return await in_thread(self.lease.read_checkpoint, token)

    async def checkpoint(self, token: Token, state: bytes) -> None:
        await in_thread(self.lease.checkpoint, token, state)

    async def release(self, token: Token, mode: ExitMode) -> None:
        await in_thread(self.lease.release, token, mode)


class AsyncSide:
    def __init__(self, lease: AsyncLease) -> None:
        self.lease = lease
        self.holder_id = lease.holder_id

    async def acquire(self, work_id: str, **options: Any) -> Token:
        return await asyncio.wait_for(self.lease.acquire(work_id, **options), BOUND)

    async def read(self, token: Token) -> Checkpoint:
        return await self.lease.read_checkpoint(token)

    async def checkpoint(self, token: Token, state: bytes) -> None:
        await self.lease.checkpoint(token, state)

    async def release(self, token: Token, mode: ExitMode) -> None:
        await self.lease.release(token, mode)


def sides(
    sync_backend: PostgresBackend, async_backend: AsyncPostgresBackend, first: str, ttl: float
) -> tuple[Side, Side]:
    """(first, second) where ``first`` names the flavour going first."""
    sync_side = SyncSide(Lease(sync_backend, holder_id=SYNC, ttl=ttl))
    async_side = AsyncSide(AsyncLease(async_backend, holder_id=ASYNC, ttl=ttl))
    return (sync_side, async_side) if first == "sync" else (async_side, sync_side)


def stored(dsn: str, work_id: str) -> tuple[Any, ...]:
    rows = pg.execute(
        dsn,
        "SELECT holder_id, fencing_token, exit_mode, checkpoint"
        " FROM worklease_leases WHERE work_id = %s",
        (work_id,),
    )
    assert len(rows) == 1, rows
    return rows[0]


# -- (a) contention -------------------------------------------------------------------------

ROUNDS = 20


async def test_flavours_contending_at_once_exactly_one_wins(
    sync_backend: PostgresBackend, async_backend: AsyncPostgresBackend, dsn: str
) -> None:
    """Both flavours acquire one work ID at the same instant, 20 times: one wins each round,
    the other gets LeaseHeldError; the winner's row is in the table and tokens only grow."""
    sync_lease = Lease(sync_backend, holder_id=SYNC, ttl=TTL)
    async_lease = AsyncLease(async_backend, holder_id=ASYNC, ttl=TTL)
    barrier = threading.Barrier(2, timeout=BOUND)

    def sync_try() -> Token | LeaseHeldError:
        barrier.wait()
        try:
            return sync_lease.acquire("contended")
        except LeaseHeldError as exc:
            return exc

    async def async_try() -> Token | LeaseHeldError:
        await in_thread(barrier.wait)
        try:
            return await async_lease.acquire("contended")
        except LeaseHeldError as exc:
            return exc

    tokens: list[int] = []
    winners: list[str] = []
    for round_no in range(ROUNDS):
        sync_result, async_result = await asyncio.gather(in_thread(sync_try), async_try())
        won = [r for r in (sync_result, async_result) if isinstance(r, Token)]
        lost = [r for r in (sync_result, async_result) if isinstance(r, LeaseHeldError)]
        assert len(won) == 1, f"round {round_no}: {sync_result!r}, {async_result!r}"
        assert len(lost) == 1, f"round {round_no}: {sync_result!r}, {async_result!r}"
        token = won[0]
        winner = SYNC if isinstance(sync_result, Token) else ASYNC
        assert token.holder_id == winner
        holder, fencing_token, exit_mode, _ = stored(dsn, "contended")
        assert (holder, fencing_token, exit_mode) == (winner, token.fencing_token, None)
        tokens.append(token.fencing_token)
        winners.append(winner)
        mode = ExitMode.FINISHED if round_no % 2 else ExitMode.ABANDONED
        if winner == SYNC:
            await in_thread(sync_lease.release, token, mode)
        else:
            await async_lease.release(token, mode)
    assert tokens == sorted(set(tokens)), tokens  # strictly increasing
    assert len(winners) == ROUNDS


def lock_waiters(dsn: str) -> int:
    """How many sessions of this database wait for a lock."""
    rows = pg.execute(
        dsn,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    return int(rows[0][0])


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def queued_race(
    sync_backend: PostgresBackend, async_backend: AsyncPostgresBackend, dsn: str
) -> tuple[Token | BaseException, Token | BaseException]:
    """Both flavours acquire a released row while a transaction locks it, so both statements
    are queued on the row lock; then the lock goes and they race for real."""
    third = Lease(sync_backend, holder_id="third-holder", ttl=TTL)
    token = third.acquire("queued")
    third.release(token, ExitMode.FINISHED)
    sync_lease = Lease(sync_backend, holder_id=SYNC, ttl=TTL)
    async_lease = AsyncLease(async_backend, holder_id=ASYNC, ttl=TTL)
    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT 1 FROM worklease_leases WHERE work_id = 'queued' FOR UPDATE")
        sync_task = asyncio.ensure_future(in_thread(sync_lease.acquire, "queued"))
        await until(lambda: lock_waiters(dsn) >= 1, "the sync acquire to wait for the lock")
        async_task = asyncio.ensure_future(async_lease.acquire("queued"))
        await until(lambda: lock_waiters(dsn) >= 2, "the async acquire to wait for the lock")
        locker.rollback()
    sync_result, async_result = await asyncio.gather(sync_task, async_task, return_exceptions=True)
    return sync_result, async_result


async def test_flavours_queued_on_the_row_lock_exactly_one_wins(
    sync_backend: PostgresBackend, async_backend: AsyncPostgresBackend, dsn: str
) -> None:
    """Both acquires wait on the row lock and run the moment it goes: one token, one
    LeaseHeldError, and the row names the winner."""
    results = await queued_race(sync_backend, async_backend, dsn)
    won = [r for r in results if isinstance(r, Token)]
    lost = [r for r in results if isinstance(r, LeaseHeldError)]
    assert (len(won), len(lost)) == (1, 1), results
    holder, fencing_token, exit_mode, _ = stored(dsn, "queued")
    assert (holder, fencing_token, exit_mode) == (won[0].holder_id, won[0].fencing_token, None)


async def test_loser_of_a_queued_race_is_told_the_winner_or_nothing(
    sync_backend: PostgresBackend, async_backend: AsyncPostgresBackend, dsn: str
) -> None:
    """LeaseHeldError names the current holder and expiry, or None when unknown (SPEC §7);
    never the holder that had already released."""
    results = await queued_race(sync_backend, async_backend, dsn)
    (winner,) = [r for r in results if isinstance(r, Token)]
    (loser,) = [r for r in results if isinstance(r, LeaseHeldError)]
    assert (loser.holder_id, loser.expires_at) in [
        (winner.holder_id, winner.expires_at),
        (None, None),
    ], (loser.holder_id, loser.expires_at, winner)


# -- (b) handoff ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [ExitMode.FINISHED, ExitMode.ABANDONED], ids=str)
@pytest.mark.parametrize("first", ["sync", "async"])
async def test_handoff_both_directions(
    sync_backend: PostgresBackend,
    async_backend: AsyncPostgresBackend,
    dsn: str,
    first: str,
    mode: ExitMode,
) -> None:
    """A released lease is taken at once by the other flavour, which reads the checkpoint,
    the exit mode and the holder; then the work goes back the other way."""
    one, two = sides(sync_backend, async_backend, first, TTL)
    work = "handoff"
    token = await one.acquire(work)
    assert await one.read(token) == Checkpoint(None, ExitMode.NONE, None)
    await one.checkpoint(token, b"from " + one.holder_id.encode())
    await one.release(token, mode)

    successor = await two.acquire(work)  # fail-fast: released means acquirable at once
    assert successor.fencing_token > token.fencing_token
    assert await two.read(successor) == Checkpoint(
        b"from " + one.holder_id.encode(), mode, one.holder_id
    )
    with pytest.raises(LeaseHeldError) as held:
        await one.acquire(work)
    assert held.value.holder_id == two.holder_id
    await two.checkpoint(successor, b"from " + two.holder_id.encode())
    await two.release(successor, mode)

    back = await one.acquire(work)
    assert back.fencing_token > successor.fencing_token
    assert await one.read(back) == Checkpoint(
        b"from " + two.holder_id.encode(), mode, two.holder_id
    )
    await one.release(back, ExitMode.FINISHED)
    assert stored(dsn, work) == (
        one.holder_id,
        back.fencing_token,
        "finished",
        b"from " + two.holder_id.encode(),
    )


CRASH_TTL = 1.5


@pytest.mark.parametrize("first", ["sync", "async"])
async def test_crash_handoff_both_directions(
    sync_backend: PostgresBackend,
    async_backend: AsyncPostgresBackend,
    first: str,
) -> None:
    """A holder that stops renewing (crashed) is replaced by the other flavour after the TTL:
    the successor reads EXPIRED, the checkpoint and the holder; the crashed holder is fenced."""
    crashed, successor_side = sides(sync_backend, async_backend, first, CRASH_TTL)
    work = "crash"
    token = await crashed.acquire(work)
    await crashed.checkpoint(token, b"before the crash")
    with pytest.raises(LeaseHeldError) as held:
        await successor_side.acquire(work)  # still within the TTL just extended
    assert held.value.holder_id == crashed.holder_id

    successor = await successor_side.acquire(work, wait=True, timeout=BOUND, poll_interval=0.05)
    assert successor.fencing_token > token.fencing_token
    assert await successor_side.read(successor) == Checkpoint(
        b"before the crash", ExitMode.EXPIRED, crashed.holder_id
    )
    with pytest.raises(FencedError):
        await crashed.checkpoint(token, b"zombie write")
    assert (await successor_side.read(successor)).state == b"before the crash"
    await successor_side.release(successor, ExitMode.FINISHED)


# -- (c) never both holding -----------------------------------------------------------------

RUN_FOR = 3.0
HOLD_TTL = 0.5
SHORT_HOLD = 0.05
LONG_HOLD = 0.8  # longer than the TTL: only the renewal keeps it
PAUSE = 0.15  # after each hold, so the other flavour (polling every 20 ms) gets a turn
POLL = 0.02
WORK = "exclusive"


@dataclass
class HoldRecord:
    """One hold of the work ID, as its holder saw it."""

    flavour: str
    token: int
    prior: Checkpoint
    start: float  # monotonic, right after the hold was granted and entered
    written: bytes | None = None  # the last checkpoint the backend acknowledged
    confirmed_end: float | None = None  # monotonic, right before the last acknowledged write
    released: bool = False  # the block exited normally: released FINISHED
    lost: BaseException | None = None


def state_for(flavour: str, token: int, phase: str) -> bytes:
    return f"{flavour}:{token}:{phase}".encode()


class Loop:
    """Shared bookkeeping of the two loops (appends are atomic; one writer per record)."""

    def __init__(self) -> None:
        self.records: list[HoldRecord] = []
        self.stop = threading.Event()
        self.deadline = time.monotonic() + RUN_FOR

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline


def sync_loop(lease: Lease, loop: Loop) -> None:
    try:
        count = 0
        while loop.running():
            count += 1
            record: HoldRecord | None = None
            try:
                with lease.hold(WORK, wait=True, timeout=BOUND, poll_interval=POLL) as held:
                    token = held.token.fencing_token
                    record = HoldRecord(SYNC, token, held.prior, time.monotonic())
                    loop.records.append(record)
                    first = state_for(SYNC, token, "start")
                    held.checkpoint(first)
                    record.written = first
                    time.sleep(LONG_HOLD if count % 2 == 0 else SHORT_HOLD)
                    held.renewal.raise_if_lost()
                    end = time.monotonic()
                    last = state_for(SYNC, token, "done")
                    held.checkpoint(last)
                    record.written, record.confirmed_end = last, end
                assert record is not None
                record.released = True
            except LeaseLostError as exc:  # a slow renewal on a loaded box: allowed
                if record is not None:
                    record.lost = exc
            time.sleep(PAUSE)
    finally:
        loop.stop.set()


async def async_loop(lease: AsyncLease, loop: Loop) -> None:
    try:
        count = 0
        while loop.running():
            count += 1
            record: HoldRecord | None = None
            try:
                async with lease.hold(WORK, wait=True, timeout=BOUND, poll_interval=POLL) as held:
                    token = held.token.fencing_token
                    record = HoldRecord(ASYNC, token, held.prior, time.monotonic())
                    loop.records.append(record)
                    first = state_for(ASYNC, token, "start")
                    await held.checkpoint(first)
                    record.written = first
                    await asyncio.sleep(LONG_HOLD if count % 2 == 0 else SHORT_HOLD)
                    end = time.monotonic()
                    last = state_for(ASYNC, token, "done")
                    await held.checkpoint(last)
                    record.written, record.confirmed_end = last, end
                assert record is not None
                record.released = True
            except LeaseLostError as exc:
                if record is not None:
                    record.lost = exc
            await asyncio.sleep(PAUSE)
    finally:
        loop.stop.set()


def granted(observer: RecordingObserver, flavour: str) -> list[tuple[int, str]]:
    tokens = [e.token.fencing_token for e in observer.of_type(AcquireEvent) if e.token]
    assert tokens == sorted(set(tokens)), f"{flavour} tokens not strictly increasing: {tokens}"
    return [(token, flavour) for token in tokens]


async def test_flavours_never_hold_at_once(
    sync_backend: PostgresBackend, async_backend: AsyncPostgresBackend, dsn: str
) -> None:
    """Both flavours loop for ~3 s over one work ID (TTL 0.5 s, renewed by hold): grants form
    one chain in token order, each holder reads exactly its predecessor's last write, exit and
    holder, and no two confirmed holds overlap in time."""
    sync_observer, async_observer = RecordingObserver(), RecordingObserver()
    sync_lease = Lease(sync_backend, holder_id=SYNC, ttl=HOLD_TTL, observer=sync_observer)
    async_lease = AsyncLease(async_backend, holder_id=ASYNC, ttl=HOLD_TTL, observer=async_observer)
    loop = Loop()
    results = await asyncio.gather(
        asyncio.to_thread(sync_loop, sync_lease, loop),
        async_loop(async_lease, loop),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result

    grants = sorted(granted(sync_observer, SYNC) + granted(async_observer, ASYNC))
    assert len({token for token, _ in grants}) == len(grants), grants
    by_token = {record.token: record for record in loop.records}
    assert set(by_token) <= {token for token, _ in grants}

    # The chain: each grant saw the newest acknowledged write and its predecessor's exit.
    last_written: bytes | None = None
    for index, (token, flavour) in enumerate(grants):
        record = by_token.get(token)
        if record is not None:
            assert record.flavour == flavour
            if index == 0:
                assert record.prior == Checkpoint(None, ExitMode.NONE, None)
            else:
                previous_token, previous_flavour = grants[index - 1]
                previous = by_token.get(previous_token)
                finished = previous is not None and previous.released
                assert record.prior == Checkpoint(
                    last_written,
                    ExitMode.FINISHED if finished else ExitMode.EXPIRED,
                    previous_flavour,
                ), (index, grants, loop.records)
            if record.written is not None:
                last_written = record.written

    # Confirmed holds (their last write was acknowledged) never overlap.
    confirmed = sorted(
        (r for r in loop.records if r.confirmed_end is not None), key=lambda r: r.token
    )
    for i, earlier in enumerate(confirmed):
        for later in confirmed[i + 1 :]:
            assert earlier.confirmed_end is not None
            assert earlier.confirmed_end < later.start, (earlier, later)

    # The run did what it is about: both flavours held and released, and work crossed over.
    for flavour in (SYNC, ASYNC):
        assert any(r.released and r.flavour == flavour for r in loop.records), loop.records
    crossings = sum(1 for a, b in itertools.pairwise(grants) if a[1] != b[1])
    assert crossings >= 1, grants
    holder, fencing_token, _, state = stored(dsn, WORK)
    assert (holder, fencing_token) == (grants[-1][1], grants[-1][0])
    assert state == last_written
