"""Server-side connection faults: ``pg_terminate_backend`` and low role timeouts.

* The connection of a checkpoint is terminated while the statement waits on a row lock held
  by another session: the call raises a transient ``BackendError``, nothing is half-written,
  and the next checkpoint succeeds.
* Ten renewal attempts in a row are terminated the same way, each on a fresh connection: the
  lease is kept with the same token (the window allows it), and the observer saw ten transient
  ``BackendError`` events followed by a success.
* A role with a 250 ms ``statement_timeout`` and a 50 ms ``idle_in_transaction_session_timeout``:
  every lease operation still works; a statement held up by a row lock past the timeout fails
  with a transient ``BackendError`` (``QueryCanceled``), with nothing written.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests import pg
from tests.faults import audit
from worklease import (
    AsyncLease,
    AsyncPostgresBackend,
    BackendError,
    Backoff,
    Checkpoint,
    ExitMode,
    Lease,
    LeaseHeldError,
    PostgresBackend,
    Token,
    Vacuum,
)
from worklease._compat import sleep
from worklease.observers import CheckpointEvent, RenewEvent
from worklease.testing import RecordingObserver

pytestmark = [pytest.mark.postgres, pytest.mark.faults]

WAIT = 15.0
"""Upper bound of every wait in this module (seconds)."""


# -- helpers ------------------------------------------------------------------------------------


def lease_row(dsn: str, work_id: str) -> tuple[Any, ...]:
    rows = pg.execute(
        dsn,
        "SELECT holder_id, fencing_token, checkpoint, expires_at, updated_at, exit_mode"
        " FROM worklease_leases WHERE work_id = %s",
        (work_id,),
    )
    assert len(rows) == 1, rows
    holder, token, state, expires_at, updated_at, exit_mode = rows[0]
    return (
        holder,
        token,
        bytes(state) if state is not None else None,
        expires_at,
        updated_at,
        exit_mode,
    )


class RowLock:
    """Another session holding ``FOR UPDATE`` on a lease row, so writes to it must wait."""

    def __init__(self, dsn: str, work_id: str) -> None:
        self.conn = psycopg.connect(dsn)
        self.pid = self.conn.info.backend_pid
        rows = self.conn.execute(
            "SELECT 1 FROM worklease_leases WHERE work_id = %s FOR UPDATE", (work_id,)
        ).fetchall()
        assert rows, f"no row to lock for {work_id!r}"

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


def waiting_on_lock(dsn: str, exclude: set[int]) -> int | None:
    rows = pg.execute(
        dsn,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND NOT (pid = ANY(%s))",
        (sorted(exclude),),
    )
    return int(rows[0][0]) if rows else None


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        sleep(0.01)


def terminate(dsn: str, pid: int) -> None:
    (done,) = pg.execute(dsn, "SELECT pg_terminate_backend(%s)", (pid,))[0]
    assert done, f"pg_terminate_backend({pid}) found no such backend"


def assert_transient_driver_error(error: BaseException | None) -> None:
    assert isinstance(error, BackendError), repr(error)
    assert error.transient, repr(error)
    assert isinstance(error.__cause__, psycopg.OperationalError), repr(error.__cause__)


def checkpoint_md5s(dsn: str, work_id: str) -> list[str | None]:
    return [row.checkpoint_md5 for row in audit.rows(dsn, work_id) if row.op == "UPDATE"]


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


# -- pg_terminate_backend on a checkpoint ---------------------------------------------------------


def test_terminated_checkpoint_is_transient_and_writes_nothing(cluster_dsn: str) -> None:
    audit.install(cluster_dsn)
    observer = RecordingObserver()
    with PostgresBackend.connect(cluster_dsn, min_size=2, max_size=4) as backend:
        lease = Lease(backend, holder_id="holder-a", ttl=60.0, observer=observer)
        token = lease.acquire("cp")
        lease.checkpoint(token, b"v1")
        before = lease_row(cluster_dsn, "cp")

        outcome: list[BaseException | None] = []

        def write() -> None:
            try:
                lease.checkpoint(token, b"v2" * 1000)
            except BaseException as exc:
                outcome.append(exc)
            else:
                outcome.append(None)

        lock = RowLock(cluster_dsn, "cp")
        writer = threading.Thread(target=write, daemon=True)
        try:
            writer.start()
            pid = wait_for(
                lambda: waiting_on_lock(cluster_dsn, {lock.pid}), "the checkpoint to wait"
            )
            terminate(cluster_dsn, pid)
            writer.join(WAIT)
            assert not writer.is_alive(), "the checkpoint hung after its connection was killed"
        finally:
            lock.release()
            writer.join(WAIT)

        assert len(outcome) == 1
        assert_transient_driver_error(outcome[0])
        assert lease_row(cluster_dsn, "cp") == before  # state, expiry, updated_at untouched
        failed = observer.of_type(CheckpointEvent)[-1]
        assert failed.error is outcome[0]

        lease.checkpoint(token, b"v3")  # the next checkpoint succeeds (on a live connection)
        assert lease_row(cluster_dsn, "cp")[2] == b"v3"
        lease.release(token, ExitMode.FINISHED)
        successor = Lease(backend, holder_id="holder-b", ttl=60.0)
        prior = successor.read_checkpoint(successor.acquire("cp"))
    assert prior == Checkpoint(b"v3", ExitMode.FINISHED, "holder-a")
    assert md5(b"v2" * 1000) not in checkpoint_md5s(cluster_dsn, "cp")
    assert audit.stale_writes(cluster_dsn) == 0


async def test_terminated_checkpoint_is_transient_and_writes_nothing_async(
    cluster_dsn: str,
) -> None:
    audit.install(cluster_dsn)
    async with AsyncPostgresBackend.connect(cluster_dsn, min_size=2, max_size=4) as backend:
        lease = AsyncLease(backend, holder_id="holder-a", ttl=60.0)
        token = await lease.acquire("cp")
        await lease.checkpoint(token, b"v1")
        before = lease_row(cluster_dsn, "cp")
        lock = RowLock(cluster_dsn, "cp")
        try:
            task = asyncio.ensure_future(lease.checkpoint(token, b"v2"))
            deadline = time.monotonic() + WAIT
            while (pid := waiting_on_lock(cluster_dsn, {lock.pid})) is None:
                assert time.monotonic() < deadline, "the checkpoint never waited on the lock"
                await asyncio.sleep(0.01)
            terminate(cluster_dsn, pid)
            done, _ = await asyncio.wait([task], timeout=WAIT)
            assert done, "the checkpoint hung after its connection was killed"
        finally:
            lock.release()
        assert_transient_driver_error(task.exception())
        assert lease_row(cluster_dsn, "cp") == before
        await lease.checkpoint(token, b"v3")
        assert lease_row(cluster_dsn, "cp")[2] == b"v3"
    assert md5(b"v2") not in checkpoint_md5s(cluster_dsn, "cp")
    assert audit.stale_writes(cluster_dsn) == 0


# -- pg_terminate_backend on ten renewals in a row ------------------------------------------------

RENEW_TTL = 10.0
TERMINATIONS = 10
FAST_RETRIES = Backoff(initial=0.05, maximum=0.2, jitter=0.0)


def renew_events(observer: RecordingObserver, token: Token) -> list[RenewEvent]:
    return [event for event in observer.of_type(RenewEvent) if event.token == token]


def check_ten_failures_then_success(events: list[RenewEvent]) -> None:
    """The renewal attempts after the lock: ten transient failures, then a success, in one
    retry cycle (attempts 1 … 11)."""
    failures = [event for event in events if event.error is not None]
    assert len(failures) == TERMINATIONS, [repr(e.error) for e in failures]
    for event in failures:
        assert_transient_driver_error(event.error)
    first = events.index(failures[0])
    cycle = events[first : first + TERMINATIONS + 1]
    assert [event.attempt for event in cycle] == list(range(1, TERMINATIONS + 2))
    assert [event.error is None for event in cycle] == [False] * TERMINATIONS + [True]


def test_ten_terminated_renewals_in_a_row_keep_the_lease(cluster_dsn: str) -> None:
    audit.install(cluster_dsn)
    observer = RecordingObserver()
    with PostgresBackend.connect(cluster_dsn, min_size=1, max_size=4) as backend:
        lease = Lease(backend, holder_id="holder-a", ttl=RENEW_TTL, observer=observer)
        token = lease.acquire("renewed")
        with lease.renewal(token, interval=0.2, backoff=FAST_RETRIES) as renewal:
            wait_for(lambda: renew_events(observer, token), "a first renewal")
            assert renew_events(observer, token)[0].error is None
            lock = RowLock(cluster_dsn, "renewed")
            killed: set[int] = set()
            try:
                for _ in range(TERMINATIONS):
                    pid = wait_for(
                        lambda: waiting_on_lock(cluster_dsn, killed | {lock.pid}),
                        "a renewal attempt on a new connection",
                    )
                    terminate(cluster_dsn, pid)
                    killed.add(pid)
                    renewal.raise_if_lost()
                    left = renewal.remaining()
                    assert left is not None
                    assert 0 < left <= RENEW_TTL
            finally:
                lock.release()
            count = len(renew_events(observer, token))
            wait_for(
                lambda: any(e.error is None for e in renew_events(observer, token)[count - 1 :]),
                "a renewal after the terminations",
            )
            renewal.raise_if_lost()
            left = renewal.remaining()
            assert left is not None
            assert left > RENEW_TTL / 2
        assert not renewal.lost
        assert len(killed) == TERMINATIONS  # every attempt ran on a fresh connection
        with pytest.raises(LeaseHeldError):
            Lease(backend, holder_id="holder-b", ttl=RENEW_TTL).acquire("renewed")
        assert lease_row(cluster_dsn, "renewed")[:2] == ("holder-a", token.fencing_token)
        lease.release(token, ExitMode.FINISHED)
    check_ten_failures_then_success(renew_events(observer, token))
    assert audit.stale_writes(cluster_dsn) == 0


async def test_ten_terminated_renewals_in_a_row_keep_the_lease_async(cluster_dsn: str) -> None:
    observer = RecordingObserver()
    async with AsyncPostgresBackend.connect(cluster_dsn, min_size=1, max_size=4) as backend:
        lease = AsyncLease(backend, holder_id="holder-a", ttl=RENEW_TTL, observer=observer)
        token = await lease.acquire("renewed")

        async def until(condition: Callable[[], Any], what: str) -> Any:
            deadline = time.monotonic() + WAIT
            while not (value := condition()):
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                await asyncio.sleep(0.01)
            return value

        async with lease.renewal(token, interval=0.2, backoff=FAST_RETRIES) as renewal:
            await until(lambda: renew_events(observer, token), "a first renewal")
            lock = RowLock(cluster_dsn, "renewed")
            killed: set[int] = set()
            try:
                for _ in range(TERMINATIONS):
                    pid = await until(
                        lambda: waiting_on_lock(cluster_dsn, killed | {lock.pid}),
                        "a renewal attempt on a new connection",
                    )
                    terminate(cluster_dsn, pid)
                    killed.add(pid)
                    assert (renewal.remaining() or 0) > 0
            finally:
                lock.release()
            count = len(renew_events(observer, token))
            await until(
                lambda: any(e.error is None for e in renew_events(observer, token)[count - 1 :]),
                "a renewal after the terminations",
            )
            assert (renewal.remaining() or 0) > RENEW_TTL / 2
        assert not renewal.lost
        assert len(killed) == TERMINATIONS
        assert lease_row(cluster_dsn, "renewed")[:2] == ("holder-a", token.fencing_token)
        await lease.release(token, ExitMode.FINISHED)
    check_ten_failures_then_success(renew_events(observer, token))


# -- role-level statement_timeout and idle_in_transaction_session_timeout -------------------------


@pytest.fixture
def timeout_role_dsn(cluster_dsn: str) -> str:
    """A LOGIN role with a 250 ms statement timeout and a 50 ms idle-in-transaction timeout
    (set on the role). The statement timeout is five times the idle one: a loaded machine ran
    an ordinary acquire past 50 ms once, and what is tested is that the role's timeout cancels
    a blocked statement (held by a row lock for seconds) and never a renewal."""
    audit.install(cluster_dsn)
    role = f"wl_timeouts_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(role)
    with psycopg.connect(cluster_dsn, autocommit=True) as conn:
        for statement in (
            sql.SQL("CREATE ROLE {} LOGIN").format(ident),
            sql.SQL(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON worklease_leases, worklease_audit TO {}"
            ).format(ident),
            sql.SQL(
                "GRANT USAGE ON SEQUENCE worklease_fencing_seq, worklease_audit_id_seq TO {}"
            ).format(ident),
            sql.SQL("ALTER ROLE {} SET statement_timeout = '250ms'").format(ident),
            sql.SQL("ALTER ROLE {} SET idle_in_transaction_session_timeout = '50ms'").format(ident),
        ):
            conn.execute(statement)
    return make_conninfo(cluster_dsn, user=role)


def test_role_timeouts_are_in_force(timeout_role_dsn: str) -> None:
    """The role settings bite: a session left idle in a transaction is killed."""
    with psycopg.connect(timeout_role_dsn) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("250ms",)
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("50ms",)
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(0.5)")
        conn.rollback()
        conn.execute("SELECT 1")  # opens a transaction, then idles in it
        sleep(0.3)
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            conn.execute("SELECT 1")


def test_every_operation_works_under_role_timeouts(timeout_role_dsn: str) -> None:
    observer = RecordingObserver()
    idle = 0.15  # longer than the 50 ms idle-in-transaction timeout
    with PostgresBackend.connect(timeout_role_dsn, min_size=2, max_size=4) as backend:
        lease = Lease(backend, holder_id="holder-a", ttl=5.0, observer=observer)
        token = lease.acquire("short")
        sleep(idle)
        assert lease.read_checkpoint(token) == Checkpoint(None, ExitMode.NONE, None)
        sleep(idle)
        lease.checkpoint(token, b"x" * 65536)
        sleep(idle)
        lease.renew(token)
        with lease.renewal(token, interval=0.05) as renewal:
            sleep(1.0)  # ~20 renewals on the renewal pool's connections
            renewal.raise_if_lost()
        assert sum(1 for e in observer.of_type(RenewEvent) if e.error is None) >= 5
        sleep(idle)
        lease.release(token, ExitMode.ABANDONED)
        other = Lease(backend, holder_id="holder-b", ttl=5.0, observer=observer)
        with other.hold("short", wait=True, timeout=5.0, interval=0.05) as hold:
            assert hold.prior == Checkpoint(b"x" * 65536, ExitMode.ABANDONED, "holder-a")
            sleep(idle)
            hold.checkpoint(b"y")
        retired = other.acquire("short")
        other.release(retired, ExitMode.RETIRED)
        sleep(idle)
        assert Vacuum(backend).sweep(0.001) == 1
        again = lease.acquire("short")
        lease.forget(again)
    # A renewal attempt that failed transiently is retried by its loop (the lease was not
    # lost: raise_if_lost above); nothing else may fail.
    errors = [
        event
        for event in observer.events
        if getattr(event, "error", None) is not None
        and not (
            isinstance(event, RenewEvent)
            and isinstance(event.error, BackendError)
            and event.error.transient
        )
    ]
    assert errors == []
    assert pg.execute(timeout_role_dsn, "SELECT count(*) FROM worklease_leases") == [(0,)]
    assert audit.stale_writes(timeout_role_dsn) == 0


def test_statement_held_past_role_timeout_is_cancelled_transiently(
    timeout_role_dsn: str, cluster_dsn: str
) -> None:
    with PostgresBackend.connect(timeout_role_dsn, min_size=1, max_size=4) as backend:
        lease = Lease(backend, holder_id="holder-a", ttl=30.0)
        token = lease.acquire("slowed")
        lease.checkpoint(token, b"before")
        before = lease_row(cluster_dsn, "slowed")
        lock = RowLock(cluster_dsn, "slowed")  # the superuser session is not time-limited
        try:
            attempts: list[tuple[str, Callable[[], object]]] = [
                ("checkpoint", lambda: lease.checkpoint(token, b"during")),
                ("release", lambda: lease.release(token, ExitMode.FINISHED)),
                ("acquire", lambda: Lease(backend, holder_id="b", ttl=30.0).acquire("slowed")),
            ]
            for name, attempt in attempts:
                started = time.monotonic()
                with pytest.raises(BackendError) as caught:
                    attempt()
                elapsed = time.monotonic() - started
                assert elapsed < 5.0, f"{name} took {elapsed:.2f}s"
                assert caught.value.transient, name
                assert isinstance(caught.value.__cause__, psycopg.errors.QueryCanceled), name
            # A renewal statement is bounded by one TTL instead (set per statement), so a
            # lock held longer than the role's 250 ms does not fail it.
            renewing = threading.Thread(target=lease.renew, args=(token,), daemon=True)
            renewing.start()
            sleep(0.3)
            assert renewing.is_alive()
        finally:
            lock.release()
        renewing.join(WAIT)
        assert not renewing.is_alive()
        after = lease_row(cluster_dsn, "slowed")
        assert after[:3] == before[:3]  # holder, token, state: nothing written meanwhile
        assert after[5] is None  # not released
        lease.checkpoint(token, b"after")  # works again once the lock is gone
        assert lease_row(cluster_dsn, "slowed")[2] == b"after"
    assert audit.stale_writes(cluster_dsn) == 0


async def test_statement_held_past_role_timeout_is_cancelled_transiently_async(
    timeout_role_dsn: str, cluster_dsn: str
) -> None:
    async with AsyncPostgresBackend.connect(timeout_role_dsn, min_size=1, max_size=4) as backend:
        lease = AsyncLease(backend, holder_id="holder-a", ttl=30.0)
        token = await lease.acquire("slowed")
        await asyncio.sleep(0.15)
        await lease.checkpoint(token, b"before")
        lock = RowLock(cluster_dsn, "slowed")
        try:
            with pytest.raises(BackendError) as caught:
                await asyncio.wait_for(lease.checkpoint(token, b"during"), WAIT)
        finally:
            lock.release()
        assert caught.value.transient
        assert isinstance(caught.value.__cause__, psycopg.errors.QueryCanceled)
        assert lease_row(cluster_dsn, "slowed")[2] == b"before"
        await lease.checkpoint(token, b"after")
        async with lease.renewal(token, interval=0.05) as renewal:
            await asyncio.sleep(0.5)
            renewal.raise_if_lost()
        await lease.release(token, ExitMode.FINISHED)
    assert lease_row(cluster_dsn, "slowed")[2] == b"after"
