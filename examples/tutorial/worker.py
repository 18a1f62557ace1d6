"""The tutorial's worker (docs/guide/tutorial.md): one process of a pool that builds reports.

Every process runs a fair-share pool over the same four reports. A report takes thirty steps;
after each one the worker checkpoints how far it got, so whoever holds the report next
resumes there, and a report somebody retired is left alone. Each process prints what it
starts, resumes and finishes, naming the token it holds and, on a resume, who held the report
before and how that holder left. SIGTERM (or
Ctrl-C) stops the pool gracefully: its reports are released ABANDONED with their checkpoints,
and the other processes take them over at once.

    python examples/tutorial/worker.py NAME [--dsn DSN] [--ttl SECONDS] [--step SECONDS]

The DSN defaults to $DSN.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from types import FrameType

from psycopg_pool import ConnectionPool

import worklease

REPORTS = ("report-1", "report-2", "report-3", "report-4")
STEPS = 30


_PRINTING = threading.Lock()


def say(name: str, text: str) -> None:
    with _PRINTING:  # one line at a time: the pool runs each report in a thread of its own
        print(f"[{name}] {text}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="this worker's holder ID")
    parser.add_argument("--dsn", default=os.environ.get("DSN"), help="default: $DSN")
    parser.add_argument("--ttl", type=float, default=6.0, help="lease TTL (default 6 s)")
    parser.add_argument("--step", type=float, default=1.0, help="seconds per step (default 1)")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("give --dsn or set DSN")
    name = args.name

    def work(token: worklease.Token, prior: worklease.Checkpoint) -> None:
        report = token.work_id
        if prior.prev_exit is worklease.ExitMode.RETIRED:
            # Somebody finished it for good: a retired work ID can be acquired again, and
            # it is the work function's to leave it be.
            say(name, f"{report}: already done (retired by {prior.prev_holder_id})")
            raise worklease.Retire
        step = json.loads(prior.state)["step"] if prior.state else 0
        if step:
            say(
                name,
                f"{report}: resuming at step {step}/{STEPS} (token {token.fencing_token}; "
                f"previous holder {prior.prev_holder_id}, exit {prior.prev_exit})",
            )
        else:
            say(name, f"{report}: starting (token {token.fencing_token})")
        renewal = worklease.current_renewal()
        assert renewal is not None  # a pool runs its work inside the lease's renewal
        while step < STEPS:
            time.sleep(args.step)  # the real work of one step
            renewal.raise_if_lost()  # handed over or lost meanwhile: stop before writing
            step += 1
            lease.checkpoint(token, json.dumps({"step": step}).encode())
        say(name, f"{report}: done, step {step}/{STEPS}")
        raise worklease.Retire  # done for good: nobody runs it again

    with ConnectionPool(args.dsn, min_size=1, max_size=4, open=True) as connections:
        lease = worklease.Lease(
            worklease.PostgresBackend(connections), holder_id=name, ttl=args.ttl
        )
        pool = worklease.Pool(lease, REPORTS, work)

        def stopping() -> None:
            say(name, "SIGTERM: handing my reports over")
            pool.stop()

        def stop(signum: int, frame: FrameType | None) -> None:
            # Nothing in the handler itself: it interrupts the main thread wherever it is,
            # perhaps inside say() holding its lock.
            threading.Thread(target=stopping, name="stop-on-sigterm").start()

        signal.signal(signal.SIGTERM, stop)
        say(name, f"pool started (pid {os.getpid()})")
        pool.run()
        say(name, "pool stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
