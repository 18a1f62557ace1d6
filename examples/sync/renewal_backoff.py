# Generated from examples/async/renewal_backoff.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Renewal and acquire lifecycle: how waiting acquires and misconfigured renewals end.

1. A waiting acquire gives up by its timeout: while worker-a holds a report, worker-b waits
   for it for 0.5 s and gets TimeoutError (caused by LeaseHeldError), not LeaseHeldError
   itself.
2. A renewal interval longer than the TTL (a deliberate misconfiguration: TTL 0.2 s, renewal
   every 0.4 s, retries paced by Backoff(0.05, 0.2, jitter=0)): the first renewal finds the
   lease already lapsed and the lease is lost with LeaseLapsedError, which is both a
   LeaseWindowExhaustedError and a LeaseExpiredError. The work is interrupted (async
   version) or learns it at its next check (threaded version); nothing is released, and the
   successor sees the previous exit "expired".

Both scenarios are about real time, so the in-memory backend runs on the system clock here;
the example takes one to two seconds. With --dsn it runs against PostgreSQL instead, with
every duration multiplied by 6 (up to about ten seconds in all): round trips to a database on
a busy machine can take a good part of a second, and the story must not depend on them.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets

import worklease

TTL = 0.2  # seconds; far below anything sensible, to keep the example short
RENEWAL_INTERVAL = 0.4  # longer than the TTL: the misconfiguration shown in scenario 2
WORK = 1.0  # how long the work takes (it outlasts the first renewal)
BACKOFF = worklease.Backoff(initial=0.05, maximum=0.2, jitter=0)


def acquire_timeout(backend: worklease.Backend, report: str, scale: float) -> None:
    print("== 1. a waiting acquire ends by its timeout")
    worker_b = worklease.Lease(backend, holder_id="worker-b", ttl=30)
    wait = 0.5 * scale
    print(f"worker-b: waits up to {wait:g} s for {report}")
    try:
        worker_b.acquire(report, wait=True, timeout=wait, poll_interval=0.1)
    except TimeoutError as exc:
        held = exc.__cause__
        is_held = isinstance(exc, worklease.LeaseHeldError)
        print(f"worker-b: gave up: TimeoutError (a LeaseHeldError: {is_held})")
        if isinstance(held, worklease.LeaseHeldError):
            print(f"worker-b: caused by LeaseHeldError: {report} is held by {held.holder_id}")


def renewal_lapses(backend: worklease.Backend, export: str, report: str, scale: float) -> None:
    print("\n== 2. a renewal interval longer than the TTL")
    ttl, interval, work = TTL * scale, RENEWAL_INTERVAL * scale, WORK * scale
    worker_c = worklease.Lease(backend, holder_id="worker-c", ttl=ttl)
    token = worker_c.acquire(export)
    print(
        f"worker-c: acquired {export} (token {token.fencing_token}) with a TTL of {ttl:g} s "
        f"and a renewal every {interval:g} s"
    )
    try:
        with worker_c.renewal(token, interval=interval, backoff=BACKOFF) as renewal:
            # The work: it needs the report worker-a holds, and waits for it a while.
            print(f"worker-c: works (waits up to {work:g} s for {report})")
            with contextlib.suppress(TimeoutError):
                worker_c.acquire(report, wait=True, timeout=work, poll_interval=0.1)
            renewal.raise_if_lost()  # threads learn of the loss here
            print("worker-c: finished the work (never happens: the lease was lost)")
    except worklease.LeaseLapsedError as exc:
        print("worker-c: lost the lease: LeaseLapsedError")
        window = isinstance(exc, worklease.LeaseWindowExhaustedError)
        expired = isinstance(exc, worklease.LeaseExpiredError)
        print(f"worker-c:   a LeaseWindowExhaustedError: {window}")
        print(f"worker-c:   a LeaseExpiredError: {expired}")
    try:
        worker_c.release(token, worklease.ExitMode.FINISHED)
    except worklease.LeaseLostError as exc:
        print(f"worker-c: cannot release: {type(exc).__name__} (nothing is recorded)")
    worker_d = worklease.Lease(backend, holder_id="worker-d", ttl=30)
    successor = worker_d.acquire(export, wait=True, timeout=30, poll_interval=0.1)
    prior = worker_d.read_checkpoint(successor)
    print(
        f"worker-d: acquired {export} (token {successor.fencing_token}); previous exit: "
        f"{prior.prev_exit} (holder {prior.prev_holder_id})"
    )
    worker_d.forget(successor)  # tidy up: rows outlive their holders


def run(backend: worklease.Backend, suffix: str, scale: float) -> None:
    report, export = "monthly-report" + suffix, "nightly-export" + suffix
    worker_a = worklease.Lease(backend, holder_id="worker-a", ttl=30)
    held = worker_a.acquire(report)
    print(f"worker-a: holds {report} (token {held.fencing_token}) throughout\n")
    acquire_timeout(backend, report, scale)
    renewal_lapses(backend, export, report, scale)
    worker_a.release(held, worklease.ExitMode.FINISHED)
    worker_a.forget(held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", help="run against this PostgreSQL database instead of in memory")
    args = parser.parse_args()
    if args.dsn is None:
        run(worklease.MemoryBackend(), suffix="", scale=1)
        return
    with worklease.PostgresBackend.connect(args.dsn) as backend:
        worklease.PostgresBackend.apply_schema(backend.pool)
        # Database round trips take longer than memory (on a loaded machine, much longer).
        run(backend, suffix="-" + secrets.token_hex(4), scale=6)


if __name__ == "__main__":
    main()
