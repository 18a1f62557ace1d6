"""One OS process running a sync ``worklease.Pool`` on PostgreSQL (driven by
tests/test_pool_processes.py).

Usage::

    python tests/pool_worker.py --dsn DSN --holder NAME --ttl 1.5 [--home part-00,part-01]

The pool covers work IDs ``part-00`` .. ``part-NN``. The work function never returns on its
own: it prints one JSON line per acquisition to stdout (what it read: ``prev_exit``,
``prev_holder_id``, ``state``, and its token), then writes the checkpoint ``"{holder}:{n}"``
(n = 1, 2, ...) every ``--checkpoint-interval`` seconds until the lease is lost, handed to
another member (fair share: ``raise_if_lost()`` raises ``LeaseShedError``) or the pool stops,
and prints one more line when it ends (``left``: the last checkpoint acknowledged, and why),
before the pool releases the lease.

Start protocol: the worker connects, prints ``{"event": "ready"}`` and waits for a line on
stdin before starting the pool. For ``--grace`` seconds after that, a work ID outside
``--home`` is given back at once (released FINISHED) so that each process settles on its home
work IDs; afterwards every acquisition is kept. SIGTERM stops the pool gracefully (the work
functions raise, so every held work ID is released ABANDONED keeping its last checkpoint);
the last line is ``{"event": "stopped"}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

import worklease
from worklease import Checkpoint, Token

_print_lock = threading.Lock()


def emit(**fields: Any) -> None:
    line = json.dumps(fields, sort_keys=True)
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Stopping(Exception):
    """Raised by the work function when the pool stops (the slot releases ABANDONED)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--holder", required=True)
    parser.add_argument("--ttl", type=float, default=1.5)
    parser.add_argument("--count", type=int, default=12, help="number of work IDs")
    parser.add_argument("--home", default="", help="comma-separated preferred work IDs")
    parser.add_argument("--grace", type=float, default=0.0)
    parser.add_argument("--checkpoint-interval", type=float, default=0.1)
    parser.add_argument("--idle-interval", type=float, default=0.2)
    parser.add_argument("--rerun-interval", type=float, default=1.0)
    parser.add_argument("--backoff-interval", type=float, default=0.3)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s {args.holder} %(threadName)s %(levelname)s %(message)s",
    )
    holder: str = args.holder
    all_ids = [f"part-{i:02d}" for i in range(args.count)]
    home = {w for w in args.home.split(",") if w}
    # Home work IDs first: the pool starts its slots in this order.
    work_ids = [w for w in all_ids if w in home] + [w for w in all_ids if w not in home]

    stop = threading.Event()
    pool_ref: list[worklease.Pool] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop.set()
        if pool_ref:
            pool_ref[0].stop()

    signal.signal(signal.SIGTERM, on_sigterm)

    backend = worklease.PostgresBackend.connect(args.dsn, min_size=2, max_size=6)
    with backend:
        backend.pool.wait(timeout=30.0)
        lease = worklease.Lease(backend, holder_id=holder, ttl=args.ttl)
        grace_end = [float("inf")]

        def work(token: Token, prior: Checkpoint) -> bytes | None:
            pool = pool_ref[0]
            acquired_local = time.time()
            keep = token.work_id in home or time.monotonic() >= grace_end[0]
            emit(
                event="acquired",
                holder=holder,
                work_id=token.work_id,
                fencing_token=token.fencing_token,
                expires_at=token.expires_at.isoformat(),
                prev_exit=str(prior.prev_exit),
                prev_holder_id=prior.prev_holder_id,
                state=None if prior.state is None else prior.state.decode(),
                kept=keep,
                t=acquired_local,
            )
            if not keep:
                return None  # released FINISHED: leave it to its home process
            renewal = worklease.current_renewal()
            assert renewal is not None, "the work function runs inside a renewal"
            n = acked = 0
            why = "returned"
            try:
                while True:
                    if pool.stopping or stop.is_set():
                        raise Stopping(token.work_id)
                    renewal.raise_if_lost()
                    n += 1
                    lease.checkpoint(token, f"{holder}:{n}".encode())
                    acked = n
                    stop.wait(args.checkpoint_interval)
            except BaseException as exc:
                why = type(exc).__name__
                raise
            finally:
                # Before the pool releases: a successor acquires only after this line.
                emit(
                    event="left",
                    holder=holder,
                    work_id=token.work_id,
                    fencing_token=token.fencing_token,
                    acked=acked,
                    why=why,
                    t=time.time(),
                )

        pool = worklease.Pool(
            lease,
            work_ids,
            work,
            idle_interval=args.idle_interval,
            rerun_interval=args.rerun_interval,
            backoff_interval=args.backoff_interval,
        )
        pool_ref.append(pool)
        emit(event="ready", holder=holder)
        go = sys.stdin.readline()
        if not go or stop.is_set():
            emit(event="stopped", holder=holder)
            return 0
        grace_end[0] = time.monotonic() + args.grace
        pool.run()
    emit(event="stopped", holder=holder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
