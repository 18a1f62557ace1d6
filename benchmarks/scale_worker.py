#!/usr/bin/env python
"""One OS process running an asyncio ``worklease.AsyncPool`` for ``bench_scale.py``.

Usage::

    python benchmarks/scale_worker.py --dsn DSN --holder proc-0 --work-ids 10000 --ttl 5 \\
        [--expect-root /path/to/src/worklease]

The pool covers the work IDs ``scale/00000`` .. ``scale/NNNNN`` (the same in every process).
The work function holds its work ID until the pool stops. The worker prints JSON lines to
stdout:

- ``{"event": "started", "t": ..., "worklease": ..., "rss_kib": ...}`` when the pool starts
  running (``t`` is ``time.monotonic()``, which all processes on one machine share;
  ``rss_kib`` the resident set size then, ``null`` without Linux's ``/proc``);
- ``{"event": "stats", "t": ..., "held": ..., "cpu_s": ..., "rss_kib": ..., ...}`` every
  ``--report-interval`` seconds: work IDs whose work function runs here, the process CPU time
  and resident set size, and running counts of what the lease and the pool reported to
  their observers;
- with ``--trail``: ``{"event": "acquired", ...}`` for every acquisition (work ID, token,
  what the previous holder left: exit, holder, checkpoint) and ``{"event": "checkpointed",
  ...}`` once the work function's one checkpoint (``"<holder>:<token>"``, written right after
  the acquisition) was acknowledged, so the benchmark can tell whether a move carried the
  previous holder's checkpoint;
- ``{"event": "stopped", ...}`` after SIGTERM stopped the pool and it returned;
- ``{"event": "wrong-tree", ...}`` (exit 2) when ``worklease`` was imported from outside
  ``--expect-root``: the benchmark measures a specific source tree.

The script runs against the current source tree and against an old commit exported by
``bench_scale.py``, so it uses only API both have; ``on_scan`` is simply never called by a pool
that does not scan.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worklease import (
        AcquireEvent,
        Checkpoint,
        ReleaseEvent,
        RenewEvent,
        ScanEvent,
        SlotBackoffEvent,
        SlotLostEvent,
        Token,
    )


def work_ids(count: int) -> list[str]:
    """The benchmark's work IDs (shared with bench_scale.py)."""
    width = max(len(str(count - 1)), 5)
    return [f"scale/{i:0{width}d}" for i in range(count)]


