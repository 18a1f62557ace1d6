"""Process and server faults against a private PostgreSQL cluster (issue 6).

- ``kill -9`` of a holder mid-work: the successor acquires only after the lease expired on
  the database clock, with a greater token, reads ``expired`` and exactly the last
  acknowledged checkpoint.
- A zombie: the holder process is ``SIGSTOP``ped for about its TTL while a successor may take
  over and write; after ``SIGCONT`` every later write of the zombie is rejected and its
  renewal reports the loss; a pause clearly shorter than the TTL loses nothing. The audit
  trail shows zero stale writes.
- PostgreSQL restarted fast within the lease window: the holder keeps its token and no error
  reaches its code. Down for longer than the window: every holder reports the loss, and
  after the restart exactly one contender per work ID wins.
- PostgreSQL immediate shutdown while checkpoints stream: every acknowledged checkpoint
  survives recovery, no stored checkpoint is anything but a complete value the holder sent,
  and the token stays the same.

Holders run as OS processes (tests/faults/holder_worker.py, sync flavour) printing one JSON
line per acknowledged checkpoint, rejected write and loss; the restart tests hold leases in
this process. Measured figures are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
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

import psycopg
import pytest

import worklease
from tests import pg
from tests.faults import audit
from tests.faults.conftest import scaled
from tests.faults.holder_worker import payload, payload_n
from worklease import Backoff, ExitMode, Lease, Token
from worklease.errors import (
    BackendError,
    FencedError,
    LeaseHeldError,
    LeaseLostError,
    LeaseWindowExhaustedError,
)
from worklease.observers import CheckpointEvent, LeaseObserver, RenewEvent

pytestmark = [pytest.mark.postgres, pytest.mark.faults]

WORKER = Path(__file__).with_name("holder_worker.py")
LOST_TYPES = {
    "FencedError",
    "LeaseExpiredError",
    "LeaseWindowExhaustedError",
    "LeaseLapsedError",
}
SUCCESSOR_TTL = 5.0
T = TypeVar("T")
Line = dict[str, Any]


def report(text: str) -> None:
    """A measured figure, shown with ``pytest -s``."""
    sys.stdout.write(f"\n[faults] {text}\n")
    sys.stdout.flush()


def seconds(delta: timedelta) -> float:
    return delta.total_seconds()


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


# -- worker processes -------------------------------------------------------------------------


@dataclass
class Worker:
    """A holder_worker.py process whose stdout lines are collected by a reader thread."""

    name: str
    proc: subprocess.Popen[str]
    stderr_path: Path
    lines: list[Line] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    eof: bool = False
    reader: threading.Thread | None = None

    def start_reader(self) -> None:
        def read() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                try:
                    record = json.loads(raw)
                except ValueError:
                    record = {"event": "garbage", "raw": raw}
                with self.cond:
                    self.lines.append(record)
                    self.cond.notify_all()
            with self.cond:
                self.eof = True
                self.cond.notify_all()

        self.reader = threading.Thread(target=read, name=f"reader-{self.name}", daemon=True)
        self.reader.start()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def command(self, **fields: Any) -> None:
        self.send(json.dumps(fields))

    def snapshot(self) -> list[Line]:
        with self.cond:
            return list(self.lines)

    def wait(
        self,
        what: str,
        check: Callable[[list[Line]], T | None],
        timeout: float,
        *,
        fail: bool = True,
    ) -> T | None:
        """Wait until ``check(lines)`` is not None; fail (or return None) after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                result = check(self.lines)
                if result is not None:
                    return result
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    break
                self.cond.wait(left)
        if not fail:
            return None
        state = "exited" if self.eof else f"timed out after {timeout:.1f} s"
        pytest.fail(f"{self.name} {state} waiting for {what}\n{self.diagnostics()}")

    def need(self, what: str, check: Callable[[list[Line]], T | None], timeout: float) -> T:
        result = self.wait(what, check, timeout)
        assert result is not None
        return result

    def drain(self, timeout: float = 10.0) -> None:
        """Wait for the end of the output (after the process died or exited)."""
        if self.reader is not None:
            self.reader.join(timeout)
            assert not self.reader.is_alive(), f"{self.name}: stdout not closed"

    def diagnostics(self) -> str:
        with contextlib.suppress(OSError):
            tail = self.stderr_path.read_text(errors="replace")[-3000:]
            return f"--- {self.name} (rc={self.proc.poll()}) stderr tail:\n{tail}"
        return f"--- {self.name}: no stderr"


@contextlib.contextmanager
def spawned(name: str, tmp_path: Path, *args: str) -> Iterator[Worker]:
    stderr_path = tmp_path / f"{name}.stderr"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), *args, "--holder", name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    worker = Worker(name, proc, stderr_path)
    worker.start_reader()
    try:
        yield worker
    except BaseException:
        sys.stderr.write(worker.diagnostics() + "\n")
        raise
    finally:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGCONT)  # a stopped process cannot die of SIGKILL late
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if worker.reader is not None:
            worker.reader.join(timeout=5)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def finish(worker: Worker, timeout: float = 30.0) -> None:
    """Wait for a worker told to stop to exit cleanly."""
    try:
        rc = worker.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{worker.name} did not exit within {timeout:.0f} s\n{worker.diagnostics()}")
    assert rc == 0, worker.diagnostics()
    worker.drain()
    assert not [line for line in worker.snapshot() if line.get("event") == "garbage"]


