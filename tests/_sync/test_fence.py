# Generated from tests/_async/test_fence.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""``worklease_fence(work_id, token)``: the guard for a user's own statements outside
``lease.transaction()`` (issue 14). The user's statements use plain psycopg, as theirs would."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from tests import pg
from tests._compat import sleep
from worklease import ExitMode, Lease

from .helpers import close_backend, open_backend

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


def test_the_fence_lets_only_the_current_unlapsed_token_write(fenced_table: str) -> None:
    backend = open_backend(fenced_table, listen=False)
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
        close_backend(backend)


def test_a_successor_is_granted_only_after_the_fenced_transaction_ends(
    fenced_table: str,
) -> None:
    backend = open_backend(fenced_table, listen=False)
    try:
        lease = Lease(backend, holder_id="worker", ttl=2.0)
        successor = Lease(backend, holder_id="successor", ttl=30)
        token = lease.acquire("job")
        committing: list[float] = []
        fenced = threading.Event()

        def user_transaction() -> None:
            with psycopg.connect(fenced_table) as conn:
                inserted = conn.execute(INSERT, {"w": "job", "t": token.fencing_token})
                assert inserted.rowcount == 1
                fenced.set()
                time.sleep(3.0)  # the lease lapses while the transaction is still open
                committing.append(time.monotonic())  # before: the grant cannot come earlier
                conn.commit()

        user = threading.Thread(target=user_transaction)
        user.start()
        try:
            while not fenced.is_set():
                sleep(0.01)
            sleep(2.2)  # lapsed by now; the takeover has to wait for the lock
            asked = time.monotonic()
            taken = successor.acquire("job", wait=True, timeout=10)
            granted = time.monotonic()
        finally:
            user.join(10)
        assert committing
        assert asked < committing[0] <= granted  # it asked, then waited for the COMMIT
        assert taken.fencing_token > token.fencing_token
        rows = pg.execute(fenced_table, "SELECT fencing_token FROM worklease_test_fenced")
        assert rows == [(token.fencing_token,)]  # written under the token that was current
    finally:
        close_backend(backend)
