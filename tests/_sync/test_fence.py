# Generated from tests/_async/test_fence.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""``worklease_fence(work_id, token)``: the guard for a user's own statements outside
``lease.transaction()`` (issue 14). The user's statements use plain psycopg, as theirs would."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from tests import pg
from tests._acompat import sleep
from worklease import ExitMode, Lease, PostgresBackend

pytestmark = pytest.mark.postgres

INSERT = (
    b"INSERT INTO worklease_test_fenced (work_id, fencing_token) "
    b"SELECT %(w)s, %(t)s WHERE worklease_fence(%(w)s, %(t)s)"
)


@pytest.fixture
def fenced_table(postgres_dsn: str) -> str:
    pg.reset(postgres_dsn)
    pg.execute(
        postgres_dsn,
        "CREATE TABLE IF NOT EXISTS worklease_test_fenced (work_id TEXT, fencing_token BIGINT)",
    )
    pg.execute(postgres_dsn, "TRUNCATE worklease_test_fenced")
    return postgres_dsn


def guarded_insert(dsn: str, work_id: str, token: int) -> int:
    with psycopg.connect(dsn) as conn:  # a transaction of the user's own
        inserted = conn.execute(INSERT, {"w": work_id, "t": token}).rowcount
        conn.commit()
    return inserted


def open_backend(dsn: str) -> PostgresBackend:
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=4, open=False)
    pool.open()
    return PostgresBackend(pool, listen=False)


def test_the_fence_lets_only_the_current_unlapsed_token_write(fenced_table: str) -> None:
    backend = open_backend(fenced_table)
    try:
        lease = Lease(backend, holder_id="worker", ttl=30)
        token = lease.acquire("job")
        assert guarded_insert(fenced_table, "job", token.fencing_token) == 1
        assert guarded_insert(fenced_table, "job", token.fencing_token + 1) == 0  # not issued
        assert guarded_insert(fenced_table, "other", token.fencing_token) == 0  # no such lease
        lease.release(token, ExitMode.FINISHED)
        assert guarded_insert(fenced_table, "job", token.fencing_token) == 0  # released
        short = Lease(backend, holder_id="worker", ttl=0.3)
        lapsing = short.acquire("job")
        sleep(0.5)
        assert guarded_insert(fenced_table, "job", lapsing.fencing_token) == 0  # lapsed
        rows = pg.execute(fenced_table, "SELECT fencing_token FROM worklease_test_fenced")
        assert rows == [(token.fencing_token,)]
    finally:
        backend.close()
        backend.pool.close()


def test_a_successor_is_granted_only_after_the_fenced_transaction_ends(
    fenced_table: str,
) -> None:
    backend = open_backend(fenced_table)
    try:
        lease = Lease(backend, holder_id="worker", ttl=1.0)
        successor = Lease(backend, holder_id="successor", ttl=30)
        token = lease.acquire("job")
        committed: list[float] = []
        fenced = threading.Event()

        def user_transaction() -> None:
            with psycopg.connect(fenced_table) as conn:
                conn.execute(INSERT, {"w": "job", "t": token.fencing_token})
                fenced.set()
                time.sleep(1.5)  # the lease lapses while the transaction is still open
                conn.commit()
                committed.append(time.monotonic())

        user = threading.Thread(target=user_transaction)
        user.start()
        try:
            while not fenced.is_set():
                sleep(0.01)
            sleep(1.1)  # lapsed by now; the takeover has to wait for the lock
            taken = successor.acquire("job", wait=True, timeout=10)
            granted = time.monotonic()
        finally:
            user.join(10)
        assert committed
        assert granted >= committed[0]
        assert taken.fencing_token > token.fencing_token
        rows = pg.execute(fenced_table, "SELECT fencing_token FROM worklease_test_fenced")
        assert rows == [(token.fencing_token,)]  # written under the token that was current
    finally:
        backend.close()
        backend.pool.close()