def rss_kib() -> int | None:
    """This process's resident set size in KiB (Linux ``/proc``), else ``None``."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * (os.sysconf("SC_PAGE_SIZE") // 1024)


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--holder", required=True, help="holder ID of this process")
    parser.add_argument("--work-ids", type=int, default=10_000)
    parser.add_argument("--ttl", type=float, default=5.0)
    parser.add_argument("--idle-interval", type=float, default=1.0)
    parser.add_argument("--report-interval", type=float, default=1.0)
    parser.add_argument(
        "--trail", action="store_true", help="checkpoint once per acquisition and report both"
    )
    parser.add_argument(
        "--fair-share",
        choices=("on", "off", "default"),
        default="default",
        help="pass fair_share= to the pool (only if this tree's pool has it)",
    )
    parser.add_argument(
        "--expect-root", default="", help="refuse to run unless worklease comes from here"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format=f"%(asctime)s {args.holder} %(name)s %(levelname)s %(message)s",
    )
    import worklease  # after argument parsing: PYTHONPATH decides which tree this is

    origin = Path(worklease.__file__).resolve().parent
    if args.expect_root:
        expected = Path(args.expect_root).resolve()
        if origin != expected:
            emit(event="wrong-tree", worklease=str(origin), expected=str(expected))
            return 2
    return asyncio.run(run(args, str(origin)))


async def run(args: argparse.Namespace, origin: str) -> int:
    import worklease

    counts: dict[str, int] = dict.fromkeys(
        (
            "acquire_events",
            "acquire_errors",
            "renew_events",
            "renew_errors",
            "release_events",
            "scans",
            "scan_errors",
            "scan_acquired",
            "slot_backoffs",
            "slot_lost",
            "slot_shed",
        ),
        0,
    )

    class LeaseCounts(worklease.LeaseObserver):
        def on_acquire(self, event: AcquireEvent) -> None:
            counts["acquire_events"] += 1
            if event.error is not None and not isinstance(event.error, worklease.LeaseHeldError):
                counts["acquire_errors"] += 1

        def on_renew(self, event: RenewEvent) -> None:
            counts["renew_events"] += 1
            if event.error is not None:
                counts["renew_errors"] += 1

        def on_release(self, event: ReleaseEvent) -> None:
            counts["release_events"] += 1

    class PoolCounts(worklease.PoolObserver):
        def on_scan(self, event: ScanEvent) -> None:
            counts["scans"] += 1
            counts["scan_acquired"] += len(event.acquired)
            if event.error is not None:
                counts["scan_errors"] += 1

        def on_slot_backoff(self, event: SlotBackoffEvent) -> None:
            counts["slot_backoffs"] += 1
            if counts["slot_backoffs"] <= 3:  # what went wrong, without flooding the log
                logging.warning("slot %s backs off: %r", event.work_id, event.error)

        def on_slot_lost(self, event: SlotLostEvent) -> None:
            counts["slot_lost"] += 1

        def on_slot_shed(self, event: Any) -> None:  # called by pools that share fairly
            counts["slot_shed"] += 1

    lag = {"max_s": 0.0, "gc_max_s": 0.0, "gc_start": 0.0}

    def gc_timer(phase: str, info: dict[str, Any]) -> None:
        """The longest garbage collection per report (a full one walks every object)."""
        if phase == "start":
            lag["gc_start"] = time.perf_counter()
        else:
            lag["gc_max_s"] = max(lag["gc_max_s"], time.perf_counter() - lag["gc_start"])

    gc.callbacks.append(gc_timer)
    stopped = asyncio.Event()
    stop_requested: list[float] = []

    async def hold(token: Token, prior: Checkpoint) -> None:
        if args.trail:
            emit(
                event="acquired",
                holder=args.holder,
                t=time.monotonic(),
                work_id=token.work_id,
                token=token.fencing_token,
                prev_exit=str(prior.prev_exit),
                prev_holder=prior.prev_holder_id,
                state=None if prior.state is None else prior.state.decode(),
            )
            state = f"{args.holder}:{token.fencing_token}"
            await lease.checkpoint(token, state.encode())
            emit(event="checkpointed", holder=args.holder, work_id=token.work_id, state=state)
        # Hold the work ID until the pool stops or hands it over (both cancel this wait).
        await stopped.wait()

    backend = worklease.AsyncPostgresBackend.connect(args.dsn)
    async with backend:
        lease = worklease.AsyncLease(
            backend, holder_id=args.holder, ttl=args.ttl, observer=LeaseCounts()
        )
        options: dict[str, Any] = {}
        if args.fair_share != "default":
            parameters = inspect.signature(worklease.AsyncPool).parameters
            if "fair_share" in parameters:
                options["fair_share"] = args.fair_share == "on"
        pool = worklease.AsyncPool(
            lease,
            work_ids(args.work_ids),
            hold,
            idle_interval=args.idle_interval,
            observer=PoolCounts(),
            **options,
        )

        def stop() -> None:
            if not stop_requested:
                stop_requested.append(time.monotonic())
            stopped.set()
            pool.stop()

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop)
        loop.add_signal_handler(signal.SIGINT, stop)

        async def report() -> None:
            while True:
                emit(
                    event="stats",
                    holder=args.holder,
                    t=time.monotonic(),
                    held=len(pool.active_slots()),
                    cpu_s=time.process_time(),
                    rss_kib=rss_kib(),
                    loop_lag_max_s=round(lag["max_s"], 3),
                    gc_max_s=round(lag["gc_max_s"], 3),
                    **counts,
                )
                lag["max_s"] = lag["gc_max_s"] = 0.0
                await asyncio.sleep(args.report_interval)

        async def watch_lag() -> None:
            """The event loop's longest stall per report: how late a 50 ms sleep woke."""
            while True:
                before = time.monotonic()
                await asyncio.sleep(0.05)
                lag["max_s"] = max(lag["max_s"], time.monotonic() - before - 0.05)

        reporter = asyncio.create_task(report())
        lag_watch = asyncio.create_task(watch_lag())
        emit(
            event="started",
            holder=args.holder,
            t=time.monotonic(),
            worklease=origin,
            rss_kib=rss_kib(),
        )
        try:
            await pool.run()
        finally:
            reporter.cancel()
            lag_watch.cancel()
    now = time.monotonic()
    emit(
        event="stopped",
        holder=args.holder,
        t=now,
        # from SIGTERM until the pool returned (every work ID released) and the backend closed
        stop_s=now - stop_requested[0] if stop_requested else None,
        cpu_s=time.process_time(),
        **counts,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
