#!/usr/bin/env python
"""Redis: how the servers' capacity for worklease's scripts grows with Cluster masters.

``bench_redis.py`` drives the backend from Python, so on a small machine its Cluster
comparison measures the Python client, not the servers. This one sends worklease's own
acquire script (``worklease._redis.ACQUIRE``, the heaviest of its writes: every call a
takeover with a TTL of 1 ms, so each one reads the row and writes it whole) from
``redis-benchmark``, Redis's own C client, pipelined, to one Cluster of 3 masters: in
alternating rounds to one master alone (keys of its own slots; ``redis-benchmark`` refuses a
Cluster of one node) and to all three (``--cluster``), and reads the CPU time every server
process and the client spent (``/proc``). It reports calls per second, server CPU per call,
and the cores each side used, so a reader can tell whether the servers or the machine were
the limit.

Servers: private ``redis-server`` processes from ``tests/redis_servers.py`` on loopback
ports, persistence off. It only reports; the result goes to
``benchmarks/results/redis_capacity.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import redis_servers  # noqa: E402
from worklease._redis import ACQUIRE  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Round:
    masters: int
    calls: int
    seconds: float
    server_cpu: list[float]
    """CPU seconds of each master during the round."""
    client_cpu: float

    @property
    def per_second(self) -> float:
        return self.calls / self.seconds

    @property
    def server_us_per_call(self) -> float:
        return sum(self.server_cpu) / self.calls * 1e6

    @property
    def server_cores(self) -> float:
        return sum(self.server_cpu) / self.seconds

    @property
    def client_cores(self) -> float:
        return self.client_cpu / self.seconds


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _load(cluster: redis_servers.RedisCluster) -> str:
    shas = {
        redis_servers.command(port, "script", "load", ACQUIRE).strip() for port in cluster.ports
    }
    if len(shas) != 1:
        raise RuntimeError(f"the nodes loaded different scripts: {shas}")
    return shas.pop()


def own_tag(port: int) -> str:
    """A hash tag whose slot the node on ``port`` serves (its keys need no redirection)."""
    for index in range(1_000):
        tag = f"n{index}"
        answer = redis_servers.command(port, "exists", f"wl:{{{tag}}}:probe")
        if answer.isdigit():  # not MOVED elsewhere
            return tag
    raise RuntimeError(f"no hash tag served by the node on port {port}")


def one_round(
    benchmark: str, cluster: redis_servers.RedisCluster, masters: int, args: argparse.Namespace
) -> Round:
    sha = _load(cluster)
    nodes = cluster.nodes[:masters]
    pids = [node.process.pid for node in nodes]
    if masters == len(cluster.nodes):
        target = ["--cluster", "-p", str(cluster.ports[0])]
        key = "wl:{tag}:__rand_int__"
    else:  # one master alone: keys of its own slots, sent to it directly
        target = ["-p", str(nodes[0].port)]
        key = f"wl:{{{own_tag(nodes[0].port)}}}:__rand_int__"
    before = [_process_cpu(pid) for pid in pids]
    client_before = _children_cpu()
    began = time.perf_counter()
    done = subprocess.run(
        [benchmark, "-h", "127.0.0.1", *target,
         "-c", str(args.clients), "-n", str(args.calls), "-P", str(args.pipeline),
         "-r", "1000000", "--threads", str(args.threads), "-q",
         "EVALSHA", sha, "1", key, "bench-holder", "1"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - began
    if done.returncode != 0 or "error" in done.stdout.lower():
        raise RuntimeError(f"redis-benchmark failed: {(done.stdout + done.stderr)[-600:]}")
    client = _children_cpu() - client_before
    server = [_process_cpu(pid) - start for pid, start in zip(pids, before, strict=True)]
    # Every call granted: the keys exist now, each written by the acquire script.
    keys = sum(int(redis_servers.command(node.port, "dbsize")) for node in nodes)
    if keys == 0:
        raise RuntimeError("redis-benchmark's calls wrote nothing: the script was refused")
    return Round(masters, args.calls, seconds, server, client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400_000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per Cluster")
    parser.add_argument("--clients", type=int, default=48)
    parser.add_argument("--pipeline", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="redis-benchmark threads")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    benchmark = shutil.which("redis-benchmark")
    if benchmark is None:
        raise SystemExit("redis-benchmark not found (apt-get install redis-tools)")
    load_start = os.getloadavg()
    cluster = redis_servers.start_cluster(3)
    rounds: list[Round] = []
    try:
        for index in range(args.rounds):
            order = (1, 3) if index % 2 == 0 else (3, 1)
            for masters in order:
                rounds.append(one_round(benchmark, cluster, masters, args))
                rate = rounds[-1].per_second
                print(f"  round {index + 1}, {masters} master(s): {rate:,.0f} calls/s",
                      file=sys.stderr, flush=True)  # fmt: skip
    finally:
        cluster.stop()
    version = subprocess.run(
        [benchmark, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "redis_benchmark": version,
        "load_start": load_start,
        "load_end": os.getloadavg(),
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "rounds": [asdict(r) for r in rounds],
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "redis_capacity.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.output / "redis_capacity.md").write_text(render(report, rounds))
    print((args.output / "redis_capacity.md").read_text())


def render(report: dict[str, Any], rounds: list[Round]) -> str:
    settings = report["settings"]
    lines = [
        "# Redis: server capacity for worklease's acquire script, 1 vs 3 Cluster masters",
        "",
        f"Run {report['when']}: {report['cpus']} CPUs shared by the servers and the client, "
        f"{report['redis_benchmark']}, persistence off, loopback. Each round: "
        f"{settings['calls']:,} calls of worklease's acquire script (`EVALSHA`, a takeover "
        f"every time: TTL 1 ms, random keys) from `redis-benchmark` "
        f"({settings['clients']} connections, pipelines of {settings['pipeline']}, "
        f"{settings['threads']} threads) to one Cluster of 3 masters: to one master alone "
        "(keys of its own slots) or to all three (`--cluster`), "
        f"{settings['rounds']} rounds of each, alternating. CPU from `/proc` (the masters "
        "that served, and the client; the median round's). Load average "
        f"at start {' '.join(f'{x:.2f}' for x in report['load_start'])}, at end "
        f"{' '.join(f'{x:.2f}' for x in report['load_end'])}.",
        "",
        "| masters serving | calls/s (median) | server CPU per call, µs | server cores "
        "| per master | client cores | machine busy (cores) |",
        "| ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    summary: dict[int, float] = {}
    middle: dict[int, Round] = {}  # the median round of each: its CPU figures are shown
    for masters in (1, 3):
        mine = sorted((r for r in rounds if r.masters == masters), key=lambda r: r.per_second)
        chosen = middle[masters] = mine[len(mine) // 2]
        summary[masters] = statistics.median(r.per_second for r in mine)
        per_master = ", ".join(f"{cpu / chosen.seconds:.2f}" for cpu in chosen.server_cpu)
        busy = chosen.server_cores + chosen.client_cores
        lines.append(
            f"| {masters} | {summary[masters]:,.0f} | {chosen.server_us_per_call:.1f} "
            f"| {chosen.server_cores:.2f} | {per_master} | {chosen.client_cores:.2f} "
            f"| {busy:.2f} |"
        )
    ratio = summary[3] / summary[1]
    one, three = middle[1], middle[3]
    busy = three.server_cores + three.client_cores
    lines += [
        "",
        f"3 masters / 1 master: **{ratio:.2f} x** the calls per second. One master is one "
        f"single-threaded process: it used {one.server_cores:.2f} of a core. Three used "
        f"{three.server_cores:.2f} cores between them while the client took "
        f"{three.client_cores:.2f}: {busy:.2f} of the machine's {report['cpus']} cores. "
        f"Server CPU per call: {one.server_us_per_call:.1f} µs with one master, "
        f"{three.server_us_per_call:.1f} µs with three (three processes sharing "
        f"{report['cpus']} cores). What the calls cost is the limit a reader can carry to a "
        "larger machine: a master serves about "
        f"{1e6 / one.server_us_per_call:,.0f} of these calls per second of its own core, so "
        "with a core for each master and the client elsewhere three masters would serve about "
        "three times one (an estimate from the figures above, not a measurement on such a "
        "machine).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
