#!/usr/bin/env python
"""The small group-commit harness of issue 25, to set beside ``bench_concurrency.py``.

One ``AsyncConnectionPool(min_size=max_size=8, kwargs={"autocommit": True})``, one
``AsyncPostgresBackend``, one ``AsyncLease``; C tasks each checkpoint their own work ID with a
256-byte state in a loop, in 3 s blocks alternating with the hand-written token-guarded UPDATE
on the same pool (``pool.connection()`` and ``conn.execute`` with psycopg's defaults). It
prints, per C, the median checkpoints/s of each side over the blocks and their ratio, and
what each checkpoint cost in CPU: the client's (this process) and the server's (every local
process named ``postgres``, read from ``/proc``; "n/a" when none is visible). The two CPU
ratios printed are what the throughput ratio would be if CPU alone limited both sides: the
client's (its one event loop the bottleneck), or the client's and server's together (both
sharing the same cores). Latency, not CPU, may limit a side, so neither is a prediction.

``--uvloop`` runs it on uvloop (when installed); ``--simple`` puts the backend in simple-query
mode (``prepare=False``). The work IDs are fresh per run; the table is
the one on the search path of ``--dsn`` (``worklease migrate`` first). It only reports.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool

from worklease import AsyncLease, AsyncPostgresBackend, ExitMode

HAND = b"""UPDATE worklease_leases
SET checkpoint = %(state)s, expires_at = now() + %(ttl)s
WHERE work_id = %(work_id)s AND fencing_token = %(token)s AND exit_mode IS NULL
RETURNING true"""


def server_cpu_seconds() -> float | None:
    """CPU time (user + system) of every process named ``postgres`` this machine shows, or
    None when there is none (a remote server). Every local cluster counts (run it where
    nothing else uses PostgreSQL), and a process that ended within a block is missed."""
    tick = os.sysconf("SC_CLK_TCK")
    total, seen = 0, False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                raw = stat.read()
        except OSError:
            continue  # gone since listed
        name = raw[raw.index(b"(") + 1 : raw.rindex(b")")]
        if name != b"postgres":
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
        seen = True
    return total / tick if seen else None


@dataclass(frozen=True, slots=True)
class Block:
    """One side's block: checkpoints per second, client and server CPU per checkpoint."""

    rate: float
    client_us: float
    server_us: float | None


async def block(count: int, seconds: float, step: Callable[[int], Awaitable[None]]) -> Block:
    stop = False
    done = 0

    async def loop(index: int) -> None:
        nonlocal done
        while not stop:
            await step(index)
            done += 1

    server_before, client_before = server_cpu_seconds(), time.process_time()
    tasks = [asyncio.create_task(loop(i)) for i in range(count)]
    began = time.perf_counter()
    await asyncio.sleep(seconds)
    stop = True
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - began
    client, server_after = time.process_time() - client_before, server_cpu_seconds()
    server = None
    if server_before is not None and server_after is not None:
        server = (server_after - server_before) * 1e6 / max(done, 1)
    return Block(done / elapsed, client * 1e6 / max(done, 1), server)


async def run(dsn: str, concurrency: int, blocks: int, seconds: float, simple: bool) -> None:
    async with AsyncConnectionPool(
        dsn, min_size=8, max_size=8, kwargs={"autocommit": True}
    ) as pool:
        backend = AsyncPostgresBackend(pool, prepare=False if simple else None)
        lease = AsyncLease(backend, holder_id="harness", ttl=60)
        state = os.urandom(256)
        run_id = uuid.uuid4().hex[:8]
        ours = [await lease.acquire(f"harness/{run_id}/o/{i}") for i in range(concurrency)]
        hand = [await lease.acquire(f"harness/{run_id}/h/{i}") for i in range(concurrency)]
        ttl = timedelta(seconds=60)
        params: list[dict[str, Any]] = [
            {"work_id": t.work_id, "token": t.fencing_token, "state": state, "ttl": ttl}
            for t in hand
        ]

        async def ours_step(index: int) -> None:
            await lease.checkpoint(ours[index], state)

        async def hand_step(index: int) -> None:
            async with pool.connection() as conn:
                cursor = await conn.execute(HAND, params[index])
                if not await cursor.fetchall():
                    raise RuntimeError("the hand-written checkpoint matched no row")

        results: dict[str, list[Block]] = {"worklease": [], "hand": []}
        for index in range(blocks):
            order = ("worklease", "hand") if index % 2 == 0 else ("hand", "worklease")
            for side in order:
                step = ours_step if side == "worklease" else hand_step
                results[side].append(await block(concurrency, seconds, step))
        medians = {side: summarize(blocks_of) for side, blocks_of in results.items()}
        (mine, my_client, my_server), (theirs, their_client, their_server) = (
            medians["worklease"],
            medians["hand"],
        )
        cpu = f"client CPU/checkpoint {my_client:.0f} vs {their_client:.0f} µs"
        if my_server is not None and their_server is not None:
            cpu += (
                f", server {my_server:.0f} vs {their_server:.0f} µs; CPU ratios: client "
                f"{their_client / my_client:.2f}, client + server "
                f"{(their_client + their_server) / (my_client + my_server):.2f}"
            )
        else:
            cpu += f" (ratio {their_client / my_client:.2f}), server n/a"
        print(
            f"C={concurrency}: worklease {mine:,.0f}/s, hand-written {theirs:,.0f}/s, "
            f"ratio {mine / theirs:.2f}; {cpu}",
            flush=True,
        )
        for token in (*ours, *hand):
            await lease.release(token, ExitMode.FINISHED)
        await backend.close()


def summarize(blocks: list[Block]) -> tuple[float, float, float | None]:
    """Medians over one side's blocks: rate, client and server CPU µs per checkpoint."""
    servers = [b.server_us for b in blocks if b.server_us is not None]
    return (
        statistics.median(b.rate for b in blocks),
        statistics.median(b.client_us for b in blocks),
        statistics.median(servers) if len(servers) == len(blocks) else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn", default=os.environ.get("WORKLEASE_TEST_DSN", "host=127.0.0.1 user=postgres")
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--blocks", type=int, default=4, help="blocks per side")
    parser.add_argument("--seconds", type=float, default=3.0, help="per block")
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument(
        "--simple",
        action="store_true",
        help="the backend in simple-query mode (prepare=False, as behind PgBouncer in "
        "transaction mode); the hand-written side keeps psycopg's defaults",
    )
    args = parser.parse_args()
    runner: Callable[[Any], Any] = asyncio.run
    if args.uvloop:
        runner = importlib.import_module("uvloop").run  # optional: not a dependency
    for concurrency in args.concurrency:
        runner(run(args.dsn, concurrency, args.blocks, args.seconds, args.simple))


if __name__ == "__main__":
    main()
