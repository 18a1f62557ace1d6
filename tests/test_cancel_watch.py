"""The cancel watch: a connection that has not answered by its moment is shut down (the
driver's wait ends at once), what it ran is cancelled on the server, and a call that ends in
time leaves its connection untouched and its descriptor closed; a cancel request nobody
answers never holds up the watch; an error on one call never ends the watch for the others;
a forked child never acts on its parent's calls."""

from __future__ import annotations

import os
import time

import psycopg
import pytest
from psycopg import errors as pg_errors

from worklease import _cancel_watch
from worklease._cancel_watch import watch_connection, watch_statement

from . import pg
from .proxy import proxied

needs_nonblocking_cancel = pytest.mark.skipif(
    not _cancel_watch.NONBLOCKING_CANCEL,
    reason="an older libpq's cancel request blocks the process while nobody answers",
)


def test_a_call_that_ends_in_time_is_left_alone(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[int] = []
    real_close = os.close

    def recording_close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        ticket = watch_connection(conn, 5.0)
        duplicate = ticket._socket
        assert duplicate is not None
        assert duplicate != conn.pgconn.socket
        monkeypatch.setattr(os, "close", recording_close)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        ticket.done()
        monkeypatch.undo()
        assert not ticket.fired
        assert ticket.reusable
        assert duplicate in closed  # our duplicate, never the connection's own descriptor
        assert conn.pgconn.socket not in closed
        time.sleep(0.1)  # past a tick of the watch: nothing left to fire
        assert conn.execute("SELECT 2").fetchone() == (2,)


def _gone_from_the_server(watcher: psycopg.Connection[tuple[object, ...]], pid: int) -> bool:
    for _ in range(200):  # the cancel request reaches the server soon after the cut
        rows = watcher.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state = 'active' AND query LIKE %s",
            (pid, "%pg_sleep(60)%"),
        ).fetchall()
        if not rows:
            return True
        time.sleep(0.05)
    return False


def test_a_silent_call_is_cut_off_and_cancelled(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as watcher:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            pid = conn.info.backend_pid
            ticket = watch_connection(conn, 0.3)
            start = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT pg_sleep(60)")
            ended = time.monotonic() - start
            ticket.done()
            assert ticket.fired
            assert not ticket.reusable
            assert 0.25 <= ended < 10.0  # cut at 0.3 s; generous for a loaded machine
        if not _cancel_watch.NONBLOCKING_CANCEL:
            return  # an old libpq: the cut alone (its blocking cancel is not sent)
        assert _gone_from_the_server(watcher, pid), "the cut-off statement still runs"


def test_a_cancelled_statement_keeps_its_connection(postgres_dsn: str) -> None:
    """The server took the cancel request: the connection may serve the next call."""
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        ticket = watch_statement(conn, 0.2)
        with pytest.raises(pg_errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(60)")
        ticket.done()
        assert ticket.fired
        assert ticket.reusable
        assert conn.execute("SELECT 1").fetchone() == (1,)


@needs_nonblocking_cancel
def test_a_cancel_nobody_answers_does_not_delay_another_cut_off(postgres_dsn: str) -> None:
    """Behind a silent network a statement's cancel request gets no answer (its thread waits
    up to 2 s for one); the cut-off of another call, due meanwhile, still comes on time, and
    the statement's connection is not reusable (its request may still arrive)."""
    with proxied(*pg.address(postgres_dsn)) as proxy:
        dsn = pg.via(postgres_dsn, proxy.port)
        with (
            psycopg.connect(dsn, autocommit=True) as first,
            psycopg.connect(dsn, autocommit=True) as second,
        ):
            proxy.stall()
            statement = watch_statement(first, 0.05)
            start = time.monotonic()
            cutter = watch_connection(second, 0.4)
            with pytest.raises(psycopg.OperationalError):
                second.execute("SELECT 1")
            waited = time.monotonic() - start
            cutter.done()
            assert cutter.fired
            assert waited < 1.8  # cut at 0.4 s; behind the 2 s cancel wait it came after 2 s
            assert statement.fired
            statement.done()  # its request unanswered: waits for it to be given up
            assert not statement.reusable
            proxy.cut()


def test_the_watch_outlives_an_error_on_one_call(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[int] = []
    real_send = _cancel_watch._send_in_thread

    def fail_once(sender: object, ticket: object) -> None:
        if not failures:
            failures.append(1)
            raise RuntimeError("no thread to be had")
        real_send(sender, ticket)  # type: ignore[arg-type]

    monkeypatch.setattr(_cancel_watch, "_send_in_thread", fail_once)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        broken = watch_statement(conn, 0.0)
        for _ in range(250):
            if broken.fired:
                break
            time.sleep(0.02)
        start = time.monotonic()
        broken.done()
        assert time.monotonic() - start < 1.0  # nothing to wait for: no request was sent
        assert broken.fired
        assert not broken.reusable
        ticket = watch_statement(conn, 0.2)
        with pytest.raises(pg_errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(60)")
        ticket.done()
        assert failures == [1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_forked_child_forgets_the_parents_calls(postgres_dsn: str) -> None:
    """Its copies of the parent's descriptors reach the parent's sockets: a child that kept
    the parent's calls could cut them off."""
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        ticket = watch_connection(conn, 60.0)
        child = os.fork()
        if child == 0:  # pragma: no cover - the child's outcome is its exit code
            os._exit(0 if not _cancel_watch._WATCH._tickets else 1)
        _, status = os.waitpid(child, 0)
        ticket.done()
        assert os.waitstatus_to_exitcode(status) == 0
        assert not ticket.fired
        assert conn.execute("SELECT 1").fetchone() == (1,)
