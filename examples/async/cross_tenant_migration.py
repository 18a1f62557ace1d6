"""Cross-tenant migration: the checkpoint as an append-only cursor over tenants.

A migration walks eight tenants. After each tenant it appends the tenant ID to the cursor
stored in the checkpoint, so the next holder of the lease continues where the last one
stopped. Three runs:

1. happy path: one worker migrates all eight tenants and releases the lease;
2. a worker crashes after three tenants; once its lease lapses, a successor skips them;
3. a worker stalls mid-batch, after migrating a tenant but before appending it to the
   cursor; a successor takes over, and when the stalled worker wakes up its checkpoint is
   rejected (FencedError). Both fencing tokens are printed.

By default it runs on the in-memory backend with a fake clock (no setup, no waiting); with
--dsn it runs against PostgreSQL, with a 3-second TTL and real waits.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from dataclasses import dataclass

import worklease
from worklease.testing import FakeClock

TENANTS = tuple(f"tenant-{n:02}" for n in range(1, 9))


@dataclass
class Cursor:
    """The checkpoint: the tenants migrated so far, in order (only ever appended to)."""

    migrated: list[str]


CODEC = worklease.JSONCodec(Cursor)


class Crash(Exception):
    """Stands in for the process dying: nothing after it runs, and nothing is released."""


@dataclass
class World:
    """Where the example runs: the backend, and how time passes for it."""

    backend: worklease.AsyncBackend
    clock: FakeClock | None  # the in-memory backend's clock; None on PostgreSQL
    ttl: float
    suffix: str  # keeps work IDs unique per run on a shared database

    def lease(self, holder_id: str) -> worklease.AsyncLease:
        return worklease.AsyncLease(self.backend, holder_id=holder_id, ttl=self.ttl)

    def lapse(self) -> None:
        """Let the leases taken so far lapse.

        In memory the fake clock jumps past the TTL. On PostgreSQL time passes for real:
        the successor's waiting acquire waits the TTL out.
        """
        if self.clock is not None:
            self.clock.advance(self.ttl + 1)


async def open_cursor(lease: worklease.AsyncLease, work_id: str) -> tuple[worklease.Token, Cursor]:
    """Acquire the migration (waiting while somebody holds it) and read its cursor."""
    token = await lease.acquire(work_id, wait=True, timeout=30, poll_interval=0.1)
    prior = await lease.read_checkpoint(token)
    cursor = CODEC.decode(prior.state) or Cursor(migrated=[])
    previous = str(prior.prev_exit)
    if prior.prev_holder_id is not None:
        previous += " (holder " + prior.prev_holder_id + ")"
    print(f"{lease.holder_id}: acquired {work_id} (token {token.fencing_token})")
    print(f"{lease.holder_id}: previous exit: {previous}; cursor: {cursor_text(cursor)}")
    return token, cursor


def cursor_text(cursor: Cursor) -> str:
    if not cursor.migrated:
        return f"0 of {len(TENANTS)} tenants"
    return f"{len(cursor.migrated)} of {len(TENANTS)} tenants, up to {cursor.migrated[-1]}"


def migrate_tenant(token: worklease.Token, tenant: str) -> None:
    """The side effect. A real one passes the fencing token to the tenant's database."""
    print(f"{token.holder_id}: migrated {tenant} (fencing token {token.fencing_token})")


async def migrate(
    lease: worklease.AsyncLease, token: worklease.Token, cursor: Cursor, tenant: str
) -> None:
    """Migrate one tenant, then append it to the cursor."""
    renewal = worklease.current_renewal()
    if renewal is not None:
        renewal.raise_if_lost()  # a thread is not interrupted when the lease is lost: ask
    migrate_tenant(token, tenant)
    cursor.migrated.append(tenant)
    await lease.checkpoint(token, CODEC.encode(cursor))


async def run_migration(
    lease: worklease.AsyncLease, work_id: str, *, crash_after: int | None = None
) -> worklease.Token:
    """Migrate every tenant not in the cursor yet, then release the lease."""
    token, cursor = await open_cursor(lease, work_id)
    async with lease.renewal(token):
        for tenant in TENANTS:
            if tenant in cursor.migrated:
                continue
            await migrate(lease, token, cursor, tenant)
            if len(cursor.migrated) == crash_after:
                raise Crash
    await lease.release(token, worklease.ExitMode.FINISHED)
    print(f"{lease.holder_id}: released as finished; cursor: {cursor_text(cursor)}")
    return token


async def happy_path(world: World) -> None:
    print("== 1. happy path")
    worker = world.lease("worker-a")
    token = await run_migration(worker, "migrate-tenants/batch-1" + world.suffix)
    await worker.forget(token)  # tidy up: rows outlive their holders


async def crash_and_resume(world: World) -> None:
    print("\n== 2. a worker crashes after three tenants")
    work_id = "migrate-tenants/batch-2" + world.suffix
    try:
        await run_migration(world.lease("worker-a"), work_id, crash_after=3)
    except Crash:
        print("worker-a: crashes without releasing; the lease lapses after its TTL")
    world.lapse()
    successor = world.lease("worker-b")
    token = await run_migration(successor, work_id)
    await successor.forget(token)


async def zombie_is_fenced(world: World) -> None:
    print("\n== 3. a stalled worker is fenced mid-batch")
    work_id = "migrate-tenants/batch-3" + world.suffix
    zombie = world.lease("worker-z")
    stale, cursor = await open_cursor(zombie, work_id)
    async with zombie.renewal(stale):
        for tenant in TENANTS[:2]:
            await migrate(zombie, stale, cursor, tenant)
        migrate_tenant(stale, TENANTS[2])  # done, but not appended to the cursor yet...
    print(f"worker-z: stalls before appending {TENANTS[2]} to the cursor; its lease lapses")
    world.lapse()
    successor = world.lease("worker-b")
    token = await run_migration(successor, work_id)  # migrates the unrecorded tenant again
    print(f"worker-z: wakes up and appends {TENANTS[2]} to the cursor")
    cursor.migrated.append(TENANTS[2])
    try:
        await zombie.checkpoint(stale, CODEC.encode(cursor))
    except worklease.FencedError:
        print(
            f"worker-z: fenced: FencedError (zombie token {stale.fencing_token}, "
            f"current token {token.fencing_token}); it stops mid-batch"
        )
    await successor.forget(token)


async def run(world: World) -> None:
    await happy_path(world)
    await crash_and_resume(world)
    await zombie_is_fenced(world)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", help="run against this PostgreSQL database instead of in memory")
    args = parser.parse_args()
    if args.dsn is None:
        clock = FakeClock()
        await run(World(worklease.AsyncMemoryBackend(clock=clock), clock, ttl=30, suffix=""))
        return
    async with worklease.AsyncPostgresBackend.connect(args.dsn) as backend:
        await worklease.AsyncPostgresBackend.apply_schema(backend.pool)
        await run(World(backend, None, ttl=3, suffix="-" + secrets.token_hex(4)))


if __name__ == "__main__":
    asyncio.run(main())
