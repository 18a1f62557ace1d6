"""Multi-process pool on PostgreSQL: three OS processes (tests/pool_worker.py) run a sync
``worklease.Pool`` over the same 12 work IDs and together cover all of them; after ``kill -9``
of one, its work IDs move to the survivors once its leases expired, and each successor reads
``expired``, the dead holder's ID and its last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests import pg

pytestmark = pytest.mark.postgres

WORKER = Path(__file__).with_name("pool_worker.py")
HOLDERS = ("w0", "w1", "w2")
WORK_IDS = [f"part-{i:02d}" for i in range(12)]
TTL = 2.0
GRACE = 3.0  # seconds after "go" during which each worker gives back non-home work IDs
T = TypeVar("T")


@dataclass
class Worker:
    holder: str
    proc: subprocess.Popen[str]
    stderr_path: Path
    lines: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    reader: threading.Thread | None = None

    def start_reader(self) -> None:
        def read() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                try:
                    record = json.loads(raw)
                except ValueError:
                    record = {"event": "garbage", "raw": raw}
                with self.lock:
                    self.lines.append(record)

        self.reader = threading.Thread(target=read, name=f"reader-{self.holder}", daemon=True)
        self.reader.start()

    def events(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [line for line in self.lines if line.get("event") == kind]

    def diagnostics(self) -> str:
        with contextlib.suppress(OSError):
            tail = self.stderr_path.read_text(errors="replace")[-3000:]
            return f"--- {self.holder} (rc={self.proc.poll()}) stderr tail:\n{tail}"
        return f"--- {self.holder}: no stderr"


def wait_for(what: str, check: Callable[[], T | None], timeout: float, step: float = 0.2) -> T:
    """Poll ``check`` until it returns something other than None; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


@dataclass(frozen=True)
class Row:
    work_id: str
    holder_id: str
    fencing_token: int
    expires_at: datetime
    checkpoint: str | None
    exit_mode: str | None
    live: bool  # expires_at > now() on the database clock, and not released


def rows(dsn: str) -> dict[str, Row]:
    result = pg.execute(
        dsn,
        "SELECT work_id, holder_id, fencing_token, expires_at, checkpoint, exit_mode,"
        " exit_mode IS NULL AND expires_at > now() FROM worklease_leases"
        " WHERE NOT starts_with(work_id, 'worklease.member/')",  # pool memberships
    )
    table = {}
    for work_id, holder_id, token, expires_at, state, exit_mode, live in result:
        text = None if state is None else bytes(state).decode()
        table[work_id] = Row(work_id, holder_id, token, expires_at, text, exit_mode, live)
    return table


def checkpoint_number(state: str | None, holder: str) -> int:
    assert state is not None, f"no checkpoint, expected one written by {holder}"
    prefix = f"{holder}:"
    assert state.startswith(prefix), f"checkpoint {state!r} was not written by {holder}"
    return int(state[len(prefix) :])


def spawn_worker(holder: str, dsn: str, tmp_path: Path, *options: str) -> Worker:
    """Start tests/pool_worker.py as ``holder`` (stderr to a file under ``tmp_path``)."""
    stderr_path = tmp_path / f"{holder}.stderr"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--dsn", dsn, "--holder", holder, *options],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    worker = Worker(holder, proc, stderr_path)
    worker.start_reader()
    return worker


