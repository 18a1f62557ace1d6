"""PgBouncer 1.18 in transaction mode, left as installed, in front of a private cluster; a
plain psycopg pool and worklease's defaults (issue 23). Holders of one flavour share one
lease object, each checkpointing its own work ID (every fifth write a transactional step
that inserts a row of the application's own), while pairs of workers hand work IDs over.
Nothing fails: every error raised is counted, and the target is none. Before ADR-0015 this
topology gave thousands of prepared-statement errors and most handoffs failed.

The ordinary suite runs a short soak per flavour; ``nox -s faults`` runs 50 holders for
60 s per flavour (the figures of the issue's "Must show").
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from tests import pg
from worklease import (
    AsyncLease,
    AsyncPostgresBackend,
    ExitMode,
    Lease,
    PostgresBackend,
)

from .conftest import LONG

pytestmark = [pytest.mark.postgres, pytest.mark.faults, pytest.mark.pgbouncer]

HOLDERS = 50 if LONG else 10
SECONDS = 60.0 if LONG else 4.0
STEP_EVERY = 5
TTL = 30.0
POLL = 0.5
ROWS = "soak_rows"


@dataclass
class Soak:
    """What one flavour's run saw."""

    writes: int = 0
    steps: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    handoffs: list[float] = field(default_factory=list)
    failed_handoffs: list[str] = field(default_factory=list)

    def error(self, exc: BaseException) -> None:
        self.errors[f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"] += 1


@pytest.fixture(scope="module")
def bounced() -> Iterator[tuple[str, str]]:
    """(direct DSN, DSN through PgBouncer) of a fresh database on a private cluster."""
    bindir = pg.find_bindir()
    if bindir is None:
        pytest.fail("no PostgreSQL server binaries for the PgBouncer soak", pytrace=False)
    cluster = pg.ThrowawayCluster(bindir)
    try:
        cluster.start()
        bouncer = pg.PgBouncer(cluster.dsn, pool_mode="transaction")
        try:
            bouncer.start()
        except pg.Unavailable as exc:
            pytest.fail(f"PgBouncer unavailable: {exc}", pytrace=False)
        try:
            with pg.fresh_database(cluster.dsn) as direct:
                pg.execute(direct, f"CREATE TABLE {ROWS} (work_id TEXT, token BIGINT, n INT)")
                yield direct, bouncer.route(direct)
        finally:
            bouncer.stop()
    finally:
        cluster.stop()


def _report(flavour: str, soak: Soak) -> str:
    handoffs = sorted(soak.handoffs)
    median = handoffs[len(handoffs) // 2] if handoffs else float("nan")
    return (
        f"{flavour}: {HOLDERS} holders x {SECONDS:.0f} s: {soak.writes} writes "
        f"({soak.steps} transactional steps), {sum(soak.errors.values())} errors "
        f"{dict(soak.errors)}; handoffs {len(handoffs)} of "
        f"{len(handoffs) + len(soak.failed_handoffs)} succeeded (median {median:.2f} s) "
        f"{soak.failed_handoffs[:3]}"
    )


# -- sync ---------------------------------------------------------------------------------


def _wait_for(lease: Lease, work_id: str, into: list[Any]) -> None:
    into.append(lease.acquire(work_id, wait=True, timeout=TTL, poll_interval=POLL))


def _sync_soak(routed: str) -> Soak:
    soak = Soak()
    stop = threading.Event()
    lock = threading.Lock()
    with ConnectionPool(routed, max_size=10, open=True) as pool:  # psycopg's defaults
        backend = PostgresBackend(pool)
        try:
            lease = Lease(backend, holder_id="soak", ttl=TTL)

            def holder(index: int) -> None:
                try:
                    with lease.hold(f"soak-sync-{index}") as held:
                        n = 0
                        while not stop.is_set():
                            n += 1
                            if n % STEP_EVERY == 0:
                                with held.transaction() as tx:
                                    tx.connection.execute(
                                        f"INSERT INTO {ROWS} VALUES (%s, %s, %s)".encode(),
                                        (held.token.work_id, held.token.fencing_token, n),
                                    )
                                    tx.checkpoint(str(n).encode())
                                with lock:
                                    soak.steps += 1
                            else:
                                held.checkpoint(str(n).encode())
                            with lock:
                                soak.writes += 1
                except Exception as exc:
                    with lock:
                        soak.error(exc)

            def handoffs() -> None:
                giver = Lease(backend, holder_id="giver", ttl=TTL)
                taker = Lease(backend, holder_id="taker", ttl=TTL)
                k = 0
                while not stop.is_set():
                    k += 1
                    work_id = f"handoff-sync-{k}"
                    try:
                        token = giver.acquire(work_id)
                        giver.checkpoint(token, f"left {k}".encode())
                        got: list[Any] = []
                        waiter = threading.Thread(target=_wait_for, args=(taker, work_id, got))
                        waiter.start()
                        time.sleep(0.05)
                        released = time.monotonic()
                        giver.release(token, ExitMode.FINISHED)
                        waiter.join(TTL + 5)
                        if not got:
                            soak.failed_handoffs.append(f"{work_id}: not acquired")
                            continue
                        took = time.monotonic() - released
                        prior = taker.read_checkpoint(got[0])
                        if prior.prev_exit != ExitMode.FINISHED or prior.state != (
                            f"left {k}".encode()
                        ):
                            soak.failed_handoffs.append(f"{work_id}: {prior}")
                        else:
                            soak.handoffs.append(took)
                        taker.release(got[0], ExitMode.FINISHED)
                    except Exception as exc:
                        soak.failed_handoffs.append(f"{work_id}: {exc!r}")
                        with lock:
                            soak.error(exc)

            threads = [threading.Thread(target=holder, args=(i,)) for i in range(HOLDERS)]
            threads.append(threading.Thread(target=handoffs))
            for thread in threads:
                thread.start()
            time.sleep(SECONDS)
            stop.set()
            for thread in threads:
                thread.join(TTL + 10)
        finally:
            backend.close()
    return soak


# -- asyncio ------------------------------------------------------------------------------


async def _async_soak(routed: str) -> Soak:
    soak = Soak()
    stop = asyncio.Event()
    async with (
        AsyncConnectionPool(routed, max_size=10, open=False) as pool,
        AsyncPostgresBackend(pool) as backend,
    ):
        lease = AsyncLease(backend, holder_id="soak", ttl=TTL)

        async def holder(index: int) -> None:
            try:
                async with lease.hold(f"soak-async-{index}") as held:
                    n = 0
                    while not stop.is_set():
                        n += 1
                        if n % STEP_EVERY == 0:
                            async with held.transaction() as tx:
                                await tx.connection.execute(
                                    f"INSERT INTO {ROWS} VALUES (%s, %s, %s)".encode(),
                                    (held.token.work_id, held.token.fencing_token, n),
                                )
                                tx.checkpoint(str(n).encode())
                            soak.steps += 1
                        else:
                            await held.checkpoint(str(n).encode())
                        soak.writes += 1
                        await asyncio.sleep(0)
            except Exception as exc:
                soak.error(exc)

        async def handoffs() -> None:
            giver = AsyncLease(backend, holder_id="giver", ttl=TTL)
            taker = AsyncLease(backend, holder_id="taker", ttl=TTL)
            k = 0
            while not stop.is_set():
                k += 1
                work_id = f"handoff-async-{k}"
                try:
                    token = await giver.acquire(work_id)
                    await giver.checkpoint(token, f"left {k}".encode())
                    waiter = asyncio.ensure_future(
                        taker.acquire(work_id, wait=True, timeout=TTL, poll_interval=POLL)
                    )
                    await asyncio.sleep(0.05)
                    released = time.monotonic()
                    await giver.release(token, ExitMode.FINISHED)
                    got = await waiter
                    took = time.monotonic() - released
                    prior = await taker.read_checkpoint(got)
                    if prior.prev_exit != ExitMode.FINISHED or prior.state != (
                        f"left {k}".encode()
                    ):
                        soak.failed_handoffs.append(f"{work_id}: {prior}")
                    else:
                        soak.handoffs.append(took)
                    await taker.release(got, ExitMode.FINISHED)
                except Exception as exc:
                    soak.failed_handoffs.append(f"{work_id}: {exc!r}")
                    soak.error(exc)

        tasks = [asyncio.ensure_future(holder(i)) for i in range(HOLDERS)]
        tasks.append(asyncio.ensure_future(handoffs()))
        await asyncio.sleep(SECONDS)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), TTL + 10)
    return soak


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_defaults_through_pgbouncer_transaction_mode_never_fail(
    bounced: tuple[str, str], flavour: str, caplog: pytest.LogCaptureFixture
) -> None:
    direct, routed = bounced
    with caplog.at_level(logging.WARNING, logger="worklease"):
        soak = _sync_soak(routed) if flavour == "sync" else asyncio.run(_async_soak(routed))
    print("\n" + _report(flavour, soak))
    warnings = sorted({r.getMessage() for r in caplog.records if r.name == "worklease"})
    print("worklease warnings:\n  " + "\n  ".join(warnings))
    assert not soak.errors, _report(flavour, soak)
    assert not soak.failed_handoffs, soak.failed_handoffs
    assert soak.handoffs, "no handoff was sampled"
    assert soak.steps > 0
    with psycopg.connect(direct, autocommit=True) as conn:
        stored = conn.execute(
            f"SELECT count(*) FROM {ROWS} WHERE work_id LIKE %s".encode(), (f"soak-{flavour}-%",)
        ).fetchone()
    assert stored is not None
    assert stored[0] == soak.steps  # every committed step's row, and only those
