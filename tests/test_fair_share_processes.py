"""Fair share across OS processes on PostgreSQL (issue 12).

Sync ``worklease.Pool`` processes (tests/pool_worker.py) over the same 12 work IDs: three
settle on 4 each; a fourth joins and all four settle on 3 each, every move a handover (the
newcomer reads ABANDONED and the previous holder's last acknowledged checkpoint or a later
one); then one is killed with SIGKILL and the three survivors settle on 4 each once its
leases lapse (EXPIRED). Every worker prints when its work function starts and stops on a
work ID; on one machine those times share a clock, so the trail shows that no work ID ever
ran in two processes at once.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests import pg
from tests.test_pool_processes import Worker, spawn_worker, wait_for

pytestmark = pytest.mark.postgres

COUNT = 12
TTL = 2.0
HOLDERS = ("f0", "f1", "f2", "f3")


def start(holder: str, dsn: str, tmp_path: Path) -> Worker:
    options = ("--ttl", str(TTL), "--count", str(COUNT))
    intervals = ("--idle-interval", "0.2", "--rerun-interval", "0.2")
    worker = spawn_worker(holder, dsn, tmp_path, *options, *intervals)
    proc = worker.proc
    wait_for(f"{holder} ready", lambda: worker.events("ready") or None, timeout=30)
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return worker


def held_counts(dsn: str) -> dict[str, int]:
    rows = pg.execute(
        dsn,
        "SELECT holder_id, count(*) FROM worklease_leases"
        " WHERE expires_at > now() AND exit_mode IS NULL"
        " AND NOT starts_with(work_id, 'worklease.member/') GROUP BY holder_id",
    )
    return {str(holder): int(n) for holder, n in rows}


def settled(dsn: str, holders: list[str], share: int) -> dict[str, int] | None:
    counts = held_counts(dsn)
    return counts if counts == dict.fromkeys(holders, share) else None


def test_processes_share_fairly_hand_over_on_join_and_take_over_a_killed_one(
    postgres_dsn: str, tmp_path: Path
) -> None:
    dsn = postgres_dsn
    pg.reset(dsn)
    workers: dict[str, Worker] = {}
    killed_at: float | None = None
    try:
        for holder in HOLDERS[:3]:
            workers[holder] = start(holder, dsn, tmp_path)
        wait_for("4 / 4 / 4", lambda: settled(dsn, list(HOLDERS[:3]), 4), timeout=60)

        time.sleep(0.5)  # checkpoints to carry over
        joined = time.time()
        workers["f3"] = start("f3", dsn, tmp_path)
        wait_for("3 / 3 / 3 / 3", lambda: settled(dsn, list(HOLDERS), 3), timeout=60)
        time.sleep(0.5)
        newcomer = [e for e in workers["f3"].events("acquired") if e["t"] >= joined]
        assert len(newcomer) == 3
        left = {
            (e["work_id"], e["holder"]): e
            for w in workers.values()
            for e in w.events("left")
            if e["t"] >= joined - 1
        }
        for move in newcomer:
            previous = move["prev_holder_id"]
            assert previous in HOLDERS[:3], move
            assert move["prev_exit"] == "abandoned", move  # handed over, not lapsed
            shed = left[(move["work_id"], previous)]
            assert shed["why"] == "LeaseShedError", shed
            holder, _, number = move["state"].partition(":")
            assert holder == previous
            assert int(number) >= shed["acked"], (move, shed)  # never an older checkpoint
            assert move["t"] > shed["t"]  # the newcomer started after the old one stopped

        victim = "f0"
        victim_ids = {
            work_id
            for work_id, holder in pg.execute(
                dsn,
                "SELECT work_id, holder_id FROM worklease_leases"
                " WHERE expires_at > now() AND exit_mode IS NULL",
            )
            if holder == victim and not str(work_id).startswith("worklease.member/")
        }
        assert len(victim_ids) == 3
        workers[victim].proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        survivors = [h for h in HOLDERS if h != victim]
        wait_for("4 / 4 / 4 after the kill", lambda: settled(dsn, survivors, 4), timeout=60)
        time.sleep(0.5)
        taken = [
            e
            for h in survivors
            for e in workers[h].events("acquired")
            if e["t"] >= killed_at and e["prev_holder_id"] == victim
        ]
        assert {e["work_id"] for e in taken} == victim_ids
        for move in taken:
            assert move["prev_exit"] == "expired", move
            assert move["t"] - killed_at >= TTL * 0.5, move  # only once its lease lapsed
            assert move["state"].startswith(f"{victim}:")
    finally:
        for worker in workers.values():
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        for worker in workers.values():
            try:
                worker.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait(timeout=10)
            for stream in (worker.proc.stdin, worker.proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            if worker.reader is not None:
                worker.reader.join(timeout=5)
    check_no_double_holder(workers, killed_at)


def check_no_double_holder(workers: dict[str, Worker], killed_at: float | None) -> None:
    """Per work ID, the spans during which a work function ran never overlap (a span of the
    killed worker that never ended ends at the kill)."""
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for worker in workers.values():
        ends: dict[tuple[str, int], float] = {
            (e["work_id"], e["fencing_token"]): e["t"] for e in worker.events("left")
        }
        for event in worker.events("acquired"):
            key = (event["work_id"], event["fencing_token"])
            end: Any = ends.get(key, killed_at)
            assert end is not None, f"{worker.holder} never left {key}"
            spans[event["work_id"]].append((event["t"], end, worker.holder))
    assert sorted(spans) == [f"part-{i:02d}" for i in range(COUNT)]
    for work_id, runs in spans.items():
        runs.sort()
        for (_, end, holder), (begin, _, successor) in itertools.pairwise(runs):
            assert begin > end, f"{work_id}: {successor} started before {holder} stopped"
