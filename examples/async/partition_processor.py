"""Partition processor: a pool spreads six partitions over the processes that run it.

Every consumer process runs a pool over the same six partitions; each partition's offset
lives in the checkpoint of its lease. The script runs two pools in one process:

1. pool-A acquires all six partitions at once (active_slots() lists all six); each consumes
   a batch of 100 records and checkpoints its offset;
2. partition-4 meets a record this consumer can never read and fails permanently: its slot
   stops, and the partition is released "abandoned", keeping offset 100. partition-5 is
   drained and retires. The other four keep running (active_slots() lists them), and pool-A
   stops; its run() returns normally, since not every slot died;
3. pool-B, a deployment that can read that record, takes partition-4 over: it sees the
   previous exit "abandoned" by pool-A and resumes at offset 100.

By default it runs on the in-memory backend; with --dsn against PostgreSQL, with --etcd
against an etcd cluster (its members' URLs, comma-separated; needs worklease[etcd]).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
from dataclasses import dataclass

import worklease

PARTITIONS = tuple(f"partition-{n}" for n in range(6))
BATCH = 100
TTL = 10


@dataclass
class Offset:
    """The checkpoint: the next record to consume."""

    next: int


CODEC = worklease.JSONCodec(Offset)


class UnreadableRecordError(Exception):
    """A record this consumer can never process."""


class SlotLog(worklease.PoolObserver):
    """Remembers which slots died and which retired."""

    def __init__(self) -> None:
        self.dead: dict[str, BaseException] = {}
        self.retired: set[str] = set()

    def on_slot_dead(self, event: worklease.SlotDeadEvent) -> None:
        self.dead[event.work_id] = event.error

    def on_slot_retired(self, event: worklease.SlotRetiredEvent) -> None:
        self.retired.add(event.work_id)


class Stage:
    """How far the demo has got. Only the reporting partition moves it on."""

    def __init__(self) -> None:
        self.number = 1


async def pause(lease: worklease.AsyncLease, token: worklease.Token) -> None:
    """Let a moment pass while holding ``token``: stands in for consuming more records.

    worklease has no sleep of its own, and this example uses nothing but worklease so that
    its threaded twin can be generated from it: a waiting acquire of the partition this
    holder already holds is refused (leases are not re-entrant) until its timeout ends it.
    """
    with contextlib.suppress(TimeoutError):
        await lease.acquire(token.work_id, wait=True, timeout=0.02, poll_interval=0.02)


def show(name: str, pool: worklease.AsyncPool) -> None:
    print(f"{name}: active slots: " + ", ".join(sorted(pool.active_slots())))


async def first_pool(backend: worklease.AsyncBackend, ids: list[str]) -> None:
    lease = worklease.AsyncLease(backend, holder_id="pool-A", ttl=TTL)
    reporter, broken, drained = ids[0], ids[4], ids[5]
    log = SlotLog()
    stage = Stage()

    async def consume(token: worklease.Token, prior: worklease.Checkpoint) -> None:
        partition = token.work_id
        offset = (CODEC.decode(prior.state) or Offset(next=0)).next + BATCH
        await lease.checkpoint(token, CODEC.encode(Offset(next=offset)))

        while stage.number == 1:  # 1. wait until all six run at once
            if partition == reporter and len(pool.active_slots()) == len(ids):
                show("pool-A", pool)
                print(f"pool-A: each partition consumed records 0-{offset - 1}")
                stage.number = 2
            else:
                await pause(lease, token)

        if partition == broken:
            raise worklease.permanent(UnreadableRecordError(f"record {offset} is unreadable"))
        if partition == drained:
            raise worklease.Retire  # the partition has no more records, ever

        while stage.number == 2:  # 2. the others keep running
            if partition == reporter and broken in log.dead and drained in log.retired:
                error = log.dead[broken]
                print(f"pool-A: {broken} failed permanently ({error}): released abandoned")
                print(f"pool-A: {drained} is drained: retired")
                show("pool-A", pool)
                stage.number = 3
            else:
                await pause(lease, token)

        if partition == reporter:  # 3. once the others finished their batch, stop
            while pool.active_slots() != {reporter}:
                await pause(lease, token)
            pool.stop()

    pool = worklease.AsyncPool(
        lease,
        ids,
        consume,
        idle_interval=0.1,
        rerun_interval=5,  # nothing reruns before the pool stops
        backoff_interval=0.1,
        observer=log,
    )
    await pool.run()
    print("pool-A: stopped; run() returned normally (not every slot died)")


async def second_pool(backend: worklease.AsyncBackend, partition: str) -> None:
    lease = worklease.AsyncLease(backend, holder_id="pool-B", ttl=TTL)

    async def resume(token: worklease.Token, prior: worklease.Checkpoint) -> None:
        offset = (CODEC.decode(prior.state) or Offset(next=0)).next
        print(
            f"pool-B: {partition}: previous exit {prior.prev_exit} "
            f"(holder {prior.prev_holder_id}); resumes at offset {offset}"
        )
        await lease.checkpoint(token, CODEC.encode(Offset(next=offset + BATCH)))
        print(f"pool-B: {partition}: consumed records {offset}-{offset + BATCH - 1}")
        pool.stop()  # enough for the demo: a real consumer keeps going

    pool = worklease.AsyncPool(lease, [partition], resume)
    await pool.run()


async def run(backend: worklease.AsyncBackend, suffix: str) -> None:
    ids = [partition + suffix for partition in PARTITIONS]
    print("== 1. pool-A takes all six partitions")
    await first_pool(backend, ids)
    print("\n== 2. pool-B resumes the partition pool-A gave up")
    await second_pool(backend, ids[4])
    if suffix:  # tidy up on PostgreSQL or etcd: rows outlive their holders
        cleaner = worklease.AsyncLease(backend, holder_id="cleaner", ttl=TTL)
        for work_id in ids:
            await cleaner.forget(await cleaner.acquire(work_id))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", help="run against this PostgreSQL database instead of in memory")
    parser.add_argument("--etcd", metavar="ENDPOINTS", help="run against this etcd cluster")
    args = parser.parse_args()
    if args.etcd is not None:
        async with worklease.AsyncEtcdBackend(args.etcd, prefix="examples/") as etcd:
            await run(etcd, suffix="-" + secrets.token_hex(4))
        return
    if args.dsn is None:
        await run(worklease.AsyncMemoryBackend(), suffix="")
        return
    async with worklease.AsyncPostgresBackend.connect(args.dsn) as backend:
        await worklease.AsyncPostgresBackend.apply_schema(backend.pool)
        await run(backend, suffix="-" + secrets.token_hex(4))


if __name__ == "__main__":
    asyncio.run(main())
