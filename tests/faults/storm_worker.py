"""One OS process of the acquire storm (driven by tests/faults/test_acquire_storm.py).

Usage::

    python tests/faults/storm_worker.py --dsn DSN --process 0 --clients 20 --work-ids 20 \
        --duration 8 --ttl 1.0 --seed 1 --out events-0.jsonl

Each client is a thread with its own holder ID (``p{process}c{client}``) sharing one sync
``PostgresBackend``. A client picks a random work ID and tries to acquire it; on success it
reads the checkpoint, writes up to three checkpoints (sometimes under a background renewal,
sometimes stalling longer than the TTL first, so fencing happens), then releases FINISHED or
ABANDONED, or "crashes" (drops the token without releasing, so the lease has to expire).

Every step is one JSON line in ``--out`` (flushed at once, so a killed process leaves a usable
log): ``grant``, ``read`` (the state read and the previous exit), ``try`` before each
checkpoint and then ``ack`` (committed), ``fail`` (refused: fenced or lapsed) or ``doubt`` (a
transient error: it may or may not have committed), ``release``, ``crash``, and ``bug`` for
anything unexpected. States are ``"{holder}|{token}|{n}"``, unique per write.

Start protocol: print ``ready`` on stdout, wait for a line on stdin, run ``--duration``
seconds, print ``done``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from typing import Any, TextIO

from worklease import (
    BackendError,
    ExitMode,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    PostgresBackend,
    Token,
)


class Log:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        fields["e"] = event
        line = json.dumps(fields, sort_keys=True) + "\n"
        with self._lock:
            self._stream.write(line)
            self._stream.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--process", type=int, required=True)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--work-ids", type=int, default=20)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


class Client:
    def __init__(
        self, lease: Lease, log: Log, rng: random.Random, work_ids: int, deadline: float
    ) -> None:
        self.lease = lease
        self.log = log
        self.rng = rng
        self.work_ids = work_ids
        self.deadline = deadline
        self.holder = lease.holder_id

    def run(self) -> None:
        try:
            while time.monotonic() < self.deadline:
                self.once()
        except BaseException as exc:
            self.log("bug", h=self.holder, error=repr(exc))
            raise

    def once(self) -> None:
        rng = self.rng
        work_id = f"w{rng.randrange(self.work_ids):02d}"
        try:
            token = self.lease.acquire(work_id)
        except LeaseHeldError:
            time.sleep(rng.uniform(0.0, 0.02))
            return
        except BackendError as exc:
            self.log("acquire_error", h=self.holder, w=work_id, error=repr(exc))
            time.sleep(0.05)
            return
        self.log("grant", h=self.holder, w=work_id, t=token.fencing_token)
        try:
            prior = self.lease.read_checkpoint(token)
        except (LeaseLostError, BackendError) as exc:
            self.log("read_error", h=self.holder, w=work_id, t=token.fencing_token, error=repr(exc))
            return
        self.log(
            "read",
            h=self.holder,
            w=work_id,
            t=token.fencing_token,
            s=prior.state.decode() if prior.state is not None else None,
            px=str(prior.prev_exit),
            ph=prior.prev_holder_id,
        )
        writes = rng.randint(0, 3)
        ending = rng.choices(["finished", "abandoned", "crash"], weights=[5, 2, 3])[0]
        if rng.random() < 0.4:
            try:
                with self.lease.renewal(token, interval=self.lease.ttl / 3):
                    self.work(token, writes, stall=False)
                    self.end(token, ending)
            except LeaseLostError as exc:
                self.log("lost", h=self.holder, w=work_id, t=token.fencing_token, error=repr(exc))
        else:
            self.work(token, writes, stall=rng.random() < 0.15)
            self.end(token, ending)

    def work(self, token: Token, writes: int, *, stall: bool) -> None:
        rng = self.rng
        base = {"h": self.holder, "w": token.work_id, "t": token.fencing_token}
        for n in range(writes):
            pause = self.lease.ttl * 1.5 if stall and n == writes - 1 else rng.uniform(0, 0.1)
            time.sleep(pause)
            state = f"{self.holder}|{token.fencing_token}|{n}"
            self.log("try", s=state, **base)
            try:
                self.lease.checkpoint(token, state.encode())
            except LeaseLostError as exc:
                self.log("fail", s=state, error=type(exc).__name__, **base)
                return
            except BackendError as exc:
                self.log("doubt", s=state, error=repr(exc), **base)
                return
            self.log("ack", s=state, **base)

    def end(self, token: Token, ending: str) -> None:
        base = {"h": self.holder, "w": token.work_id, "t": token.fencing_token}
        if ending == "crash":
            self.log("crash", **base)
            return
        try:
            self.lease.release(token, ExitMode(ending))
        except (LeaseLostError, BackendError) as exc:
            self.log("release_error", m=ending, error=type(exc).__name__, **base)
            return
        self.log("release", m=ending, **base)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with open(args.out, "a", encoding="utf-8") as out:
        log = Log(out)
        with PostgresBackend.connect(
            args.dsn, min_size=2, max_size=args.pool_size, timeout=30.0
        ) as backend:
            backend.pool.wait(timeout=30.0)
            sys.stdout.write("ready\n")
            sys.stdout.flush()
            sys.stdin.readline()
            deadline = time.monotonic() + args.duration
            threads = []
            for index in range(args.clients):
                holder = f"p{args.process}c{index}"
                lease = Lease(backend, holder_id=holder, ttl=args.ttl)
                rng = random.Random(f"{args.seed}:{holder}")
                client = Client(lease, log, rng, args.work_ids, deadline)
                thread = threading.Thread(target=client.run, name=holder, daemon=True)
                thread.start()
                threads.append(thread)
            for thread in threads:
                thread.join(args.duration + 60.0)
            stuck = [thread.name for thread in threads if thread.is_alive()]
            if stuck:
                log("bug", error=f"clients still running: {stuck}")
        log("done", process=args.process)
    sys.stdout.write("done\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
