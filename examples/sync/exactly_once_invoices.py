# Generated from examples/async/exactly_once_invoices.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Exactly-once invoices: a restartable batch whose steps commit with their checkpoint.

A monthly billing batch invoices 30 customers. Each step inserts one invoice and stages the
position of the next customer as the checkpoint, in one transactional step: the invoice row
and the checkpoint commit together, or neither does. The demo starts a worker process, kills
it with SIGKILL in the middle of the batch (no cleanup of any kind), and starts a second
worker, which waits out the dead worker's lease, resumes from the checkpoint and finishes.
The invoice table has no unique constraint, so it would show any invoice written twice.

It needs PostgreSQL: ``--dsn DSN`` (the table ``example_invoices`` is created there).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time

import psycopg

import worklease

CUSTOMERS = tuple(f"customer-{n:02}" for n in range(1, 31))
TTL = 2.0
TABLE = """CREATE TABLE IF NOT EXISTS example_invoices (
    batch TEXT NOT NULL, customer TEXT NOT NULL, fencing_token BIGINT NOT NULL)"""


def work(dsn: str, batch: str, name: str) -> None:
    """One worker: hold the batch, then invoice customer after customer from the checkpoint."""
    with worklease.PostgresBackend.connect(dsn, listen=False) as backend:
        lease = worklease.Lease(backend, holder_id=name, ttl=TTL)
        with lease.hold(batch, wait=True, timeout=30) as held:
            prior = held.prior
            start = int(prior.state or b"0")
            previous = str(prior.prev_exit)
            if prior.prev_holder_id is not None:
                previous += f" (holder {prior.prev_holder_id})"
            print(f"{name}: previous exit: {previous}; resumes at {CUSTOMERS[start]}", flush=True)
            for position in range(start, len(CUSTOMERS)):
                with held.transaction() as tx:
                    tx.connection.execute(
                        b"INSERT INTO example_invoices VALUES (%s, %s, %s)",
                        (batch, CUSTOMERS[position], held.token.fencing_token),
                    )
                    tx.connection.execute(b"SELECT pg_sleep(0.05)")  # a slow step
                    tx.checkpoint(str(position + 1).encode())
            print(f"{name}: invoiced up to {CUSTOMERS[-1]}; releasing", flush=True)


def invoices(dsn: str, batch: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            b"SELECT customer FROM example_invoices WHERE batch = %s", (batch,)
        ).fetchall()
    return [customer for (customer,) in rows]


def start_worker(dsn: str, batch: str, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--dsn", dsn, "--batch", batch, "--worker", name]
    )


def demo(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLE.encode())
    batch = "billing-2026-11-" + secrets.token_hex(4)
    first = start_worker(dsn, batch, "worker-1")
    while len(invoices(dsn, batch)) < 10:  # let it get well into the batch
        if first.poll() is not None:
            raise SystemExit("worker-1 ended early")
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    written = invoices(dsn, batch)
    print(f"worker-1: killed with SIGKILL after {len(written)} invoices", flush=True)
    second = start_worker(dsn, batch, "worker-2")
    if second.wait() != 0:
        raise SystemExit("worker-2 failed")
    final = invoices(dsn, batch)
    once = len(set(final)) == len(final) == len(CUSTOMERS)
    print(
        f"invoice table: {len(final)} invoices for {len(set(final))} customers"
        + (", each invoiced exactly once" if once else ", NOT exactly once")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", required=True, help="the PostgreSQL database to use")
    parser.add_argument("--batch", help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        work(args.dsn, args.batch, args.worker)
        return
    with worklease.PostgresBackend.connect(args.dsn) as backend:
        worklease.PostgresBackend.apply_schema(backend.pool)
    demo(args.dsn)


if __name__ == "__main__":
    main()
