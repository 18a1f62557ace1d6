"""Celery: a task that runs at most once at a time per key and resumes from its checkpoint.

Celery may deliver a task twice (acks_late, a worker lost mid-task, a retry racing a slow
first run) and several workers run tasks at once. The task takes a lease on its key first:
while one run holds it, another run of the same key does not start (here it reports the
holder; in production ``self.retry(countdown=...)`` reschedules it). The run checkpoints after
every step; a run that fails releases the lease ABANDONED, and the next run resumes after the
last checkpoint instead of from the start.

Each worker process builds its own pool and lease on first use (connections must not cross
a fork: Celery's prefork workers fork after import).

    python examples/recipes/celery_task_per_key.py --dsn "host=... dbname=... user=..."

(the DSN also comes from ``WORKLEASE_DSN``). As a script it runs the tasks eagerly in this
process (``task_always_eager``); a real worker runs the same task code. The schema must exist
(``worklease migrate``).
"""

# mypy: disable-error-code="untyped-decorator"
# (the framework is untyped)
from __future__ import annotations

import argparse
import os
import uuid

from celery import Celery
from psycopg_pool import ConnectionPool

import worklease

STEPS = 4
app = Celery("recipes", broker="memory://", backend="cache+memory://")
app.conf.task_always_eager = True  # the script only: a worker runs the task the same way

_per_process: dict[int, worklease.Lease] = {}


def lease() -> worklease.Lease:
    """This process's lease (built after the fork, on first use)."""
    pid = os.getpid()
    if pid not in _per_process:
        pool = ConnectionPool(
            os.environ.get("WORKLEASE_DSN", ""), min_size=1, max_size=4, open=True
        )
        _per_process[pid] = worklease.Lease(
            worklease.PostgresBackend(pool), holder_id=f"celery-{pid}", ttl=30
        )
    return _per_process[pid]


class StepFailed(Exception):
    pass


@app.task(bind=True)
def export_report(self: object, key: str, fail_at: int | None = None) -> str:
    try:
        held = lease().hold(f"export/{key}")
        with held:
            step = int(held.prior.state or b"0")
            print(f"{key}: previous exit {held.prior.prev_exit}; resuming after step {step}")
            while step < STEPS:
                step += 1
                if step == fail_at:
                    raise StepFailed(f"step {step} failed")
                print(f"{key}: step {step} done")
                held.checkpoint(str(step).encode())
        return f"{key}: all {STEPS} steps done"
    except worklease.LeaseHeldError as held_error:
        # In production: raise self.retry(countdown=5) to run again once the holder is done.
        return f"{key}: not started, held by {held_error.holder_id}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("WORKLEASE_DSN", ""))
    args = parser.parse_args()
    os.environ["WORKLEASE_DSN"] = args.dsn
    key = f"report-{uuid.uuid4().hex[:8]}"

    result = export_report.delay(key, fail_at=3)
    print(f"first run: {type(result.result).__name__}: {result.result}")

    # Another worker holds the key: a duplicate delivery does not start.
    other = worklease.Lease(lease().backend, holder_id="celery-other-worker", ttl=30)
    token = other.acquire(f"export/{key}")
    print(f"duplicate: {export_report.delay(key).get()}")
    other.release(token, worklease.ExitMode.ABANDONED)

    print(f"second run: {export_report.delay(key).get()}")


if __name__ == "__main__":
    main()
