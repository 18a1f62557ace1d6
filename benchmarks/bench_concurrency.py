#!/usr/bin/env python
"""Checkpoint throughput under concurrency: group commit against the hand-written floor.

C concurrent holders (threads, or asyncio tasks) each hold their own work ID and checkpoint it
in a loop for ``--seconds`` seconds, on a pool of ``--pool-size`` connections (8). Four
sides, taking turns at every C, in both flavours:

- **worklease**: one lease object shared by the C holders (a checkpoint goes alone while the
  pool has a free connection; callers beyond that are grouped: one statement per round,
  ``checkpoint_many``);
- **two rounds**: the same with the group commit before issue 25 (a backend without
  ``write_lanes``: two writes or rounds in flight, whatever the pool's size);
- **without group commit**: the same, through a backend that lacks ``checkpoint_many`` (the
  design before group commit: one statement per call);
- **hand-written**: what a user writes without worklease: each holder takes a connection of
  the pool and sends its token-guarded UPDATE with psycopg's defaults.

Reported per side: checkpoints per second, latency median and p99 (every call timed with
``perf_counter_ns``). Results go to ``benchmarks/results/concurrency.{md,json,png}``. The run
uses a fresh database ``worklease_bench_<random>`` and drops it. It only reports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from time import perf_counter, perf_counter_ns
from typing import Any

from bench_ops import RESULTS, Stats, Texts, default_dsn, environment, fresh_database
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from worklease import AsyncLease, AsyncPostgresBackend, ExitMode, Lease, PostgresBackend, Token

CONCURRENCY = (1, 8, 32, 128)
SIDES = ("worklease", "two_rounds", "no_group", "hand")
FLAVOURS = ("sync", "async")
TARGETS_MARK = "<!-- targets -->"
"""Where the internal targets start: the guide includes the file up to here."""
TARGETS = {
    ("sync", 8): 0.90,
    ("async", 8): 0.90,
    ("sync", 32): 1.75,
    ("sync", 128): 2.0,
    ("async", 32): 2.5,
    ("async", 128): 3.0,
}
"""worklease / hand-written checkpoints per second (issue 25). C = 1 has none: the
per-operation bound of bench_ops.py governs a lone caller."""


class UngroupedBackend(PostgresBackend):
    """The backend without its batch checkpoint: every checkpoint is its own statement."""

    checkpoint_many = None  # type: ignore[assignment]


class AsyncUngroupedBackend(AsyncPostgresBackend):
    checkpoint_many = None  # type: ignore[assignment]


class TwoRoundsBackend(PostgresBackend):
    """The backend without its write lanes: the group commit design before issue 25 (two
    rounds in flight, whatever the pool's size)."""

    write_lanes = None  # type: ignore[assignment]


class AsyncTwoRoundsBackend(AsyncPostgresBackend):
    write_lanes = None  # type: ignore[assignment]


@dataclass
class Run:
    flavour: str
    concurrency: int
    side: str
    calls: int
    seconds: float
    latency: Stats

    @property
    def per_second(self) -> float:
        return self.calls / self.seconds


@dataclass
class Report:
    settings: dict[str, Any]
    environment: dict[str, Any] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)

    def find(self, flavour: str, concurrency: int, side: str) -> Run | None:
        for run in self.runs:
            if (run.flavour, run.concurrency, run.side) == (flavour, concurrency, side):
                return run
        return None


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _rotated(index: int) -> list[str]:
    """The sides in the order of slice ``index``: each side goes first as often."""
    shift = index % len(SIDES)
    return [*SIDES[shift:], *SIDES[:shift]]


def _params(token: Token, state: bytes, ttl: timedelta) -> dict[str, Any]:
    return {"work_id": token.work_id, "token": token.fencing_token, "state": state, "ttl": ttl}


def _hand_step(
    pool: ConnectionPool[Any], query: bytes, params: list[dict[str, Any]]
) -> Callable[[int], None]:
    def step(index: int) -> None:
        with pool.connection() as conn:
            if not conn.execute(query, params[index]).fetchall():
                raise RuntimeError("hand-written checkpoint matched no row")

    return step


def _lease_step(lease: Lease, tokens: list[Token], state: bytes) -> Callable[[int], None]:
    def step(index: int) -> None:
        lease.checkpoint(tokens[index], state)

    return step


