"""Worker functions for ``manage.py worklease_run`` in the tests."""

from __future__ import annotations

import json
import os
import sys
import time

from django.db import connection

import worklease
from worklease.contrib.django import closing_connections

STEPS = int(os.environ.get("WL_TEST_STEPS", "3"))
STEP_SECONDS = float(os.environ.get("WL_TEST_STEP_SECONDS", "0.05"))
HOLDER = os.environ.get("WL_TEST_HOLDER", "django-worker")


def say(text: str) -> None:
    print(text, flush=True)
    sys.stdout.flush()


def reports(backend: worklease.PostgresBackend) -> worklease.Pool:
    """A pool over WL_TEST_WORK_IDS: each report takes STEPS steps, checkpointed, and records
    each step through Django's own connection (this thread's)."""
    lease = worklease.Lease(backend, holder_id=HOLDER, ttl="5s")

    def work(token: worklease.Token, prior: worklease.Checkpoint) -> None:
        step = json.loads(prior.state)["step"] if prior.state else 0
        say(f"{token.work_id}: from step {step} (previous exit {prior.prev_exit})")
        renewal = worklease.current_renewal()
        assert renewal is not None
        while step < STEPS:
            time.sleep(STEP_SECONDS)
            renewal.raise_if_lost()
            step += 1
            with connection.cursor() as cursor:  # the ORM's connection works in here
                cursor.execute(
                    "INSERT INTO steps_done (work_id, step, holder) VALUES (%s, %s, %s)",
                    [token.work_id, step, HOLDER],
                )
            lease.checkpoint(token, json.dumps({"step": step}).encode())
        say(f"{token.work_id}: done")
        raise worklease.Retire

    work_ids = os.environ.get("WL_TEST_WORK_IDS", "report-1,report-2").split(",")
    return worklease.Pool(lease, work_ids, closing_connections(work), idle_interval=0.2)


def scheduler(backend: worklease.PostgresBackend) -> tuple[worklease.Leader, object]:
    leader = worklease.Leader(
        worklease.Lease(backend, holder_id=HOLDER, ttl="5s"), "scheduler", idle_interval=0.2
    )

    def term(token: worklease.Token) -> None:
        say(f"elected with token {token.fencing_token}")
        while not leader.stopping:
            time.sleep(0.05)

    return leader, term


def both(backend: worklease.PostgresBackend) -> list[object]:
    return [reports(backend), scheduler(backend)]


def dying(backend: worklease.PostgresBackend) -> list[object]:
    """A leader beside a pool whose only work ID fails for good: the pool ends."""
    lease = worklease.Lease(backend, holder_id=HOLDER, ttl="5s")

    def work(token: worklease.Token, prior: worklease.Checkpoint) -> None:
        raise worklease.permanent(RuntimeError("the report template is gone"))

    return [scheduler(backend), worklease.Pool(lease, ["doomed"], work, idle_interval=0.2)]


def wrong(backend: worklease.PostgresBackend) -> int:
    return 42
