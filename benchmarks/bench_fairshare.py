#!/usr/bin/env python
"""Fair-share pools at scale: how evenly separate OS processes share 10,000 work IDs.

Each process runs ``AsyncPool`` over the same work IDs (``benchmarks/scale_worker.py`` with
``--trail``: every work function checkpoints ``"<holder>:<token>"`` once and holds its work
ID until the pool stops or hands it over). One run measures, for the current tree ("fair
share") and for the scan design of commit 77ddce9 (the pool as it was before fair share:
every process takes whatever is free), on the same server:

1. four processes start together: the time until each holds N/4 ± 2 % (target ≤ 10 s);
2. the steady state with everything held: statements per second (target ≤ 100);
3. ``kill -9`` of the process holding most: the time until the three survivors hold N/3 ±
   2 % each and all N are held (target ≤ TTL + 5 s);
4. a fifth process joins: the time until the four live ones hold N/4 ± 2 % each (target
   ≤ 15 s), and how the join moved work: the share of moves done by release (the successor
   read ``abandoned``, not ``expired``; target 100 %) and checkpoints lost (the successor
   read something other than the previous holder's acknowledged checkpoint; target 0);
5. a process holding all N alone (its start's checkpoints written) gets SIGTERM: the time
   until every work ID is released
   (a successor may take it), and whether they were released rather than left to lapse
   (target ≤ 1 s, all released); the process's own time from SIGTERM until its pool
   stopped and its backend closed is shown beside it.

Results go to ``benchmarks/results/fairshare.{md,json,png}``; each design runs in fresh
databases on the server of ``--dsn``, dropped afterwards. The script reports; it never fails
on a missed target.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench_scale import (
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
    fresh_database,
    probe_statements,
    spawn,
    stop_workers,
    summarize_logs,
)

SCAN_COMMIT = "77ddce9"
DESIGNS = ("fair", "scan")
LABELS = {"fair": "fair share", "scan": f"scan design ({SCAN_COMMIT})"}
TOLERANCE = 0.02
START_TARGET_S = 10.0
LOSS_MARGIN_S = 5.0
JOIN_TARGET_S = 15.0
STATEMENTS_TARGET = 100.0
SIGTERM_TARGET_S = 1.0


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def even(sample: Sample, holders: Sequence[str], total: int) -> bool:
    """Every one of ``holders`` holds its share ± 2 %, nobody else holds any, all are held."""
    share = total / len(holders)
    if sample.total < total or set(sample.holders) - set(holders):
        return False
    return all(abs(sample.holders.get(h, 0) - share) <= share * TOLERANCE for h in holders)


def wait(
    monitor: Monitor,
    workers: Sequence[Worker],
    done: Callable[[Sample], bool],
    timeout: float,
    interval: float = 0.25,
) -> tuple[Sample | None, float]:
    """Sample until ``done`` or ``timeout``; the sample (or None) and the seconds waited."""
    start = time.monotonic()
    while True:
        check_alive(workers)
        sample = monitor.sample()
        if done(sample):
            return sample, sample.t - start
        if sample.t - start >= timeout:
            return None, timeout
        time.sleep(interval)


def quiet(workers: Sequence[Worker], timeout: float = 60.0) -> float:
    """Wait until every work function has written its one checkpoint (the start's burst of
    writes is over); the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        acquired = sum(len(w.events("acquired")) for w in workers)
        written = sum(len(w.events("checkpointed")) for w in workers)
        if acquired and written >= acquired:
            break
        time.sleep(0.1)
    return time.monotonic() - start


def shares(sample: Sample, holders: Sequence[str]) -> list[int]:
    return [sample.holders.get(h, 0) for h in holders]


def moves(workers: Sequence[Worker], since: float, until: float) -> dict[str, Any]:
    """How the acquisitions between ``since`` and ``until`` moved work (see the module doc)."""
    checkpoints: dict[tuple[str, str], set[str]] = {}
    for worker in workers:
        for event in worker.events("checkpointed"):
            checkpoints.setdefault((event["work_id"], worker.holder), set()).add(event["state"])
    total = released = lost = 0
    for worker in workers:
        for event in worker.events("acquired"):
            previous = event.get("prev_holder")
            if not since <= event["t"] <= until or previous in (None, worker.holder):
                continue
            total += 1
            if event["prev_exit"] == "abandoned":
                released += 1
            acked = checkpoints.get((event["work_id"], previous), set())
            if acked and event.get("state") not in acked:
                lost += 1
            elif not acked and event.get("state") is not None:
                pass  # written before the window by a holder we did not hear from: fine
    return {"moves": total, "by_release": released, "checkpoints_lost": lost}


