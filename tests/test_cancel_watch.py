"""The cancel watch's cut-off: a connection that has not answered by its moment is shut down
(the driver's wait ends at once), what it ran is cancelled on the server, and a call that
ends in time leaves its connection untouched and no descriptor behind."""

from __future__ import annotations

import os
import time

import psycopg
import pytest

from worklease import _cancel_watch
from worklease._cancel_watch import watch_connection


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_call_that_ends_in_time_is_left_alone(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        before = _open_fds()
        ticket = watch_connection(conn, 5.0)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        ticket.done()
        assert not ticket.fired
        assert _open_fds() == before
        time.sleep(0.1)  # past a tick of the watch: nothing left to fire
        assert conn.execute("SELECT 2").fetchone() == (2,)


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
            assert 0.25 <= ended < 10.0  # cut at 0.3 s; generous for a loaded machine
        if not _cancel_watch.NONBLOCKING_CANCEL:
            return  # an old libpq: the cut alone (its blocking cancel is not sent)
        for _ in range(200):  # the cancel request reaches the server soon after the cut
            rows = watcher.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND query LIKE %s",
                (pid, "%pg_sleep(60)%"),
            ).fetchall()
            if not rows:
                return
            time.sleep(0.05)
        raise AssertionError("the cut-off statement still runs on the server after 10 s")
