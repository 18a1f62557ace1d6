"""An acquire storm: many clients in several processes over a few work IDs.

Clients (threads of ``storm_worker.py`` processes, sync flavour) acquire random work IDs, read
the checkpoint, write checkpoints (some under a background renewal, some after stalling past
the TTL), then release or crash; one whole process is SIGKILLed half-way. Invariants, from the
audit trail (server side) and the workers' logs (client side):

* no stale write (``audit.stale_writes == 0``);
* per work ID, granted tokens strictly increase in grant order;
* never two unexpired holders: every grant replaced a row that was released or expired;
* every acknowledged checkpoint was stored, every refused one was not;
* every successor read exactly the last acknowledged checkpoint before its grant (or a write
  whose outcome its writer could not know: a transient error, or the process was killed).

Short run (ordinary suite): 2 processes x 20 clients over 20 work IDs for 8 s; long run
(``nox -s faults``): 4 processes x 50 clients for 30 s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from tests import pg
from tests.faults import audit
from tests.faults.conftest import scaled

pytestmark = [pytest.mark.postgres, pytest.mark.faults]

WORKER = Path(__file__).with_name("storm_worker.py")
ROOT = Path(__file__).resolve().parents[2]
PROCESSES = scaled(2, 4)
CLIENTS = scaled(20, 50)  # per process
DURATION = float(scaled(8, 30))
WORK_IDS = 20
TTL = 1.0


def md5(text: str | None) -> str | None:
    return None if text is None else hashlib.md5(text.encode()).hexdigest()


def read_line(stream: IO[str], timeout: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"no output from a worker within {timeout:g}s"
    return stream.readline().strip()


def load(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by SIGKILL
            continue
    return events


@dataclass
class Write:
    token: int
    n: int
    state: str
    outcome: str | None  # ack, fail, doubt, or None (the process died)


def test_acquire_storm(cluster_dsn: str, tmp_path: Path) -> None:
    audit.install(cluster_dsn)
    outs = [tmp_path / f"events-{index}.jsonl" for index in range(PROCESSES)]
    errs = [tmp_path / f"stderr-{index}.log" for index in range(PROCESSES)]
    procs: list[subprocess.Popen[str]] = []
    victim = 0
    with contextlib.ExitStack() as stack:
        try:
            for index in range(PROCESSES):
                command = [
                    sys.executable,
                    str(WORKER),
                    f"--dsn={cluster_dsn}",
                    f"--process={index}",
                    f"--clients={CLIENTS}",
                    f"--work-ids={WORK_IDS}",
                    f"--duration={DURATION}",
                    f"--ttl={TTL}",
                    f"--seed={os.getpid()}",
                    f"--pool-size={min(CLIENTS, 10)}",
                    f"--out={outs[index]}",
                ]
                stderr = stack.enter_context(errs[index].open("w"))
                procs.append(
                    subprocess.Popen(
                        command,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=stderr,
                        text=True,
                        cwd=ROOT,
                    )
                )
            for proc in procs:
                assert proc.stdout is not None
                assert read_line(proc.stdout, 60.0) == "ready"
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            time.sleep(DURATION * 0.6)
            procs[victim].send_signal(signal.SIGKILL)  # a whole process crashes mid-storm
            for index, proc in enumerate(procs):
                code = proc.wait(timeout=DURATION + 90.0)
                if index == victim:
                    assert code == -signal.SIGKILL
                else:
                    assert code == 0, errs[index].read_text()[-3000:]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
                for stream in (proc.stdin, proc.stdout):
                    if stream is not None:
                        with contextlib.suppress(OSError):
                            stream.close()

    events = [event for path in outs for event in load(path)]
    figures = verify(cluster_dsn, events)
    print("acquire storm:", json.dumps(figures, sort_keys=True))
    assert figures["grants"] >= 20 * PROCESSES
    assert figures["acks"] >= 20 * PROCESSES
    assert figures["reads_checked"] >= 20 * PROCESSES
    assert figures["takeovers_after_expiry"] >= 1


def verify(dsn: str, events: list[dict[str, Any]]) -> dict[str, int]:
    bugs = [event for event in events if event["e"] == "bug"]
    assert bugs == [], bugs[:5]

    # -- server side: the audit trail -----------------------------------------------------------
    assert audit.stale_writes(dsn) == 0
    history: dict[str, list[audit.AuditRow]] = defaultdict(list)
    for row in audit.rows(dsn):
        history[row.work_id].append(row)
    grants: dict[tuple[str, int], audit.AuditRow] = {}
    stored_md5: dict[tuple[str, int], set[str | None]] = defaultdict(set)
    takeovers_after_expiry = 0
    for work_id, rows in history.items():
        assert rows[0].op == "INSERT"
        assert all(row.op != "DELETE" for row in rows)
        last_grant = -1
        for previous, row in zip([None, *rows[:-1]], rows, strict=True):
            stored_md5[(work_id, row.new_token or 0)].add(row.checkpoint_md5)
            if previous is not None:
                assert row.old_token == previous.new_token, (work_id, row)
            is_grant = row.op == "INSERT" or row.new_token != row.old_token
            if not is_grant:
                continue
            assert row.new_token is not None
            assert row.new_token > last_grant, f"{work_id}: tokens not increasing at {row}"
            last_grant = row.new_token
            grants[(work_id, row.new_token)] = row
            if previous is not None:
                # Never two unexpired holders: the row replaced was released or expired.
                assert previous.expires_at is not None
                released = previous.exit_mode is not None
                assert released or previous.expires_at < row.at, (previous, row)
                if not released:
                    takeovers_after_expiry += 1

    # -- client side: the workers' logs ---------------------------------------------------------
    granted = [event for event in events if event["e"] == "grant"]
    for event in granted:
        grant = grants.get((event["w"], event["t"]))
        assert grant is not None, f"grant not in the audit trail: {event}"
        assert grant.new_holder == event["h"]

    writes: dict[str, list[Write]] = defaultdict(list)  # by work ID
    by_state: dict[str, Write] = {}
    for event in events:
        if event["e"] == "try":
            write = Write(event["t"], int(event["s"].rsplit("|", 1)[1]), event["s"], None)
            writes[event["w"]].append(write)
            by_state[event["s"]] = write
        elif event["e"] in ("ack", "fail", "doubt"):
            by_state[event["s"]].outcome = event["e"]
    acks = fails = 0
    for work_id, items in writes.items():
        for write in items:
            accepted = md5(write.state) in stored_md5[(work_id, write.token)]
            if write.outcome == "ack":
                acks += 1
                assert accepted, f"acknowledged checkpoint not stored: {write}"
            elif write.outcome == "fail":
                fails += 1
                assert not accepted, f"refused checkpoint was stored: {write}"
        items.sort(key=lambda write: (write.token, write.n))

    reads_checked = 0
    for event in events:
        if event["e"] != "read":
            continue
        token = event["t"]
        before = [write for write in writes[event["w"]] if write.token < token]
        acked = [write for write in before if write.outcome == "ack"]
        last = acked[-1] if acked else None
        allowed = {last.state if last else None}
        allowed |= {
            write.state
            for write in before
            if write.outcome in (None, "doubt")
            and (last is None or (write.token, write.n) > (last.token, last.n))
        }
        assert event["s"] in allowed, f"{event} read, expected one of {allowed}"
        assert grants[(event["w"], token)].checkpoint_md5 == md5(event["s"])
        reads_checked += 1

    return {
        "events": len(events),
        "grants": len(grants),
        "grants_logged": len(granted),
        "acks": acks,
        "refused_writes": fails,
        "doubtful_writes": sum(1 for e in events if e["e"] == "doubt"),
        "reads_checked": reads_checked,
        "takeovers_after_expiry": takeovers_after_expiry,
        "releases": sum(1 for e in events if e["e"] == "release"),
        "crashes": sum(1 for e in events if e["e"] == "crash"),
        "renewal_losses": sum(1 for e in events if e["e"] == "lost"),
        "acquire_errors": sum(1 for e in events if e["e"] == "acquire_error"),
        "rows": int(pg.execute(dsn, "SELECT count(*) FROM worklease_leases")[0][0]),
    }
