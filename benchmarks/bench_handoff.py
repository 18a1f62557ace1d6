#!/usr/bin/env python
"""Handoff latency on PostgreSQL: how fast a waiting successor gets a work ID, both flavours.

Two scenarios, each with a holder and a successor on separate backends (separate pools and
release listeners, as two processes would have):

- **release**: the successor waits in ``acquire(wait=True)`` with a 30 s poll interval; the
  holder releases. Measured: from just before the holder's ``release`` call until the
  successor's ``acquire`` returns. Target: median ≤ 5 ms (the release is announced with
  ``NOTIFY`` and wakes the waiter; without it the wait would last the poll interval).
- **crash**: the holder acquires with a short TTL and vanishes without releasing (its
  backend is closed, as a killed process's connections would be). Measured: from the end of
  the holder's ``acquire`` until the successor's ``acquire`` returns, minus the TTL. Target:
  ≤ 100 ms over the TTL (a waiter sleeps until the holder's expiry, not a poll interval).

Results go to ``benchmarks/results/`` (``handoff.md``, ``handoff.json``, ``handoff.png``);
``nox -s bench`` runs it after ``bench_ops.py``. The run uses a fresh database and drops it.
The script reports; it never fails on a missed target.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import statistics
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

from bench_ops import RESULTS, default_dsn, environment, fresh_database

from worklease import (
    AsyncLease,
    AsyncPostgresBackend,
    ExitMode,
    Lease,
    LeaseObserver,
    PostgresBackend,
)
from worklease.observers import AcquireEvent

POLL = 30.0
"""The successor's poll interval: far longer than any handoff may take."""

TARGET_RELEASE_P50_MS = 5.0
TARGET_CRASH_OVER_TTL_MS = 100.0


@dataclass
class Series:
    scenario: str
    flavour: str
    samples_ms: list[float] = field(default_factory=list)
    target_ms: float = 0.0
    ttl_s: float | None = None

    def median(self) -> float:
        return statistics.median(self.samples_ms)

    def p99(self) -> float:
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

    def checked(self) -> float:
        """The figure the target applies to (release: median; crash: the worst case)."""
        return self.median() if self.scenario == "release" else max(self.samples_ms)


class FirstRefusal(LeaseObserver):
    """Signals once the successor's first attempt was refused: it is waiting from then on
    (its release watch is opened before that first attempt)."""

    def __init__(self) -> None:
        self.waiting = threading.Event()

    def on_acquire(self, event: AcquireEvent) -> None:
        if event.error is not None:
            self.waiting.set()


# -- sync ---------------------------------------------------------------------------------------


def sync_release(dsn: str, rounds: int) -> Series:
    series = Series("release", "sync", target_ms=TARGET_RELEASE_P50_MS)
    with PostgresBackend.connect(dsn) as holder_backend, PostgresBackend.connect(dsn) as other:
        holder = Lease(holder_backend, holder_id="holder", ttl=30)
        for index in range(rounds):
            work_id = f"handoff/sync/release/{index}"
            token = holder.acquire(work_id)
            refusal = FirstRefusal()
            successor = Lease(other, holder_id="successor", ttl=30, observer=refusal)
            got: list[float] = []

            def wait(
                work_id: str = work_id, successor: Lease = successor, got: list[float] = got
            ) -> None:
                successor.acquire(work_id, wait=True, poll_interval=POLL, timeout=POLL)
                got.append(perf_counter())

            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            if not refusal.waiting.wait(10):
                raise RuntimeError("the successor never tried to acquire")
            started = perf_counter()
            holder.release(token, ExitMode.FINISHED)
            thread.join(POLL + 5)
            if not got:
                raise RuntimeError("the successor did not acquire")
            series.samples_ms.append((got[0] - started) * 1000)
    return series


def sync_crash(dsn: str, rounds: int, ttl: float) -> Series:
    series = Series("crash", "sync", target_ms=TARGET_CRASH_OVER_TTL_MS, ttl_s=ttl)
    with PostgresBackend.connect(dsn) as other:
        for index in range(rounds):
            work_id = f"handoff/sync/crash/{index}"
            refusal = FirstRefusal()
            successor = Lease(other, holder_id="successor", ttl=30, observer=refusal)
            with PostgresBackend.connect(dsn) as doomed:
                Lease(doomed, holder_id="doomed", ttl=ttl).acquire(work_id)
                acquired_at = perf_counter()
            # The holder's backend is closed: nothing renews or releases the lease any more.
            successor.acquire(work_id, wait=True, poll_interval=POLL, timeout=POLL)
            series.samples_ms.append((perf_counter() - acquired_at - ttl) * 1000)
    return series


# -- async --------------------------------------------------------------------------------------


