"""Fixtures shared by the tests in this directory."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool

from tests import pg
from worklease import AsyncBackend, AsyncMemoryBackend, AsyncPostgresBackend

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    # PostgreSQL as often deployed: behind PgBouncer in transaction mode, default settings
    # (the release listener finds it cannot work there and waits poll)
    pytest.param("pgbouncer", id="pgbouncer", marks=[pytest.mark.postgres, pytest.mark.pgbouncer]),
]
"""The backends the conformance suite runs against (one fresh, empty instance per test)."""


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
                # the documented setting for the application's statements behind PgBouncer
                kwargs={"prepare_threshold": None},
            ) as pool,
            AsyncPostgresBackend(pool, listen_dsn=direct if needs_reports else None) as postgres,
        ):
            yield postgres
        return
    raise ValueError("unknown backend kind: " + repr(kind))
