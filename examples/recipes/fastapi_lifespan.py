"""FastAPI: a leader and a pool started and stopped with the application (``lifespan``).

One ``AsyncConnectionPool`` serves the routes and worklease. On startup the lifespan opens it,
starts a leader (one replica of the service runs the scheduler) and a pool (the replicas share
the tenants' sync work fairly), each as a task; on shutdown it stops both (the pool releases
its work IDs ABANDONED with their checkpoints, so another replica resumes at once) and closes
the pool. ``GET /status`` reports what this replica is doing.

    uvicorn examples.recipes.fastapi_lifespan:app     # with WORKLEASE_DSN set

Run as a script, it starts the app in-process with FastAPI's ``TestClient`` (which runs the
lifespan), asks ``/status`` until the leader is elected and every tenant synced once, and shuts
down. The schema must exist (``worklease migrate``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from psycopg_pool import AsyncConnectionPool

import worklease

RUN = os.environ.get("RECIPE_RUN_ID", uuid.uuid4().hex[:8])
TENANTS = [f"tenant-sync-{RUN}-{n}" for n in range(3)]
state: dict[str, Any] = {"leader": None, "synced": {}, "ticks": 0}


async def schedule(token: worklease.Token) -> None:
    """The leader's term: runs the scheduler until the leader stops (or the lease is lost:
    the renewal cancels the term)."""
    state["leader"] = token.fencing_token
    renewal = worklease.current_renewal()
    assert renewal is not None  # a leader's term runs inside its renewal
    leader: worklease.AsyncLeader = state["elector"]
    try:
        while not leader.stopping:
            state["ticks"] += 1  # fence downstream writes with token.fencing_token
            renewal.raise_if_lost()
            await asyncio.sleep(0.05)
    finally:
        state["leader"] = None


async def sync_tenant(token: worklease.Token, prior: worklease.Checkpoint) -> bytes:
    rounds = int(prior.state or b"0") + 1
    state["synced"][token.work_id] = rounds
    await asyncio.sleep(0.01)  # the tenant's sync work
    return str(rounds).encode()


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    pool = AsyncConnectionPool(
        os.environ.get("WORKLEASE_DSN", ""), min_size=1, max_size=8, open=False
    )
    await pool.open(wait=True)
    backend = worklease.AsyncPostgresBackend(pool)
    lease = worklease.AsyncLease(backend, holder_id=f"api-{os.getpid()}", ttl=10)
    leader = state["elector"] = worklease.AsyncLeader(lease, f"scheduler-{RUN}")
    tenants = worklease.AsyncPool(
        lease, TENANTS, sync_tenant, rerun_interval=0.05, idle_interval=0.05
    )
    tasks = [asyncio.create_task(leader.run_forever(schedule)), asyncio.create_task(tenants.run())]
    app.state.pool = pool
    try:
        yield
    finally:
        leader.stop()
        tenants.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await backend.close()
        await pool.close()


app = FastAPI(lifespan=lifespan)


@app.get("/status")
async def status() -> dict[str, Any]:
    async with app.state.pool.connection() as conn:  # the routes use the same pool
        await conn.execute("SELECT 1")
    return {"leader_token": state["leader"], "ticks": state["ticks"], "synced": state["synced"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("WORKLEASE_DSN", ""))
    args = parser.parse_args()
    os.environ["WORKLEASE_DSN"] = args.dsn
    from fastapi.testclient import TestClient

    with TestClient(app) as client:  # runs the lifespan: startup now, shutdown at the end
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            body = client.get("/status").json()
            if body["leader_token"] and len(body["synced"]) == len(TENANTS):
                break
            time.sleep(0.05)
        print(f"leader elected: {body['leader_token'] is not None}")
        print(f"tenants synced: {len(body['synced'])} of {len(TENANTS)}")
    print(f"after shutdown the leader stepped down: {state['leader'] is None}")


if __name__ == "__main__":
    main()
