# Generated from tests/_async/test_prepared.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""How statements reach the server (ADR-0011): prepared on READ COMMITTED connections, as
pinned simple queries elsewhere and with ``prepare=False``, and correct either way."""

from __future__ import annotations

from typing import Any

import pytest

from tests import pg
from tests._compat import spawn_all
from worklease import BackendError, ConfigError, ExitMode, Lease, LeaseHeldError

from .helpers import close_backend, open_backend

pytestmark = pytest.mark.postgres

REPEATABLE_READ = {"options": "-c default_transaction_isolation=repeatable\\ read"}


def prepared_statements(backend: Any) -> list[str]:
    """The statements prepared on the connections of the backend's pool."""
    found: list[str] = []
    for _ in range(4):  # every connection of the pool, whichever one is handed out
        with backend.pool.connection() as conn:
            cursor = conn.execute("SELECT statement FROM pg_prepared_statements")
            found += [row[0] for row in cursor.fetchall()]
    return found


def exercise(backend: Any, work_id: str) -> None:
    lease = Lease(backend, holder_id="h", ttl=30.0)
    token = lease.acquire(work_id)
    lease.checkpoint(token, b"state")
    assert (lease.read_checkpoint(token)).state == b"state"
    lease.renew(token)
    lease.release(token, ExitMode.FINISHED)


def test_statements_are_prepared_on_read_committed_connections(postgres_dsn: str) -> None:
    pg.reset(postgres_dsn)
    backend = open_backend(postgres_dsn)
    try:
        assert backend.prepare is None  # decided per connection: this one is direct
        exercise(backend, "prepared")
        prepared = prepared_statements(backend)
        assert any("worklease_leases" in text for text in prepared), prepared
    finally:
        close_backend(backend)


@pytest.mark.parametrize("how", ["prepare=False", "repeatable read by default"])
def test_other_connections_get_simple_queries(postgres_dsn: str, how: str) -> None:
    pg.reset(postgres_dsn)
    if how == "prepare=False":
        backend = open_backend(postgres_dsn, prepare=False)
    else:
        backend = open_backend(postgres_dsn, pool_kwargs=REPEATABLE_READ)
    try:
        exercise(backend, "simple")
        prepared = prepared_statements(backend)
        assert not any("worklease_leases" in text for text in prepared), prepared
    finally:
        close_backend(backend)


def test_contended_acquires_under_repeatable_read_never_fail_to_serialize(
    postgres_dsn: str,
) -> None:
    """The isolation is pinned per statement where the default is not READ COMMITTED: 16
    acquirers racing for one work ID get a grant or LeaseHeldError, never a serialization
    failure."""
    pg.reset(postgres_dsn)
    backend = open_backend(postgres_dsn, pool_kwargs=REPEATABLE_READ)
    try:

        def race(index: int) -> str:
            lease = Lease(backend, holder_id=f"h{index}", ttl=0.05)
            outcomes = []
            for _ in range(20):
                try:
                    lease.acquire("contended")
                    outcomes.append("granted")
                except LeaseHeldError:
                    outcomes.append("held")
            return ",".join(outcomes)

        results = spawn_all(race, 16)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors
        assert any("granted" in str(r) for r in results)
    finally:
        close_backend(backend)


def test_prepare_must_be_a_flag(postgres_dsn: str) -> None:
    with pytest.raises(ConfigError):
        open_backend(postgres_dsn, prepare="yes")


def test_a_cancelled_overrun_says_it_was_worklease(postgres_dsn: str) -> None:
    """A prepared statement still running at its bound is cancelled by worklease's watch,
    and the error says so (transient)."""
    from worklease._pg import single_statement
    from worklease._sync.postgres import run_statement

    backend = open_backend(postgres_dsn)
    try:
        statements = backend._statements
        sleeper = b"SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SELECT pg_sleep(5)"
        single = b"SELECT pg_sleep(5)"
        assert single_statement(statements.checkpoint) is not None
        with backend.pool.connection() as conn:
            with pytest.raises(BackendError) as caught:
                run_statement(conn, "sleep", sleeper, {}, 0.2, single)
        assert caught.value.transient
        assert "cancelled by worklease" in str(caught.value)
    finally:
        close_backend(backend)
