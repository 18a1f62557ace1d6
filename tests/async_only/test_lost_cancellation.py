"""Cancellations that an await loses on the way (asyncio only).

Before Python 3.12 ``asyncio.wait_for`` drops a cancellation that arrives just as the awaited
thing finishes (CPython gh-86296). psycopg_pool waits for a free connection that way, so a
statement cancelled while waiting for a connection went on as if never cancelled, and a pool
stopping waited for that slot for ever (seen as a rare hang of a fair-share test). The race
itself is a matter of luck; these cases reproduce the loss deterministically: a pool whose
checkout returns a connection despite the cancellation, exactly as the lossy wait does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from tests import pg
from worklease import (
    AsyncLease,
    AsyncMemoryBackend,
    AsyncPool,
    AsyncPostgresBackend,
    Checkpoint,
    ExitMode,
    Token,
    current_renewal,
)

BOUND = 30.0
"""Upper bound for anything that should happen 'at once' on a loaded CI box."""


class LossyPool(AsyncConnectionPool[Any]):
    """Once ``lossy`` is set, a checkout waits until it is cancelled and then hands out a
    connection anyway, the way ``asyncio.wait_for`` does before Python 3.12 when the
    connection arrives together with the cancellation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lossy = False
        self.waiting = asyncio.Event()

    async def getconn(self, timeout: float | None = None) -> Any:
        if self.lossy:
            self.lossy = False
            self.waiting.set()
            try:
                await asyncio.sleep(BOUND)
            except asyncio.CancelledError:
                pass  # lost, as wait_for loses it
        return await super().getconn(timeout)


@pytest.fixture
async def lossy_pool(postgres_dsn: str) -> AsyncIterator[LossyPool]:
    pg.reset(postgres_dsn)
    async with LossyPool(postgres_dsn, min_size=1, max_size=4, open=False) as pool:
        yield pool


@pytest.mark.postgres
async def test_a_statement_whose_checkout_lost_the_cancellation_is_cancelled(
    lossy_pool: LossyPool, postgres_dsn: str
) -> None:
    """The cancellation the checkout lost is raised before the statement runs: the task ends
    cancelled and the checkpoint is not written."""
    async with AsyncPostgresBackend(lossy_pool) as backend:
        lease = AsyncLease(backend, holder_id="holder-a", ttl=30.0)
        token = await lease.acquire("lossy")
        await lease.checkpoint(token, b"before")
        lossy_pool.lossy = True
        task = asyncio.ensure_future(lease.checkpoint(token, b"after"))
        await asyncio.wait_for(lossy_pool.waiting.wait(), BOUND)
        task.cancel()
        done, _ = await asyncio.wait((task,), timeout=BOUND)
        assert done, "the checkpoint did not end after its cancellation"
        assert task.cancelled()
        assert (await lease.read_checkpoint(token)).state == b"before"
        # The connection went back to the pool: the lease is still usable.
        await lease.release(token, ExitMode.FINISHED)
        rows = pg.execute(
            postgres_dsn,
            "SELECT exit_mode, checkpoint FROM worklease_leases WHERE work_id = 'lossy'",
        )
        assert rows == [("finished", b"before")]


async def test_a_pool_stop_ends_a_work_function_whose_await_lost_the_cancellation() -> None:
    """stop() also tells the slot's renewal: a work function whose own await lost the
    cancellation stops at its next ``raise_if_lost()``, and the lease is released as
    ABANDONED with its last checkpoint."""
    backend = AsyncMemoryBackend()
    lease = AsyncLease(backend, holder_id="pool-a", ttl=30.0)
    started = asyncio.Event()
    steps = 0

    async def work(token: Token, prior: Checkpoint) -> bytes | None:
        nonlocal steps
        renewal = current_renewal()
        assert renewal is not None
        while True:
            renewal.raise_if_lost()
            steps += 1
            await lease.checkpoint(token, b"step %d" % steps)
            started.set()
            try:
                await asyncio.sleep(BOUND)
            except asyncio.CancelledError:
                pass  # an await that loses the cancellation (wait_for before 3.12)

    pool = AsyncPool(lease, ["only"], work, idle_interval=0.05)
    running = asyncio.ensure_future(pool.run())
    await asyncio.wait_for(started.wait(), BOUND)
    pool.stop()
    done, _ = await asyncio.wait((running,), timeout=BOUND)
    assert done, "the pool did not stop"
    assert running.exception() is None
    assert steps == 1
    prior = await backend.acquire_with_checkpoint("only", "next", 30.0)
    assert prior[1].prev_exit is ExitMode.ABANDONED
    assert prior[1].state == b"step 1"