def run_design(design: str, src: Path, cfg: Config, server: str, tmp: Path) -> dict[str, Any]:
    logs = tmp / f"logs-{design}"
    logs.mkdir()
    n = cfg.work_ids
    extra = ["--trail", "--fair-share", "on" if design == "fair" else "off"]
    result: dict[str, Any] = {"measured": False, "source": str(src)}
    holders = [f"proc-{i}" for i in range(cfg.processes)]
    with fresh_database(server) as (database, dsn):
        monitor = Monitor(dsn, server, database, pss=probe_statements(dsn) is None)
        workers: list[Worker] = []
        t0 = time.monotonic()
        try:
            _progress(f"{LABELS[design]}: {cfg.processes} processes, {n:,} work IDs")
            monitor.sample()
            t0 = time.monotonic()
            workers = [spawn(cfg, h, dsn, src, logs, extra) for h in holders]
            sample, seconds = wait(monitor, workers, lambda s: even(s, holders, n), 60.0)
            last = monitor.samples[-1]
            result["start"] = {
                "even": sample is not None,
                "seconds": seconds,
                "shares": shares(sample or last, holders),
            }
            _progress(f"  start: {seconds:.2f} s, {result['start']['shares']}")

            # The steady state starts once the start's burst of checkpoints is over, and
            # ``settle`` later: an idle PostgreSQL 15 backend reports its statistics up to 10 s
            # after its last statement.
            result["start"]["burst_over_s"] = seconds + quiet(workers)
            time.sleep(cfg.settle)
            x0, own0, w0 = monitor.xacts(), monitor.own_xacts, time.monotonic()
            first = len(monitor.samples)
            end = w0 + cfg.window
            while time.monotonic() < end:
                check_alive(workers)
                monitor.sample()
                time.sleep(1.0)
            x1, w1 = monitor.xacts(), time.monotonic()
            held = [s.total for s in monitor.samples[first:]]
            result["steady"] = {
                "statements_per_s": (x1 - x0 - (monitor.own_xacts - own0)) / (w1 - w0),
                "all_held": bool(held) and min(held) >= n,
            }
            _progress(f"  steady: {result['steady']['statements_per_s']:.1f} statements/s")

            before = monitor.sample()
            victim = max(workers, key=lambda w: before.holders.get(w.holder, 0))
            victim.proc.send_signal(signal.SIGKILL)
            victim.killed_at = time.monotonic()
            victim.proc.wait()
            survivors = [h for h in holders if h != victim.holder]
            sample, seconds = wait(
                monitor, workers, lambda s: even(s, survivors, n), cfg.ttl + 30.0
            )
            result["loss"] = {
                "victim": victim.holder,
                "victim_held": before.holders.get(victim.holder, 0),
                "even": sample is not None,
                "seconds": seconds,
                "shares": shares(sample or monitor.samples[-1], survivors),
            }
            _progress(f"  kill -9: {seconds:.2f} s, {result['loss']['shares']}")

            time.sleep(2.0)
            joined = time.monotonic()
            newcomer = f"proc-{cfg.processes}"
            workers.append(spawn(cfg, newcomer, dsn, src, logs, extra))
            live = [*survivors, newcomer]
            sample, seconds = wait(monitor, workers, lambda s: even(s, live, n), 30.0)
            settled = time.monotonic()
            time.sleep(1.0)  # the last acquisitions reported
            result["join"] = {
                "even": sample is not None,
                "seconds": seconds,
                "shares": shares(sample or monitor.samples[-1], live),
                **moves(workers, joined, settled + 1.0),
            }
            _progress(f"  join: {seconds:.2f} s, {result['join']['shares']}")
            result["measured"] = True
        except SideError as exc:
            result["note"] = f"not measured: {exc}"
            _progress(f"  {result['note']}")
        finally:
            result["stop"] = stop_workers(workers, cfg.stop_timeout)
            result["logs"] = summarize_logs(workers)
            result["timeline"] = {
                "t": [round(s.t - t0, 3) for s in monitor.samples],
                "by_holder": {
                    h: [s.holders.get(h, 0) for s in monitor.samples]
                    for h in [*holders, f"proc-{cfg.processes}"]
                },
            }
            monitor.close()
    result["sigterm"] = sigterm_alone(design, src, cfg, server, tmp, extra)
    return result