def _ahand_step(
    pool: AsyncConnectionPool[Any], query: bytes, params: list[dict[str, Any]]
) -> Callable[[int], Awaitable[None]]:
    async def step(index: int) -> None:
        async with pool.connection() as conn:
            cursor = await conn.execute(query, params[index])
            if not await cursor.fetchall():
                raise RuntimeError("hand-written checkpoint matched no row")

    return step


def _alease_step(
    lease: AsyncLease, tokens: list[Token], state: bytes
) -> Callable[[int], Awaitable[None]]:
    async def step(index: int) -> None:
        await lease.checkpoint(tokens[index], state)

    return step


# -- the sync flavour ---------------------------------------------------------------------------


def _threads(count: int, seconds: float, step: Callable[[int], None]) -> tuple[list[int], float]:
    """Run ``step(i)`` in a loop on ``count`` threads for ``seconds``; every call's time."""
    samples: list[list[int]] = [[] for _ in range(count)]
    start_line = threading.Barrier(count + 1)
    stop = threading.Event()

    def loop(index: int) -> None:
        out = samples[index]
        start_line.wait()
        while not stop.is_set():
            begin = perf_counter_ns()
            step(index)
            out.append(perf_counter_ns() - begin)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    start_line.wait()
    began = perf_counter()
    stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return [s for out in samples for s in out], perf_counter() - began


def bench_sync(cfg: argparse.Namespace, dsn: str, report: Report) -> None:
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn,
        min_size=cfg.pool_size,
        max_size=cfg.pool_size,
        kwargs={"autocommit": True},
        open=False,
        name="bench-concurrency-sync",
    )
    pool.open(wait=True)
    hand = Texts.hand().checkpoint
    ttl = timedelta(seconds=cfg.ttl)
    state = os.urandom(cfg.state_bytes)
    try:
        for concurrency in cfg.concurrency:
            sides: dict[str, tuple[Lease, list[Token], Callable[[int], None]]] = {}
            for side in SIDES:
                prefix = f"sync/{concurrency}/{side}"
                backend = {"no_group": UngroupedBackend, "two_rounds": TwoRoundsBackend}.get(
                    side, PostgresBackend
                )(pool)
                lease = Lease(backend, holder_id="bench", ttl=cfg.ttl)
                tokens = [lease.acquire(f"{prefix}/{i}") for i in range(concurrency)]
                if side == "hand":
                    step = _hand_step(pool, hand, [_params(t, state, ttl) for t in tokens])
                else:
                    step = _lease_step(lease, tokens, state)
                for index in range(concurrency):  # warm every connection and plan
                    step(index)
                sides[side] = (lease, tokens, step)
            _progress(f"  sync C={concurrency}")
            samples: dict[str, list[int]] = {side: [] for side in SIDES}
            elapsed = dict.fromkeys(SIDES, 0.0)
            for slice_index in range(cfg.slices):  # the sides take turns: drift hits all
                for side in _rotated(slice_index):
                    got, seconds = _threads(concurrency, cfg.seconds / cfg.slices, sides[side][2])
                    samples[side] += got
                    elapsed[side] += seconds
            for side, (lease, tokens, _) in sides.items():
                report.runs.append(
                    Run(
                        "sync",
                        concurrency,
                        side,
                        len(samples[side]),
                        elapsed[side],
                        Stats.of(samples[side]),
                    )
                )
                for token in tokens:
                    lease.release(token, ExitMode.FINISHED)
                lease.backend.close()  # type: ignore[attr-defined]
    finally:
        pool.close()


# -- the asyncio flavour ------------------------------------------------------------------------


async def _tasks(count: int, seconds: float, step: Callable[[int], Any]) -> tuple[list[int], float]:
    samples: list[list[int]] = [[] for _ in range(count)]
    stop = asyncio.Event()

    async def loop(index: int) -> None:
        out = samples[index]
        while not stop.is_set():
            begin = perf_counter_ns()
            await step(index)
            out.append(perf_counter_ns() - begin)

    began = perf_counter()
    tasks = [asyncio.create_task(loop(i)) for i in range(count)]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    stop.set()
    await asyncio.gather(*tasks)
    return [s for out in samples for s in out], perf_counter() - began


