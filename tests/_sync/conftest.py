# Generated from tests/_async/conftest.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Fixtures shared by the tests in this directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg_pool import ConnectionPool

from tests import pg
from worklease import Backend, MemoryBackend, PostgresBackend

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]
"""The backends the conformance suite runs against (one fresh, empty instance per test)."""


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """A fresh, empty backend of the kind named by the parameter."""
    kind = request.param
    if kind == "memory":
        with MemoryBackend() as memory:
            yield memory
        return
    if kind == "postgres":
        dsn: str = request.getfixturevalue("postgres_dsn")
        pg.reset(dsn)  # an empty table; the token sequence keeps counting
        with (
            ConnectionPool(dsn, min_size=1, max_size=4, open=False) as pool,
            PostgresBackend(pool) as postgres,
        ):
            yield postgres
        return
    raise ValueError("unknown backend kind: " + repr(kind))