def sigterm_alone(
    design: str, src: Path, cfg: Config, server: str, tmp: Path, extra: list[str]
) -> dict[str, Any]:
    """One process holding every work ID gets SIGTERM: how long until it exits, and were its
    work IDs released (not left to lapse)?"""
    logs = tmp / f"logs-{design}-alone"
    logs.mkdir()
    n = cfg.work_ids
    with fresh_database(server) as (database, dsn):
        monitor = Monitor(dsn, server, database, pss=False)
        worker = spawn(cfg, "alone", dsn, src, logs, extra)
        try:
            sample, _ = wait(monitor, [worker], lambda s: s.total >= n, 60.0)
            if sample is None:
                return {"measured": False, "note": "never held everything"}
            quiet([worker])  # holding everything, its start's checkpoints written
            time.sleep(1.0)
            count = (
                "SELECT count(*) FILTER (WHERE exit_mode IS NOT NULL),"
                " count(*) FILTER (WHERE exit_mode IS NULL)"
                " FROM worklease_leases WHERE NOT starts_with(work_id, 'worklease.member/')"
            )
            sent = time.monotonic()
            worker.proc.send_signal(signal.SIGTERM)
            released_s: float | None = None
            while worker.proc.poll() is None or released_s is None:
                row = monitor.conn.execute(count).fetchone()
                if released_s is None and row is not None and int(row[0]) >= n:
                    released_s = time.monotonic() - sent
                if time.monotonic() - sent > 60:
                    break
                time.sleep(0.02)
            worker.proc.wait(timeout=60)
            exited = None
            stopped = worker.first("stopped")
            if stopped is not None and stopped.get("stop_s") is not None:
                exited = float(stopped["stop_s"])
            rows = monitor.conn.execute(count).fetchone()
            released, lapsing = (int(rows[0]), int(rows[1])) if rows else (0, 0)
            return {
                "measured": True,
                "seconds": released_s if released_s is not None else time.monotonic() - sent,
                "stopped_s": exited,
                "released": released,
                "left": lapsing,
            }
        finally:
            stop_workers([worker], cfg.stop_timeout)
            monitor.close()


def verdict(value: bool | None) -> str:
    return "-" if value is None else ("pass" if value else "FAIL")