async def bench_async(cfg: argparse.Namespace, dsn: str, report: Report) -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn,
        min_size=cfg.pool_size,
        max_size=cfg.pool_size,
        kwargs={"autocommit": True},
        open=False,
        name="bench-concurrency-async",
    )
    await pool.open(wait=True)
    hand = Texts.hand().checkpoint
    ttl = timedelta(seconds=cfg.ttl)
    state = os.urandom(cfg.state_bytes)
    try:
        for concurrency in cfg.concurrency:
            sides: dict[str, tuple[AsyncLease, list[Token], Callable[[int], Awaitable[None]]]] = {}
            for side in SIDES:
                prefix = f"async/{concurrency}/{side}"
                backend = {
                    "no_group": AsyncUngroupedBackend,
                    "two_rounds": AsyncTwoRoundsBackend,
                }.get(side, AsyncPostgresBackend)(pool)
                lease = AsyncLease(backend, holder_id="bench", ttl=cfg.ttl)
                tokens = [await lease.acquire(f"{prefix}/{i}") for i in range(concurrency)]
                if side == "hand":
                    astep = _ahand_step(pool, hand, [_params(t, state, ttl) for t in tokens])
                else:
                    astep = _alease_step(lease, tokens, state)
                for index in range(concurrency):
                    await astep(index)
                sides[side] = (lease, tokens, astep)
            _progress(f"  async C={concurrency}")
            samples: dict[str, list[int]] = {side: [] for side in SIDES}
            elapsed = dict.fromkeys(SIDES, 0.0)
            for slice_index in range(cfg.slices):
                for side in _rotated(slice_index):
                    got, seconds = await _tasks(
                        concurrency, cfg.seconds / cfg.slices, sides[side][2]
                    )
                    samples[side] += got
                    elapsed[side] += seconds
            for side, (lease, tokens, _) in sides.items():
                report.runs.append(
                    Run(
                        "async",
                        concurrency,
                        side,
                        len(samples[side]),
                        elapsed[side],
                        Stats.of(samples[side]),
                    )
                )
                for token in tokens:
                    await lease.release(token, ExitMode.FINISHED)
                await lease.backend.close()  # type: ignore[attr-defined]
    finally:
        await pool.close()


# -- output -------------------------------------------------------------------------------------


def _us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def verdict(report: Report, flavour: str, concurrency: int) -> tuple[float | None, str]:
    ours = report.find(flavour, concurrency, "worklease")
    hand = report.find(flavour, concurrency, "hand")
    if ours is None or hand is None:
        return None, "-"
    ratio = ours.per_second / hand.per_second
    goal = TARGETS.get((flavour, concurrency))
    if goal is None:
        return ratio, "-"
    return ratio, f"≥ {goal:.2f}: {'pass' if ratio >= goal else 'FAIL'}"


def render_markdown(report: Report) -> str:
    env, settings = report.environment, report.settings
    lines = [
        "# Checkpoint throughput under concurrency",
        "",
        f"Run {env.get('started_at', '?')}: PostgreSQL {env.get('postgresql', '?')} on "
        f"{env.get('host', '?')}, Python {env.get('python', '?')}, "
        f"psycopg {env.get('packages', {}).get('psycopg', '?')}, {env.get('cpus', '?')} CPUs "
        "shared by client and server. "
        f"{settings['seconds']:g} s per side and concurrency (in {settings['slices']} turns, "
        "the sides alternating), a pool of "
        f"{settings['pool_size']} connections, checkpoint state {settings['state_bytes']} bytes.",
        "",
        "C holders each checkpoint their own work ID in a loop. **worklease**: one lease "
        "object shared by all (group commit: a checkpoint goes alone while the pool has a "
        "free connection, the callers beyond it share batch rounds); **two rounds**: the "
        "same with the rule of group commit before issue 25 (two rounds in flight whatever the "
        "pool's size; the batches' arrays in binary, as now); **no group**: through a "
        "backend without `checkpoint_many` (one "
        "statement per call, the design before group commit); **hand**: each holder sends "
        "its token-guarded UPDATE on a pool connection with psycopg's defaults. Throughput "
        "in checkpoints/s; latency of one call in µs (median / p99). Ratio = worklease / "
        "hand.",
        "",
        "| flavour | C | worklease /s | two rounds /s | no group /s | hand /s | ratio "
        "| worklease µs | two rounds µs | hand µs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = [
        "",
        TARGETS_MARK,
        "",
        "Targets (issue 25; ratio worklease / hand):",
        "",
        "| flavour | C | ratio | target |",
        "|---|---:|---:|---|",
    ]
    for flavour in FLAVOURS:
        for concurrency in settings["concurrency"]:
            runs = {side: report.find(flavour, concurrency, side) for side in SIDES}
            if all(run is None for run in runs.values()):
                continue
            ratio, goal = verdict(report, flavour, concurrency)

            def rate(run: Run | None) -> str:
                return "-" if run is None else f"{run.per_second:,.0f}"

            def latency(run: Run | None) -> str:
                if run is None:
                    return "-"
                return f"{_us(run.latency.median_us)} / {_us(run.latency.p99_us)}"

            shown = "-" if ratio is None else f"{ratio:.2f}"
            lines.append(
                f"| {flavour} | {concurrency} | {rate(runs['worklease'])} "
                f"| {rate(runs['two_rounds'])} | {rate(runs['no_group'])} "
                f"| {rate(runs['hand'])} | {shown} "
                f"| {latency(runs['worklease'])} | {latency(runs['two_rounds'])} "
                f"| {latency(runs['hand'])} |"
            )
            if goal != "-":
                verdicts.append(f"| {flavour} | {concurrency} | {shown} | {goal} |")
    lines += verdicts
    for flavour in FLAVOURS:
        ours = report.find(flavour, 32, "worklease")
        hand = report.find(flavour, 32, "hand")
        if ours is not None and hand is not None:
            ok = ours.latency.p99_us <= hand.latency.p99_us
            lines.append("")
            lines.append(
                f"p99 at C = 32, {flavour}: worklease {_us(ours.latency.p99_us)} µs, hand "
                f"{_us(hand.latency.p99_us)} µs: {'pass' if ok else 'FAIL'}."
            )
    return "\n".join(lines) + "\n"


