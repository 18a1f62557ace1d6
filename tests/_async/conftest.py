"""Fixtures shared by the tests in this directory."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from psycopg_pool import AsyncConnectionPool

from tests import pg
from worklease import (
    AsyncBackend,
    AsyncEtcdBackend,
    AsyncMemoryBackend,
    AsyncPostgresBackend,
    AsyncRedisBackend,
)
from worklease._aredis import ClusterClient, RedisClient

REDIS_CLUSTER_MATRIX = os.environ.get("WORKLEASE_TEST_REDIS_CLUSTER", "") == "matrix"
"""Whether every backend-parametrized test runs on a Redis Cluster too (``nox -s redis``);
otherwise the Cluster runs the conformance suite and its own cases (tests/_async/test_redis.py)
and the rest of the matrix runs on standalone Redis, to keep CI's time."""

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    # PostgreSQL as often deployed: behind PgBouncer in transaction mode, default settings
    # (the release listener finds it cannot work there and waits poll)
    pytest.param("pgbouncer", id="pgbouncer", marks=[pytest.mark.postgres, pytest.mark.pgbouncer]),
    pytest.param("etcd", id="etcd", marks=pytest.mark.etcd),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
    *(
        [pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.redis)]
        if REDIS_CLUSTER_MATRIX
        else []
    ),
]
"""The backends the conformance suite runs against (one fresh, empty instance per test)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the cases of a module marked ``not_on(kind, ...)`` for those backend kinds
    (a capability the backend does not have, such as etcd's missing transactional steps)."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker("not_on")
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("backend") if callspec is not None else None
        (dropped if marker is not None and kind in marker.args else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[AsyncBackend]:
    """A fresh, empty backend of the kind named by the parameter."""
    kind = request.param
    if kind == "memory":
        async with AsyncMemoryBackend() as memory:
            yield memory
        return
    if kind == "postgres":
        dsn: str = request.getfixturevalue("postgres_dsn")
        pg.reset(dsn)  # an empty table; the token sequence keeps counting
        async with (
            AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False) as pool,
            AsyncPostgresBackend(pool) as postgres,
        ):
            yield postgres
        return
    if kind == "etcd":
        cluster = request.getfixturevalue("etcd_cluster")
        prefix = f"test-{uuid.uuid4().hex[:12]}/"
        async with AsyncEtcdBackend(cluster.endpoints, prefix=prefix) as backend:
            yield backend
        return
    if kind in ("redis", "redis-cluster"):
        async with redis_backend(request, cluster=kind == "redis-cluster") as backend:
            yield backend
        return
    if kind == "pgbouncer":
        direct: str = request.getfixturevalue("postgres_dsn")
        routed: str = request.getfixturevalue("pgbouncer_dsn")
        pg.reset(direct)
        # A test of instant handoff gets the documented remedy: a listener route past the
        # pooler; the rest run with default settings (the listener falls back to polling).
        needs_reports = request.node.get_closest_marker("needs_release_reports") is not None
        async with (
            AsyncConnectionPool(
                routed,
                min_size=1,
                max_size=4,
                open=False,
                # psycopg's defaults, as a team already running PgBouncer has them: worklease
                # sees the pooler and sends its statements unprepared (ADR-0015)
            ) as pool,
            AsyncPostgresBackend(pool, listen_dsn=direct if needs_reports else None) as postgres,
        ):
            yield postgres
        return
    raise ValueError("unknown backend kind: " + repr(kind))


@asynccontextmanager
async def redis_backend(
    request: pytest.FixtureRequest, *, cluster: bool
) -> AsyncIterator[AsyncRedisBackend]:
    """A Redis backend under a fresh prefix on this run's standalone server or Cluster, its
    client closed afterwards."""
    client: RedisClient | ClusterClient
    if cluster:
        client = ClusterClient.from_url(request.getfixturevalue("redis_cluster").url)
    else:
        client = RedisClient.from_url(request.getfixturevalue("redis_server").url)
    try:
        async with AsyncRedisBackend(client, prefix=f"test-{uuid.uuid4().hex[:12]}:") as backend:
            yield backend
    finally:
        await client.aclose()