def render(report: dict[str, Any], cfg: Config) -> str:
    sides, env = report["sides"], report["environment"]
    n = cfg.work_ids

    def timed(side: dict[str, Any], key: str) -> str:
        phase = side.get(key)
        if not side.get("measured") or phase is None:
            return str(side.get("note", "not measured"))
        split = " / ".join(f"{x:,}" for x in phase["shares"])
        if phase["even"]:
            return f"{phase['seconds']:.2f} s ({split})"
        return f"not even after {phase['seconds']:.0f} s ({split})"

    def passed(side: dict[str, Any], key: str, target: float) -> bool | None:
        phase = side.get(key)
        if not side.get("measured") or phase is None:
            return None
        return bool(phase["even"] and phase["seconds"] <= target)

    def moved(side: dict[str, Any]) -> str:
        join = side.get("join")
        if not side.get("measured") or join is None:
            return "-"
        if not join["moves"]:
            return "no moves"
        share = join["by_release"] / join["moves"]
        return f"{share:.0%} of {join['moves']:,} by release; {join['checkpoints_lost']} lost"

    def moves_ok(side: dict[str, Any]) -> bool | None:
        join = side.get("join")
        if not side.get("measured") or join is None or not join["moves"]:
            return None if join is None else False
        return bool(join["by_release"] == join["moves"] and join["checkpoints_lost"] == 0)

    def steady(side: dict[str, Any]) -> str:
        if not side.get("measured"):
            return "-"
        state = side["steady"]
        held = "" if state["all_held"] else " (not all held)"
        return f"{state['statements_per_s']:.1f}{held}"

    def steady_ok(side: dict[str, Any]) -> bool | None:
        if not side.get("measured"):
            return None
        state = side["steady"]
        return bool(state["all_held"] and state["statements_per_s"] <= STATEMENTS_TARGET)

    def sigterm(side: dict[str, Any]) -> str:
        alone = side.get("sigterm") or {}
        if not alone.get("measured"):
            return str(alone.get("note", "not measured"))
        stopped = alone.get("stopped_s")
        tail = "" if stopped is None else f" (pool stopped and backend closed: {stopped:.2f} s)"
        if alone["left"]:
            return (
                f"not all released {alone['seconds']:.0f} s after SIGTERM{tail}: "
                f"{alone['released']:,} released, {alone['left']:,} left to lapse"
            )
        return f"all {alone['released']:,} released {alone['seconds']:.2f} s after SIGTERM{tail}"

    def sigterm_ok(side: dict[str, Any]) -> bool | None:
        alone = side.get("sigterm") or {}
        if not alone.get("measured"):
            return None
        return bool(alone["seconds"] <= SIGTERM_TARGET_S and alone["left"] == 0)

    rows: list[tuple[str, Callable[[dict[str, Any]], str], str, Callable[..., bool | None]]] = [
        (
            f"{cfg.processes} processes start together: each holds {n // cfg.processes:,} ± 2 %",
            lambda s: timed(s, "start"),
            f"≤ {START_TARGET_S:g} s",
            lambda s: passed(s, "start", START_TARGET_S),
        ),
        (
            f"kill -9 of one: the {cfg.processes - 1} survivors hold "
            f"{n // (cfg.processes - 1):,} ± 2 % each, all held",
            lambda s: timed(s, "loss"),
            f"≤ {cfg.ttl + LOSS_MARGIN_S:g} s (TTL + {LOSS_MARGIN_S:g} s)",
            lambda s: passed(s, "loss", cfg.ttl + LOSS_MARGIN_S),
        ),
        (
            f"a {cfg.processes + 1}th process joins: each of {cfg.processes} live holds "
            f"{n // cfg.processes:,} ± 2 %",
            lambda s: timed(s, "join"),
            f"≤ {JOIN_TARGET_S:g} s",
            lambda s: passed(s, "join", JOIN_TARGET_S),
        ),
        ("moves caused by the join", moved, "100 % by release; 0 lost", moves_ok),
        ("steady state, all held: statements/s", steady, f"≤ {STATEMENTS_TARGET:g}", steady_ok),
        (
            f"SIGTERM of a process holding {n:,}",
            sigterm,
            f"≤ {SIGTERM_TARGET_S:g} s, all released",
            sigterm_ok,
        ),
    ]
    lines = [
        f"# Fair-share pools: {cfg.processes} processes x {n:,} work IDs",
        "",
        f"Run {env.get('started_at', '?')}: PostgreSQL {env.get('postgresql', '?')} on "
        f"{env.get('host', '?')}, Python {env.get('python', '?')}, psycopg "
        f"{env.get('packages', {}).get('psycopg', '?')}, {env.get('cpus', '?')} CPUs (workers "
        f"and server on one machine), load average at start "
        f"{env.get('load_average_at_start', ['?'])[0]}. Fair share: the working tree at "
        f"{env.get('git', {}).get('commit', '?')}; scan design: commit {SCAN_COMMIT}, the pool "
        f"before fair share. TTL {cfg.ttl:g} s, idle interval {cfg.idle_interval:g} s. "
        f"Runtime {report['runtime_s']:.0f} s.",
        "",
        "Every process runs `AsyncPool` over the same work IDs; each work function checkpoints "
        '`"<holder>:<token>"` once and holds its work ID until the pool stops or hands it over '
        "(`benchmarks/scale_worker.py --trail`). Shares are counted in the lease table every "
        "quarter second; statements per second are transactions in the bench database "
        "(`pg_stat_database`) minus the benchmark's own, over a window that starts 11 s after "
        "the start's burst of checkpoints ended (idle backends report late). The result "
        "column judges fair share, the scan design's in brackets.",
        "",
        f"| scenario | {LABELS['fair']} | {LABELS['scan']} | target | result |",
        "|---|---|---|---|---|",
    ]
    for label, show, target, check in rows:
        new, old = sides["fair"], sides["scan"]
        text = verdict(check(new))
        if check(old) is not None:
            text += f" (scan: {verdict(check(old))})"
        lines.append(f"| {label} | {show(new)} | {show(old)} | {target} | {text} |")
    lines += ["", "Shutdown of the four-process runs (SIGTERM at the end):", ""]
    for design in DESIGNS:
        stops = sides[design].get("stop", {})
        lines.append(f"- {LABELS[design]}: " + ", ".join(f"{h} {v}" for h, v in stops.items()))
    for design in DESIGNS:
        logs = sides[design].get("logs", {})
        lines.append(
            f"- worker log lines ({LABELS[design]}): {logs.get('warnings', 0)} warnings, "
            f"{logs.get('errors', 0)} errors, {logs.get('tracebacks', 0)} tracebacks"
        )
    return "\n".join(lines) + "\n"


