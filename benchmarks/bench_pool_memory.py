#!/usr/bin/env python
"""Client memory per held lease of an asyncio pool, measured with tracemalloc and RSS.

One ``AsyncPool`` over ``--work-ids`` N work IDs holds ``--held`` of them (``max_work_ids``,
as one member of a group of N / held processes would; default: all), every work function
waiting until the pool stops, on the in-memory backend (``--backend memory``: what the
library itself keeps, without a driver) or on PostgreSQL (``--dsn``: psycopg's share too).

Measured once the pool holds what it should and two scans more passed:

- *tracemalloc*: the bytes Python allocated since the pool was built (the work-ID list and
  the backend's own rows excluded: the in-memory backend's store is the server's memory, not
  the client's), divided by the leases held; and where they went, by source file;
- *RSS*: the process's resident set growth since the same moment, per held lease (includes
  the interpreter's free lists and arenas: what an operator sees).

Results: ``benchmarks/results/pool_memory.{md,json}``. The script reports; it never fails
on a target.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--work-ids", type=int, default=100_000)
    parser.add_argument("--held", type=int, default=0, help="leases to hold (0: all)")
    parser.add_argument("--backend", choices=("memory", "postgres"), default="memory")
    parser.add_argument("--dsn", default="host=127.0.0.1 user=postgres dbname=test")
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--label", default="")
    parser.add_argument(
        "--src", type=Path, default=REPO / "src", help="import worklease from here (an old tree)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    return parser.parse_args()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(args.src))
    import worklease

    ids = [f"scale/{i:06d}" for i in range(args.work_ids)]
    held_goal = args.held or args.work_ids
    if args.backend == "memory":
        backend: Any = worklease.AsyncMemoryBackend()
    else:
        backend = worklease.AsyncPostgresBackend.connect(args.dsn)
        await backend.open()
        await backend.apply_schema()
    stopped = asyncio.Event()

    async def hold(token: worklease.Token, prior: worklease.Checkpoint) -> None:
        await stopped.wait()

    gc.collect()
    tracemalloc.start(1)
    base_trace = tracemalloc.take_snapshot()
    base_rss = rss_bytes()
    lease = worklease.AsyncLease(backend, holder_id=f"memory-{os.getpid()}", ttl=args.ttl)
    pool = worklease.AsyncPool(
        lease,
        ids,
        hold,
        idle_interval=0.5,
        max_work_ids=args.held or None,
    )
    runner = asyncio.create_task(pool.run())
    started = time.monotonic()
    while len(pool.active_slots()) < held_goal:
        if time.monotonic() - started > args.timeout or runner.done():
            break
        await asyncio.sleep(0.2)
    covered_s = time.monotonic() - started
    ended = None
    if runner.done():  # the pool's run ended by itself before holding what it should
        ended = repr(runner.exception()) if not runner.cancelled() else "cancelled"
    await asyncio.sleep(1.5)  # a few more scans and a renewal round
    held = len(pool.active_slots())
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    rss = rss_bytes()
    # The in-memory backend's store is the "server": its allocations are left out.
    store = str(Path(worklease.__file__).parent / "_memory.py")
    by_file: Counter[str] = Counter()
    total = 0
    for stat in snapshot.compare_to(base_trace, "filename"):
        name = stat.traceback[0].filename
        if args.backend == "memory" and name == store:
            continue
        by_file[name] += stat.size_diff
        total += stat.size_diff
    tracemalloc.stop()
    pool.stop()
    stopped.set()
    if not runner.done() or not runner.cancelled():
        with contextlib.suppress(Exception):
            await runner
    if args.backend != "memory":
        await backend.close()
    root = str(REPO)

    def short(name: str) -> str:
        return name.replace(root + "/", "").replace(sys.prefix + "/", "")

    return {
        "label": args.label,
        "backend": args.backend,
        "work_ids": args.work_ids,
        "held": held,
        "covered_s": round(covered_s, 2),
        "run_ended_early": ended,
        "traced_bytes_per_lease": round(total / max(held, 1)),
        "rss_bytes_per_lease": round((rss - base_rss) / max(held, 1)),
        "by_file_bytes_per_lease": {
            short(name): round(size / max(held, 1))
            for name, size in by_file.most_common(12)
            if size > 0
        },
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def main() -> int:
    args = parse_args()
    result = asyncio.run(measure(args))
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / "pool_memory.json"
    runs = json.loads(path.read_text()) if path.exists() else []
    runs = [
        r
        for r in runs
        if (r["label"], r["backend"], r["work_ids"], r["held"])
        != (result["label"], result["backend"], result["work_ids"], result["held"])
    ]
    runs.append(result)
    path.write_text(json.dumps(runs, indent=2) + "\n")
    lines = [
        "# Client memory per held lease (one asyncio pool)",
        "",
        "tracemalloc: bytes allocated since the pool was built, per held lease (the in-memory "
        "backend's store left out); RSS: resident set growth over the same time, per held "
        "lease. `benchmarks/bench_pool_memory.py`.",
        "",
        "| label | backend | N | held | covered | tracemalloc / lease | RSS / lease | "
        "largest shares (bytes / lease) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        shares = ", ".join(f"{k}: {v}" for k, v in list(r["by_file_bytes_per_lease"].items())[:5])
        lines.append(
            f"| {r['label']} | {r['backend']} | {r['work_ids']:,} | {r['held']:,} | "
            f"{r['covered_s']} s | {r['traced_bytes_per_lease']:,} B | "
            f"{r['rss_bytes_per_lease']:,} B | {shares} |"
        )
    (args.output / "pool_memory.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
