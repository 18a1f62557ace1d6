"""Cluster singleton scheduler: leader election with a lease.

Every node of a cluster runs the same scheduler, but only the elected leader may fire the
scheduled jobs. The nodes stand for election on one work ID. Three situations (the script plays
every node in turn, in one process):

1. fail-fast election: node-2 stands for election while node-1 leads; it gets LeaseHeldError
   and skips the round;
2. standby failover: node-1 crashes while leading; node-2, standing by with a waiting acquire,
   takes over once node-1's lease lapses and sees that node-1 left "expired";
3. a stalled leader is fenced: node-1's renewals stall, node-2 takes over, and node-1's next
   write is rejected with FencedError; its election returns FencedError without releasing.

By default it runs on the in-memory backend with a fake clock (no setup, no waiting); with
--dsn it runs against PostgreSQL with real waits: the crashed and the stalled node-1 take
leases of 3 seconds, which their successor waits out, the nodes that keep running leases of
30 seconds, which no slow machine lets lapse in the middle of a term.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from dataclasses import dataclass

import worklease
from worklease.testing import FakeClock


@dataclass
class World:
    """Where the example runs: the backend, and how time passes for it."""

    backend: worklease.AsyncBackend
    clock: FakeClock | None  # the in-memory backend's clock; None on PostgreSQL
    ttl: float  # the TTL of a node that keeps running
    lapsing_ttl: float  # the TTL of a node that crashes or stalls: its lease is let lapse
    suffix: str  # keeps work IDs unique per run on a shared database

    def lease(self, holder_id: str, *, lapses: bool = False) -> worklease.AsyncLease:
        ttl = self.lapsing_ttl if lapses else self.ttl
        return worklease.AsyncLease(self.backend, holder_id=holder_id, ttl=ttl)

    def lapse(self) -> None:
        """Let the leases of the nodes that crashed or stalled lapse.

        In memory the fake clock jumps past their TTL. On PostgreSQL time passes for real:
        the standby's waiting acquire waits the TTL out.
        """
        if self.clock is not None:
            self.clock.advance(self.lapsing_ttl + 1)


def on_elected(token: worklease.Token) -> None:
    print(f"{token.holder_id}: elected leader (token {token.fencing_token})")


def on_relinquished(token: worklease.Token) -> None:
    print(f"{token.holder_id}: relinquished leadership")


def on_lost(token: worklease.Token) -> None:
    print(f"{token.holder_id}: lost leadership")


def node(
    lease: worklease.AsyncLease,
    work_id: str,
    *,
    standby: bool = False,
    renewal_interval: float | None = None,
) -> worklease.AsyncLeader:
    """One node's leader election. A standby waits for the lease instead of failing fast."""
    return worklease.AsyncLeader(
        lease,
        work_id,
        idle_interval=0.1,  # after losing an election (default 1 s)
        backoff_interval=0.05,  # after each term (default 1 s)
        on_elected=on_elected,
        on_relinquished=on_relinquished,
        on_lost=on_lost,
        acquire_wait=standby,
        poll_interval=0.1,
        renewal_interval=renewal_interval,
    )


async def fire_jobs(lease: worklease.AsyncLease, token: worklease.Token, tick: int) -> None:
    """Claim a tick by recording it in the lease's checkpoint, then fire its jobs.

    Recording first means a leader that was superseded is stopped (FencedError) before it
    fires anything.
    """
    await lease.checkpoint(token, str(tick).encode())
    print(f"{token.holder_id}: fires the jobs of tick {tick}")


async def fail_fast(world: World, work_id: str) -> None:
    print("== 1. fail-fast election")
    lease1, lease2 = world.lease("node-1"), world.lease("node-2")

    async def follower_term(token: worklease.Token) -> None:
        print("node-2: fires the jobs (never happens: node-1 leads)")

    async def leader_term(token: worklease.Token) -> None:
        await fire_jobs(lease1, token, 1)
        print("node-2: stands for election while node-1 leads")
        try:
            await node(lease2, work_id).run(follower_term)
        except worklease.LeaseHeldError as exc:
            print(f"node-2: not elected: LeaseHeldError (leader {exc.holder_id}); skips the round")

    await node(lease1, work_id).run(leader_term)


async def failover(world: World, work_id: str) -> None:
    print("\n== 2. standby failover after the leader crashes")
    lease1, lease2 = world.lease("node-1", lapses=True), world.lease("node-2")
    token = await lease1.acquire(work_id)
    print(f"node-1: elected leader (token {token.fencing_token})")
    print("node-1: crashes: nothing renews or releases its lease until the TTL runs out")
    world.lapse()

    async def standby_term(token: worklease.Token) -> None:
        prior = await lease2.read_checkpoint(token)
        print(f"node-2: previous leader {prior.prev_holder_id} left {prior.prev_exit}")
        await fire_jobs(lease2, token, 2)

    print("node-2: stands by, waiting for the lease")
    await node(lease2, work_id, standby=True).run(standby_term)


async def stalled_leader(world: World, work_id: str) -> None:
    print("\n== 3. a stalled leader is fenced")
    lease1, lease2 = world.lease("node-1", lapses=True), world.lease("node-2")
    successor: list[worklease.Token] = []

    async def standby_term(token: worklease.Token) -> None:
        successor.append(token)
        prior = await lease2.read_checkpoint(token)
        print(f"node-2: previous leader {prior.prev_holder_id} left {prior.prev_exit}")
        await fire_jobs(lease2, token, 4)

    async def stalling_term(token: worklease.Token) -> None:
        await fire_jobs(lease1, token, 3)
        print("node-1: stalls (its renewals too); its lease lapses")
        world.lapse()
        await node(lease2, work_id, standby=True).run(standby_term)
        print("node-1: wakes up and claims tick 4")
        await fire_jobs(lease1, token, 4)  # FencedError: the claim is rejected

    # A renewal interval far beyond the TTL stands in for renewals that stall with the node.
    try:
        await node(lease1, work_id, renewal_interval=3600).run(stalling_term)
    except worklease.FencedError:
        print("node-1: fenced: FencedError; nothing fired, nothing released")
    await lease2.forget(successor[0])  # tidy up: rows outlive their holders


async def run(world: World) -> None:
    work_id = "nightly-scheduler" + world.suffix
    await fail_fast(world, work_id)
    await failover(world, work_id)
    await stalled_leader(world, work_id)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", help="run against this PostgreSQL database instead of in memory")
    args = parser.parse_args()
    if args.dsn is None:
        clock = FakeClock()
        memory = worklease.AsyncMemoryBackend(clock=clock)
        await run(World(memory, clock, ttl=30, lapsing_ttl=30, suffix=""))
        return
    async with worklease.AsyncPostgresBackend.connect(args.dsn) as backend:
        await worklease.AsyncPostgresBackend.apply_schema(backend.pool)
        await run(World(backend, None, ttl=30, lapsing_ttl=3, suffix="-" + secrets.token_hex(4)))


if __name__ == "__main__":
    asyncio.run(main())
