#!/usr/bin/env python
"""Pools at scale: several OS processes share many work IDs on PostgreSQL.

Four processes (``--processes``) each run an asyncio ``AsyncPool`` over the same 10,000 work
IDs (``--work-ids``); each work function holds its work ID until the pool stops
(``benchmarks/scale_worker.py``). From one run this reports

1. coverage: the time from starting the processes until every work ID is held (target ≤ 5 s);
2. the steady-state load while all are held: statements per second on the database, from
   ``pg_stat_database`` (and ``pg_stat_statements`` when the server preloads it), minus the
   benchmark's own queries (target ≤ 100/s);
3. failover: ``kill -9`` of the process holding the most work IDs, then the time until the
   survivors hold all of them again (target ≤ TTL + 2 s).

It measures the current source tree ("new design": the pool scans for free work IDs and
renews in batches) and, for comparison, the per-slot pool of commit 16ed5a9 ("old design":
one acquire attempt per unheld work ID per idle interval, one renewal per lease per TTL/3),
exported with ``git archive``. Every phase is bounded by a timeout.

Results go to ``benchmarks/results/`` (``scale.md``, ``scale.json``, ``scale.png``). Each design
runs in a fresh database ``worklease_bench_scale_<random>`` on the server of ``--dsn``, dropped
at the end. See ``benchmarks/README.md``. The script reports; it never fails on a missed target.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from worklease import PostgresBackend

LOCAL_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=5"
REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
WORKER = Path(__file__).resolve().with_name("scale_worker.py")
OLD_COMMIT = "16ed5a9"
DESIGNS = ("new", "old")
LABELS = {"new": "new design", "old": "old per-slot design"}
COVERAGE_TARGET_S = 5.0
STATEMENTS_TARGET = 100.0
FAILOVER_MARGIN_S = 2.0  # target: TTL + this

HELD = (
    "SELECT holder_id, count(*) FROM worklease_leases"
    " WHERE expires_at > now() AND exit_mode IS NULL"
    " AND NOT starts_with(work_id, 'worklease.member/')"  # fair-share pool memberships
    " GROUP BY holder_id"
)
XACTS = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s"
STATEMENTS = (
    "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements"
    " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


@dataclass(frozen=True)
class Config:
    work_ids: int
    processes: int
    ttl: float
    idle_interval: float
    window: float
    settle: float
    coverage_timeout: float
    failover_timeout: float
    stop_timeout: float
    sample_interval: float
    tail: float

    @property
    def failover_target(self) -> float:
        return self.ttl + FAILOVER_MARGIN_S


class SideError(Exception):
    """A design could not be measured (a worker died, the wrong tree was imported, ...)."""


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the database -------------------------------------------------------------------------------


def default_dsn() -> str:
    return os.environ.get("WORKLEASE_TEST_DSN") or LOCAL_DSN


@contextlib.contextmanager
def fresh_database(server_dsn: str) -> Iterator[tuple[str, str]]:
    """Create ``worklease_bench_scale_<random>`` with the worklease schema; drop it afterwards
    (terminating whatever connections are left first)."""
    name = f"worklease_bench_scale_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            PostgresBackend.apply_schema(conn)
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


def probe_statements(dsn: str) -> str | None:
    """Make ``pg_stat_statements`` readable in the bench database; why not, if it is not."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute(STATEMENTS).fetchone()
    except psycopg.Error as exc:
        return f"pg_stat_statements not available: {exc.diag.message_primary or exc}"
    return None


@dataclass
class Sample:
    """One look at the lease table: when, how many work IDs are held, by whom; and the bench
    database's transaction counter with how many of those transactions were our own."""

    t: float
    total: int
    holders: dict[str, int]
    xacts: int
    own_xacts: int