def render_chart(report: dict[str, Any], path: Path) -> str | None:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return "matplotlib not installed (pip install -e . --group bench): no chart"
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for ax, design in zip(axes, DESIGNS, strict=True):
        line = report["sides"][design].get("timeline", {})
        for holder, values in line.get("by_holder", {}).items():
            if any(values):
                ax.plot(line["t"], values, label=holder, linewidth=1.2)
        ax.set_title(LABELS[design])
        ax.set_xlabel("seconds since the processes started")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[0].set_ylabel("work IDs held")
    fig.suptitle("Work IDs held per process: start, kill -9 of one, a new one joins")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", default=default_dsn(), help="server to create databases on")
    parser.add_argument("--work-ids", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--ttl", type=float, default=5.0)
    parser.add_argument("--idle-interval", type=float, default=1.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--skip-scan", action="store_true", help="measure fair share only")
    parser.add_argument(
        "--render", action="store_true", help="redraw fairshare.md/.png from fairshare.json"
    )
    return parser.parse_args(argv)


def config(args: argparse.Namespace) -> Config:
    return Config(
        work_ids=args.work_ids,
        processes=args.processes,
        ttl=args.ttl,
        idle_interval=args.idle_interval,
        window=args.window,
        settle=11.0,  # PostgreSQL 15 backends flush their statistics within 10 s
        coverage_timeout=60.0,
        failover_timeout=30.0,
        stop_timeout=30.0,
        sample_interval=0.25,
        tail=0.0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = config(args)
    if args.render:  # only redraw the table and chart from a saved report
        saved = json.loads((args.output / "fairshare.json").read_text(encoding="utf-8"))
        (args.output / "fairshare.md").write_text(render(saved, cfg), encoding="utf-8")
        render_chart(saved, args.output / "fairshare.png")
        return 0
    started = time.monotonic()
    report: dict[str, Any] = {"environment": environment(args.dsn), "sides": {}}
    repo_src = Path(__file__).resolve().parents[1] / "src"
    with tempfile.TemporaryDirectory(prefix="worklease-bench-fair-") as name:
        tmp = Path(name)
        report["sides"]["fair"] = run_design("fair", repo_src, cfg, args.dsn, tmp)
        if args.skip_scan:
            report["sides"]["scan"] = {"measured": False, "note": "skipped"}
        else:
            old_src, rev = export_old(SCAN_COMMIT, tmp)
            if old_src is None:
                report["sides"]["scan"] = {"measured": False, "note": rev}
            else:
                report["sides"]["scan"] = run_design("scan", old_src, cfg, args.dsn, tmp)
                report["sides"]["scan"]["commit"] = rev
    report["runtime_s"] = time.monotonic() - started
    output: Path = args.output
    output.mkdir(parents=True, exist_ok=True)
    (output / "fairshare.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    markdown = render(report, cfg)
    (output / "fairshare.md").write_text(markdown, encoding="utf-8")
    why = render_chart(report, output / "fairshare.png")
    if why:
        _progress(why)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
