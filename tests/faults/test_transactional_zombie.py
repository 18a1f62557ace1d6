"""Transactional steps under SIGSTOP (issue 14): exactly once for rows in the same database.

A holder process writes transactional steps (a row of its own in ``worklease_test_steps`` and
the checkpoint, in one fenced transaction) and is ``SIGSTOP``ped for 0.4-2 TTLs; meanwhile a
successor takes the work ID over when it lapses and writes transactional steps of its own.
The audit trigger records every accepted change of a lease row with its transaction ID, and
the step rows carry theirs, so the test can tell, from the server's point of view:

- no step row was written under a superseded token (no zombie row's transaction is later
  than the successor's grant, and no lease-row change with a superseded token was accepted);
- every committed step row came with its own checkpoint, in the same transaction;
- no step was committed twice, and every acknowledged step is there.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import worklease
from tests import pg
from worklease import ExitMode, Lease, LeaseHeldError, Token

from . import audit
from .conftest import scaled
from .test_process_faults import (
    SUCCESSOR_TTL,
    acked,
    acked_since,
    acks,
    connected,
    either,
    finish,
    first,
    md5,
    report,
    seen,
    spawned,
)

pytestmark = [pytest.mark.postgres, pytest.mark.faults]

TTL = 0.5
GAP = 0.02

STEPS = """CREATE TABLE IF NOT EXISTS worklease_test_steps (
    work_id TEXT NOT NULL, token BIGINT NOT NULL, n INT NOT NULL,
    xid TEXT NOT NULL DEFAULT pg_current_xact_id()::text)"""


@pytest.fixture
def backend(cluster_dsn: str) -> Iterator[worklease.PostgresBackend]:
    with connected(cluster_dsn, 10.0) as b:
        yield b


def successor_step(lease: Lease, token: Token, n: int) -> None:
    with lease.transaction(token) as tx:
        tx.connection.execute(
            b"INSERT INTO worklease_test_steps (work_id, token, n) VALUES (%s, %s, %s)",
            (token.work_id, token.fencing_token, n),
        )
        tx.checkpoint(f"successor:{token.work_id}:{n}".encode())


@pytest.mark.lengthy
def test_transactional_steps_of_a_paused_zombie_never_land_after_a_takeover(
    cluster_dsn: str, backend: worklease.PostgresBackend, tmp_path: Path
) -> None:
    audit.install(cluster_dsn)
    pg.execute(cluster_dsn, STEPS)
    rng = random.Random()
    successor = Lease(backend, holder_id="successor", ttl=SUCCESSOR_TTL)
    rounds = scaled(200, 400)
    taken: dict[str, int] = {}  # work ID -> the successor's token
    zombie_tokens: dict[str, int] = {}
    started = time.monotonic()
    with spawned(
        "txzombie", tmp_path, "zombie", "--dsn", cluster_dsn, "--gap", str(GAP), "--transactional"
    ) as zombie:
        zombie.need("ready", lambda ls: first(ls, "ready"), 30)
        for i in range(rounds):
            work_id = f"tx-{i:03d}"
            zombie.command(cmd="hold", work_id=work_id, ttl=TTL)
            acquired = zombie.need(
                f"{work_id} acquired",
                either(seen("acquired", work_id), seen("acquire_failed", work_id)),
                15,
            )
            assert acquired["event"] == "acquired", acquired
            zombie_tokens[work_id] = acquired["token"]
            # Generous, as in test_zombie_after_sigstop_is_fenced: three steps once acquired
            # took more than 15 s once on a loaded CI machine.
            zombie.need(f"{work_id} writing", acked({work_id: 3}), 60)
            pause = TTL * rng.uniform(0.4, 2.0)
            zombie.proc.send_signal(signal.SIGSTOP)
            resume_at = time.monotonic() + pause
            token: Token | None = None
            try:
                while token is None and time.monotonic() < resume_at:
                    try:
                        token = successor.acquire(work_id)
                    except LeaseHeldError:
                        time.sleep(0.01)
                if token is not None:
                    successor_step(successor, token, 1)
                time.sleep(max(resume_at - time.monotonic(), 0.0))
            finally:
                zombie.proc.send_signal(signal.SIGCONT)
            resumed_at = time.monotonic()
            if token is not None:
                taken[work_id] = token.fencing_token
                n = 1
                deadline = time.monotonic() + 15
                while zombie.wait("", seen("exit", work_id), 0.03, fail=False) is None:
                    assert time.monotonic() < deadline, f"{work_id}: the zombie never gave up"
                    n += 1
                    successor_step(successor, token, n)  # the successor goes on meanwhile
                successor.release(token, ExitMode.FINISHED)
            else:
                # nobody took over: it keeps the lease, or finds out it lapsed and gives up
                zombie.need(
                    f"{work_id} writing again or giving up",
                    either(seen("exit", work_id), acked_since(work_id, resumed_at, 3)),
                    15,
                )
                zombie.command(cmd="release", work_id=work_id)
            zombie.need(f"{work_id} exit", seen("exit", work_id), 15)
        zombie.command(cmd="quit")
        finish(zombie)
        lines = zombie.snapshot()
    elapsed = time.monotonic() - started

    assert audit.stale_writes(cluster_dsn) == 0
    history = audit.rows(cluster_dsn)
    with psycopg.connect(cluster_dsn) as conn:
        steps = conn.execute(
            b"SELECT work_id, token, n, xid FROM worklease_test_steps ORDER BY work_id, n"
        ).fetchall()
        xids: dict[str, int] = dict(conn.execute(b"SELECT xid, id FROM worklease_audit").fetchall())
    by_id = {row.id: row for row in history}
    # No step twice.
    keys = [(w, t, n) for w, t, n, _ in steps]
    assert len(keys) == len(set(keys))
    superseded = 0
    for work_id, token_value, n, xid in steps:
        # The row's own transaction changed the lease row: the guard, with this token, writing
        # this step's checkpoint.
        audit_id = xids.get(xid)
        assert audit_id is not None, (work_id, n, "a step row without its checkpoint")
        change = by_id[audit_id]
        assert (change.work_id, change.new_token) == (work_id, token_value)
        who = "zombie" if token_value == zombie_tokens.get(work_id) else "successor"
        assert change.checkpoint_md5 == md5(f"{who}:{work_id}:{n}".encode())
        # Never after a newer grant for the work ID.
        newer = [
            r.id
            for r in history
            if r.work_id == work_id and r.new_token is not None and r.new_token > token_value
        ]
        if newer and audit_id > min(newer):
            superseded += 1
    assert superseded == 0
    # Every acknowledged zombie step is there, exactly once.
    stored = {(w, n) for w, t, n, _ in steps if t == zombie_tokens.get(w)}
    for work_id in zombie_tokens:
        for ack in acks(lines, work_id):
            assert (work_id, ack["ack"]) in stored, (work_id, ack)
    zombie_rows_after_pause = sum(
        1
        for w, t, n, _ in steps
        if w in taken
        and t == zombie_tokens[w]
        and n > max((a["ack"] for a in acks(lines, w)), default=0)
    )
    report(
        f"transactional zombie x{rounds} (TTL {TTL:g} s, pauses 0.4-2 TTL): {len(taken)} taken "
        f"over, {len(steps)} step rows, 0 under a superseded token, 0 without their "
        f"checkpoint, 0 twice; {zombie_rows_after_pause} committed but unacknowledged zombie "
        f"step(s) (stopped between COMMIT and the ack); {elapsed:.0f} s"
    )