def acks(lines: list[Line], work_id: str) -> list[Line]:
    return [line for line in lines if "ack" in line and line.get("work_id") == work_id]


def events(lines: list[Line], kind: str, work_id: str | None = None) -> list[Line]:
    return [
        line
        for line in lines
        if line.get("event") == kind and (work_id is None or line.get("work_id") == work_id)
    ]


def first(lines: list[Line], kind: str, work_id: str | None = None) -> Line | None:
    found = events(lines, kind, work_id)
    return found[0] if found else None


def max_ack(lines: list[Line], work_id: str) -> int:
    return max((line["ack"] for line in acks(lines, work_id)), default=0)


Check = Callable[[list[Line]], Any]


def seen(kind: str, work_id: str | None = None) -> Check:
    """The first ``kind`` line (of ``work_id``), or None."""
    return lambda lines: first(lines, kind, work_id)


def either(*checks: Check) -> Check:
    """The first result of several checks that is not None (nor false)."""

    def check(lines: list[Line]) -> Any:
        for one in checks:
            result = one(lines)
            if result:
                return result
        return None

    return check


def acked(minimum: dict[str, int]) -> Check:
    """True once every work ID in ``minimum`` has at least that many acknowledgements."""
    return lambda lines: all(max_ack(lines, w) >= n for w, n in minimum.items()) or None


def acked_since(work_id: str, since: float, count: int) -> Check:
    """True once ``count`` writes of ``work_id`` were acknowledged after ``since``."""
    return lambda lines: len([a for a in acks(lines, work_id) if a["t"] > since]) >= count or None


# -- the server ---------------------------------------------------------------------------------


@contextlib.contextmanager
def server_down(cluster: pg.ThrowawayCluster, mode: str) -> Iterator[None]:
    """Stop the cluster for the block; it is started again whatever happens."""
    cluster.server_stop(mode)
    try:
        yield
    finally:
        if not pg.answers(cluster.dsn):
            cluster.server_start()


@contextlib.contextmanager
def connected(dsn: str, pool_timeout: float) -> Iterator[worklease.PostgresBackend]:
    """A backend in this process whose pool checkouts give up after ``pool_timeout``."""
    with worklease.PostgresBackend.connect(dsn, min_size=1, max_size=6, timeout=pool_timeout) as b:
        b.pool.wait(timeout=30.0)
        yield b


@pytest.fixture
def backend(cluster_dsn: str) -> Iterator[worklease.PostgresBackend]:
    with connected(cluster_dsn, 10.0) as b:
        yield b


def acquire_row(rows: list[audit.AuditRow], old_token: int, new_token: int) -> audit.AuditRow:
    found = [r for r in rows if r.old_token == old_token and r.new_token == new_token]
    assert len(found) == 1, (old_token, new_token, rows)
    return found[0]


# -- kill -9 --------------------------------------------------------------------------------------

KILL_TTL = 2.0
KILL_GAP = 0.3  # seconds between the victim's checkpoints
KILL_SIZE = 8192


