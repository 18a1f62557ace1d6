#!/usr/bin/env python
"""Pools at scale on a grid: N work IDs x P processes on PostgreSQL, two designs side by side.

For every cell (N, P) of ``--grid`` (default: N = 1,000 / 10,000 / 100,000 x P = 2 / 4 / 8) and
every design of ``--designs`` (``before``: commit 0fc614a exported with ``git archive``;
``after``: a copy of the working tree's ``src/`` taken when the run starts), in a fresh
database each, P processes (``benchmarks/scale_worker.py``: one ``AsyncPool`` each, every work
function holding its work ID until the pool stops; TTL 10 s) share the same N work IDs:

1. covered: seconds from starting the P processes until all N are held and each process
   holds N/P ± 2 % ("never" after ``--timeout``, with what was held then);
2. the idle pool, over a ``--window`` after a ``--settle``: CPU cores used by the PostgreSQL
   server's processes (``/proc/<pid>/stat`` utime + stime of the postmaster and all its
   children), transactions/s in the bench database (``pg_stat_database.xact_commit``), the
   workers' slot backoffs/s, RSS per process and per held lease;
3. SIGTERM of the process holding most: seconds until every work ID it held is released
   (no row of it left with ``exit_mode`` NULL: a successor may take it), how many it released
   and how many it left to lapse, its own stop time, and when the others hold all N again;
4. a replacement joins (back to P processes, time until even), then ``kill -9`` of the one
   holding most: seconds until the survivors hold all N again (target TTL + 5 s; for P = 2:
   does the one survivor cover all N within 60 s?).

Results: ``benchmarks/results/pool_scale.{md,json}``, rewritten after every cell. Every cell's
processes are stopped (SIGTERM, then SIGKILL after ``--stop-timeout``) when the cell ends,
also on failure or timeout, and its database is dropped. The script reports; it never fails on
a missed target. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import bench_scale
import psycopg
from bench_fairshare import TOLERANCE, even
from bench_scale import (
    REPO,
    RESULTS,
    Config,
    Monitor,
    Sample,
    SideError,
    Worker,
    check_alive,
    default_dsn,
    environment,
    export_old,
    stop_workers,
    summarize_logs,
    worker_rates,
)
from psycopg import sql
from psycopg.conninfo import make_conninfo

BEFORE_COMMIT = "0fc614a"
DESIGNS = ("before", "after")
DEFAULT_GRID = "1000x2,1000x4,1000x8,10000x2,10000x4,10000x8,100000x2,100000x4,100000x8"
FAILOVER_MARGIN_S = 5.0  # target: TTL + this
SOLE_SURVIVOR_S = 60.0  # P = 2: does the one survivor cover all N within this?
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NOT_MEMBER = "NOT starts_with(work_id, 'worklease.member/')"
STILL_HELD = (
    f"SELECT count(*) FROM worklease_leases WHERE {NOT_MEMBER}"
    " AND holder_id = %s AND exit_mode IS NULL"
)
HELD_IDS = (
    f"SELECT work_id FROM worklease_leases WHERE {NOT_MEMBER}"
    " AND holder_id = %s AND exit_mode IS NULL AND expires_at > now()"
)
# What became of the work IDs a SIGTERMed process held: still its row, unreleased (lapsing);
# taken by a successor after a lapse; otherwise released (its row with an exit mode, or a
# successor's row that read one).
FATE = (
    "SELECT"
    " count(*) FILTER (WHERE holder_id = %(v)s AND exit_mode IS NULL),"
    " count(*) FILTER (WHERE holder_id <> %(v)s AND prev_holder_id = %(v)s"
    "  AND prev_exit_mode = 'expired'),"
    " count(*) FILTER (WHERE (holder_id = %(v)s AND exit_mode = 'abandoned')"
    "  OR (holder_id <> %(v)s AND prev_holder_id = %(v)s AND prev_exit_mode = 'abandoned')),"
    " count(*)"
    " FROM worklease_leases WHERE work_id = ANY(%(ids)s)"
)
COMMITS = "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s"
ACTIVITY = "SELECT pid, datname, backend_type FROM pg_stat_activity"
APPLY_SCHEMA = (
    "import sys, psycopg\n"
    "from worklease import PostgresBackend\n"
    "with psycopg.connect(sys.argv[1], autocommit=True) as conn:\n"
    "    PostgresBackend.apply_schema(conn)\n"
)

_SPAWNED: list[subprocess.Popen[str]] = []  # every worker ever started: killed at exit


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@atexit.register
def _kill_strays() -> None:
    for proc in _SPAWNED:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(subprocess.SubprocessError):
                proc.wait(timeout=5)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through every cell's cleanup


# -- the database and the processes -------------------------------------------------------------


@contextlib.contextmanager
def cell_database(server_dsn: str, src: Path) -> Iterator[tuple[str, str]]:
    """A fresh ``worklease_bench_poolscale_<random>`` with the schema of ``src``'s own tree
    (applied by a subprocess importing it); dropped afterwards, connections terminated."""
    name = f"worklease_bench_poolscale_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server_dsn, dbname=name)
    try:
        env = dict(os.environ, PYTHONPATH=str(src))
        done = subprocess.run(
            [sys.executable, "-c", APPLY_SCHEMA, dsn],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise SideError(f"applying the schema failed: {done.stderr.strip()[-500:]}")
        yield name, dsn
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def spawn(cfg: Config, holder: str, dsn: str, src: Path, logs: Path) -> Worker:
    """``bench_scale.spawn``, with the worker bound to die with this script (``setpriv
    --pdeathsig KILL`` where util-linux has it): no stray processes even after a SIGKILL."""
    setpriv = shutil.which("setpriv")
    launcher = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    worker = bench_scale.spawn(cfg, holder, dsn, src, logs, launcher=launcher)
    _SPAWNED.append(worker.proc)
    return worker


def proc_memory(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of a process in KiB from ``/proc/<pid>/status``; None if gone."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if "VmRSS" not in fields:
        return None
    return fields["VmRSS"], fields.get("VmHWM", fields["VmRSS"])


class Guard:
    """What every wait calls: a worker we did not stop has exited → ``SideError``; the
    workers' RSS together above the budget → ``SideError`` (the cell ends, they are killed)."""

    def __init__(self, max_rss_kib: int) -> None:
        self.max_rss_kib = max_rss_kib
        self.peak_total_kib = 0

    def check(self, workers: Sequence[Worker]) -> None:
        check_alive(workers)
        total = 0
        for worker in workers:
            if worker.proc.poll() is None and (mem := proc_memory(worker.proc.pid)):
                total += mem[0]
        self.peak_total_kib = max(self.peak_total_kib, total)
        if total > self.max_rss_kib:
            raise SideError(
                f"memory guard: the workers' RSS reached {total / 2**20:.1f} GiB "
                f"(budget {self.max_rss_kib / 2**20:.1f} GiB, --max-rss-gib)"
            )

    def sleep(self, workers: Sequence[Worker], seconds: float, step: float = 0.5) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.check(workers)
            time.sleep(min(step, left))