@contextlib.contextmanager
def running_workers(dsn: str, tmp_path: Path) -> Iterator[dict[str, Worker]]:
    workers: dict[str, Worker] = {}
    try:
        for index, holder in enumerate(HOLDERS):
            home = ",".join(WORK_IDS[index * 4 : index * 4 + 4])
            options = ("--ttl", str(TTL), "--home", home, "--grace", str(GRACE))
            workers[holder] = spawn_worker(holder, dsn, tmp_path, *options)
        yield workers
    except BaseException:
        for worker in workers.values():
            sys.stderr.write(worker.diagnostics() + "\n")
        raise
    finally:
        for worker in workers.values():
            if worker.proc.poll() is None:
                worker.proc.kill()
        for worker in workers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=10)
            for stream in (worker.proc.stdin, worker.proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


def test_three_processes_cover_all_work_ids_and_take_over_a_killed_one(
    postgres_dsn: str, tmp_path: Path
) -> None:
    dsn = postgres_dsn
    pg.reset(dsn)
    with running_workers(dsn, tmp_path) as workers:
        # All three connected, then start them together.
        wait_for(
            "all workers ready",
            lambda: all(w.events("ready") for w in workers.values()) or None,
            timeout=30,
        )
        for worker in workers.values():
            assert worker.proc.stdin is not None
            worker.proc.stdin.write("go\n")
            worker.proc.stdin.flush()
        went = time.monotonic()

        # Together they cover all 12 work IDs, each holder at least one.
        def covered() -> dict[str, Row] | None:
            if time.monotonic() < went + GRACE + 1.5:  # let the grace-period shuffle settle
                return None
            table = rows(dsn)
            if sorted(table) != WORK_IDS or not all(r.live for r in table.values()):
                return None
            holders = {r.holder_id for r in table.values()}
            return table if holders == set(HOLDERS) else None

        before = wait_for("all 12 work IDs held by all three workers", covered, timeout=30)
        for worker in workers.values():
            assert worker.proc.poll() is None, worker.diagnostics()

        # The victim: the holder with the most work IDs (ties: the lowest name).
        counts = {h: sum(r.holder_id == h for r in before.values()) for h in HOLDERS}
        victim = max(HOLDERS, key=lambda h: (counts[h], -HOLDERS.index(h)))
        survivors = [h for h in HOLDERS if h != victim]
        victim_ids = sorted(w for w, r in before.items() if r.holder_id == victim)
        assert victim_ids
        for work_id in victim_ids:  # it has been checkpointing
            checkpoint_number(before[work_id].checkpoint, victim)

        workers[victim].proc.send_signal(signal.SIGKILL)
        workers[victim].proc.wait(timeout=10)
        assert workers[victim].proc.returncode == -signal.SIGKILL
        time.sleep(0.3)  # let a statement already sent by the victim finish on the server
        after_kill = rows(dsn)
        final_n: dict[str, int] = {}
        for work_id in victim_ids:
            row = after_kill[work_id]
            if row.holder_id == victim:  # not yet taken over (normal: the TTL has not passed)
                n = checkpoint_number(row.checkpoint, victim)
                assert n >= checkpoint_number(before[work_id].checkpoint, victim)
                final_n[work_id] = n
        assert final_n, "every work ID of the killed worker was taken over within 0.3 s"

        # Each of its work IDs moves to a survivor.
        def taken_over() -> dict[str, Row] | None:
            table = rows(dsn)
            done = all(
                table[w].live
                and table[w].holder_id in survivors
                and table[w].fencing_token > before[w].fencing_token
                for w in victim_ids
            )
            return table if done else None

        after = wait_for("the survivors to take over the killed worker's work IDs", taken_over, 30)

        # Each successor's work function prints its acquisition just after the grant.
        def reported() -> bool | None:
            return (
                all(
                    any(
                        e["work_id"] == w and e["fencing_token"] == after[w].fencing_token
                        for e in workers[after[w].holder_id].events("acquired")
                    )
                    for w in victim_ids
                )
                or None
            )

        wait_for("the successors' JSON lines", reported, timeout=10)

        for work_id in victim_ids:
            successor = after[work_id].holder_id
            grants = [
                e
                for h in survivors
                for e in workers[h].events("acquired")
                if e["work_id"] == work_id and e["fencing_token"] > before[work_id].fencing_token
            ]
            assert len(grants) == 1, f"{work_id}: expected one takeover, got {grants}"
            grant = grants[0]
            assert grant["holder"] == successor
            assert grant["fencing_token"] == after[work_id].fencing_token
            assert grant["fencing_token"] > before[work_id].fencing_token
            assert grant["kept"] is True
            assert grant["prev_exit"] == "expired", grant
            assert grant["prev_holder_id"] == victim, grant
            # The dead holder's last checkpoint: at least what the table showed before the
            # kill; the one it showed after the kill, or one write the server still had in
            # flight.
            n = checkpoint_number(grant["state"], victim)
            assert n >= checkpoint_number(before[work_id].checkpoint, victim), grant
            if work_id in final_n:
                assert final_n[work_id] <= n <= final_n[work_id] + 1, (grant, final_n)
            # Not before the TTL since the victim's last write: the grant's database time
            # (expires_at - ttl) is after the victim's last expiry seen after its death.
            granted_at = datetime.fromisoformat(grant["expires_at"]) - timedelta(seconds=TTL)
            assert granted_at >= after_kill[work_id].expires_at, (grant, after_kill[work_id])
            assert granted_at >= before[work_id].expires_at

        # Nothing the victim did not hold changed hands.
        for work_id in WORK_IDS:
            if work_id not in victim_ids:
                assert after[work_id].holder_id == before[work_id].holder_id
                assert after[work_id].fencing_token == before[work_id].fencing_token
        assert {after[w].holder_id for w in WORK_IDS} <= set(survivors)

        # SIGTERM: the survivors stop gracefully and release what they hold.
        for holder in survivors:
            workers[holder].proc.send_signal(signal.SIGTERM)
        for holder in survivors:
            try:
                rc = workers[holder].proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{holder} did not exit within 20 s of SIGTERM")
            assert rc == 0, workers[holder].diagnostics()
        for holder in survivors:
            reader = workers[holder].reader
            assert reader is not None
            reader.join(timeout=5)
            assert workers[holder].events("stopped"), workers[holder].diagnostics()
        final = rows(dsn)
        assert sorted(final) == WORK_IDS
        for work_id, row in final.items():
            assert row.exit_mode == "abandoned", row
            assert row.holder_id == after[work_id].holder_id
            assert row.fencing_token == after[work_id].fencing_token
            checkpoint_number(row.checkpoint, row.holder_id)  # kept its last checkpoint
        assert not any(w.events("garbage") for w in workers.values())
