"""A lease holder in its own OS process, for the process-fault tests (tests/faults/
test_process_faults.py). Sync flavour, PostgreSQL backend. Every line on stdout is one JSON
object, flushed at once; the test parses them.

Modes::

    python tests/faults/holder_worker.py stream --dsn DSN --holder NAME --ttl 2 \\
        --work-ids a,b [--gap 0.3] [--size 8192] [--interval SECONDS]
    python tests/faults/holder_worker.py zombie --dsn DSN --holder NAME [--gap 0.02]
    python tests/faults/holder_worker.py contend --dsn DSN --holder NAME --ttl 10 --work-ids a,b

``stream``: one thread per work ID acquires it (waiting), renews it in the background and
writes the checkpoints ``payload(work_id, n)`` for n = 1, 2, ... with ``--gap`` seconds between
them. After each write that returned it prints ``{"ack": n, "token": t, "work_id": w,
"t": monotonic}``; a write that raised prints ``write_failed`` (and the next write uses the
next n, so a failed n is never sent again). A line ``stop`` on stdin (or EOF) releases every
work ID FINISHED.

``zombie``: a long-lived holder driven by JSON commands on stdin, one work ID at a time
(``--transactional``: each write is a transactional step that also inserts the row
``(work_id, token, n)`` into ``worklease_test_steps``):
``{"cmd": "hold", "work_id": w, "ttl": s}`` acquires ``w`` (no waiting), starts its renewal
and writes small checkpoints continuously, printing an ``ack`` per write that returned. On the
first rejected write it keeps writing: every further write must be rejected too; it waits
(bounded) until the renewal itself reports the loss, writes three more times, prints
``loss`` with the renewal's cause and leaves. ``{"cmd": "release", "work_id": w}`` ends a
session that still holds its lease (released FINISHED). ``{"cmd": "quit"}`` exits.

``contend``: connects, prints ``ready``, waits for ``go`` on stdin, then tries each work ID
once (no waiting), printing ``won`` (with what it read) or ``held``; then waits for ``stop``
and releases what it won.

Times ``t`` are ``time.monotonic()`` (CLOCK_MONOTONIC, comparable between processes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import threading
import time
from typing import Any

import worklease
from worklease import ExitMode, Token
from worklease.errors import BackendError, LeaseHeldError, LeaseLostError

_print_lock = threading.Lock()
HEADER_SIZE = 64


def emit(**fields: Any) -> None:
    line = json.dumps(fields, sort_keys=True)
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def payload(work_id: str, n: int, size: int) -> bytes:
    """The exact bytes written as checkpoint ``n`` of ``work_id``: a header naming both, then
    pseudo-random (incompressible) bytes derived from them, ``size`` bytes in all."""
    header = f"{work_id}:{n}:".encode().ljust(HEADER_SIZE, b".")
    body = hashlib.shake_256(header).digest(max(size - HEADER_SIZE, 0))
    return header + body


def payload_n(work_id: str, state: bytes | None) -> int | None:
    """The n a checkpoint written by :func:`payload` claims to be (None if it names none)."""
    if state is None:
        return None
    prefix = f"{work_id}:".encode()
    if not state.startswith(prefix):
        return None
    digits = state[len(prefix) :].split(b":", 1)[0]
    return int(digits) if digits.isdigit() else None


def error_fields(exc: BaseException) -> dict[str, Any]:
    fields: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)[:300]}
    if isinstance(exc, BackendError):
        fields["transient"] = exc.transient
    return fields


def connect(dsn: str) -> worklease.PostgresBackend:
    backend = worklease.PostgresBackend.connect(dsn, min_size=1, max_size=8)
    backend.open()
    backend.pool.wait(timeout=30.0)
    return backend


# -- stream ---------------------------------------------------------------------------------


def stream(args: argparse.Namespace) -> int:
    backend = connect(args.dsn)
    lease = worklease.Lease(backend, holder_id=args.holder, ttl=args.ttl)
    stop = threading.Event()
    work_ids = [w for w in args.work_ids.split(",") if w]

    def run(work_id: str) -> None:
        token = lease.acquire(work_id, wait=True, timeout=60.0, poll_interval=0.05)
        prior = lease.read_checkpoint(token)
        emit(
            event="acquired",
            work_id=work_id,
            token=token.fencing_token,
            expires_at=token.expires_at.isoformat(),
            prev_exit=str(prior.prev_exit),
            t=time.monotonic(),
        )
        n = 0
        with lease.renewal(token, interval=args.interval) as renewal:
            while not stop.is_set():
                if renewal.lost:
                    break
                n += 1
                try:
                    lease.checkpoint(token, payload(work_id, n, args.size))
                except LeaseLostError as exc:
                    emit(event="rejected", work_id=work_id, n=n, **error_fields(exc))
                    break
                except Exception as exc:
                    emit(event="write_failed", work_id=work_id, n=n, t=time.monotonic(),
                         **error_fields(exc))  # fmt: skip
                else:
                    emit(ack=n, token=token.fencing_token, work_id=work_id, t=time.monotonic())
                stop.wait(args.gap)
            if renewal.cause is not None:
                return  # leaving the block raises the cause: reported by guarded()
            try:
                lease.release(token, ExitMode.FINISHED)
            except Exception as exc:
                emit(event="release_failed", work_id=work_id, **error_fields(exc))
                return
        emit(event="released", work_id=work_id, last=n)

    def guarded(work_id: str) -> None:
        try:
            run(work_id)
        except LeaseLostError as exc:  # the renewal's exit raises the loss
            emit(event="loss", work_id=work_id, cause=type(exc).__name__)
        except Exception as exc:
            emit(event="crashed", work_id=work_id, **error_fields(exc))
            logging.exception("stream %s failed", work_id)

    threads = [
        threading.Thread(target=guarded, args=(w,), name=f"stream-{w}", daemon=True)
        for w in work_ids
    ]
    for thread in threads:
        thread.start()
    emit(event="started", pid_t=time.monotonic())
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    stop.set()
    for thread in threads:
        thread.join(timeout=30.0)
    backend.close()
    emit(event="stopped")
    return 0


# -- zombie ---------------------------------------------------------------------------------


def zombie(args: argparse.Namespace) -> int:
    backend = connect(args.dsn)
    sessions: dict[str, threading.Event] = {}
    threads: list[threading.Thread] = []

    def session(work_id: str, ttl: float, release: threading.Event) -> None:
        lease = worklease.Lease(backend, holder_id=args.holder, ttl=ttl)
        try:
            token = lease.acquire(work_id)
        except Exception as exc:
            emit(event="acquire_failed", work_id=work_id, **error_fields(exc))
            return
        emit(
            event="acquired",
            work_id=work_id,
            token=token.fencing_token,
            expires_at=token.expires_at.isoformat(),
            t=time.monotonic(),
        )
        try:
            with lease.renewal(token) as renewal:
                hold_session(lease, token, renewal, release)
        except LeaseLostError as exc:
            emit(event="exit", work_id=work_id, error=type(exc).__name__)
        except Exception as exc:
            emit(event="exit", work_id=work_id, **error_fields(exc))
            logging.exception("zombie session %s failed", work_id)
        else:
            emit(event="exit", work_id=work_id, error=None)

    def hold_session(
        lease: worklease.Lease, token: Token, renewal: worklease.Renewal, release: threading.Event
    ) -> None:
        work_id = token.work_id
        n = 0

        def write() -> BaseException | None:
            nonlocal n
            n += 1
            start = time.monotonic()
            state = f"zombie:{work_id}:{n}".encode()
            try:
                if args.transactional:  # the step's own row and its checkpoint, together
                    with lease.transaction(token) as tx:
                        tx.connection.execute(
                            b"INSERT INTO worklease_test_steps (work_id, token, n) "
                            b"VALUES (%s, %s, %s)",
                            (work_id, token.fencing_token, n),
                        )
                        tx.checkpoint(state)
                else:
                    lease.checkpoint(token, state)
            except Exception as exc:
                return exc
            emit(ack=n, token=token.fencing_token, work_id=work_id, t0=start, t=time.monotonic())
            return None

        while True:
            if release.is_set():
                left = renewal.remaining()  # the window the release is bounded by
                began = time.monotonic()
                try:
                    lease.release(token, ExitMode.FINISHED)
                except Exception as exc:
                    emit(
                        event="release_failed",
                        work_id=work_id,
                        left=left,
                        elapsed=time.monotonic() - began,
                        **error_fields(exc),
                    )
                else:
                    emit(event="released", work_id=work_id, last=n)
                return
            error = write()
            if error is not None:
                break
            time.sleep(args.gap)
        # The first rejected write: from here on, every write must be rejected.
        emit(event="rejected", work_id=work_id, n=n, t=time.monotonic(), **error_fields(error))
        if not isinstance(error, LeaseLostError):
            return
        deadline = time.monotonic() + 10.0
        after_report = 0
        while after_report < 3 and time.monotonic() < deadline:
            time.sleep(args.gap)
            reported = renewal.lost
            error = write()
            if error is None:
                emit(event="accepted_after_rejection", work_id=work_id, n=n)
            else:
                emit(event="rejected", work_id=work_id, n=n, t=time.monotonic(),
                     **error_fields(error))  # fmt: skip
            if reported:
                after_report += 1
        cause = renewal.cause
        emit(
            event="loss",
            work_id=work_id,
            cause=None if cause is None else type(cause).__name__,
            t=time.monotonic(),
        )

    emit(event="ready")
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        if command["cmd"] == "quit":
            break
        if command["cmd"] == "hold":
            release = threading.Event()
            sessions[command["work_id"]] = release
            thread = threading.Thread(
                target=session,
                args=(command["work_id"], float(command["ttl"]), release),
                name=f"zombie-{command['work_id']}",
                daemon=True,
            )
            threads.append(thread)
            thread.start()
        elif command["cmd"] == "release":
            sessions[command["work_id"]].set()
    for release in sessions.values():
        release.set()
    for thread in threads:
        thread.join(timeout=10.0)
    backend.close()
    emit(event="stopped")
    return 0


# -- contend --------------------------------------------------------------------------------


def contend(args: argparse.Namespace) -> int:
    backend = connect(args.dsn)
    lease = worklease.Lease(backend, holder_id=args.holder, ttl=args.ttl)
    work_ids = [w for w in args.work_ids.split(",") if w]
    won: list[Token] = []
    emit(event="ready")
    if sys.stdin.readline().strip() != "go":
        backend.close()
        return 1
    for work_id in work_ids:
        try:
            token = lease.acquire(work_id)
        except LeaseHeldError as exc:
            emit(event="held", work_id=work_id, holder_id=exc.holder_id)
            continue
        except Exception as exc:
            emit(event="acquire_failed", work_id=work_id, **error_fields(exc))
            continue
        won.append(token)
        prior = lease.read_checkpoint(token)
        emit(
            event="won",
            work_id=work_id,
            token=token.fencing_token,
            prev_exit=str(prior.prev_exit),
            prev_holder_id=prior.prev_holder_id,
            state=None if prior.state is None else prior.state.decode(errors="replace"),
        )
    emit(event="done")
    sys.stdin.readline()  # "stop" or EOF
    for token in won:
        try:
            lease.release(token, ExitMode.FINISHED)
        except Exception as exc:
            emit(event="release_failed", work_id=token.work_id, **error_fields(exc))
    backend.close()
    emit(event="stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["stream", "zombie", "contend"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--holder", required=True)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--work-ids", default="")
    parser.add_argument("--gap", type=float, default=0.3, help="seconds between writes")
    parser.add_argument("--size", type=int, default=8192, help="checkpoint size (stream)")
    parser.add_argument("--interval", type=float, default=None, help="renewal interval")
    parser.add_argument(
        "--transactional",
        action="store_true",
        help="zombie: each write is a transactional step inserting into worklease_test_steps",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s {args.holder} %(threadName)s %(levelname)s %(message)s",
    )
    modes = {"stream": stream, "zombie": zombie, "contend": contend}
    return modes[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