# -- the server's CPU ---------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime + stime in clock ticks) from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
        fields = text[text.rindex(")") + 2 :].split()
        return int(fields[1]), int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


class ServerCpu:
    """CPU time of one PostgreSQL server: the postmaster (the parent of a backend of ours)
    and all its children, read from ``/proc``. ``postmaster`` is None, with ``why``, when the
    server is not a local process we can see."""

    def __init__(self, backend_pid: int) -> None:
        self.postmaster: int | None = None
        self.why = ""
        if _comm(backend_pid) != "postgres" or (stat := _stat(backend_pid)) is None:
            self.why = f"backend {backend_pid} is not a local process (server elsewhere?)"
            return
        if _comm(stat[0]) not in ("postgres", "postmaster"):
            self.why = f"the parent of backend {backend_pid} is {_comm(stat[0])!r}"
            return
        self.postmaster = stat[0]

    def snapshot(self) -> dict[int, int]:
        """pid → utime + stime (ticks) of the postmaster and every child of it."""
        ticks: dict[int, int] = {}
        if self.postmaster is None:
            return ticks
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = _stat(pid)
            if stat is not None and (pid == self.postmaster or stat[0] == self.postmaster):
                ticks[pid] = stat[1]
        return ticks


def cpu_split(
    before: dict[int, int],
    after: dict[int, int],
    span: float,
    activity: dict[int, tuple[str | None, str]],
    database: str,
    own: set[int],
) -> dict[str, Any]:
    """Cores used over ``span`` by all server processes and by groups of them. A process
    that started in the window counts in full; one that ended in it is lost (counted)."""
    groups = dict.fromkeys(("bench_db", "own", "other_db", "auxiliary"), 0.0)
    total = 0.0
    for pid, ticks in after.items():
        cores = (ticks - before.get(pid, 0)) / CLOCK_TICKS / span
        total += cores
        datname, kind = activity.get(pid, (None, "?"))
        if pid in own:
            groups["own"] += cores
        elif datname == database:
            groups["bench_db"] += cores
        elif datname is not None and kind == "client backend":
            groups["other_db"] += cores
        else:
            groups["auxiliary"] += cores
    return {
        "available": True,
        "cores": round(total, 4),
        **{k: round(v, 4) for k, v in groups.items()},
        "processes": len(after),
        "appeared": len(set(after) - set(before)),
        "vanished": len(set(before) - set(after)),
        "other_db_backends": sum(
            1
            for pid, (datname, kind) in activity.items()
            if pid in after
            and pid not in own
            and datname not in (None, database)
            and kind == "client backend"
        ),
    }


