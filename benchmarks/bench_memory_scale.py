#!/usr/bin/env python
"""The in-memory backend's cost per operation as the number of held leases grows.

For each store size (``--sizes``, default 1,000 / 10,000 / 100,000 held leases, four holders)
one ``MemoryBackend`` / ``AsyncMemoryBackend`` is filled through ``acquire_many``, then one
more lease goes through each operation on its own work ID, through a ``Lease`` /
``AsyncLease`` as a user calls it: acquire (of a released work ID) + release, checkpoint
(256 bytes), renew, read_checkpoint. Operations alternate in blocks; every call is timed with
``perf_counter_ns``. The sizes run in one process, one after the other, so the figures are
side by side. Results go to ``benchmarks/results/memory_scale.{md,json}``. The script only
reports.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from worklease import AsyncLease, AsyncMemoryBackend, ExitMode, Lease, MemoryBackend

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (1_000, 10_000, 100_000)
OPERATIONS = ("acquire+release", "checkpoint", "renew", "read_checkpoint")
HOLDERS = 4


def _stats(samples: list[int]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"median_us": statistics.median(ordered) / 1000, "p99_us": p99 / 1000}


def fill_sync(backend: MemoryBackend, size: int) -> None:
    for holder in range(HOLDERS):
        ids = [f"held/{holder}/{i}" for i in range(holder, size, HOLDERS)]
        backend.acquire_many(ids, f"holder-{holder}", 3600.0)


async def fill_async(backend: AsyncMemoryBackend, size: int) -> None:
    for holder in range(HOLDERS):
        ids = [f"held/{holder}/{i}" for i in range(holder, size, HOLDERS)]
        await backend.acquire_many(ids, f"holder-{holder}", 3600.0)


def bench_sync(size: int, cfg: argparse.Namespace) -> dict[str, dict[str, float]]:
    backend = MemoryBackend()
    fill_sync(backend, size)
    lease = Lease(backend, holder_id="bench", ttl=3600.0)
    state = os.urandom(256)
    token = lease.acquire("probe/held")

    def acquire_release() -> None:
        lease.release(lease.acquire("probe/cycle"), ExitMode.FINISHED)

    calls: dict[str, Callable[[], object]] = {
        "acquire+release": acquire_release,
        "checkpoint": lambda: lease.checkpoint(token, state),
        "renew": lambda: lease.renew(token),
        "read_checkpoint": lambda: lease.read_checkpoint(token),
    }
    samples: dict[str, list[int]] = {name: [] for name in OPERATIONS}
    for _ in range(cfg.blocks):
        for name in OPERATIONS:
            call = calls[name]
            out = samples[name]
            for _ in range(cfg.block):
                start = perf_counter_ns()
                call()
                out.append(perf_counter_ns() - start)
    lease.release(token, ExitMode.FINISHED)
    return {name: _stats(series) for name, series in samples.items()}


async def bench_async(size: int, cfg: argparse.Namespace) -> dict[str, dict[str, float]]:
    backend = AsyncMemoryBackend()
    await fill_async(backend, size)
    lease = AsyncLease(backend, holder_id="bench", ttl=3600.0)
    state = os.urandom(256)
    token = await lease.acquire("probe/held")

    async def acquire_release() -> None:
        await lease.release(await lease.acquire("probe/cycle"), ExitMode.FINISHED)

    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "acquire+release": acquire_release,
        "checkpoint": lambda: lease.checkpoint(token, state),
        "renew": lambda: lease.renew(token),
        "read_checkpoint": lambda: lease.read_checkpoint(token),
    }
    samples: dict[str, list[int]] = {name: [] for name in OPERATIONS}
    for _ in range(cfg.blocks):
        for name in OPERATIONS:
            call = calls[name]
            out = samples[name]
            for _ in range(cfg.block):
                start = perf_counter_ns()
                await call()
                out.append(perf_counter_ns() - start)
    await lease.release(token, ExitMode.FINISHED)
    return {name: _stats(series) for name, series in samples.items()}


def render(report: dict[str, Any]) -> str:
    env, cfg = report["environment"], report["settings"]
    sizes = cfg["sizes"]
    lines = [
        "# In-memory backend: cost per operation as held leases grow",
        "",
        f"Run {env['started_at']}: Python {env['python']}, {env['cpus']} CPUs. "
        f"{cfg['blocks']} blocks of {cfg['block']} calls per operation, the operations "
        "alternating; one lease through `Lease` / `AsyncLease` beside the store's other "
        "leases, four holders. µs, median / p99.",
        "",
        "| operation | flavour | " + " | ".join(f"{n:,} held" for n in sizes) + " |",
        "|---|---|" + "---:|" * len(sizes),
    ]
    for flavour in ("sync", "async"):
        for name in OPERATIONS:
            cells = []
            for size in sizes:
                stats = report["results"][flavour][str(size)][name]
                cells.append(f"{stats['median_us']:.1f} / {stats['p99_us']:.1f}")
            lines.append(f"| {name} | {flavour} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--output", type=Path, default=RESULTS)
    cfg = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {"sync": {}, "async": {}}
    for size in cfg.sizes:
        gc.collect()
        results["sync"][str(size)] = bench_sync(size, cfg)
        gc.collect()
        results["async"][str(size)] = asyncio.run(bench_async(size, cfg))
        print(f"{size:,} held: done", file=sys.stderr)
    report = {
        "settings": {"sizes": cfg.sizes, "blocks": cfg.blocks, "block": cfg.block},
        "environment": {
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_at_end": list(os.getloadavg()),
        },
        "results": results,
    }
    text = render(report)
    print(text)
    cfg.output.mkdir(parents=True, exist_ok=True)
    (cfg.output / "memory_scale.md").write_text(text, encoding="utf-8")
    (cfg.output / "memory_scale.json").write_text(
        json.dumps(report, indent=2) + "\n", encoding="utf-8"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