def test_kill_9_successor_takes_over_after_expiry(
    cluster_dsn: str, backend: worklease.PostgresBackend, tmp_path: Path
) -> None:
    audit.install(cluster_dsn)
    rng = random.Random()
    successor = Lease(backend, holder_id="successor", ttl=SUCCESSOR_TTL)
    latencies: list[float] = []
    walls: list[float] = []
    strict_rounds = 0
    rounds = scaled(3, 10)
    for round_no in range(rounds):
        work_id = f"kill9-{round_no}"
        victim = f"victim-{round_no}"
        with spawned(
            victim,
            tmp_path,
            "stream",
            "--dsn",
            cluster_dsn,
            "--ttl",
            str(KILL_TTL),
            "--work-ids",
            work_id,
            "--gap",
            str(KILL_GAP),
            "--size",
            str(KILL_SIZE),
        ) as worker:
            acquired = worker.need("acquired", seen("acquired", work_id), 30)
            assert acquired["prev_exit"] == "none"
            wanted = rng.randint(3, 6)
            worker.need(f"{wanted} acknowledged checkpoints", acked({work_id: wanted}), 30)
            time.sleep(rng.uniform(0.0, 1.5 * KILL_GAP))  # anywhere in a write or between two
            killed_at = time.monotonic()
            worker.proc.send_signal(signal.SIGKILL)
            assert worker.proc.wait(timeout=10) == -signal.SIGKILL

            # The successor tries every 10 ms: refused until the lease expired.
            deadline = killed_at + KILL_TTL + 15.0
            refused_by: list[str | None] = []
            while True:
                try:
                    token = successor.acquire(work_id)
                except LeaseHeldError as held:
                    refused_by.append(held.holder_id)
                else:
                    acquired_at = time.monotonic()
                    break
                assert time.monotonic() < deadline, "the successor never acquired"
                time.sleep(0.01)
            worker.drain()
            lines = worker.snapshot()

        assert refused_by, "acquired at once: the victim's lease cannot have expired yet"
        assert set(refused_by) == {victim}
        assert token.fencing_token > acquired["token"]
        prior = successor.read_checkpoint(token)
        assert prior.prev_exit == ExitMode.EXPIRED
        assert prior.prev_holder_id == victim
        stored_n = payload_n(work_id, prior.state)
        assert stored_n is not None, prior.state[:80] if prior.state else None
        assert prior.state == payload(work_id, stored_n, KILL_SIZE), "checkpoint not intact"
        victim_acks = acks(lines, work_id)
        last = victim_acks[-1]
        assert [a["ack"] for a in victim_acks] == list(range(1, last["ack"] + 1))
        assert {a["token"] for a in victim_acks} == {acquired["token"]}
        if killed_at < last["t"] + KILL_GAP:
            # Killed between two writes: exactly the last acknowledged checkpoint.
            strict_rounds += 1
            assert stored_n == last["ack"], (stored_n, last)
        else:
            # Killed during a write: it may have committed without being acknowledged.
            assert stored_n in (last["ack"], last["ack"] + 1), (stored_n, last)

        # Not before expiry, on the database clock: the successor's grant came after the
        # victim's last accepted write had made the lease expire.
        history = audit.rows(cluster_dsn, work_id)
        grant_row = acquire_row(history, acquired["token"], token.fencing_token)
        before = [r for r in history if r.id < grant_row.id]
        assert all(r.new_token == acquired["token"] for r in before)
        assert not [r for r in history if r.id > grant_row.id]
        victim_expiry = before[-1].expires_at
        assert victim_expiry is not None
        granted_at = token.expires_at - timedelta(seconds=SUCCESSOR_TTL)
        assert granted_at > victim_expiry, (granted_at, victim_expiry)
        latencies.append(seconds(granted_at - victim_expiry))
        walls.append(acquired_at - killed_at)
        successor.release(token, ExitMode.FINISHED)

    assert audit.stale_writes(cluster_dsn) == 0
    report(
        f"kill -9 x{rounds} (TTL {KILL_TTL:g} s): takeover after expiry on the DB clock "
        f"min {min(latencies) * 1000:.0f} ms / max {max(latencies) * 1000:.0f} ms; "
        f"kill -> acquire {min(walls):.2f}..{max(walls):.2f} s; "
        f"{strict_rounds} round(s) killed between writes (exact last ack checked)"
    )


# -- the zombie -------------------------------------------------------------------------------

ZOMBIE_TTL = 0.5
ZOMBIE_GAP = 0.02
SAFE_MARGIN = 0.15  # seconds of DB lease left after a pause for it to count as clearly short
TAKEOVER_SLACK = 0.15  # seconds a lease may stay expired before the polling successor has it


def successor_state(work_id: str, k: int) -> bytes:
    return f"successor:{work_id}:{k}".encode()


@dataclass
class ZombieRound:
    work_id: str
    pause: float
    remaining: float  # DB lease left when the zombie was stopped (a lower bound)
    zombie_token: int
    successor: Token | None = None
    successor_writes: int = 0
    window_left: float = 0.0  # in the zombie's window when it resumed (a lower bound)
    outcome: str = ""
    cause: str | None = None
    starved: bool = False  # the successor made no attempt long after the expiry (no CPU)