# -- one cell -----------------------------------------------------------------------------------


def sample(monitor: Monitor) -> tuple[Sample, float]:
    """One lease-table sample and how long the query took."""
    start = time.monotonic()
    found = monitor.sample()
    return found, time.monotonic() - start


def wait(
    monitor: Monitor,
    workers: Sequence[Worker],
    guard: Guard,
    done: Callable[[Sample], bool],
    timeout: float,
    start: float | None = None,
) -> tuple[Sample | None, float]:
    """Sample the lease table until ``done`` or ``timeout`` after ``start``: the sample that
    was done (or None) and the seconds since ``start``. Samples are at least 0.25 s apart and
    at least four query durations (the benchmark's own load stays under a fifth of a core)."""
    start = time.monotonic() if start is None else start
    while True:
        guard.check(workers)
        found, took = sample(monitor)
        if done(found):
            return found, found.t - start
        if found.t - start >= timeout:
            return None, timeout
        time.sleep(max(0.25, 4 * took))


def shares(found: Sample, holders: Sequence[str]) -> list[int]:
    return [found.holders.get(h, 0) for h in holders]


def live(workers: Sequence[Worker]) -> list[Worker]:
    return [w for w in workers if w.killed_at is None and w.proc.poll() is None]


def coverage(
    monitor: Monitor, workers: Sequence[Worker], guard: Guard, n: int, timeout: float, t0: float
) -> dict[str, Any]:
    holders = [w.holder for w in workers]
    all_held: list[float] = []

    def covered(found: Sample) -> bool:
        if found.total >= n and not all_held:
            all_held.append(found.t - t0)
        return even(found, holders, n)

    found, seconds = wait(monitor, workers, guard, covered, timeout, start=t0)
    last = found or monitor.samples[-1]
    return {
        "even": found is not None,
        "seconds": seconds if found is not None else None,
        "all_held_s": all_held[0] if all_held else None,
        "timeout_s": timeout,
        "held": last.total,
        "shares": shares(last, holders),
    }


def idle_window(
    monitor: Monitor,
    cpu: ServerCpu,
    workers: Sequence[Worker],
    guard: Guard,
    n: int,
    database: str,
    settle: float,
    window: float,
) -> dict[str, Any]:
    """Settle (no queries in the bench database, so our own have been flushed to
    ``pg_stat_database`` by the window), then measure over ``window`` with one lease-table
    sample at each end and none in between."""
    own_before = monitor.own_xacts
    guard.sleep(workers, settle)
    first, _ = sample(monitor)
    c0, c0_at = cpu.snapshot(), time.monotonic()
    row = monitor.stats.execute(COMMITS, (database,)).fetchone()
    x0 = (int(row[0]), int(row[1])) if row else (0, 0)
    guard.sleep(workers, window)
    row = monitor.stats.execute(COMMITS, (database,)).fetchone()
    x1 = (int(row[0]), int(row[1])) if row else (0, 0)
    c1, c1_at = cpu.snapshot(), time.monotonic()
    own = monitor.own_xacts - own_before  # the first sample: it may land in the window
    activity = {
        int(pid): (datname, str(kind))
        for pid, datname, kind in monitor.stats.execute(ACTIVITY).fetchall()
    }
    span = c1_at - c0_at
    last, _ = sample(monitor)
    ours = {monitor.conn.info.backend_pid, monitor.stats.info.backend_pid}
    result: dict[str, Any] = {
        "settle_s": settle,
        "window_s": round(span, 3),
        "all_held_at_start": first.total >= n,
        "all_held_at_end": last.total >= n,
        "even_at_end": even(last, [w.holder for w in live(workers)], n),
        "xact_commit_per_s": round((x1[0] - x0[0] - own) / span, 3),
        "xact_rollback_per_s": round((x1[1] - x0[1]) / span, 3),
        "own_xacts_subtracted": own,
        "server_cpu": (
            cpu_split(c0, c1, span, activity, database, ours)
            if cpu.postmaster is not None
            else {"available": False, "why": cpu.why}
        ),
        "connections": sum(
            1 for pid, (datname, _) in activity.items() if datname == database and pid not in ours
        ),
        "workers": worker_rates(workers, c0_at, c1_at),
    }
    rss: list[int] = []
    hwm: list[int] = []
    grown: list[int] = []
    for worker in workers:
        mem = proc_memory(worker.proc.pid)
        if mem is None:
            continue
        rss.append(mem[0])
        hwm.append(mem[1])
        started = worker.first("started") or {}
        if started.get("rss_kib") is not None:
            grown.append(mem[0] - int(started["rss_kib"]))
    held = last.total or 1
    result["rss"] = {
        "per_process_kib": rss,
        "max_per_process_mib": round(max(rss) / 1024, 2) if rss else None,
        "peak_hwm_mib": round(max(hwm) / 1024, 2) if hwm else None,
        "per_held_lease_kib": round(sum(rss) / held, 3) if rss else None,
        # above each process's RSS when its pool started (interpreter, imports, connections)
        "growth_per_held_lease_kib": (
            round(sum(grown) / held, 3) if grown and len(grown) == len(rss) else None
        ),
        "held": last.total,
    }
    return result


