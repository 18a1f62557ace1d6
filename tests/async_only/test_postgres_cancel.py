"""asyncio cancellation against PostgreSQL: statements cancelled while blocked on a row lock,
a runner cancelled mid-work (behaviour.md P13), and a body cancelled when the renewal is fenced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from tests import pg
from worklease import (
    AsyncLease,
    AsyncPostgresBackend,
    AsyncRunner,
    Checkpoint,
    ExitMode,
    FencedError,
    LeaseHeldError,
    Token,
)

pytestmark = pytest.mark.postgres

TTL = 30.0
BOUND = 30.0
"""Upper bound for anything that should happen 'at once' on a loaded CI box."""
PROMPT = 5.0


@pytest.fixture
def dsn(postgres_dsn: str) -> str:
    pg.reset(postgres_dsn)
    return postgres_dsn


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async with AsyncConnectionPool(
        dsn, min_size=1, max_size=4, open=False, check=AsyncConnectionPool.check_connection
    ) as pool:
        yield pool


@pytest.fixture
async def backend(pool: AsyncConnectionPool[Any]) -> AsyncIterator[AsyncPostgresBackend]:
    async with AsyncPostgresBackend(pool) as backend:
        yield backend


def row(dsn: str, work_id: str) -> tuple[Any, ...]:
    """(holder_id, fencing_token, exit_mode, prev_exit_mode, prev_holder_id, checkpoint,
    expired) of the work ID's row."""
    rows = pg.execute(
        dsn,
        "SELECT holder_id, fencing_token, exit_mode, prev_exit_mode, prev_holder_id,"
        " checkpoint, expires_at < now() FROM worklease_leases WHERE work_id = %s",
        (work_id,),
    )
    assert len(rows) == 1, rows
    return rows[0]


def lock_waiters(dsn: str) -> int:
    """Sessions of this database waiting for a lock."""
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


@contextmanager
def row_locked(dsn: str, work_id: str) -> Iterator[psycopg.Connection[Any]]:
    """Another session holding the row lock (``SELECT ... FOR UPDATE``) until the block ends
    (then rolled back)."""
    with psycopg.connect(dsn) as locker:
        rows = locker.execute(
            "SELECT 1 FROM worklease_leases WHERE work_id = %s FOR UPDATE", (work_id,)
        ).fetchall()
        assert rows == [(1,)]
        try:
            yield locker
        finally:
            locker.rollback()


async def cancel_while_blocked(dsn: str, work_id: str, call: Awaitable[Any]) -> None:
    """Start ``call`` while the row is locked, wait until it waits for the lock, cancel it,
    and check it raises CancelledError and leaves no statement waiting on the server."""
    with row_locked(dsn, work_id):
        task = asyncio.ensure_future(call)
        await until(lambda: lock_waiters(dsn) >= 1 or task.done(), "the statement to block")
        assert not task.done(), "the statement did not block on the row lock"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), BOUND)
        assert task.cancelled()
        # Nothing of the cancelled call stays queued on the lock, still able to commit later.
        await until(lambda: lock_waiters(dsn) == 0, "the cancelled statement to go away")


# -- (a) cancellation mid-statement ---------------------------------------------------------


async def test_cancelled_checkpoint_writes_all_or_nothing(
    backend: AsyncPostgresBackend, dsn: str
) -> None:
    """A checkpoint cancelled while its UPDATE waits on a row lock: CancelledError, the stored
    state is exactly the old or the new one, and the pool keeps working."""
    lease = AsyncLease(backend, holder_id="holder-a", ttl=TTL)
    token = await lease.acquire("ckpt")
    old, new = b"old" * 1000, b"new" * 2000
    await lease.checkpoint(token, old)

    await cancel_while_blocked(dsn, "ckpt", lease.checkpoint(token, new))

    holder, fencing_token, exit_mode, _, _, state, expired = row(dsn, "ckpt")
    assert (holder, fencing_token, exit_mode, expired) == (
        "holder-a",
        token.fencing_token,
        None,
        False,
    )
    assert bytes(state) in (old, new)
    assert (await lease.read_checkpoint(token)).state in (old, new)
    # The pool (and the lease) still work: the next writes go through.
    await lease.checkpoint(token, b"after")
    await lease.renew(token)
    assert (await lease.read_checkpoint(token)).state == b"after"
    await lease.release(token, ExitMode.FINISHED)
    assert row(dsn, "ckpt")[2] == "finished"


async def test_cancelled_acquire_takes_all_or_nothing(
    backend: AsyncPostgresBackend, dsn: str
) -> None:
    """An acquire cancelled while waiting on the row lock: CancelledError, and the row is
    either untouched or fully granted (never a mix of the two)."""
    first = AsyncLease(backend, holder_id="holder-a", ttl=TTL)
    token = await first.acquire("acq")
    await first.checkpoint(token, b"old")
    await first.release(token, ExitMode.ABANDONED)
    before = row(dsn, "acq")

    second = AsyncLease(backend, holder_id="holder-b", ttl=TTL)
    await cancel_while_blocked(dsn, "acq", second.acquire("acq"))

    after = row(dsn, "acq")
    granted = (
        "holder-b",
        after[1],
        None,
        "abandoned",
        "holder-a",
        b"old",
        False,
    )
    assert after in (before, granted), (before, after)
    if after == granted:
        assert after[1] > token.fencing_token
    # The pool still works; a third holder gets the work ID once it is free.
    pg.execute(
        dsn,
        "UPDATE worklease_leases SET expires_at = now() - interval '1 second'"
        " WHERE work_id = 'acq'",
    )
    third = AsyncLease(backend, holder_id="holder-c", ttl=TTL)
    successor = await third.acquire("acq")
    prior = await third.read_checkpoint(successor)
    assert prior.state == b"old"
    if after == before:
        assert prior == Checkpoint(b"old", ExitMode.ABANDONED, "holder-a")
    else:
        assert prior == Checkpoint(b"old", ExitMode.EXPIRED, "holder-b")


