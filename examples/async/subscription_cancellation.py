"""Subscription cancellation: a multi-step job that resumes where a crashed worker stopped.

Cancelling a SaaS subscription takes four steps per tenant: cancel billing, schedule
deprovisioning, archive data, send the confirmation email. Every finished step is recorded in
the checkpoint, so whoever holds the lease next skips it. Three runs:

1. happy path: one worker does all four steps and releases the lease;
2. a worker crashes after the first step; once its lease lapses, a successor sees the
   previous exit "expired" and skips the finished step;
3. a worker stalls after doing a step but before recording it; a successor takes over (and
   repeats that step: work between checkpoints is at-least-once), and when the stalled worker
   wakes up its checkpoint is rejected with FencedError.

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

STEPS = ("cancel billing", "schedule deprovisioning", "archive data", "send confirmation email")


@dataclass
class Progress:
    """The checkpoint: the steps finished so far."""

    done: list[str]


CODEC = worklease.JSONCodec(Progress)


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


async def start(lease: worklease.AsyncLease, work_id: str) -> tuple[worklease.Token, Progress]:
    """Acquire the work ID (waiting while somebody holds it) and read the checkpoint."""
    token = await lease.acquire(work_id, wait=True, timeout=30, poll_interval=0.1)
    prior = await lease.read_checkpoint(token)
    previous = str(prior.prev_exit)
    if prior.prev_holder_id is not None:
        previous += " (holder " + prior.prev_holder_id + ")"
    print(f"{lease.holder_id}: acquired {work_id} (token {token.fencing_token})")
    print(f"{lease.holder_id}: previous exit: {previous}")
    return token, CODEC.decode(prior.state) or Progress(done=[])


def perform(token: worklease.Token, step: str) -> None:
    """The side effect of a step. A real one passes the fencing token downstream."""
    print(f"{token.holder_id}: {step} (fencing token {token.fencing_token})")


async def cancel_subscription(
    lease: worklease.AsyncLease, work_id: str, *, crash_after: str | None = None
) -> worklease.Token:
    """Run the job to the end, skipping the steps a previous holder finished."""
    token, progress = await start(lease, work_id)
    async with lease.renewal(token):  # keeps the lease alive while the steps run
        for step in STEPS:
            if step in progress.done:
                print(f"{lease.holder_id}: skips {step} (done before)")
                continue
            perform(token, step)
            progress.done.append(step)
            await lease.checkpoint(token, CODEC.encode(progress))
            if step == crash_after:
                raise Crash
    await lease.release(token, worklease.ExitMode.FINISHED)
    print(f"{lease.holder_id}: released as finished")
    return token


async def happy_path(world: World) -> None:
    print("== 1. happy path")
    worker = world.lease("worker-a")
    token = await cancel_subscription(worker, "cancel-subscription/tenant-1" + world.suffix)
    await worker.forget(token)  # tidy up: rows outlive their holders


async def crash_and_resume(world: World) -> None:
    print("\n== 2. a worker crashes after the first step")
    work_id = "cancel-subscription/tenant-2" + world.suffix
    try:
        await cancel_subscription(world.lease("worker-a"), work_id, crash_after=STEPS[0])
    except Crash:
        print("worker-a: crashes without releasing; the lease lapses after its TTL")
    world.lapse()
    successor = world.lease("worker-b")
    token = await cancel_subscription(successor, work_id)
    await successor.forget(token)


async def zombie_is_fenced(world: World) -> None:
    print("\n== 3. a stalled worker is fenced")
    work_id = "cancel-subscription/tenant-3" + world.suffix
    zombie = world.lease("worker-z")
    stale, progress = await start(zombie, work_id)
    async with zombie.renewal(stale):
        perform(stale, STEPS[0])
        progress.done.append(STEPS[0])
        await zombie.checkpoint(stale, CODEC.encode(progress))
        perform(stale, STEPS[1])  # done, but not recorded yet...
    print(f"worker-z: stalls before recording {STEPS[1]!r}; its lease lapses")
    world.lapse()
    successor = world.lease("worker-b")
    token = await cancel_subscription(successor, work_id)  # repeats the unrecorded step
    print("worker-z: wakes up and records its step")
    progress.done.append(STEPS[1])
    try:
        await zombie.checkpoint(stale, CODEC.encode(progress))
    except worklease.FencedError:
        print(
            f"worker-z: fenced: FencedError (its token {stale.fencing_token} was superseded "
            f"by token {token.fencing_token}); it stops"
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