def sigterm_one(
    monitor: Monitor, workers: list[Worker], guard: Guard, cfg: Config, timeout: float
) -> tuple[dict[str, Any], Worker]:
    """SIGTERM the live process holding most; watch its rows until none is unreleased or it
    has exited (what is left then lapses); then wait until the others hold all N."""
    n = cfg.work_ids
    before, _ = sample(monitor)
    victim = max(live(workers), key=lambda w: before.holders.get(w.holder, 0))
    ids = [r[0] for r in monitor.conn.execute(HELD_IDS, (victim.holder,)).fetchall()]
    monitor.own_xacts += 1
    others = [w for w in workers if w is not victim]
    sent = time.monotonic()
    victim.proc.send_signal(signal.SIGTERM)
    victim.killed_at = sent  # check_alive no longer expects it to live
    released_at: float | None = None
    exited_at: float | None = None
    while True:
        row = monitor.conn.execute(STILL_HELD, (victim.holder,)).fetchone()
        monitor.own_xacts += 1
        now = time.monotonic()
        if released_at is None and row is not None and int(row[0]) == 0:
            released_at = now
        if exited_at is None and victim.proc.poll() is not None:
            exited_at = now
        if released_at is not None and exited_at is not None:
            break
        if exited_at is not None and now - exited_at > 1.0:
            break  # exited with rows unreleased: those lapse
        if now - sent > cfg.stop_timeout:
            victim.proc.kill()
            victim.proc.wait()
            break
        guard.check(others)
        time.sleep(0.05)
    row = monitor.conn.execute(FATE, {"v": victim.holder, "ids": ids}).fetchone()
    monitor.own_xacts += 1
    lapsing, lapsed, abandoned, found = (int(x) for x in row) if row else (0, 0, 0, 0)
    if victim.reader is not None:
        victim.reader.join(timeout=5.0)
    stopped = victim.first("stopped") or {}
    result: dict[str, Any] = {
        "victim": victim.holder,
        "held": len(ids),
        "all_released": released_at is not None,
        "released_s": None if released_at is None else round(released_at - sent, 3),
        "exited_s": None if exited_at is None else round(exited_at - sent, 3),
        "stop_s": stopped.get("stop_s"),
        "killed_after_stop_timeout": exited_at is None,
        "released": len(ids) - lapsing - lapsed,
        "released_abandoned": abandoned,
        "left_to_lapse": lapsing + lapsed,
        "rows_found": found,
    }
    found_all, seconds = wait(
        monitor,
        others,
        guard,
        lambda s: s.total >= n and victim.holder not in s.holders,
        timeout,
        start=sent,
    )
    result["others_hold_all_s"] = None if found_all is None else round(seconds, 3)
    return result, victim


def kill_one(
    monitor: Monitor, workers: list[Worker], guard: Guard, cfg: Config, timeout: float
) -> dict[str, Any]:
    """kill -9 of the live process holding most; the time until the survivors hold all N,
    then until they hold even shares (given at most 10 s more)."""
    n = cfg.work_ids
    before, _ = sample(monitor)
    victim = max(live(workers), key=lambda w: before.holders.get(w.holder, 0))
    survivors = [w.holder for w in live(workers) if w is not victim]
    held = before.holders.get(victim.holder, 0)
    victim.proc.send_signal(signal.SIGKILL)
    victim.killed_at = kill = time.monotonic()
    victim.proc.wait()
    all_held: list[float] = []

    def done(found: Sample) -> bool:
        ok = found.total >= n and set(found.holders) <= set(survivors)
        if ok and not all_held:
            all_held.append(found.t)
        if all_held and found.t - all_held[0] >= 10.0:
            return True  # all held but not even: stop waiting
        return ok and even(found, survivors, n)

    found, _ = wait(monitor, workers, guard, done, timeout, start=kill)
    last = found or monitor.samples[-1]
    return {
        "victim": victim.holder,
        "victim_held": held,
        "survivors": len(survivors),
        "all_held": bool(all_held),
        "all_held_s": round(all_held[0] - kill, 3) if all_held else None,
        "even": even(last, survivors, n),
        "even_s": round(last.t - kill, 3) if even(last, survivors, n) else None,
        "timeout_s": timeout,
        "shares": shares(last, survivors),
        "target_s": cfg.ttl + FAILOVER_MARGIN_S,
    }