@pytest.mark.lengthy
def test_zombie_after_sigstop_is_fenced(
    cluster_dsn: str, backend: worklease.PostgresBackend, tmp_path: Path
) -> None:
    audit.install(cluster_dsn)
    rng = random.Random()
    successor = Lease(backend, holder_id="successor", ttl=SUCCESSOR_TTL)
    iterations = scaled(200, 400)  # the issue asks for at least 200 pauses, CI included
    rounds: list[ZombieRound] = []
    started = time.monotonic()
    with (
        spawned(
            "zombie", tmp_path, "zombie", "--dsn", cluster_dsn, "--gap", str(ZOMBIE_GAP)
        ) as zombie,
        psycopg.connect(cluster_dsn, autocommit=True) as conn,
    ):

        def lease_row(work_id: str) -> tuple[datetime, datetime]:
            row = conn.execute(
                "SELECT expires_at, now() FROM worklease_leases WHERE work_id = %s", (work_id,)
            ).fetchone()
            assert row is not None
            return row[0], row[1]

        zombie.need("ready", lambda ls: first(ls, "ready"), 30)
        for i in range(iterations):
            work_id = f"zombie-{i:03d}"
            zombie.command(cmd="hold", work_id=work_id, ttl=ZOMBIE_TTL)
            acquired = zombie.need(
                f"{work_id} acquired",
                either(seen("acquired", work_id), seen("acquire_failed", work_id)),
                15,
            )
            assert acquired["event"] == "acquired", acquired
            # Generous: three checkpoints once acquired; under a loaded CI machine (the suite
            # runs three workers beside the server) this once took more than 15 s.
            zombie.need(f"{work_id} writing", acked({work_id: 3}), 60)

            pause = ZOMBIE_TTL * rng.uniform(0.4, 2.0)
            zombie.proc.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                expires_at, now = lease_row(work_id)
                this = ZombieRound(work_id, pause, seconds(expires_at - now), acquired["token"])
                rounds.append(this)
                resume_at = stopped_at + pause
                refused_by: set[str | None] = set()
                attempts: list[float] = []  # when each acquire began (monotonic)
                while time.monotonic() < resume_at:
                    attempts.append(time.monotonic())
                    try:
                        this.successor = successor.acquire(work_id)
                        break
                    except LeaseHeldError as held:
                        refused_by.add(held.holder_id)
                    time.sleep(max(min(0.01, resume_at - time.monotonic()), 0.0))
                assert refused_by <= {"zombie"}, refused_by
                if this.successor is not None:
                    this.successor_writes = 1
                    successor.checkpoint(this.successor, successor_state(work_id, 1))
                else:
                    expires_at, now = lease_row(work_id)
                    read_by = time.monotonic()
                    overdue = seconds(now - expires_at)
                    # Every attempt that began once the lease had expired (with the slack for
                    # the round trip) must have been granted. The expiry is placed as late as
                    # the read allows, so a refusal just before it never counts.
                    expired_by = read_by - overdue
                    late = [
                        round(t - expired_by, 3)
                        for t in attempts
                        if t > expired_by + TAKEOVER_SLACK
                    ]
                    assert not late, (
                        f"{work_id}: acquires began {late} s after the lease expired, yet "
                        "the successor could not acquire it"
                    )
                    # Expired long before the pause ended with no attempt after that: this
                    # process got no CPU then (a loaded machine); counted below.
                    this.starved = overdue >= TAKEOVER_SLACK
                time.sleep(max(resume_at - time.monotonic(), 0.0))
                # What the zombie can know of its lease: the writes it completed before the
                # stop (the renewal may have extended it further).
                completed = [a["t0"] for a in acks(zombie.snapshot(), work_id)]
            finally:
                zombie.proc.send_signal(signal.SIGCONT)
            resumed_at = time.monotonic()
            this.window_left = max(completed) + ZOMBIE_TTL - resumed_at

            if this.successor is not None:
                # The successor keeps writing while the zombie finds out it was fenced.
                this.outcome = "taken"
                deadline = resumed_at + 15.0
                while zombie.wait("", seen("exit", work_id), 0.03, fail=False) is None:
                    assert time.monotonic() < deadline, f"{work_id}: the zombie never gave up"
                    this.successor_writes += 1
                    successor.checkpoint(
                        this.successor, successor_state(work_id, this.successor_writes)
                    )
                successor.release(this.successor, ExitMode.FINISHED)
            else:
                # Clearly short: the lease had at least SAFE_MARGIN left when the zombie
                # resumed, both on the database clock and in the zombie's own window.
                clearly_short = (
                    resumed_at - stopped_at < this.remaining - SAFE_MARGIN
                    and this.window_left > SAFE_MARGIN
                )
                # The zombie kept the lease (several writes after the pause), or lost it on
                # its own (a pause about as long as the lease; nobody took over).
                zombie.need(
                    f"{work_id} writing again or giving up",
                    either(seen("exit", work_id), acked_since(work_id, resumed_at, 3)),
                    15,
                )
                if clearly_short:
                    gave_up = events(zombie.snapshot(), "exit", work_id)
                    assert not gave_up, (
                        f"{work_id}: paused {resumed_at - stopped_at:.3f} s with "
                        f"{this.remaining:.3f} s of lease left ({this.window_left:.3f} s in its "
                        f"window on resuming), yet the zombie lost it: {gave_up}\n"
                        + timeline(zombie.snapshot(), work_id, resumed_at)
                    )
                zombie.command(cmd="release", work_id=work_id)
                this.outcome = "kept" if clearly_short else "ambiguous"
            done = zombie.need(f"{work_id} exit", seen("exit", work_id), 15)
            check_zombie_round(this, zombie.snapshot(), done)

        zombie.command(cmd="quit")
        finish(zombie)
    elapsed = time.monotonic() - started

    # The audit trail: nothing the zombie wrote was accepted after the successor's grant.
    assert audit.stale_writes(cluster_dsn) == 0
    history = audit.rows(cluster_dsn)
    lines = zombie.snapshot()
    latencies = []
    for this in rounds:
        rows = [r for r in history if r.work_id == this.work_id]
        zombie_rows = [r for r in rows if r.new_token == this.zombie_token]
        accepted = {r.checkpoint_md5 for r in zombie_rows}
        for ack in acks(lines, this.work_id):
            assert md5(f"zombie:{this.work_id}:{ack['ack']}".encode()) in accepted, ack
        if this.successor is None:
            assert {r.new_token for r in rows} == {this.zombie_token}
            continue
        token = this.successor
        grant = acquire_row(rows, this.zombie_token, token.fencing_token)
        assert all(r.id < grant.id for r in zombie_rows), "a zombie write after the takeover"
        last_zombie = max(zombie_rows, key=lambda r: r.id)
        assert last_zombie.expires_at is not None
        granted_at = token.expires_at - timedelta(seconds=SUCCESSOR_TTL)
        assert granted_at > last_zombie.expires_at, (this, last_zombie)
        latencies.append(seconds(granted_at - last_zombie.expires_at))
        final = rows[-1]
        assert final.new_token == token.fencing_token
        assert final.exit_mode == "finished"
        assert final.checkpoint_md5 == md5(successor_state(this.work_id, this.successor_writes))

    taken = [r for r in rounds if r.outcome == "taken"]
    kept = [r for r in rounds if r.outcome == "kept"]
    cut = [r for r in rounds if r.outcome == "kept, release cut"]
    starved = [r for r in rounds if r.starved]
    assert len(starved) <= max(2, len(rounds) // 20), [r.work_id for r in starved]
    # A release cut at the window's end is load, not the pause: rare, or something is wrong.
    assert len(cut) <= max(2, len(kept) // 20), [r.work_id for r in cut]
    ambiguous = [r for r in rounds if r.outcome == "ambiguous"]
    assert taken, "no pause let a successor take over"
    assert kept, "no pause was clearly shorter than the lease"
    rejected = [line for line in lines if line.get("event") == "rejected"]
    causes: dict[str, int] = {}
    for this in taken:
        causes[str(this.cause)] = causes.get(str(this.cause), 0) + 1
    report(
        f"zombie x{iterations} (TTL {ZOMBIE_TTL:g} s, pauses "
        f"{min(r.pause for r in rounds):.2f}..{max(r.pause for r in rounds):.2f} s) in "
        f"{elapsed:.0f} s: {len(taken)} taken over, {len(kept)} clearly short (kept; resumed "
        f"with >= {min(min(r.window_left, r.remaining - r.pause) for r in kept):.2f} s left), "
        f"{len(cut)} kept but released past the window's end, "
        f"{len(starved)} with the successor starved of CPU after the expiry, "
        f"{len(ambiguous)} near the TTL (no successor; "
        f"{sum(r.cause is not None for r in ambiguous)} lost on their own); "
        f"{len(rejected)} zombie writes rejected; renewal causes {causes}; "
        f"takeover after expiry {min(latencies) * 1000:.0f}..{max(latencies) * 1000:.0f} ms; "
        f"stale writes in the audit trail: {audit.stale_writes(cluster_dsn)}"
    )


def timeline(lines: list[Line], work_id: str, origin: float) -> str:
    """The lines of one work ID, times relative to ``origin``."""
    out = []
    for line in lines:
        if line.get("work_id") != work_id:
            continue
        shown = dict(line)
        for key in ("t", "t0"):
            if key in shown:
                shown[key] = round(shown[key] - origin, 4)
        out.append(json.dumps(shown, sort_keys=True))
    return "\n".join(out[-25:])


def check_zombie_round(this: ZombieRound, lines: list[Line], done: Line) -> None:
    work_id = this.work_id
    mine = [line for line in lines if line.get("work_id") == work_id]
    assert not events(mine, "accepted_after_rejection"), mine[-10:]
    assert not events(mine, "crashed"), mine[-10:]
    rejected_at = next(
        (index for index, line in enumerate(mine) if line.get("event") == "rejected"), None
    )
    if rejected_at is not None:
        later = mine[rejected_at:]
        assert not [line for line in later if "ack" in line], f"{work_id}: write accepted late"
        for line in events(later, "rejected"):
            assert line["error"] in LOST_TYPES, line
        loss = first(mine, "loss")
        assert loss is not None, mine[-10:]
        assert loss["cause"] in LOST_TYPES, f"{work_id}: the renewal did not report the loss"
        assert len(events(later, "rejected")) >= 4  # the first, and three after the report
        assert done["error"] in LOST_TYPES, done
        this.cause = loss["cause"]
    if this.successor is not None:
        assert rejected_at is not None, f"{work_id}: the zombie was never rejected: {mine[-10:]}"
    elif this.outcome == "kept":
        assert rejected_at is None, mine[-10:]
        failed = first(mine, "release_failed")
        if failed is None:
            assert first(mine, "released") is not None, [line.get("event") for line in mine]
            assert done["error"] is None, done
        else:
            # Kept through the pause (three writes acked after it, asserted above), then, on a
            # loaded machine, the release outran the half-second window it is bounded by: it
            # failed only once the window had run out (cancelled at the bound, or found the
            # lease lost), or the renewal had already lost the lease to the load before it.
            # Never fenced (nobody else took the work ID), never early.
            assert failed["error"] != "FencedError", failed
            left = failed.get("left")
            if left is None:  # lost before the release began: the renewal says so
                assert failed["error"] in {"LeaseWindowExhaustedError", "LeaseLapsedError"}, failed
            else:
                assert failed["error"] in LOST_TYPES or failed.get("transient") is True, failed
                assert failed["elapsed"] + 0.05 >= left, f"{work_id}: failed early: {failed}"
            assert done["error"] is None or done["error"] in LOST_TYPES, done
            this.outcome = "kept, release cut"
    else:  # ambiguous: kept it (and released it), or lost it on its own
        failed = first(mine, "release_failed")
        if failed is not None:  # the renewal found it lapsed just before the release
            assert failed["error"] in LOST_TYPES, failed
            assert done["error"] in LOST_TYPES, done
            this.cause = done["error"]
        else:
            assert first(mine, "released") is not None or this.cause is not None, mine[-10:]


# -- PostgreSQL restarts ------------------------------------------------------------------------


class TimedObserver(LeaseObserver):
    """Records (monotonic time, event) for renewals and checkpoints."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.renewals: list[tuple[float, RenewEvent]] = []
        self.checkpoints: list[tuple[float, CheckpointEvent]] = []

    def on_renew(self, event: RenewEvent) -> None:
        with self.lock:
            self.renewals.append((time.monotonic(), event))

    def on_checkpoint(self, event: CheckpointEvent) -> None:
        with self.lock:
            self.checkpoints.append((time.monotonic(), event))

    def renewed(self) -> list[float]:
        with self.lock:
            return [t for t, e in self.renewals if e.error is None]

    def last_success_start(self) -> float:
        """When the last successful renewal or checkpoint began (an upper bound)."""
        with self.lock:
            events: list[tuple[float, RenewEvent | CheckpointEvent]] = [
                *self.renewals,
                *self.checkpoints,
            ]
        return max(t - e.duration for t, e in events if e.error is None)

    def failed(self) -> list[RenewEvent]:
        with self.lock:
            return [e for _, e in self.renewals if e.error is not None]


def renewed_after(observer: TimedObserver, since: float, count: int) -> Callable[[], bool]:
    return lambda: len([t for t in observer.renewed() if t > since]) >= count


def wait_until(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


def test_fast_restart_within_the_window_keeps_the_lease(
    cluster: pg.ThrowawayCluster, cluster_dsn: str, backend: worklease.PostgresBackend
) -> None:
    ttl = 10.0
    observer = TimedObserver()
    lease = Lease(backend, holder_id="steady", ttl=ttl, observer=observer)
    restarts = scaled(2, 5)
    gaps: list[float] = []
    downtimes: list[float] = []
    first_writes: list[float] = []
    lowest_remaining = ttl
    with lease.hold("fast-restart", interval=0.2, backoff=Backoff(0.05, 0.5)) as hold:
        token = hold.token
        for restart in range(restarts):
            hold.checkpoint(f"before-{restart}".encode())
            wait_until("renewals", renewed_after(observer, time.monotonic(), 2), 10)
            stopping_at = time.monotonic()
            with server_down(cluster, "fast"):
                time.sleep(0.1)
                cluster.server_start()
            started_at = time.monotonic()
            downtimes.append(started_at - stopping_at)
            # User code carries on: no loss, no error, the same token.
            hold.renewal.raise_if_lost()
            hold.checkpoint(f"after-{restart}".encode())
            first_writes.append(time.monotonic() - started_at)
            wait_until("a renewal after the restart", renewed_after(observer, started_at, 1), 10)
            remaining = hold.renewal.remaining()
            assert remaining is not None
            lowest_remaining = min(lowest_remaining, remaining)
            before = [t for t in observer.renewed() if t < stopping_at]
            after = [t for t in observer.renewed() if t > started_at]
            gaps.append(after[0] - before[-1])
        hold.renewal.raise_if_lost()
        assert hold.renewal.cause is None
    failed = observer.failed()
    for event in failed:
        assert isinstance(event.error, BackendError), event
        assert event.error.transient, event
    (row,) = pg.execute(
        cluster_dsn,
        "SELECT fencing_token, holder_id, exit_mode, checkpoint FROM worklease_leases"
        " WHERE work_id = 'fast-restart'",
    )
    assert row[0] == token.fencing_token
    assert row[1] == "steady"
    assert row[2] == "finished"
    assert bytes(row[3]) == f"after-{restarts - 1}".encode()
    assert max(gaps) < ttl / 2
    report(
        f"fast restart x{restarts} (TTL {ttl:g} s, renewal every 0.2 s): server down "
        f"{min(downtimes):.2f}..{max(downtimes):.2f} s, renewal gap across the restart "
        f"{min(gaps):.2f}..{max(gaps):.2f} s, {len(failed)} failed (transient) renewal "
        f"attempts, lowest window left {lowest_remaining:.2f} s, token unchanged; the first "
        f"checkpoint after a restart took {min(first_writes):.2f}..{max(first_writes):.2f} s"
    )


OUTAGE_TTL = 2.0
OUTAGE_DOWN = 4.0


@dataclass
class OldHolder:
    work_id: str
    holder: str
    lease: Lease
    observer: TimedObserver
    token: Token | None = None
    acked: int = 0
    attempted: int = 0
    failed_writes: list[str] = field(default_factory=list)
    lost_at: float | None = None
    loss: BaseException | None = None
    exit_error: BaseException | None = None
    unexpected: BaseException | None = None
    started: threading.Event = field(default_factory=threading.Event)

    def run(self, stop: threading.Event) -> None:
        try:
            with self.lease.hold(
                self.work_id, interval=0.3, backoff=Backoff(0.05, 0.5), cleanup_timeout=2.0
            ) as hold:
                self.token = hold.token
                self.started.set()
                while not stop.is_set():
                    try:
                        hold.renewal.raise_if_lost()
                        self.attempted += 1
                        hold.checkpoint(f"{self.holder}:{self.attempted}".encode())
                        self.acked = self.attempted
                    except LeaseLostError as exc:
                        self.lost_at = time.monotonic()
                        self.loss = exc
                        raise
                    except BackendError as exc:
                        self.failed_writes.append(type(exc).__name__)
                    time.sleep(0.1)
        except LeaseLostError as exc:
            self.exit_error = exc
        except BaseException as exc:
            self.unexpected = exc
        finally:
            self.started.set()


def test_outage_longer_than_the_window_then_one_winner_per_work_id(
    cluster: pg.ThrowawayCluster, cluster_dsn: str, tmp_path: Path
) -> None:
    audit.install(cluster_dsn)
    # Checkpoints during the outage give up after 1 s (instead of blocking on the pool).
    with connected(cluster_dsn, 1.0) as backend:
        outage_and_contenders(cluster, cluster_dsn, backend, tmp_path)


def outage_and_contenders(
    cluster: pg.ThrowawayCluster,
    cluster_dsn: str,
    backend: worklease.PostgresBackend,
    tmp_path: Path,
) -> None:
    holders = [
        OldHolder(
            f"outage-{i}",
            f"old-{i}",
            Lease(backend, holder_id=f"old-{i}", ttl=OUTAGE_TTL, observer=observer),
            observer,
        )
        for i, observer in enumerate(TimedObserver() for _ in range(3))
    ]
    work_ids = [h.work_id for h in holders]
    stop = threading.Event()
    threads = [
        threading.Thread(target=h.run, args=(stop,), name=h.holder, daemon=True) for h in holders
    ]
    try:
        for thread in threads:
            thread.start()
        for h in holders:
            assert h.started.wait(30)
            assert h.token is not None, h.unexpected
        wait_until("checkpoints", lambda: all(h.acked >= 5 for h in holders), 30)

        stopped_at = time.monotonic()
        with server_down(cluster, "fast"):
            for thread in threads:
                thread.join(timeout=OUTAGE_TTL + 10.0)
                assert not thread.is_alive(), "a holder did not notice the loss"
            time.sleep(max(stopped_at + OUTAGE_DOWN - time.monotonic(), 0.0))
            cluster.server_start()
        restarted_at = time.monotonic()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=15)

    detection: list[float] = []
    for h in holders:
        assert h.unexpected is None, repr(h.unexpected)
        assert isinstance(h.loss, LeaseWindowExhaustedError), repr(h.loss)
        assert h.exit_error is h.loss  # leaving the hold raised the same loss
        assert h.lost_at is not None
        # The window closes one TTL after the start of the last write that succeeded: the
        # loss is not reported before, and noticed soon after (between two steps of the
        # holder, one of which may wait for the 1 s pool timeout).
        window_end = h.observer.last_success_start() + OUTAGE_TTL
        assert window_end > stopped_at
        assert h.lost_at >= window_end - 0.01, (h.lost_at, window_end)
        assert h.lost_at <= window_end + 2.0, (h.lost_at, window_end)
        assert h.lost_at < restarted_at
        detection.append(h.lost_at - window_end)

    # The contenders race for every work ID once the server is back.
    names = [f"contender-{i}" for i in range(3)]
    with contextlib.ExitStack() as stack:
        contenders = []
        for name in names:
            order = list(work_ids)
            random.shuffle(order)
            contenders.append(
                stack.enter_context(
                    spawned(
                        name,
                        tmp_path,
                        "contend",
                        "--dsn",
                        cluster_dsn,
                        "--ttl",
                        "30",
                        "--work-ids",
                        ",".join(order),
                    )
                )
            )
        for worker in contenders:
            worker.need("ready", lambda ls: first(ls, "ready"), 30)
        for worker in contenders:
            worker.send("go")
        results: dict[str, list[Line]] = {}
        for worker in contenders:
            worker.need("done", seen("done"), 30)
            results[worker.name] = worker.snapshot()
        for work_id in work_ids:
            won = [
                (name, line)
                for name, lines in results.items()
                for line in events(lines, "won", work_id)
            ]
            held = [line for lines in results.values() for line in events(lines, "held", work_id)]
            assert len(won) == 1, (work_id, won)
            assert len(held) == len(names) - 1, (work_id, held)
            winner, grant = won[0]
            # A loser that raced the winner's grant cannot name it (documented: None).
            assert {line["holder_id"] for line in held} <= {winner, None}, held
            h = holders[work_ids.index(work_id)]
            assert h.token is not None
            assert grant["token"] > h.token.fencing_token
            assert grant["prev_exit"] == "expired"
            assert grant["prev_holder_id"] == h.holder
            prefix = f"{h.holder}:"
            assert grant["state"].startswith(prefix)
            assert h.acked <= int(grant["state"][len(prefix) :]) <= h.attempted, (grant, h)
        for lines in results.values():
            assert not events(lines, "acquire_failed"), lines

        # The old holders are zombies now: their lease object refuses at once, and the
        # database fences a write sent around that gate.
        with connected(cluster_dsn, 10.0) as direct:
            for h in holders:
                assert h.token is not None
                with pytest.raises(LeaseLostError):
                    h.lease.checkpoint(h.token, b"stale")
                with pytest.raises(FencedError):
                    direct.checkpoint(h.token, b"stale", OUTAGE_TTL)
        for worker in contenders:
            worker.send("stop")
        for worker in contenders:
            finish(worker)
            assert not events(worker.snapshot(), "release_failed")

    assert audit.stale_writes(cluster_dsn) == 0
    history = audit.rows(cluster_dsn)
    for work_id in work_ids:
        grants = [
            r
            for r in history
            if r.work_id == work_id and r.op == "UPDATE" and r.old_token != r.new_token
        ]
        assert len(grants) == 1, grants  # one holder change: the single winner
    report(
        f"outage {OUTAGE_DOWN:g} s > TTL {OUTAGE_TTL:g} s: loss reported "
        + ", ".join(
            f"{type(h.loss).__name__} after {(h.lost_at or 0) - stopped_at:.2f} s" for h in holders
        )
        + f" (window end + {min(detection):.3f}..{max(detection):.3f} s)"
        + f"; {sum(len(h.failed_writes) for h in holders)} failed writes during the outage; "
        f"one winner for each of {len(work_ids)} work IDs among {len(names)} contenders"
    )


# -- immediate shutdown while checkpoints stream ---------------------------------------------------

STREAM_SIZE = 8192
STREAM_TTL = 10.0


def test_immediate_shutdown_keeps_acknowledged_checkpoints(
    cluster: pg.ThrowawayCluster, cluster_dsn: str, tmp_path: Path
) -> None:
    audit.install(cluster_dsn)
    rng = random.Random()
    work_ids = [f"stream-{i}" for i in range(4)]
    crashes = scaled(5, 15)
    outages: list[float] = []
    with spawned(
        "streamer",
        tmp_path,
        "stream",
        "--dsn",
        cluster_dsn,
        "--ttl",
        str(STREAM_TTL),
        "--work-ids",
        ",".join(work_ids),
        "--gap",
        "0.002",
        "--size",
        str(STREAM_SIZE),
        "--interval",
        "0.5",
    ) as worker:
        tokens = {}
        for work_id in work_ids:
            line = worker.need("acquired", seen("acquired", work_id), 30)
            tokens[work_id] = line["token"]
        for _ in range(crashes):
            base = {w: max_ack(worker.snapshot(), w) for w in work_ids}
            worker.need("checkpoints streaming", acked({w: base[w] + 20 for w in work_ids}), 60)
            time.sleep(rng.uniform(0.0, 0.2))
            crashed_at = time.monotonic()
            with server_down(cluster, "immediate"):
                # While the server is down nothing can commit: every acknowledgement printed
                # by now is of a write committed before the crash.
                time.sleep(0.3)
                last = {w: max_ack(worker.snapshot(), w) for w in work_ids}
                cluster.server_start()
            outages.append(time.monotonic() - crashed_at)
            stored = pg.execute(
                cluster_dsn,
                "SELECT work_id, fencing_token, holder_id, exit_mode, checkpoint"
                " FROM worklease_leases",
            )
            assert sorted(r[0] for r in stored) == work_ids
            for work_id, fencing_token, holder_id, exit_mode, checkpoint in stored:
                state = bytes(checkpoint)
                n = payload_n(work_id, state)
                assert n is not None, state[:80]
                assert state == payload(work_id, n, STREAM_SIZE), f"{work_id}: checkpoint torn"
                assert n >= last[work_id], f"{work_id}: acknowledged {last[work_id]}, found {n}"
                assert fencing_token == tokens[work_id]
                assert holder_id == "streamer"
                assert exit_mode is None

        worker.need(
            "checkpoints after the last crash", acked({w: last[w] + 20 for w in work_ids}), 60
        )
        worker.send("stop")
        finish(worker)
        lines = worker.snapshot()

    for kind in ("loss", "rejected", "crashed", "release_failed"):
        assert not events(lines, kind), events(lines, kind)
    failures = events(lines, "write_failed")
    for line in failures:
        assert line["error"] == "BackendError", line
        assert line["transient"], line
    history = audit.rows(cluster_dsn)
    assert audit.stale_writes(cluster_dsn) == 0
    writes = 0
    for work_id in work_ids:
        sent = [line["n"] for line in failures if line["work_id"] == work_id]
        sent += [line["ack"] for line in acks(lines, work_id)]
        expected = {md5(payload(work_id, n, STREAM_SIZE)): n for n in range(1, max(sent) + 1)}
        rows = [r for r in history if r.work_id == work_id]
        assert rows[0].op == "INSERT"
        assert {r.new_token for r in rows} == {tokens[work_id]}  # one token throughout
        written = []
        for r in rows[1:]:
            assert r.checkpoint_md5 in expected, f"{work_id}: a checkpoint nobody sent: {r}"
            written.append(expected[r.checkpoint_md5])
        assert written == sorted(written), f"{work_id}: checkpoints out of order"
        durable = set(written)
        for line in acks(lines, work_id):
            assert line["ack"] in durable, f"{work_id}: acknowledged {line['ack']} is missing"
        released = first(lines, "released", work_id)
        assert released is not None
        assert rows[-1].exit_mode == "finished"
        assert rows[-1].checkpoint_md5 == md5(payload(work_id, released["last"], STREAM_SIZE))
        assert max_ack(lines, work_id) == released["last"]
        writes += len(durable)
    report(
        f"immediate shutdown x{crashes} while {len(work_ids)} work IDs stream {STREAM_SIZE} B "
        f"checkpoints: {writes} writes stored, every acknowledged one present and intact, "
        f"{len(failures)} writes failed (transient) during outages of "
        f"{min(outages):.2f}..{max(outages):.2f} s, token unchanged, 0 stale writes"
    )
