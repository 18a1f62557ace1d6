#!/usr/bin/env python
"""etcd beside PostgreSQL: per-operation latency and handoff latency, in one run.

Per operation, each through ``Lease`` (what users call), sync and async:

- **etcd**: ``EtcdBackend`` on a private 3-member etcd cluster (loopback, data in memory
  where /dev/shm exists, etcd's default timings);
- **etcd by hand**: the same effect written directly against etcd's JSON gateway with httpx's
  defaults, the least a user would send: acquire = lease grant + put-if-absent txn; checkpoint
  = keepalive (etcd extends a lease only so) + txn comparing the key's revision + put; read =
  range; renew = one keepalive (no check that the key is still held); release = txn comparing
  the revision + delete;
- **PostgreSQL**: ``PostgresBackend`` on the local server (the same machine, the same run).

Sides take turns in blocks, so drift hits them alike. Handoff: a successor waits in
``acquire(wait=True)`` with a 30 s poll interval; from just before the holder's ``release``
until the successor's ``acquire`` returns (etcd: the watch API; PostgreSQL: LISTEN/NOTIFY).

Results: ``benchmarks/results/etcd.md`` and ``etcd.json``; ``nox -s bench`` runs it. The
script reports; it never fails on a number.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_ops import RESULTS, default_dsn, environment, fresh_database  # noqa: E402

from tests import etcd  # noqa: E402
from worklease import (  # noqa: E402
    AsyncEtcdBackend,
    AsyncLease,
    AsyncPostgresBackend,
    EtcdBackend,
    ExitMode,
    Lease,
    PostgresBackend,
)

OPERATIONS = ("acquire+release", "checkpoint", "read_checkpoint", "renew")
POLL = 30.0


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "median_us": statistics.median(ordered) * 1e6,
        "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6,
    }


# -- the sides -------------------------------------------------------------------------------


Call = Iterator[tuple[str, dict[str, Any]]]
"""A hand-written operation: yields each request (path, body) and is sent its answer."""


class HandEtcd:
    """A user's own etcd calls over httpx with its defaults (one client, keep-alive): the
    requests of each operation, sent by ``run`` (sync) or ``arun`` (async)."""

    def __init__(self, endpoint: str, ttl: int) -> None:
        self.base = endpoint
        self.ttl = ttl
        self.key = b64(f"hand/{uuid.uuid4().hex}".encode())
        self.lease = 0
        self.revision = 0

    def _guarded(self, op: dict[str, Any]) -> dict[str, Any]:
        compare = {"key": self.key, "target": "MOD", "mod_revision": str(self.revision)}
        return {"compare": [compare | {"result": "EQUAL"}], "success": [op]}

    def acquire(self) -> Generator[tuple[str, dict[str, Any]], dict[str, Any], None]:
        self.lease = int((yield "/v3/lease/grant", {"TTL": self.ttl})["ID"])
        absent = {"key": self.key, "target": "CREATE", "create_revision": "0", "result": "EQUAL"}
        put = {"request_put": {"key": self.key, "value": b64(b"me"), "lease": self.lease}}
        answer = yield "/v3/kv/txn", {"compare": [absent], "success": [put]}
        assert answer.get("succeeded"), answer
        self.revision = int(answer["header"]["revision"])

    def checkpoint(
        self, state: bytes
    ) -> Generator[tuple[str, dict[str, Any]], dict[str, Any], None]:
        # The state and an extended expiry: etcd extends a lease only by a keepalive.
        yield "/v3/lease/keepalive", {"ID": str(self.lease)}
        put = {"request_put": {"key": self.key, "value": b64(state), "lease": self.lease}}
        answer = yield "/v3/kv/txn", self._guarded(put)
        assert answer.get("succeeded"), answer
        self.revision = int(answer["header"]["revision"])

    def read(self) -> Generator[tuple[str, dict[str, Any]], dict[str, Any], None]:
        yield "/v3/kv/range", {"key": self.key}

    def renew(self) -> Generator[tuple[str, dict[str, Any]], dict[str, Any], None]:
        yield "/v3/lease/keepalive", {"ID": str(self.lease)}

    def release(self) -> Generator[tuple[str, dict[str, Any]], dict[str, Any], None]:
        yield "/v3/kv/txn", self._guarded({"request_delete_range": {"key": self.key}})

    def acquire_release(self) -> Generator[tuple[str, dict[str, Any]], dict[str, Any], None]:
        yield from self.acquire()
        yield from self.release()


def run_call(client: httpx.Client, base: str, call: Generator[Any, Any, None]) -> None:
    try:
        path, body = next(call)
        while True:
            path, body = call.send(client.post(base + path, json=body).json())
    except StopIteration:
        pass


async def arun_call(client: httpx.AsyncClient, base: str, call: Generator[Any, Any, None]) -> None:
    try:
        path, body = next(call)
        while True:
            path, body = call.send((await client.post(base + path, json=body)).json())
    except StopIteration:
        pass


def hand_steps(
    client: httpx.Client, cycle: HandEtcd, held: HandEtcd, state: bytes
) -> dict[str, Callable[[], object]]:
    """``cycle`` acquires and releases its key; ``held`` holds its own for the rest."""
    run_call(client, held.base, held.acquire())
    return {
        "acquire+release": lambda: run_call(client, cycle.base, cycle.acquire_release()),
        "checkpoint": lambda: run_call(client, held.base, held.checkpoint(state)),
        "read_checkpoint": lambda: run_call(client, held.base, held.read()),
        "renew": lambda: run_call(client, held.base, held.renew()),
    }


async def ahand_steps(
    client: httpx.AsyncClient, cycle: HandEtcd, held: HandEtcd, state: bytes
) -> dict[str, Callable[[], Awaitable[object]]]:
    await arun_call(client, held.base, held.acquire())
    return {
        "acquire+release": lambda: arun_call(client, cycle.base, cycle.acquire_release()),
        "checkpoint": lambda: arun_call(client, held.base, held.checkpoint(state)),
        "read_checkpoint": lambda: arun_call(client, held.base, held.read()),
        "renew": lambda: arun_call(client, held.base, held.renew()),
    }


def lease_steps(lease: Lease, work_id: str, state: bytes) -> dict[str, Callable[[], object]]:
    holder: dict[str, Any] = {"token": lease.acquire(work_id + "-held")}

    def acquire_release() -> None:
        token = lease.acquire(work_id)
        lease.release(token, ExitMode.FINISHED)

    return {
        "acquire+release": acquire_release,
        "checkpoint": lambda: lease.checkpoint(holder["token"], state),
        "read_checkpoint": lambda: lease.read_checkpoint(holder["token"]),
        "renew": lambda: lease.renew(holder["token"]),
    }


def alternate(
    sides: dict[str, Callable[[], object]], iterations: int, block: int, warmup: int
) -> dict[str, list[float]]:
    for fn in sides.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    done = 0
    while done < iterations:
        for name, fn in sides.items():
            for _ in range(block):
                start = perf_counter()
                fn()
                samples[name].append(perf_counter() - start)
        done += block
    return samples


async def aalternate(
    sides: dict[str, Callable[[], Awaitable[object]]], iterations: int, block: int, warmup: int
) -> dict[str, list[float]]:
    for fn in sides.values():
        for _ in range(warmup):
            await fn()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    done = 0
    while done < iterations:
        for name, fn in sides.items():
            for _ in range(block):
                start = perf_counter()
                await fn()
                samples[name].append(perf_counter() - start)
        done += block
    return samples


def alease_steps(
    lease: AsyncLease, token: Any, work_id: str, state: bytes
) -> dict[str, Callable[[], Awaitable[object]]]:
    async def acquire_release() -> None:
        fresh = await lease.acquire(work_id)
        await lease.release(fresh, ExitMode.FINISHED)

    return {
        "acquire+release": acquire_release,
        "checkpoint": lambda: lease.checkpoint(token, state),
        "read_checkpoint": lambda: lease.read_checkpoint(token),
        "renew": lambda: lease.renew(token),
    }


# -- handoff ---------------------------------------------------------------------------------


def handoff(holder_lease: Lease, successor_lease: Lease, work_id: str, rounds: int) -> list[float]:
    samples: list[float] = []
    for _ in range(rounds):
        token = holder_lease.acquire(work_id)
        got: dict[str, float] = {}
        ready = threading.Event()

        def wait(box: dict[str, float] = got, ready: threading.Event = ready) -> None:
            ready.set()
            successor = successor_lease.acquire(
                work_id, wait=True, timeout=POLL * 2, poll_interval=POLL
            )
            box["at"] = perf_counter()
            successor_lease.release(successor, ExitMode.FINISHED)

        thread = threading.Thread(target=wait)
        thread.start()
        ready.wait()
        threading.Event().wait(0.2)  # the successor is waiting (its first try was refused)
        start = perf_counter()
        holder_lease.release(token, ExitMode.FINISHED)
        thread.join(timeout=POLL * 2)
        samples.append(got["at"] - start)
    return samples


# -- run -------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    state = os.urandom(args.state_bytes)
    result: dict[str, Any] = {"rows": [], "handoff": {}}
    with etcd.cluster(3) as cluster, fresh_database(args.dsn) as (database, dsn):
        result["environment"] = environment(dsn, database)
        result["environment"]["etcd"] = httpx.get(cluster.endpoints[0] + "/version").json()
        result["environment"]["etcd_cluster"] = "3 members on loopback, data in memory"
        prefix = f"bench-{uuid.uuid4().hex[:8]}/"
        etcd_backend = EtcdBackend(cluster.endpoints, prefix=prefix)
        pg_backend = PostgresBackend.connect(dsn, min_size=1, max_size=4)
        pg_backend.open()
        # The member EtcdBackend talks to first (the first endpoint), so both sides pay
        # the same hops (a follower forwards to the leader).
        first = cluster.endpoints[0]
        hand_client = httpx.Client()
        hand = HandEtcd(first, int(args.ttl))
        hand_held = HandEtcd(first, int(args.ttl))
        try:
            sides = {
                "etcd": lease_steps(
                    Lease(etcd_backend, holder_id="bench", ttl=args.ttl), "e", state
                ),
                "etcd by hand": hand_steps(hand_client, hand, hand_held, state),
                "PostgreSQL": lease_steps(
                    Lease(pg_backend, holder_id="bench", ttl=args.ttl), "p", state
                ),
            }
            for operation in OPERATIONS:
                print(f"sync {operation} ...", file=sys.stderr, flush=True)
                samples = alternate(
                    {name: steps[operation] for name, steps in sides.items()},
                    args.iterations,
                    args.block,
                    args.warmup,
                )
                result["rows"].append(
                    {"flavour": "sync", "operation": operation}
                    | {name: stats(values) for name, values in samples.items()}
                )
            print("handoff ...", file=sys.stderr, flush=True)
            for name, backend in (("etcd", etcd_backend), ("PostgreSQL", pg_backend)):
                other = (
                    EtcdBackend(cluster.endpoints, prefix=prefix)
                    if name == "etcd"
                    else PostgresBackend.connect(dsn, min_size=1, max_size=2)
                )
                if isinstance(other, PostgresBackend):
                    other.open()
                try:
                    values = handoff(
                        Lease(backend, holder_id="holder", ttl=args.ttl),
                        Lease(other, holder_id="successor", ttl=args.ttl),
                        f"handoff-{name}",
                        args.handoffs,
                    )
                finally:
                    other.close()
                result["handoff"][name] = {
                    "n": len(values),
                    "median_ms": statistics.median(values) * 1e3,
                    "p99_ms": sorted(values)[min(len(values) - 1, int(len(values) * 0.99))] * 1e3,
                    "max_ms": max(values) * 1e3,
                }
        finally:
            hand_client.close()
            etcd_backend.close()
            pg_backend.close()
        asyncio.run(run_async(args, cluster.endpoints, dsn, state, result))
    return result


async def run_async(
    args: argparse.Namespace, endpoints: list[str], dsn: str, state: bytes, result: dict[str, Any]
) -> None:
    prefix = f"abench-{uuid.uuid4().hex[:8]}/"
    async with (
        AsyncEtcdBackend(endpoints, prefix=prefix) as etcd_backend,
        AsyncPostgresBackend.connect(dsn, min_size=1, max_size=4) as pg_backend,
        httpx.AsyncClient() as hand_client,
    ):
        etcd_lease = AsyncLease(etcd_backend, holder_id="bench", ttl=args.ttl)
        pg_lease = AsyncLease(pg_backend, holder_id="bench", ttl=args.ttl)
        sides = {
            "etcd": alease_steps(etcd_lease, await etcd_lease.acquire("ae-held"), "ae", state),
            "etcd by hand": await ahand_steps(
                hand_client,
                HandEtcd(endpoints[0], int(args.ttl)),
                HandEtcd(endpoints[0], int(args.ttl)),
                state,
            ),
            "PostgreSQL": alease_steps(pg_lease, await pg_lease.acquire("ap-held"), "ap", state),
        }
        for operation in OPERATIONS:
            print(f"async {operation} ...", file=sys.stderr, flush=True)
            samples = await aalternate(
                {name: steps[operation] for name, steps in sides.items()},
                args.iterations,
                args.block,
                args.warmup,
            )
            result["rows"].append(
                {"flavour": "async", "operation": operation}
                | {name: stats(values) for name, values in samples.items()}
            )


def render(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        "# etcd beside PostgreSQL",
        "",
        f"Run {env['started_at']}: Python {env['python']}, {env['cpus']} CPUs (client and "
        f"servers share them), etcd {env['etcd'].get('etcdserver')} ({env['etcd_cluster']}), "
        f"PostgreSQL {env['postgresql']} on {env['host']}. Medians / p99 in µs.",
        "",
        "| flavour | operation | etcd | etcd by hand (httpx) | PostgreSQL | etcd / by hand |"
        " etcd / PostgreSQL |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]

    def cell(side: dict[str, float] | None) -> str:
        return f"{side['median_us']:,.0f} / {side['p99_us']:,.0f}" if side else "-"

    for row in result["rows"]:
        ours, pg = row["etcd"], row["PostgreSQL"]
        hand = row.get("etcd by hand")
        by_hand = f"{ours['median_us'] / hand['median_us']:.2f}" if hand else "-"
        lines.append(
            f"| {row['flavour']} | {row['operation']} | {cell(ours)} | {cell(hand)} "
            f"| {cell(pg)} | {by_hand} | {ours['median_us'] / pg['median_us']:.2f} |"
        )
    lines += [
        "",
        "Handoff (sync; from just before the holder's release until the waiting successor's "
        f"acquire returns; poll interval {POLL:g} s, so only a notification explains a fast one):",
        "",
        "| backend | n | median ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, row in result["handoff"].items():
        lines.append(
            f"| {name} | {row['n']} | {row['median_ms']:.1f} | {row['p99_ms']:.1f} "
            f"| {row['max_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", default=default_dsn(), help="PostgreSQL server DSN")
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--block", type=int, default=25)
    parser.add_argument("--handoffs", type=int, default=30)
    parser.add_argument("--ttl", type=float, default=60.0)
    parser.add_argument("--state-bytes", type=int, default=256)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = run(args)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "etcd.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    text = render(result)
    (args.output / "etcd.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