def run_cell(
    design: str, src: Path, cfg: Config, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    n, p = cfg.work_ids, cfg.processes
    logs = tmp / f"logs-{n}x{p}-{design}-{uuid.uuid4().hex[:6]}"
    logs.mkdir()
    started = time.monotonic()
    result: dict[str, Any] = {
        "n": n,
        "p": p,
        "design": design,
        "measured": False,
        "source": str(src),
        "load_average_at_start": list(os.getloadavg()),
    }
    guard = Guard(args.max_rss_kib)
    workers: list[Worker] = []
    holders = [f"proc-{i}" for i in range(p)]
    terminated: str | None = None
    t0 = time.monotonic()
    try:
        with cell_database(args.dsn, src) as (database, dsn):
            result["database"] = database
            monitor = Monitor(dsn, args.dsn, database, pss=False)
            try:
                cpu = ServerCpu(monitor.conn.info.backend_pid)
                _progress(f"{n:,} x {p} [{design}] in {database}")
                monitor.sample()
                t0 = time.monotonic()
                workers = [spawn(cfg, h, dsn, src, logs) for h in holders]
                result["covered"] = coverage(monitor, workers, guard, n, args.timeout, t0)
                c = result["covered"]
                _progress(
                    f"  covered: {c['seconds']:.2f} s"
                    if c["even"]
                    else f"  never covered ({c['held']:,} held: {c['shares']})"
                )
                result["idle"] = idle_window(
                    monitor, cpu, workers, guard, n, database, cfg.settle, cfg.window
                )
                idle = result["idle"]
                _progress(
                    f"  idle: server {idle['server_cpu'].get('cores', 'n/a')} cores, "
                    f"{idle['xact_commit_per_s']:.1f} xact/s"
                )
                result["sigterm"], victim = sigterm_one(monitor, workers, guard, cfg, args.timeout)
                terminated = victim.holder
                s = result["sigterm"]
                _progress(
                    f"  SIGTERM {s['victim']}: released {s['released']:,} / "
                    f"left {s['left_to_lapse']:,} in {s['released_s']} s"
                )
                # back to P processes, then kill -9 of one
                joined = time.monotonic()
                workers.append(spawn(cfg, f"proc-{p}", dsn, src, logs))
                rejoin = [w.holder for w in live(workers)]
                found, seconds = wait(
                    monitor, workers, guard, lambda s: even(s, rejoin, n), args.timeout, joined
                )
                result["rejoin"] = {
                    "even": found is not None,
                    "seconds": round(seconds, 3) if found is not None else None,
                    "shares": shares(found or monitor.samples[-1], rejoin),
                }
                timeout = max(args.timeout, cfg.ttl + FAILOVER_MARGIN_S + 10.0)
                if p == 2:
                    timeout = max(timeout, SOLE_SURVIVOR_S)
                result["kill9"] = kill_one(monitor, workers, guard, cfg, timeout)
                k = result["kill9"]
                _progress(f"  kill -9 {k['victim']}: all held again in {k['all_held_s']} s")
                result["measured"] = True
            except (SideError, psycopg.Error, OSError) as exc:
                result["note"] = f"not measured: {exc}"
                _progress(f"  {result['note']}")
            finally:
                result["stop"] = stop_workers(workers, cfg.stop_timeout)
                if terminated is not None:
                    result["stop"][terminated] = "SIGTERM (measured above)"
                result["logs"] = summarize_logs(workers)
                result["memory_guard_peak_mib"] = round(guard.peak_total_kib / 1024, 1)
                monitor.close()
                result["timeline"] = {
                    "t": [round(s.t - t0, 3) for s in monitor.samples],
                    "held": [s.total for s in monitor.samples],
                    "by_holder": {
                        h: [s.holders.get(h, 0) for s in monitor.samples]
                        for h in [*holders, f"proc-{p}"]
                    },
                }
    except (SideError, psycopg.Error, OSError, subprocess.SubprocessError) as exc:
        result.setdefault("note", f"not measured: {exc}")
        _progress(f"  {result['note']}")
    finally:
        # a last resort: nothing of this cell outlives it
        for worker in workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait()
    result["load_average_at_end"] = list(os.getloadavg())
    result["runtime_s"] = round(time.monotonic() - started, 1)
    return result


# -- the "after" tree ---------------------------------------------------------------------------


def snapshot_tree(tmp: Path) -> tuple[Path, dict[str, Any]]:
    """Copy the working tree's ``src/`` (all cells measure the same code, whatever is edited
    during the run); the copy and what it was: HEAD, the files that differ, a digest."""
    target = tmp / "worklease-after" / "src"
    shutil.copytree(REPO / "src", target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    info: dict[str, Any] = {"head": None, "modified": [], "diff_sha256": None}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        git = ["git", "-C", str(REPO)]
        info["head"] = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            [*git, "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        info["modified"] = [line[3:] for line in status.splitlines() if line.strip()]
        digest = hashlib.sha256()
        for path in sorted(target.rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(target)).encode() + b"\0")
                digest.update(path.read_bytes())
        info["tree_sha256"] = digest.hexdigest()[:16]
    return target, info


# -- output -------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render(report: dict[str, Any]) -> str:
    env, settings = report["environment"], report["settings"]
    after, before = report.get("after", {}), report.get("before", {})
    load_end = env.get("load_average_at_end") or ["?"]
    modified = ", ".join(after.get("modified") or []) or "none"
    lines = [
        "# worklease pools at scale: N work IDs x P processes",
        "",
        f"Run {env.get('started_at', '?')} on {env.get('cpus', '?')} CPUs (workers and server "
        f"on one machine), PostgreSQL {env.get('postgresql', '?')} on {env.get('host', '?')}, "
        f"Python {env.get('python', '?')}, psycopg "
        f"{env.get('packages', {}).get('psycopg', '?')}; load average at start "
        f"{_num((env.get('load_average_at_start') or [0])[0], 2)}, at end "
        f"{_num(load_end[0], 2) if load_end[0] != '?' else '?'}. Commit "
        f"{after.get('head') or '?'}. **before**: commit {settings['before_commit']} "
        f"({before.get('rev', before.get('note', 'not measured in this run'))}); "
        "**after**: the working tree's src/ "
        f"copied at the start (files differing from HEAD: {modified}; tree digest "
        f"{after.get('tree_sha256', '?')}). TTL {settings['ttl_s']:g} s, idle interval "
        f"{settings['idle_interval_s']:g} s, timeout {settings['timeout_s']:g} s, settle "
        f"{settings['settle_s']:g} s, window {settings['window_s']:g} s. Runtime "
        f"{report.get('runtime_s', 0):.0f} s.",
        "",
        "Every process runs `AsyncPool` over the same N work IDs (`benchmarks/scale_worker.py`: "
        "each work function holds its work ID until the pool stops). *covered*: from starting "
        f"the P processes until all N are held and each holds N/P ± {TOLERANCE:.0%}. *server "
        "CPU*: cores used over the window by the PostgreSQL server (utime + stime from "
        "`/proc/<pid>/stat` of the postmaster and all its children; in brackets without the "
        "backends of other databases, i.e. the bench database's backends plus the auxiliary "
        "processes; the split is in `pool_scale.json`). *xact/s*: "
        "`pg_stat_database.xact_commit` of the bench database over the window, minus the "
        "script's own. *slot backoffs/s*: the workers' `on_slot_backoff` count. *RSS/held "
        "lease*: the workers' RSS summed, over the work IDs held (in brackets: only the growth "
        "since each pool started). *SIGTERM*: of the process holding most, until none of its "
        "rows is left unreleased (its successor may take them; in brackets: until the others "
        "hold all N), what it released / left to lapse, and its own time from SIGTERM until "
        "its pool stopped and its backend closed. *kill -9*: after a replacement brought the "
        "pool back to P, of the process holding most; until the survivors hold all N "
        f"(target TTL + {FAILOVER_MARGIN_S:g} s).",
        "",
        "| N | P | design | covered | server CPU, idle (cores) | xact/s | slot backoffs/s "
        "| RSS/process, max (MiB) | RSS/held lease (KiB) | SIGTERM → all released "
        "| released / left to lapse | SIGTERM → own stop | kill -9 → survivors hold all N |",
        "|---:|---:|---|---|---|---:|---:|---:|---|---|---|---:|---|",
    ]
    notes: list[str] = []
    for cell in report["cells"]:
        head = f"| {cell['n']:,} | {cell['p']} | {cell['design']} "
        if "covered" not in cell:
            lines.append(head + f"| {cell.get('note', 'not measured')} |" + " - |" * 9)
            continue
        c = cell["covered"]
        covered = (
            _s(c["seconds"])
            if c["even"]
            else f"never ({c['held']:,} held at {c['timeout_s']:g} s: "
            + " / ".join(f"{x:,}" for x in c["shares"])
            + ")"
        )
        row = [covered]
        idle = cell.get("idle")
        if idle:
            cpu = idle["server_cpu"]
            row.append(
                f"{cpu['cores']:.3f} ({cpu['cores'] - cpu['other_db']:.3f})"
                if cpu.get("available")
                else "n/a"
            )
            row.append(_num(idle["xact_commit_per_s"]))
            row.append(_num(idle["workers"].get("slot_backoffs"), 2))
            rss = idle["rss"]
            row.append(_num(rss["max_per_process_mib"]))
            per = _num(rss["per_held_lease_kib"])
            if rss.get("growth_per_held_lease_kib") is not None:
                per += f" ({rss['growth_per_held_lease_kib']:.1f})"
            row.append(per)
            if not idle["all_held_at_end"]:
                notes.append(
                    f"{cell['n']:,} x {cell['p']} {cell['design']}: not all held at "
                    "the end of the window"
                )
            if cpu.get("available") and cpu.get("other_db_backends"):
                notes.append(
                    f"{cell['n']:,} x {cell['p']} {cell['design']}: "
                    f"{cpu['other_db_backends']} backend(s) of other databases connected "
                    f"(their CPU, {cpu['other_db']:.3f} cores, is in the total)"
                )
        else:
            row += ["-"] * 5
        s = cell.get("sigterm")
        if s:
            text = _s(s["released_s"]) if s["all_released"] else "not all"
            text += f" ({_s(s['others_hold_all_s'])})"
            row.append(text)
            row.append(f"{s['released']:,} / {s['left_to_lapse']:,}")
            row.append(_s(s["stop_s"]))
        else:
            row += ["-"] * 3
        k = cell.get("kill9")
        if k:
            if k["all_held"]:
                text = _s(k["all_held_s"])
                if k["all_held_s"] > k["target_s"]:
                    text += f" (> {k['target_s']:g} s)"
            else:
                text = f"not after {k['timeout_s']:g} s"
            if cell["p"] == 2:
                ok = k["all_held"] and k["all_held_s"] <= SOLE_SURVIVOR_S
                text += f"; survivor covers all N within {SOLE_SURVIVOR_S:g} s: "
                text += "yes" if ok else "no"
            row.append(text)
        else:
            row.append("-")
        lines.append(head + "| " + " | ".join(row) + " |")
        if cell.get("note"):
            notes.append(f"{cell['n']:,} x {cell['p']} {cell['design']}: {cell['note']}")
        log = cell.get("logs") or {}
        if log.get("warnings") or log.get("errors") or log.get("tracebacks"):
            notes.append(
                f"{cell['n']:,} x {cell['p']} {cell['design']}: worker log: "
                f"{log['warnings']} warnings, {log['errors']} errors, {log['tracebacks']} "
                "tracebacks"
                + (f" (commonest: `{log['commonest'][0]['message']}`)" if log["commonest"] else "")
            )
        killed = [h for h, v in (cell.get("stop") or {}).items() if v.startswith("killed: not")]
        if killed:
            notes.append(
                f"{cell['n']:,} x {cell['p']} {cell['design']}: SIGKILLed at the end, not "
                f"stopped within {settings['stop_timeout_s']:g} s: {', '.join(killed)}"
            )
    lines += [
        "",
        "The script's own sampling in the window is one lease-table query at each end and "
        "`/proc` reads (no query in between); its two connections' CPU is reported in "
        "`pool_scale.json` (`idle.server_cpu.own`) and is included in the total.",
    ]
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "pool_scale.json").write_text(json.dumps(report, indent=1) + "\n", "utf-8")
    (output / "pool_scale.md").write_text(render(report), encoding="utf-8")


# -- main ---------------------------------------------------------------------------------------


def parse_grid(text: str) -> list[tuple[int, int]]:
    cells = []
    for part in text.split(","):
        n, _, p = part.strip().lower().partition("x")
        try:
            cell = (int(n.replace("_", "")), int(p))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad cell {part!r}: expected NxP") from None
        if cell[0] < 1 or cell[1] < 2:
            raise argparse.ArgumentTypeError(f"bad cell {part!r}: N ≥ 1 and P ≥ 2")
        cells.append(cell)
    return cells


def parse_designs(text: str) -> list[str]:
    designs = [d.strip() for d in text.split(",") if d.strip()]
    for design in designs:
        if design not in DESIGNS:
            raise argparse.ArgumentTypeError(f"unknown design {design!r} (before, after)")
    return designs


def mem_total_kib() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return 8 * 2**20


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", default=default_dsn(), help="server to create databases on")
    parser.add_argument(
        "--grid", type=parse_grid, default=parse_grid(DEFAULT_GRID), help="NxP,NxP,..."
    )
    parser.add_argument("--designs", type=parse_designs, default=list(DESIGNS), help="before,after")
    parser.add_argument("--before-commit", default=BEFORE_COMMIT, help="the 'before' design")
    parser.add_argument("--ttl", type=float, default=10.0, help="lease TTL (s)")
    parser.add_argument("--idle-interval", type=float, default=1.0, help="pool idle interval")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="give up on coverage, takeover, rejoin (s)"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=11.0,
        help="quiet time between coverage and the window (s; PostgreSQL 15 backends flush "
        "their statistics within 10 s)",
    )
    parser.add_argument("--window", type=float, default=10.0, help="idle-pool window (s)")
    parser.add_argument(
        "--stop-timeout", type=float, default=30.0, help="SIGKILL a worker not stopped by then"
    )
    parser.add_argument(
        "--max-rss-gib",
        type=float,
        default=round(mem_total_kib() * 0.6 / 2**20, 1),
        help="end a cell (killing its workers) when their RSS together exceeds this "
        "(default: 60 %% of RAM)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help="results directory")
    parser.add_argument(
        "--render", action="store_true", help="rewrite pool_scale.md from pool_scale.json"
    )
    args = parser.parse_args(argv)
    for name in ("ttl", "idle_interval", "timeout", "window", "stop_timeout", "max_rss_gib"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    args.max_rss_kib = int(args.max_rss_gib * 2**20)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    output: Path = args.output
    if args.render:
        saved = json.loads((output / "pool_scale.json").read_text(encoding="utf-8"))
        (output / "pool_scale.md").write_text(render(saved), encoding="utf-8")
        return 0
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    started = time.monotonic()
    base = Config(
        work_ids=0,
        processes=0,
        ttl=args.ttl,
        idle_interval=args.idle_interval,
        window=args.window,
        settle=args.settle,
        coverage_timeout=args.timeout,
        failover_timeout=args.timeout,
        stop_timeout=args.stop_timeout,
        sample_interval=0.25,
        tail=0.0,
    )
    report: dict[str, Any] = {
        "settings": {
            "grid": [f"{n}x{p}" for n, p in args.grid],
            "designs": args.designs,
            "before_commit": args.before_commit,
            "ttl_s": args.ttl,
            "idle_interval_s": args.idle_interval,
            "timeout_s": args.timeout,
            "settle_s": args.settle,
            "window_s": args.window,
            "stop_timeout_s": args.stop_timeout,
            "max_rss_gib": args.max_rss_gib,
            "tolerance": TOLERANCE,
            "failover_target_s": args.ttl + FAILOVER_MARGIN_S,
        },
        "environment": environment(args.dsn),
        "cells": [],
    }
    with tempfile.TemporaryDirectory(prefix="worklease-bench-poolscale-") as name:
        tmp = Path(name)
        sources: dict[str, Path | None] = {}
        if "after" in args.designs:
            sources["after"], report["after"] = snapshot_tree(tmp)
        else:
            report["after"] = snapshot_tree(tmp)[1]
        if "before" in args.designs:
            src, detail = export_old(args.before_commit, tmp)
            sources["before"] = src
            report["before"] = {"rev": detail} if src else {"note": detail}
        try:
            for n, p in args.grid:
                for design in args.designs:
                    cfg = replace(base, work_ids=n, processes=p)
                    src = sources[design]
                    if src is None:
                        cell = {"n": n, "p": p, "design": design}
                        cell["note"] = report["before"].get("note", "not measured")
                    else:
                        cell = run_cell(design, src, cfg, args, tmp)
                    report["cells"].append(cell)
                    report["environment"]["load_average_at_end"] = list(os.getloadavg())
                    report["runtime_s"] = round(time.monotonic() - started, 1)
                    write(report, output)
        finally:
            report["environment"]["load_average_at_end"] = list(os.getloadavg())
            report["runtime_s"] = round(time.monotonic() - started, 1)
            write(report, output)
    print(render(report))
    print(f"results written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