class Monitor:
    """The benchmark's own view of the database. Lease-table queries run in the bench
    database and are counted (to be subtracted); ``pg_stat_database`` is read from the server
    DSN's database, so those reads cost the bench database nothing."""

    def __init__(self, bench_dsn: str, server_dsn: str, database: str, pss: bool) -> None:
        self.database = database
        self.pss = pss
        self.conn = psycopg.connect(bench_dsn, autocommit=True)
        self.stats = psycopg.connect(server_dsn, autocommit=True)
        self.own_xacts = 0  # transactions we ran in the bench database
        self.own_statements = 0  # statements we ran there (as pg_stat_statements counts them)
        self.samples: list[Sample] = []

    def close(self) -> None:
        self.conn.close()
        self.stats.close()

    def xacts(self) -> int:
        row = self.stats.execute(XACTS, (self.database,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def statements(self) -> int | None:
        if not self.pss:
            return None
        row = self.conn.execute(STATEMENTS).fetchone()
        self.own_xacts += 1
        self.own_statements += 1
        return int(row[0]) if row else 0

    def sample(self) -> Sample:
        before = time.monotonic()
        rows = self.conn.execute(HELD).fetchall()
        self.own_xacts += 1
        self.own_statements += 1
        xacts = self.xacts()
        holders = {str(holder): int(n) for holder, n in rows}
        sample = Sample(
            t=(before + time.monotonic()) / 2,
            total=sum(holders.values()),
            holders=holders,
            xacts=xacts,
            own_xacts=self.own_xacts,
        )
        self.samples.append(sample)
        return sample


# -- the worker processes -----------------------------------------------------------------------


@dataclass
class Worker:
    holder: str
    proc: subprocess.Popen[str]
    stderr_path: Path
    lines: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    reader: threading.Thread | None = None
    killed_at: float | None = None

    def start_reader(self) -> None:
        def read() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                try:
                    record = json.loads(raw)
                except ValueError:
                    record = {"event": "garbage", "raw": raw[:500]}
                with self.lock:
                    self.lines.append(record)

        self.reader = threading.Thread(target=read, name=f"reader-{self.holder}", daemon=True)
        self.reader.start()

    def events(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [line for line in self.lines if line.get("event") == kind]

    def first(self, kind: str) -> dict[str, Any] | None:
        found = self.events(kind)
        return found[0] if found else None

    def stderr_tail(self, lines: int = 8) -> str:
        try:
            text = self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def spawn(
    cfg: Config,
    holder: str,
    dsn: str,
    src: Path,
    logs: Path,
    extra: Sequence[str] = (),
    launcher: Sequence[str] = (),
) -> Worker:
    """Start one worker process; ``launcher`` goes before the interpreter (e.g. setpriv)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    stderr_path = logs / f"{holder}.stderr"
    with stderr_path.open("w", encoding="utf-8") as stderr:
        proc = subprocess.Popen(
            [
                *launcher,
                sys.executable,
                str(WORKER),
                "--dsn",
                dsn,
                "--holder",
                holder,
                "--work-ids",
                str(cfg.work_ids),
                "--ttl",
                str(cfg.ttl),
                "--idle-interval",
                str(cfg.idle_interval),
                "--expect-root",
                str(src / "worklease"),
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
    worker = Worker(holder, proc, stderr_path)
    worker.start_reader()
    return worker


def check_alive(workers: Sequence[Worker]) -> None:
    """Raise ``SideError`` when a worker we did not kill has exited."""
    for worker in workers:
        if worker.killed_at is None and worker.proc.poll() is not None:
            if worker.reader is not None:
                worker.reader.join(timeout=2.0)
            wrong = worker.first("wrong-tree")
            if wrong is not None:
                raise SideError(
                    f"{worker.holder} imported worklease from {wrong['worklease']}, "
                    f"expected {wrong['expected']}"
                )
            raise SideError(
                f"{worker.holder} exited with code {worker.proc.returncode}: {worker.stderr_tail()}"
            )


def stop_workers(workers: Sequence[Worker], timeout: float) -> dict[str, Any]:
    """SIGTERM every live worker, wait up to ``timeout`` in all, SIGKILL what is left."""
    outcome: dict[str, Any] = {}
    for worker in workers:
        if worker.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                worker.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for worker in workers:
        try:
            worker.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            worker.proc.wait()
            outcome[worker.holder] = f"killed: not stopped {timeout:g} s after SIGTERM"
            continue
        if worker.reader is not None:
            worker.reader.join(timeout=5.0)
        if worker.killed_at is not None:
            outcome[worker.holder] = "killed (failover)"
            continue
        stopped = worker.first("stopped")
        if stopped is None:
            outcome[worker.holder] = f"exited with code {worker.proc.returncode}"
        else:
            outcome[worker.holder] = f"stopped in {stopped.get('stop_s') or 0:.2f} s"
    return outcome


_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \S+ ")


def summarize_logs(workers: Sequence[Worker]) -> dict[str, Any]:
    """Count warnings, errors and tracebacks in the workers' stderr; keep the commonest."""
    levels: Counter[str] = Counter()
    messages: Counter[str] = Counter()
    tracebacks = 0
    for worker in workers:
        try:
            text = worker.stderr_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Traceback"):
                tracebacks += 1
            match = _LEVEL.search(line)
            if match and _STAMP.match(line):
                levels[match.group(1)] += 1
                # the message without time and holder, work IDs folded, for grouping
                message = re.sub(r"scale/\d+", "scale/N", _STAMP.sub("", line))
                message = re.sub(r"0x[0-9a-f]+", "0x...", message)
                messages[message[:300]] += 1
    return {
        "warnings": levels["WARNING"],
        "errors": levels["ERROR"] + levels["CRITICAL"],
        "tracebacks": tracebacks,
        "commonest": [{"count": n, "message": m} for m, n in messages.most_common(5)],
    }


# -- one design ---------------------------------------------------------------------------------


def poll_until(
    monitor: Monitor,
    workers: Sequence[Worker],
    done: Callable[[Sample], bool],
    deadline: float,
    interval: float,
) -> Sample | None:
    """Sample every ``interval`` until ``done`` (that sample) or ``deadline`` (``None``)."""
    while True:
        check_alive(workers)
        sample = monitor.sample()
        if done(sample):
            return sample
        if sample.t >= deadline:
            return None
        time.sleep(max(min(interval, deadline - time.monotonic()), 0.0))


def sample_for(
    monitor: Monitor, workers: Sequence[Worker], seconds: float, interval: float
) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        check_alive(workers)
        monitor.sample()
        time.sleep(max(min(interval, end - time.monotonic()), 0.0))


def stats_near(worker: Worker, t: float) -> dict[str, Any] | None:
    """The worker's stats line reported closest to monotonic time ``t``."""
    stats = worker.events("stats")
    if not stats:
        return None
    return min(stats, key=lambda line: abs(float(line["t"]) - t))


COUNTED = (
    "acquire_events",
    "renew_events",
    "renew_errors",
    "scans",
    "release_events",
    "slot_backoffs",
)


def worker_rates(workers: Sequence[Worker], t0: float, t1: float) -> dict[str, Any]:
    """Per-second rates of the workers' observer counts and CPU use between two times."""
    totals: dict[str, float] = dict.fromkeys((*COUNTED, "cpu_cores"), 0.0)
    seconds = 0.0
    for worker in workers:
        a, b = stats_near(worker, t0), stats_near(worker, t1)
        if a is None or b is None or b["t"] <= a["t"]:
            continue
        span = float(b["t"]) - float(a["t"])
        seconds = max(seconds, span)
        for key in COUNTED:
            totals[key] += (int(b.get(key, 0)) - int(a.get(key, 0))) / span
        totals["cpu_cores"] += (float(b["cpu_s"]) - float(a["cpu_s"])) / span
    return {key: round(totals[key], 3) for key in (*COUNTED, "cpu_cores")} | {
        "measured_over_s": round(seconds, 3)
    }


def run_side(design: str, src: Path, cfg: Config, server_dsn: str, tmp: Path) -> dict[str, Any]:
    """Start the processes on ``src``'s worklease and take the three measurements."""
    logs = tmp / f"logs-{design}"
    logs.mkdir()
    n = cfg.work_ids
    holders = [f"proc-{i}" for i in range(cfg.processes)]
    result: dict[str, Any] = {"measured": False, "source": str(src)}
    with fresh_database(server_dsn) as (database, dsn):
        result["database"] = database
        why_not = probe_statements(dsn)
        result["pg_stat_statements"] = why_not or "available"
        monitor = Monitor(dsn, server_dsn, database, pss=why_not is None)
        workers: list[Worker] = []
        t0 = time.monotonic()
        try:
            _progress(f"{LABELS[design]}: {cfg.processes} processes, {n} work IDs ({database})")
            monitor.sample()
            t0 = time.monotonic()
            workers = [spawn(cfg, holder, dsn, src, logs) for holder in holders]

            # 1. coverage
            covered = poll_until(
                monitor,
                workers,
                lambda s: s.total >= n,
                t0 + cfg.coverage_timeout,
                cfg.sample_interval,
            )
            best = max(s.total for s in monitor.samples)
            last = monitor.samples[-1]
            starts = [s["t"] for w in workers if (s := w.first("started")) is not None]
            result["worker_start_s"] = sorted(round(t - t0, 3) for t in starts)
            result["coverage"] = {
                "covered": covered is not None,
                "seconds": None if covered is None else covered.t - t0,
                "seconds_from_first_pool_start": (
                    None if covered is None or not starts else covered.t - min(starts)
                ),
                "timeout_s": cfg.coverage_timeout,
                "max_fraction_held": best / n,
                "fraction_held_at_end": last.total / n,
            }
            _progress(
                f"  coverage: {_seconds(result['coverage']['seconds'])}"
                if covered
                else f"  not covered after {cfg.coverage_timeout:g} s ({best / n:.1%} at best)"
            )

            # 2. steady state
            sample_for(monitor, workers, cfg.settle, 0.5)
            pss0_own = monitor.own_statements
            x0 = monitor.xacts()
            s0 = monitor.statements()
            own0 = monitor.own_xacts
            w0 = time.monotonic()
            first = len(monitor.samples)
            sample_for(monitor, workers, cfg.window, 1.0)
            s1 = monitor.statements()
            x1 = monitor.xacts()
            w1 = time.monotonic()
            span = w1 - w0
            in_window = monitor.samples[first:]
            own = monitor.own_xacts - own0
            held = [s.total for s in in_window]
            steady: dict[str, Any] = {
                "window_s": span,
                "from_s": w0 - t0,
                "to_s": w1 - t0,
                "xacts": x1 - x0,
                "own_xacts": own,
                "statements_per_s": (x1 - x0 - own) / span,
                "all_held": bool(held) and min(held) >= n,
                "min_held": min(held) if held else None,
                "pss_statements_per_s": None,
                "workers": worker_rates(workers, w0, w1),
            }
            if s0 is not None and s1 is not None:
                # our pg_stat_statements read at the start and the samples since are in it
                own_pss = monitor.own_statements - pss0_own - 1
                steady["pss_statements"] = s1 - s0
                steady["pss_own_statements"] = own_pss
                steady["pss_statements_per_s"] = (s1 - s0 - own_pss) / span
            result["steady"] = steady
            _progress(f"  steady state: {steady['statements_per_s']:.1f} statements/s")

            # 3. failover
            before = monitor.sample()
            result["held_before_kill"] = {h: before.holders.get(h, 0) for h in holders}
            victim = max(workers, key=lambda w: before.holders.get(w.holder, 0))
            victim_held = before.holders.get(victim.holder, 0)
            victim.proc.send_signal(signal.SIGKILL)
            victim.killed_at = kill = time.monotonic()
            victim.proc.wait()
            gone: list[float] = []

            def recovered(sample: Sample) -> bool:
                mine = sample.holders.get(victim.holder, 0)
                if mine == 0 and not gone:
                    gone.append(sample.t)
                return mine == 0 and sample.total >= n

            back = poll_until(
                monitor,
                workers,
                recovered,
                kill + cfg.ttl + cfg.failover_timeout,
                cfg.sample_interval,
            )
            end = monitor.samples[-1]
            result["failover"] = {
                "victim": victim.holder,
                "victim_held": victim_held,
                "kill_s": kill - t0,
                "recovered": back is not None,
                "seconds": None if back is None else back.t - kill,
                "victim_none_held_s": gone[0] - kill if gone else None,
                "timeout_s": cfg.ttl + cfg.failover_timeout,
                "fraction_held_at_end": end.total / n,
            }
            _progress(
                f"  failover ({victim.holder} held {victim_held}): "
                + (
                    _seconds(result["failover"]["seconds"])
                    if back
                    else f"not recovered after {cfg.ttl + cfg.failover_timeout:g} s"
                )
            )
            sample_for(monitor, workers, cfg.tail, cfg.sample_interval * 5)
            result["measured"] = True
        except (SideError, psycopg.Error) as exc:
            result["note"] = f"not measured: {exc}"
            _progress(f"  {result['note']}")
        finally:
            result["stop"] = stop_workers(workers, cfg.stop_timeout)
            result["logs"] = summarize_logs(workers)
            monitor.close()
            result["timeline"] = timeline(monitor.samples, t0, holders)
    return result


def timeline(samples: Sequence[Sample], t0: float, holders: Sequence[str]) -> dict[str, Any]:
    """The samples, compacted for scale.json and the chart."""
    return {
        "t": [round(s.t - t0, 3) for s in samples],
        "held": [s.total for s in samples],
        "by_holder": {h: [s.holders.get(h, 0) for s in samples] for h in holders},
        "xacts": [s.xacts for s in samples],
        "own_xacts": [s.own_xacts for s in samples],
    }


# -- the old design -----------------------------------------------------------------------------


def export_old(commit: str, tmp: Path) -> tuple[Path | None, str]:
    """``git archive <commit> src`` unpacked under ``tmp``; the src path, or why not."""
    target = tmp / f"worklease-{commit}"
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--verify", "--short", f"{commit}^{{commit}}"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit, "src"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        target.mkdir()
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(target, filter="data")
    except (OSError, subprocess.SubprocessError, tarfile.TarError) as exc:
        detail = getattr(exc, "stderr", None)
        if isinstance(detail, bytes):
            detail = detail.decode(errors="replace")
        return None, f"not measured: commit {commit} unavailable ({(detail or exc)!s})".strip()
    src = target / "src"
    if not (src / "worklease" / "__init__.py").is_file():
        return None, f"not measured: commit {commit} has no src/worklease"
    return src, rev


# -- environment and output ---------------------------------------------------------------------


def git_state() -> dict[str, Any]:
    state: dict[str, Any] = {"commit": None, "src_modified": None}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        state["commit"] = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        state["src_modified"] = bool(status.strip())
    return state


def environment(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        host = conn.info.host
    versions: dict[str, str] = {}
    for package in ("psycopg", "psycopg_pool", "matplotlib"):
        with contextlib.suppress(ImportError):
            versions[package] = str(getattr(importlib.import_module(package), "__version__", "?"))
    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "postgresql": row[0] if row else "?",
        "host": host,
        "packages": versions,
        "git": git_state(),
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def _load(value: object) -> str:
    if isinstance(value, list) and value:
        return f"{float(value[0]):.2f}"
    return "?"


def verdicts(side: dict[str, Any], cfg: Config) -> dict[str, bool | None]:
    """pass/fail of one measured design against each target."""
    if not side.get("measured"):
        return {"coverage": None, "statements": None, "pss": None, "failover": None}
    coverage, steady, failover = side["coverage"], side["steady"], side["failover"]
    pss = steady.get("pss_statements_per_s")
    return {
        "coverage": coverage["covered"] and coverage["seconds"] <= COVERAGE_TARGET_S,
        "statements": steady["all_held"] and steady["statements_per_s"] <= STATEMENTS_TARGET,
        "pss": None if pss is None else steady["all_held"] and pss <= STATEMENTS_TARGET,
        # a failover only counts from a stable state: all held through the window
        "failover": (
            failover["recovered"] and failover["seconds"] <= cfg.failover_target
            if steady["all_held"]
            else None
        ),
    }


def render_markdown(report: dict[str, Any], cfg: Config) -> str:
    env, sides = report["environment"], report["sides"]
    git = env.get("git", {})
    modified = " with uncommitted changes in src/" if git.get("src_modified") else ""
    old = sides["old"]
    old_source = (
        f"commit {report['settings']['old_commit']} ({old.get('commit', '?')})"
        if old.get("measured") or old.get("commit")
        else old.get("note", "not measured")
    )
    n = cfg.work_ids
    lines = [
        f"# worklease pools at scale: {cfg.processes} processes x {n:,} work IDs",
        "",
        f"Run {env.get('started_at', '?')}: PostgreSQL {env.get('postgresql', '?')} on "
        f"{env.get('host', '?')}, Python {env.get('python', '?')}, "
        f"psycopg {env.get('packages', {}).get('psycopg', '?')}, {env.get('cpus', '?')} CPUs "
        f"(workers and server on one machine), load average at start "
        f"{_load(env.get('load_average_at_start'))}, at end "
        f"{_load(env.get('load_average_at_end'))}. New design: the working tree at "
        f"{git.get('commit') or '?'}{modified}; old per-slot design: {old_source}. "
        f"TTL {cfg.ttl:g} s, idle interval {cfg.idle_interval:g} s, settle {cfg.settle:g} s, "
        f"window {cfg.window:g} s. Runtime {report['runtime_s']:.1f} s.",
        "",
        f"Each process runs `AsyncPool` over the same {n:,} work IDs (`AsyncLease`, "
        "`AsyncPostgresBackend.connect(dsn)`); every work function holds its work ID until the "
        "pool stops. Statements per second: transactions in the bench database over the window "
        "(`pg_stat_database.xact_commit + xact_rollback`: one per round trip, including the "
        "empty query of the pool's connection check before each checkout), minus the "
        "benchmark's own queries; `pg_stat_statements`, when the server preloads it, counts "
        "statements instead (each of a multi-statement string, no checks). The result column "
        "judges the new design, the old one's in brackets.",
        "",
        "| metric | new design | old per-slot design | target | result |",
        "|---|---:|---:|---:|---|",
    ]
    checks = {design: verdicts(sides[design], cfg) for design in DESIGNS}

    def cell(design: str, fn: Callable[[dict[str, Any]], str]) -> str:
        side = sides[design]
        if not side.get("measured"):
            return str(side.get("note", "not measured"))
        return fn(side)

    def verdict(key: str) -> str:
        def word(value: bool | None) -> str:
            return "-" if value is None else ("pass" if value else "FAIL")

        new, old_ = checks["new"][key], checks["old"][key]
        text = word(new)
        if old_ is not None:
            text += f" (old: {word(old_)})"
        return text

    def coverage(side: dict[str, Any]) -> str:
        c = side["coverage"]
        if c["covered"]:
            return _seconds(c["seconds"])
        return (
            f"not covered after {c['timeout_s']:g} s ({c['max_fraction_held']:.1%} held at "
            f"best, {c['fraction_held_at_end']:.1%} at the end)"
        )

    def from_pool(side: dict[str, Any]) -> str:
        c = side["coverage"]
        return _seconds(c["seconds_from_first_pool_start"]) if c["covered"] else "-"

    def statements(side: dict[str, Any]) -> str:
        s = side["steady"]
        text = _rate(s["statements_per_s"])
        if not s["all_held"]:
            text += f" (not all held: min {s['min_held'] or 0:,})"
        return text

    def pss(side: dict[str, Any]) -> str:
        s = side["steady"]
        if s.get("pss_statements_per_s") is None:
            return "n/a" if side["pg_stat_statements"] != "available" else "-"
        return _rate(s["pss_statements_per_s"])

    def held_through(side: dict[str, Any]) -> str:
        s = side["steady"]
        return "yes" if s["all_held"] else f"no (min {s['min_held'] or 0:,})"

    def before_kill(side: dict[str, Any]) -> str:
        return " / ".join(f"{v:,}" for v in side["held_before_kill"].values())

    def victim(side: dict[str, Any]) -> str:
        f = side["failover"]
        return f"{f['victim_held']:,} ({f['victim']})"

    def failover(side: dict[str, Any]) -> str:
        f = side["failover"]
        if f["recovered"]:
            if not side["steady"]["all_held"]:
                return f"{_seconds(f['seconds'])} (not judged: not all held in the window)"
            return _seconds(f["seconds"])
        return (
            f"not recovered after {f['timeout_s']:g} s ({f['fraction_held_at_end']:.1%} held at "
            "the end)"
        )

    def victim_gone(side: dict[str, Any]) -> str:
        return _seconds(side["failover"]["victim_none_held_s"])

    def cpu(side: dict[str, Any]) -> str:
        return f"{side['steady']['workers']['cpu_cores']:.2f}"

    def events(side: dict[str, Any]) -> str:
        w = side["steady"]["workers"]
        return (
            f"{_rate(w['acquire_events'])} / {_rate(w['renew_events'])} "
            f"({_rate(w['renew_errors'])} failed) / {_rate(w['scans'])}"
        )

    def logs(side: dict[str, Any]) -> str:
        log = side["logs"]
        return f"{log['warnings']} / {log['errors']} / {log['tracebacks']}"

    rows: list[tuple[str, Callable[[dict[str, Any]], str], str, str]] = [
        (
            f"coverage: processes started → all {n:,} work IDs held",
            coverage,
            f"≤ {COVERAGE_TARGET_S:g} s",
            verdict("coverage"),
        ),
        ("coverage: first pool running → all held", from_pool, "-", "-"),
        (
            "steady state: statements/s in total (pg_stat_database)",
            statements,
            f"≤ {STATEMENTS_TARGET:g}",
            verdict("statements"),
        ),
        (
            "steady state: statements/s in total (pg_stat_statements)",
            pss,
            f"≤ {STATEMENTS_TARGET:g}",
            verdict("pss"),
        ),
        ("all work IDs held through the window", held_through, "-", "-"),
        ("work IDs held per process before the kill", before_kill, "-", "-"),
        ("work IDs held by the killed process", victim, "-", "-"),
        (
            "failover: kill -9 → all held again by the survivors",
            failover,
            f"≤ {cfg.failover_target:g} s (TTL + {FAILOVER_MARGIN_S:g} s)",
            verdict("failover"),
        ),
        ("failover: kill -9 → the killed process holds none", victim_gone, "-", "-"),
        ("worker CPU in the window (cores, all processes)", cpu, "-", "-"),
        (
            "lease events/s in the window: acquire attempts / renewals (failed) / scans",
            events,
            "-",
            "-",
        ),
        ("worker log lines: warnings / errors / tracebacks", logs, "-", "-"),
    ]
    for label, fn, target, result in rows:
        lines.append(f"| {label} | {cell('new', fn)} | {cell('old', fn)} | {target} | {result} |")

    new, old = sides["new"], sides["old"]
    if new.get("measured") and old.get("measured"):
        a, b = new["steady"]["statements_per_s"], old["steady"]["statements_per_s"]
        if not new["steady"]["all_held"]:
            lines += ["", "No gain computed: the new design lost work IDs during the window."]
        elif a > 0:
            lines += ["", f"The old design sent {b / a:,.0f} times the statements per second."]
    notes = []
    for design in DESIGNS:
        side = sides[design]
        if side.get("pg_stat_statements") not in (None, "available"):
            notes.append(f"{side['pg_stat_statements']} (only `pg_stat_database` is reported)")
            break
    for design in DESIGNS:
        log = sides[design].get("logs")
        if log and log["commonest"]:
            notes.append(
                f"Commonest worker log lines ({LABELS[design]}): "
                + "; ".join(f"{m['count']}x `{m['message']}`" for m in log["commonest"][:3])
            )
        stop = sides[design].get("stop")
        if stop:
            notes.append(
                f"Shutdown ({LABELS[design]}, SIGTERM): "
                + ", ".join(f"{h} {s}" for h, s in stop.items())
            )
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"


def render_chart(report: dict[str, Any], cfg: Config, path: Path) -> str | None:
    """Held work IDs and statements/s over time per design; returns why not, if not drawn."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return "matplotlib not installed (pip install -e . --group bench): no chart"
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    measured = [d for d in DESIGNS if report["sides"][d].get("timeline", {}).get("t")]
    if not measured:
        return "nothing measured: no chart"
    fig, axes = plt.subplots(
        len(measured), 2, figsize=(13, 4.2 * len(measured)), dpi=110, squeeze=False
    )
    for row, design in enumerate(measured):
        side = report["sides"][design]
        line = side["timeline"]
        ts, ax = line["t"], axes[row][0]
        for holder, counts in line["by_holder"].items():
            ax.plot(ts, counts, linewidth=1, alpha=0.8, label=holder)
        ax.plot(ts, line["held"], color="#222222", linewidth=2, label="held (all processes)")
        ax.axhline(cfg.work_ids, color="#888888", linestyle="dotted", linewidth=1)
        ax.set_ylabel("work IDs held")
        rates_ax = axes[row][1]
        mid, rates = _rates(line)
        rates_ax.plot(mid, rates, color="#4C72B0")
        rates_ax.axhline(STATEMENTS_TARGET, color="#C44E52", linestyle="dashed", label="target")
        rates_ax.set_yscale("symlog", linthresh=10)
        rates_ax.set_ylim(bottom=0)
        rates_ax.set_ylabel("statements/s (pg_stat_database, 1 s bins)")
        for a in (ax, rates_ax):
            _mark(a, side, cfg)
            a.set_xlabel("seconds since the processes started")
        ax.set_title(f"{LABELS[design]}: work IDs held")
        rates_ax.set_title(f"{LABELS[design]}: load on the database")
        ax.legend(loc="center right", fontsize=7)
        rates_ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def _mark(ax: Any, side: dict[str, Any], cfg: Config) -> None:
    coverage, steady, failover = side.get("coverage"), side.get("steady"), side.get("failover")
    ax.axvline(COVERAGE_TARGET_S, color="#9467BD", linestyle="dotted", linewidth=1)
    if coverage and coverage["covered"]:
        ax.axvline(coverage["seconds"], color="#9467BD", linewidth=1, label="all held")
    if steady:
        ax.axvspan(steady["from_s"], steady["to_s"], color="#DDDDDD", alpha=0.5, label="window")
    if failover:
        kill = failover["kill_s"]
        ax.axvline(kill, color="#C44E52", linestyle="dashed", linewidth=1.2, label="kill -9")
        ax.axvline(kill + cfg.failover_target, color="#C44E52", linestyle="dotted", linewidth=1)


def _rates(line: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Statements/s between samples at least a second apart, without our own queries."""
    ts, xacts, own = line["t"], line["xacts"], line["own_xacts"]
    mid: list[float] = []
    rates: list[float] = []
    j = 0
    for i in range(len(ts)):
        j = max(j, i + 1)
        while j < len(ts) and ts[j] - ts[i] < 1.0:
            j += 1
        if j >= len(ts):
            break
        span = ts[j] - ts[i]
        mid.append((ts[i] + ts[j]) / 2)
        rates.append(max((xacts[j] - xacts[i] - (own[j] - own[i])) / span, 0.0))
    return mid, rates


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--dsn",
        default=default_dsn(),
        help="server to benchmark on; a fresh database per design is created and dropped there "
        "(default: $WORKLEASE_TEST_DSN or the local server on 127.0.0.1:5432)",
    )
    parser.add_argument("--work-ids", type=int, default=10_000, help="work IDs (shared by all)")
    parser.add_argument("--processes", type=int, default=4, help="worker processes")
    parser.add_argument("--ttl", type=float, default=5.0, help="lease TTL in seconds")
    parser.add_argument("--idle-interval", type=float, default=1.0, help="pool idle interval")
    parser.add_argument("--window", type=float, default=10.0, help="steady-state window (s)")
    parser.add_argument(
        "--settle",
        type=float,
        default=None,
        help="wait after coverage before the window starts (default: one TTL)",
    )
    parser.add_argument(
        "--coverage-timeout", type=float, default=60.0, help="give up on coverage after (s)"
    )
    parser.add_argument(
        "--failover-timeout",
        type=float,
        default=20.0,
        help="give up on failover this long after TTL has passed since the kill (s)",
    )
    parser.add_argument(
        "--stop-timeout", type=float, default=20.0, help="SIGKILL workers not stopped by then"
    )
    parser.add_argument(
        "--sample-interval", type=float, default=0.1, help="lease-table polling interval (s)"
    )
    parser.add_argument(
        "--old-commit", default=OLD_COMMIT, help="the per-slot design to compare with"
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--skip-old", action="store_true", help="measure the new design only")
    parser.add_argument("--skip-chart", action="store_true", help="do not draw scale.png")
    args = parser.parse_args(argv)
    if args.work_ids < 1 or args.processes < 2:
        parser.error("--work-ids must be at least 1 and --processes at least 2 (for failover)")
    for name in ("ttl", "idle_interval", "window", "sample_interval"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    cfg = Config(
        work_ids=args.work_ids,
        processes=args.processes,
        ttl=args.ttl,
        idle_interval=args.idle_interval,
        window=args.window,
        settle=args.ttl if args.settle is None else args.settle,
        coverage_timeout=args.coverage_timeout,
        failover_timeout=args.failover_timeout,
        stop_timeout=args.stop_timeout,
        sample_interval=args.sample_interval,
        tail=2.0,
    )
    output: Path = args.output
    output.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "settings": {
            "work_ids": cfg.work_ids,
            "processes": cfg.processes,
            "ttl_s": cfg.ttl,
            "idle_interval_s": cfg.idle_interval,
            "window_s": cfg.window,
            "settle_s": cfg.settle,
            "coverage_timeout_s": cfg.coverage_timeout,
            "failover_timeout_s": cfg.ttl + cfg.failover_timeout,
            "stop_timeout_s": cfg.stop_timeout,
            "sample_interval_s": cfg.sample_interval,
            "old_commit": args.old_commit,
            "targets": {
                "coverage_s": COVERAGE_TARGET_S,
                "statements_per_s": STATEMENTS_TARGET,
                "failover_s": cfg.failover_target,
            },
        },
        "environment": environment(args.dsn),
        "sides": {},
    }
    sides: dict[str, dict[str, Any]] = report["sides"]
    with tempfile.TemporaryDirectory(prefix="worklease-bench-scale-") as name:
        tmp = Path(name)
        sides["new"] = run_side("new", REPO / "src", cfg, args.dsn, tmp)
        if args.skip_old:
            sides["old"] = {"measured": False, "note": "skipped (--skip-old)"}
        else:
            src, detail = export_old(args.old_commit, tmp)
            if src is None:
                sides["old"] = {"measured": False, "note": detail}
                _progress(f"old per-slot design: {detail}")
            else:
                sides["old"] = run_side("old", src, cfg, args.dsn, tmp)
                sides["old"]["commit"] = detail
    for side in sides.values():
        side["passed"] = verdicts(side, cfg)
    report["environment"]["load_average_at_end"] = list(os.getloadavg())
    report["runtime_s"] = round(time.monotonic() - started, 3)

    markdown = render_markdown(report, cfg)
    (output / "scale.md").write_text(markdown, encoding="utf-8")
    (output / "scale.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if not args.skip_chart:
        why = render_chart(report, cfg, output / "scale.png")
        if why:
            _progress(why)
    print(markdown)
    print(f"results written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