async def async_release(dsn: str, rounds: int) -> Series:
    series = Series("release", "async", target_ms=TARGET_RELEASE_P50_MS)
    async with (
        AsyncPostgresBackend.connect(dsn) as holder_backend,
        AsyncPostgresBackend.connect(dsn) as other,
    ):
        holder = AsyncLease(holder_backend, holder_id="holder", ttl=30)
        for index in range(rounds):
            work_id = f"handoff/async/release/{index}"
            token = await holder.acquire(work_id)
            refusal = FirstRefusal()
            successor = AsyncLease(other, holder_id="successor", ttl=30, observer=refusal)
            task = asyncio.create_task(
                successor.acquire(work_id, wait=True, poll_interval=POLL, timeout=POLL)
            )
            for _ in range(1000):
                if refusal.waiting.is_set():
                    break
                await asyncio.sleep(0.01)
            else:
                raise RuntimeError("the successor never tried to acquire")
            started = perf_counter()
            await holder.release(token, ExitMode.FINISHED)
            await task
            series.samples_ms.append((perf_counter() - started) * 1000)
    return series


async def async_crash(dsn: str, rounds: int, ttl: float) -> Series:
    series = Series("crash", "async", target_ms=TARGET_CRASH_OVER_TTL_MS, ttl_s=ttl)
    async with AsyncPostgresBackend.connect(dsn) as other:
        successor = AsyncLease(other, holder_id="successor", ttl=30)
        for index in range(rounds):
            work_id = f"handoff/async/crash/{index}"
            async with AsyncPostgresBackend.connect(dsn) as doomed:
                await AsyncLease(doomed, holder_id="doomed", ttl=ttl).acquire(work_id)
                acquired_at = perf_counter()
            await successor.acquire(work_id, wait=True, poll_interval=POLL, timeout=POLL)
            series.samples_ms.append((perf_counter() - acquired_at - ttl) * 1000)
    return series


# -- output -------------------------------------------------------------------------------------


def render_markdown(results: list[Series], env: dict[str, Any], rounds: dict[str, int]) -> str:
    lines = [
        "# Handoff latency on PostgreSQL",
        "",
        f"Run {env['started_at']}: PostgreSQL {env['postgresql']} on {env['host']}, Python "
        f"{env['python']}, {env['cpus']} CPUs. {rounds['release']} release rounds and "
        f"{rounds['crash']} crash rounds per flavour; the successor polls every {POLL:g} s.",
        "",
        "Release: from the holder's `release` call to the waiting successor's `acquire` "
        "returning. Crash: from the end of the holder's `acquire` (it then vanishes) to the "
        "successor's `acquire` returning, minus the TTL. Times in ms.",
        "",
        "| scenario | flavour | median | p99 | max | target | result |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for series in results:
        if series.scenario == "release":
            target = f"median ≤ {series.target_ms:g} ms"
            name = "release → successor acquired"
        else:
            target = f"max ≤ TTL + {series.target_ms:g} ms"
            name = f"crash → successor acquired, over the TTL ({series.ttl_s:g} s)"
        verdict = "pass" if series.checked() <= series.target_ms else "FAIL"
        lines.append(
            f"| {name} | {series.flavour} | {series.median():.2f} | {series.p99():.2f} | "
            f"{max(series.samples_ms):.2f} | {target} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def render_chart(results: list[Series], path: Path) -> str | None:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return "matplotlib not installed (pip install -e . --group bench): no chart"
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for axis, scenario in zip(axes, ("release", "crash"), strict=True):
        chosen = [series for series in results if series.scenario == scenario]
        axis.boxplot(
            [series.samples_ms for series in chosen],
            tick_labels=[series.flavour for series in chosen],
        )
        target = chosen[0].target_ms if chosen else 0.0
        axis.axhline(target, color="red", linestyle="--", label=f"target {target:g} ms")
        axis.set_title(
            "release → successor (ms)"
            if scenario == "release"
            else "crash → successor minus TTL (ms)"
        )
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--dsn", default=default_dsn(), help="server to create the database on")
    parser.add_argument("--rounds", type=int, default=100, help="release rounds per flavour")
    parser.add_argument("--crash-rounds", type=int, default=5, help="crash rounds per flavour")
    parser.add_argument("--ttl", type=float, default=1.0, help="TTL of the crashing holder (s)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--skip-chart", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    output: Path = args.output
    output.mkdir(parents=True, exist_ok=True)
    with fresh_database(args.dsn) as (database, dsn):
        env = environment(dsn, database)
        print(f"handoff benchmark in database {database}", file=sys.stderr, flush=True)
        results = [
            sync_release(dsn, args.rounds),
            asyncio.run(async_release(dsn, args.rounds)),
            sync_crash(dsn, args.crash_rounds, args.ttl),
            asyncio.run(async_crash(dsn, args.crash_rounds, args.ttl)),
        ]
    env["load_average_at_end"] = list(os.getloadavg())
    rounds = {"release": args.rounds, "crash": args.crash_rounds}
    markdown = render_markdown(results, env, rounds)
    (output / "handoff.md").write_text(markdown, encoding="utf-8")
    payload = {
        "environment": env,
        "rounds": rounds,
        "poll_interval_s": POLL,
        "series": [
            {**asdict(series), "median_ms": series.median(), "p99_ms": series.p99()}
            for series in results
        ],
    }
    (output / "handoff.json").write_text(json.dumps(payload, indent=2) + "\n")
    if not args.skip_chart:
        why = render_chart(results, output / "handoff.png")
        if why:
            print(why, file=sys.stderr)
    print(markdown)
    print(f"results written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
