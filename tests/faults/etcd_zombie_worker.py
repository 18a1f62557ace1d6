"""A lease holder on etcd in its own OS process, for tests/faults/test_etcd_faults.py.

    python tests/faults/etcd_zombie_worker.py ENDPOINTS PREFIX WORK_ID TTL

Acquires ``WORK_ID`` (no waiting), renews it in the background and writes the checkpoints
``zombie:N`` for N = 1, 2, ... continuously; after each write that returned it prints
``{"ack": N, "token": T}``, after each refused one ``{"refused": N, "error": ...}``. After the
first refusal it tries three more writes (each must be refused too), prints ``{"done": ...}``
with the renewal's cause and exits. Every line is one JSON object, flushed at once.
"""

from __future__ import annotations

import json
import sys
import time

import worklease
from worklease.errors import BackendError, LeaseLostError


def emit(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> int:
    endpoints, prefix, work_id, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    backend = worklease.EtcdBackend(endpoints, prefix=prefix, timeout=1.0)
    lease = worklease.Lease(backend, holder_id="zombie", ttl=ttl)
    token = lease.acquire(work_id)
    emit(acquired=token.fencing_token, t=time.monotonic())
    refused = 0
    n = 0
    with lease.renewal(token) as renewal:
        while refused < 4:
            n += 1
            try:
                lease.checkpoint(token, f"zombie:{n}".encode())
            except LeaseLostError as exc:
                refused += 1
                emit(refused=n, error=type(exc).__name__, t=time.monotonic())
                continue
            except BackendError as exc:  # etcd unreachable for a moment: not a refusal
                emit(failed=n, error=str(exc)[:200], t=time.monotonic())
                time.sleep(0.05)
                continue
            if refused:
                emit(stale_ack=n, token=token.fencing_token, t=time.monotonic())
            else:
                emit(ack=n, token=token.fencing_token, t=time.monotonic())
            time.sleep(0.02)
        cause = renewal.cause
    emit(done=True, cause=type(cause).__name__ if cause else None)
    backend.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LeaseLostError as exc:  # leaving the renewal block re-raises the loss
        emit(done=True, cause=type(exc).__name__)
        sys.exit(0)
