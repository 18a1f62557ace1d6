#!/usr/bin/env python
"""How long the in-memory backend holds its one lock during whole-store and batch operations.

The store (``MemoryBackend``) is filled with ``--leases`` leases (default 100,000, four
holders plus four pool memberships, on a ``FakeClock``), then each operation below runs once
per run (``--runs``, default 5), each on a freshly filled store:

==================  ==========================================================================
survey              ``survey(all work IDs, member_prefix(group))``
find_available      ``find_available(all work IDs)`` (everything held)
renew_many          ``renew_many(all tokens)``
checkpoint_many     ``checkpoint_many`` of all tokens with 64 bytes each
release_many        ``release_many(all tokens, FINISHED)``
acquire_many        ``acquire_many(all work IDs)`` into an empty store
sweep               every lease released ``RETIRED`` an hour ago, then ``sweep(0, False)``
rows                ``rows()``
==================  ==========================================================================

Per operation it reports the total time of the call (median over the runs) and the longest
single hold of the store's lock (the lock is replaced by a wrapper that times each outermost
hold; its own cost is included), median and maximum over the runs, also less the time the
garbage collector ran inside that hold (a full collection over the 100,000 rows pauses every
thread for tens of milliseconds, whether the lock is held or not, and lands in whichever hold
allocates at the moment). In a second pass, without the wrapper, a thread renews one other
lease in a loop while the operation runs: its longest single renew is what a concurrent
``renew`` waited (CPython hands the GIL to a waiting thread only every 5 ms, so up to about
5 ms there is the interpreter, not the lock).

The script works against any tree of worklease with the memory backend: to measure an older
commit, export it (``git archive <commit> src | tar -x -C /tmp/old_wl``) and run this script
with ``PYTHONPATH=/tmp/old_wl/src``. It only reports; it never fails on a number.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import worklease
from worklease import ExitMode, MemoryBackend, Token
from worklease._fairshare import member_prefix, member_work_id
from worklease.testing import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TTL = 3600.0
HOLDERS = ("holder-0", "holder-1", "holder-2", "holder-3")
GROUP = "bench"
STATE = b"s" * 64


class GcClock:
    """Total nanoseconds the cyclic garbage collector has run so far (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.total = 0
        self._started = 0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self.total += time.perf_counter_ns() - self._started


GC = GcClock()


class TimedLock:
    """Wraps the store's lock and records how long each outermost hold lasts, and how much
    of that the garbage collector ran (a pause of every thread, lock or not)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._depth = 0
        self._start = 0
        self._gc_start = 0
        self.holds: list[int] = []
        self.gc_in_holds: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)  # e.g. the new store's count of waiting threads

    def __enter__(self) -> None:
        self._inner.__enter__()
        self._depth += 1
        if self._depth == 1:
            self._gc_start = GC.total
            self._start = time.perf_counter_ns()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.holds.append(time.perf_counter_ns() - self._start)
            self.gc_in_holds.append(GC.total - self._gc_start)
        self._inner.__exit__(exc_type, exc, tb)


@dataclass
class Filled:
    backend: MemoryBackend
    clock: FakeClock
    work_ids: list[str]
    tokens: list[Token]


def fill(leases: int, *, held: bool = True) -> Filled:
    clock = FakeClock(T0)
    backend = MemoryBackend(clock=clock)
    work_ids = [f"work-{index:06d}" for index in range(leases)]
    tokens: list[Token] = []
    if held:
        share = -(-leases // len(HOLDERS))
        for number, holder in enumerate(HOLDERS):
            batch = work_ids[number * share : (number + 1) * share]
            tokens += [token for token, _ in backend.acquire_many(batch, holder, TTL)]
    for holder in HOLDERS:
        backend.acquire(member_work_id(GROUP, holder), holder, TTL)
    return Filled(backend, clock, work_ids, tokens)


Operation = Callable[[Filled], object]


def _sweep_setup(filled: Filled) -> None:
    filled.backend.release_many(filled.tokens, ExitMode.RETIRED)
    filled.clock.advance(3600)


# name -> (fill held?, untimed setup or None, the timed call)
OPERATIONS: dict[str, tuple[bool, Callable[[Filled], None] | None, Operation]] = {
    "survey": (True, None, lambda f: f.backend.survey(f.work_ids, member_prefix(GROUP))),
    "find_available": (True, None, lambda f: f.backend.find_available(f.work_ids)),
    "renew_many": (True, None, lambda f: f.backend.renew_many(f.tokens, TTL)),
    "checkpoint_many": (
        True,
        None,
        lambda f: f.backend.checkpoint_many([(token, STATE) for token in f.tokens], TTL),
    ),
    "release_many": (True, None, lambda f: f.backend.release_many(f.tokens, ExitMode.FINISHED)),
    "acquire_many": (False, None, lambda f: f.backend.acquire_many(f.work_ids, "taker", TTL)),
    "sweep": (True, _sweep_setup, lambda f: f.backend.sweep(0.0, False)),
    "rows": (True, None, lambda f: f.backend.rows()),
}


def timed_hold(name: str, leases: int) -> tuple[float, float, float]:
    """One run: total seconds, the longest hold, the longest hold less the collector's
    pauses in it (seconds)."""
    held, setup, operation = OPERATIONS[name]
    filled = fill(leases, held=held)
    if setup is not None:
        setup(filled)
    store = filled.backend._store
    lock = TimedLock(store._lock)
    store._lock = lock  # type: ignore[assignment]  # a stand-in with the same protocol
    started = time.perf_counter()
    operation(filled)
    total = time.perf_counter() - started
    net = [hold - in_gc for hold, in_gc in zip(lock.holds, lock.gc_in_holds, strict=True)]
    return total, max(lock.holds, default=0) / 1e9, max(net, default=0) / 1e9


def concurrent_renew(name: str, leases: int) -> float:
    """One run: the longest single ``renew`` another thread saw while the operation ran."""
    held, setup, operation = OPERATIONS[name]
    filled = fill(leases, held=held)
    if setup is not None:
        setup(filled)
    token = filled.backend.acquire("competitor", "competitor", TTL)
    started = threading.Event()
    stop = threading.Event()
    longest = 0.0

    def compete() -> None:
        nonlocal longest
        started.set()
        while not stop.is_set():
            begin = time.perf_counter()
            filled.backend.renew(token, TTL)
            longest = max(longest, time.perf_counter() - begin)
            time.sleep(0.0002)

    thread = threading.Thread(target=compete, daemon=True)
    thread.start()
    started.wait()
    time.sleep(0.01)
    longest = 0.0  # only what happens while the operation runs
    operation(filled)
    stop.set()
    thread.join()
    return longest


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--leases", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=sorted(OPERATIONS), default=None)
    parser.add_argument("--label", default=None, help="a title for the table")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    names = args.only or list(OPERATIONS)
    label = args.label or f"worklease from {Path(worklease.__file__).parent}"
    print(f"## {label}\n")
    print(f"{args.leases:,} leases, {args.runs} runs, Python {sys.version.split()[0]}; ms\n")
    print(
        "| operation | total (median) | longest hold (median / max) "
        "| longest hold less GC (median / max) | concurrent renew (median / max) |"
    )
    print("|---|---:|---:|---:|---:|")
    figures: dict[str, dict[str, list[float]]] = {}
    for name in names:
        runs: dict[str, list[float]] = {
            "total": [],
            "longest_hold": [],
            "longest_hold_less_gc": [],
            "concurrent_renew": [],
        }
        for _ in range(args.runs):
            total, hold, net = timed_hold(name, args.leases)
            runs["total"].append(total)
            runs["longest_hold"].append(hold)
            runs["longest_hold_less_gc"].append(net)
            runs["concurrent_renew"].append(concurrent_renew(name, args.leases))
        figures[name] = runs

        def pair(key: str, runs: dict[str, list[float]] = runs) -> str:
            return f"{ms(statistics.median(runs[key]))} / {ms(max(runs[key]))}"

        print(
            f"| {name} | {ms(statistics.median(runs['total']))} | {pair('longest_hold')} "
            f"| {pair('longest_hold_less_gc')} | {pair('concurrent_renew')} |",
            flush=True,
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"label": label, "leases": args.leases, "figures": figures}, indent=2),
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