async def test_cancelled_release_records_all_or_nothing(
    backend: AsyncPostgresBackend, dsn: str
) -> None:
    """A release cancelled while waiting on the row lock: CancelledError, and the row is still
    held or fully released (exit recorded and expired together)."""
    lease = AsyncLease(backend, holder_id="holder-a", ttl=TTL)
    token = await lease.acquire("rel")
    await lease.checkpoint(token, b"old")
    before = row(dsn, "rel")

    await cancel_while_blocked(dsn, "rel", lease.release(token, ExitMode.FINISHED))

    after = row(dsn, "rel")
    released = (*before[:2], "finished", *before[3:6], True)
    assert after in (before, released), (before, after)
    # The pool still works: reads and another holder's acquire go through.
    assert (await backend.read_checkpoint(token)).state == b"old"
    rival = AsyncLease(backend, holder_id="holder-b", ttl=TTL)
    if after == before:
        with pytest.raises(LeaseHeldError):
            await rival.acquire("rel")
        await backend.release(token, ExitMode.FINISHED)
    successor = await rival.acquire("rel")
    assert await rival.read_checkpoint(successor) == Checkpoint(
        b"old", ExitMode.FINISHED, "holder-a"
    )


# -- (b) behaviour.md P13: runner cancelled mid-work ----------------------------------------


async def test_runner_cancelled_mid_work_releases_abandoned(
    backend: AsyncPostgresBackend, dsn: str
) -> None:
    """P13: the caller cancels run() mid-work: run raises CancelledError, the state written
    before the cancel is stored, and a fail-fast successor takes over at once and reads it,
    ABANDONED and holder-a."""
    lease = AsyncLease(backend, holder_id="holder-a", ttl=TTL)
    working = asyncio.Event()

    async def work(token: Token, prior: Checkpoint) -> bytes:
        await lease.checkpoint(token, b"final state")
        working.set()
        await asyncio.sleep(BOUND * 10)  # cancelled long before
        return b"never written"

    runner = AsyncRunner(lease, work)
    task = asyncio.ensure_future(runner.run("p13"))
    await asyncio.wait_for(working.wait(), BOUND)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), BOUND)
    assert task.cancelled()

    successor_lease = AsyncLease(backend, holder_id="holder-b", ttl=TTL)
    successor = await successor_lease.acquire("p13")  # fail-fast: released, not lapsed
    assert await successor_lease.read_checkpoint(successor) == Checkpoint(
        b"final state", ExitMode.ABANDONED, "holder-a"
    )
    assert row(dsn, "p13")[:2] == ("holder-b", successor.fencing_token)


# -- (c) the body is cancelled when the renewal is fenced -----------------------------------


class GatedBackend(AsyncPostgresBackend):
    """Renewals wait for ``gate``, so a test can take the lease over between two renewals."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        super().__init__(pool)
        self.gate = asyncio.Event()
        self.gate.set()
        self.renewals = 0
        self.waiting = False

    async def renew(self, token: Token, ttl: float) -> None:
        self.waiting = True
        try:
            await self.gate.wait()
        finally:
            self.waiting = False
        await super().renew(token, ttl)
        self.renewals += 1


async def test_renewal_fenced_by_a_takeover_cancels_the_body(
    pool: AsyncConnectionPool[Any], backend: AsyncPostgresBackend, dsn: str
) -> None:
    """Another holder takes over (expiry forced by SQL, then a real acquire); the renewal's
    next attempt is fenced and the block raises FencedError within a few seconds."""
    gated = GatedBackend(pool)
    async with gated:
        lease = AsyncLease(gated, holder_id="holder-a", ttl=5.0)
        token = await lease.acquire("fenced")
        body_cancelled = False
        started = 0.0
        with pytest.raises(FencedError) as caught:  # noqa: PT012
            async with lease.renewal(token, interval=0.2) as renewal:
                await until(lambda: gated.renewals >= 1, "a first renewal")
                gated.gate.clear()  # the next renewal waits until the takeover is done
                # Attempts are sequential: one waiting at the gate means none is in flight.
                await until(lambda: gated.waiting, "the next renewal to wait at the gate")
                pg.execute(
                    dsn,
                    "UPDATE worklease_leases SET expires_at = now() - interval '1 second'"
                    " WHERE work_id = 'fenced'",
                )
                rival = AsyncLease(backend, holder_id="holder-b", ttl=TTL)
                successor = await rival.acquire("fenced")
                started = time.monotonic()
                gated.gate.set()
                try:
                    await asyncio.sleep(BOUND)
                except asyncio.CancelledError:
                    body_cancelled = True
                    raise
        elapsed = time.monotonic() - started
        assert body_cancelled
        assert elapsed < PROMPT, elapsed
        assert (caught.value.work_id, caught.value.holder_id, caught.value.fencing_token) == (
            "fenced",
            "holder-a",
            token.fencing_token,
        )
        assert renewal.lost
        assert isinstance(renewal.cause, FencedError)
        with pytest.raises(FencedError):
            await lease.checkpoint(token, b"zombie")
    assert row(dsn, "fenced")[:3] == ("holder-b", successor.fencing_token, None)
    assert await rival.read_checkpoint(successor) == Checkpoint(None, ExitMode.EXPIRED, "holder-a")
