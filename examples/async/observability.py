"""Observability: a lease observer and a vacuum observer that aggregate metrics.

``Metrics`` subclasses both LeaseObserver and VacuumObserver and keeps, per operation, the
number of calls and errors and the average latency (from each event's ``duration``), the hold
time of every lease (from its acquire to its release, keyed by fencing token), the fencing
events, and the sweeps. The script drives a few leases and prints the report:

1. worker-a runs invoice-run to the end (acquire, read, checkpoint, renew, checkpoint,
   release);
2. worker-a takes export-run and stalls; its lease lapses, worker-b takes over, worker-c
   fails to acquire it (held), and worker-a's next checkpoint is fenced; worker-b retires it;
3. the vacuum sweeps retired rows older than the retention.

By default it runs on the in-memory backend with a fake clock, so hold times are exact. With
--dsn it runs against PostgreSQL with a 3-second TTL; there the sweep uses a retention of ten
years, so it deletes nothing that belongs to anybody else.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import worklease
from worklease.testing import FakeClock


class Metrics(worklease.LeaseObserver, worklease.VacuumObserver):
    """Aggregates lease and vacuum events. Observers are called from whichever task or
    thread did the work (renewals included), so everything is guarded by a lock."""

    def __init__(self, now: Callable[[], datetime]) -> None:
        self._now = now
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.latency: defaultdict[str, float] = defaultdict(float)  # seconds per operation
        self.open_holds: dict[int, tuple[str, datetime]] = {}  # fencing token -> holder, start
        self.holds: list[tuple[int, str, timedelta]] = []
        self.fenced: list[str] = []
        self.swept = 0

    def _count(self, operation: str, duration: float, error: BaseException | None) -> None:
        with self._lock:
            self.calls[operation] += 1
            self.latency[operation] += duration
            if error is not None:
                self.errors[operation] += 1

    def on_acquire(self, event: worklease.AcquireEvent) -> None:
        self._count("acquire", event.duration, event.error)
        if event.token is not None:
            with self._lock:
                holder = (event.token.holder_id, self._now())
                self.open_holds[event.token.fencing_token] = holder

    def on_read_checkpoint(self, event: worklease.ReadCheckpointEvent) -> None:
        self._count("read_checkpoint", event.duration, event.error)

    def on_checkpoint(self, event: worklease.CheckpointEvent) -> None:
        self._count("checkpoint", event.duration, event.error)

    def on_renew(self, event: worklease.RenewEvent) -> None:
        self._count("renew", event.duration, event.error)

    def on_release(self, event: worklease.ReleaseEvent) -> None:
        self._count("release", event.duration, event.error)
        if event.error is None:
            with self._lock:
                opened = self.open_holds.pop(event.token.fencing_token, None)
                if opened is not None:
                    held = self._now() - opened[1]
                    self.holds.append((event.token.fencing_token, opened[0], held))

    def on_forget(self, event: worklease.ForgetEvent) -> None:
        self._count("forget", event.duration, event.error)

    def on_fenced(self, event: worklease.FencedEvent) -> None:
        token = event.token
        with self._lock:
            self.fenced.append(
                f"{event.operation} by {token.holder_id} (token {token.fencing_token})"
            )

    def on_sweep(self, event: worklease.SweepEvent) -> None:
        self._count("sweep", event.duration, event.error)
        with self._lock:
            self.swept += event.deleted

    def report(self) -> None:
        with self._lock:
            print(f"{'operation':<16} {'calls':>5} {'errors':>6}  avg latency")
            for operation, calls in sorted(self.calls.items()):
                average = self.latency[operation] / calls * 1000
                errors = self.errors[operation]
                print(f"{operation:<16} {calls:>5} {errors:>6}  {average:.3f} ms")
            print("hold times (acquire to release):")
            for fencing_token, holder, held in sorted(self.holds):
                seconds = held.total_seconds()
                print(f"  token {fencing_token} ({holder}): {seconds:.2f} s")
            for fencing_token, (holder, _) in sorted(self.open_holds.items()):
                print(f"  token {fencing_token} ({holder}): never released")
            print(f"fencing events: {len(self.fenced)}")
            for fenced in self.fenced:
                print(f"  {fenced}")
            print(f"rows swept: {self.swept}")


@dataclass
class World:
    """Where the example runs: the backend, and how time passes for it."""

    backend: worklease.AsyncBackend
    clock: FakeClock | None  # the in-memory backend's clock; None on PostgreSQL
    ttl: float
    suffix: str  # keeps work IDs unique per run on a shared database
    retention: timedelta  # how long the vacuum keeps retired rows

    def now(self) -> datetime:
        return self.clock.now() if self.clock is not None else datetime.now(UTC)

    def spend(self, seconds: float) -> None:
        """Let time pass while a holder works (only the fake clock moves)."""
        if self.clock is not None:
            self.clock.advance(seconds)

    def lapse(self) -> None:
        """Let the leases taken so far lapse.

        In memory the fake clock jumps past the TTL. On PostgreSQL time passes for real:
        the successor's waiting acquire waits the TTL out.
        """
        self.spend(self.ttl + 1)


async def run(world: World) -> None:
    metrics = Metrics(world.now)

    def lease(holder_id: str) -> worklease.AsyncLease:
        return worklease.AsyncLease(
            world.backend, holder_id=holder_id, ttl=world.ttl, observer=metrics
        )

    worker_a, worker_b, worker_c = lease("worker-a"), lease("worker-b"), lease("worker-c")
    invoices, export = "invoice-run" + world.suffix, "export-run" + world.suffix

    print("== 1. worker-a runs invoice-run to the end")
    token = await worker_a.acquire(invoices)
    await worker_a.read_checkpoint(token)
    for step in (b"step 1", b"step 2"):
        world.spend(5)
        await worker_a.checkpoint(token, step)
        world.spend(5)
        await worker_a.renew(token)
    await worker_a.release(token, worklease.ExitMode.FINISHED)
    print(f"worker-a: token {token.fencing_token}: read, 2 checkpoints, 2 renewals, released")
    finished = token

    print("\n== 2. worker-a stalls on export-run and is fenced")
    stale = await worker_a.acquire(export)
    await worker_a.checkpoint(stale, b"part 1")
    print(f"worker-a: token {stale.fencing_token}: checkpointed, then stalls; its lease lapses")
    world.lapse()
    token = await worker_b.acquire(export, wait=True, timeout=30, poll_interval=0.1)
    prior = await worker_b.read_checkpoint(token)
    print(f"worker-b: token {token.fencing_token}: previous exit {prior.prev_exit}")
    try:
        await worker_c.acquire(export)
    except worklease.LeaseHeldError as exc:
        print(f"worker-c: LeaseHeldError (held by {exc.holder_id})")
    try:
        await worker_a.checkpoint(stale, b"part 2")
    except worklease.FencedError:
        print("worker-a: checkpoint rejected: FencedError")
    world.spend(3)
    await worker_b.release(token, worklease.ExitMode.RETIRED)
    print(f"worker-b: token {token.fencing_token}: released as retired")
    retired = token

    print("\n== 3. the vacuum sweeps retired rows")
    world.spend(world.retention.total_seconds() + 1)
    deleted = await worklease.AsyncVacuum(world.backend, observer=metrics).sweep(world.retention)
    print(f"vacuum: {deleted} row(s) deleted")

    print()
    metrics.report()
    if world.clock is None:  # tidy up on PostgreSQL: rows outlive their holders
        await worker_a.forget(finished)
        await worker_b.forget(retired)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", help="run against this PostgreSQL database instead of in memory")
    args = parser.parse_args()
    if args.dsn is None:
        clock = FakeClock()
        backend = worklease.AsyncMemoryBackend(clock=clock)
        await run(World(backend, clock, ttl=30, suffix="", retention=timedelta(days=1)))
        return
    async with worklease.AsyncPostgresBackend.connect(args.dsn) as pg:
        await worklease.AsyncPostgresBackend.apply_schema(pg.pool)
        suffix = "-" + secrets.token_hex(4)
        await run(World(pg, None, ttl=3, suffix=suffix, retention=timedelta(days=3650)))


if __name__ == "__main__":
    asyncio.run(main())