def render_chart(report: Report, path: Path) -> str | None:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return "matplotlib not installed (pip install -e . --group bench): no chart"
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), dpi=120, sharey=True)
    styles = {"worklease": "-o", "two_rounds": "-.d", "no_group": "--s", "hand": ":^"}
    labels = {
        "worklease": "worklease (group commit)",
        "two_rounds": "two rounds (the rule before issue 25)",
        "no_group": "no group commit",
        "hand": "hand-written",
    }
    for ax, flavour in zip(axes, FLAVOURS, strict=True):
        for side in SIDES:
            points = [
                (run.concurrency, run.per_second)
                for c in report.settings["concurrency"]
                if (run := report.find(flavour, c, side)) is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, styles[side], label=labels[side])
        ax.set_xscale("log", base=2)
        ax.set_xticks(
            report.settings["concurrency"], [str(c) for c in report.settings["concurrency"]]
        )
        ax.set_xlabel("concurrent holders (C)")
        ax.set_title(flavour)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("checkpoints per second")
    axes[0].legend(loc="upper left")
    fig.suptitle(f"checkpoint throughput, {report.settings['pool_size']}-connection pool")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def render_json(report: Report) -> dict[str, Any]:
    return {
        "settings": report.settings,
        "environment": report.environment,
        "runs": [
            {
                **{k: v for k, v in asdict(run).items() if k != "latency"},
                "per_second": run.per_second,
                "latency": asdict(run.latency),
            }
            for run in report.runs
        ],
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", default=default_dsn(), help="server to use (needs CREATEDB)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per side and concurrency")
    parser.add_argument(
        "--slices",
        type=int,
        default=20,
        help="turns the sides take within those seconds (short turns spread the machine's "
        "drift over every side)",
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=list(CONCURRENCY), help="values of C"
    )
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--ttl", type=float, default=60.0)
    parser.add_argument("--state-bytes", type=int, default=256)
    parser.add_argument("--flavour", choices=(*FLAVOURS, "both"), default="both")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--skip-chart", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(
        settings={
            "seconds": args.seconds,
            "slices": args.slices,
            "concurrency": list(args.concurrency),
            "pool_size": args.pool_size,
            "ttl_s": args.ttl,
            "state_bytes": args.state_bytes,
        }
    )
    output: Path = args.output
    output.mkdir(parents=True, exist_ok=True)
    with fresh_database(args.dsn) as (database, dsn):
        _progress(f"benchmarking in database {database}")
        report.environment = environment(dsn, database)
        if args.flavour in ("sync", "both"):
            bench_sync(args, dsn, report)
        if args.flavour in ("async", "both"):
            asyncio.run(bench_async(args, dsn, report))
    report.environment["load_average_at_end"] = list(os.getloadavg())
    (output / "concurrency.md").write_text(render_markdown(report), encoding="utf-8")
    (output / "concurrency.json").write_text(json.dumps(render_json(report), indent=2) + "\n")
    if not args.skip_chart:
        why = render_chart(report, output / "concurrency.png")
        if why:
            _progress(why)
    print(render_markdown(report))
    print(f"results written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
