# Generated from tests/_async/test_postgres_listen.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""PostgreSQL release notifications: release and forget NOTIFY, the listener wakes waiters.

Two backends on two pools stand for two processes. Upper time bounds are generous (a few
seconds against poll intervals of 30 s): they tell a wake-up at the release from one at the
next poll, not how fast it is. A hand-over at the release (typically milliseconds) waits with
a poll interval and a holder's TTL of an hour, so only the release can end the wait within
the test; its bound is 20 s, far beyond what a loaded machine adds.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from time import monotonic
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from tests import pg
from tests._compat import sleep
from worklease import ExitMode, FencedError, Lease, PostgresBackend

from .helpers import close_backend, handed_over, open_backend

pytestmark = pytest.mark.postgres

LONG = 30.0
"""A poll interval no test may sit out."""
PROMPT = 5.0
"""Upper bound for a wake-up that should come at the release."""
NEVER = 3600.0
"""A poll interval and a holder's TTL no test lives to see."""
HANDOVER = 20.0
"""Upper bound for a hand-over at the release when nothing else can end the wait before
``NEVER``."""
GIVE_UP = 2 * HANDOVER
"""When such a waiting acquire times out. Its last attempt, at that deadline, finds the row
free, so a release that never woke the waiter shows as a hand-over this late: well past
``HANDOVER``."""
SETTLE = 20.0
"""How long the listener may take to (re)connect in a test."""

_postgres_module = sys.modules[PostgresBackend.open.__module__]
Listener: Any = _postgres_module.ReleaseListener
_listener_module = sys.modules[Listener.__module__]

_LISTENERS = """SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (query LIKE '%worklease-probe:%' OR query LIKE 'LISTEN %')"""


def listener_pids(dsn: str) -> set[int]:
    """The server processes of listener connections on the test database."""
    return {pid for (pid,) in pg.execute(dsn, _LISTENERS)}


@pytest.fixture
def two(
    postgres_dsn: str,
) -> Iterator[tuple[PostgresBackend, PostgresBackend]]:
    """Two backends on two pools: the releasing "process" and the waiting one."""
    pg.reset(postgres_dsn)
    first = open_backend(postgres_dsn)
    second = open_backend(postgres_dsn)
    try:
        yield first, second
    finally:
        close_backend(first)
        close_backend(second)


def until_delivered(releaser: PostgresBackend, watcher: PostgresBackend) -> None:
    """Release through ``releaser`` until ``watcher`` sees it: its listener is listening."""
    lease = Lease(releaser, holder_id="warm-up", ttl=LONG)
    deadline = monotonic() + SETTLE
    watch = watcher.watch_releases(["warm-up"])
    assert watch is not None
    with watch:
        while True:
            lease.release(lease.acquire("warm-up"), ExitMode.FINISHED)
            if watch.wait(0.5):
                return
            assert monotonic() < deadline, "the listener never delivered a release"


def test_release_and_forget_notify_only_when_they_happen(
    two: tuple[PostgresBackend, PostgresBackend], postgres_dsn: str
) -> None:
    backend, _ = two
    lease = Lease(backend, holder_id="a", ttl=LONG)
    with psycopg.connect(postgres_dsn, autocommit=True) as listener:
        listener.execute("LISTEN worklease_release")
        stale = lease.acquire("notified")
        lease.release(stale, ExitMode.FINISHED)
        token = lease.acquire("notified")
        with pytest.raises(FencedError):
            backend.release(stale, ExitMode.FINISHED)
        with pytest.raises(FencedError):
            backend.forget(stale)
        lease.forget(token)
        payloads = [n.payload for n in listener.notifies(timeout=1.0) if n.payload == "notified"]
    assert payloads == ["notified", "notified"]  # the release, then the forget


@pytest.mark.parametrize("how", ["release", "forget"])
def test_a_waiter_on_another_backend_wakes_at_the_release(
    two: tuple[PostgresBackend, PostgresBackend], how: str
) -> None:
    first, second = two
    until_delivered(first, second)
    token, after = handed_over(first, second, how, poll=NEVER, timeout=GIVE_UP)
    assert token.holder_id == "waiter"
    assert after < HANDOVER  # the release woke it: not the poll, the expiry or the timeout


def test_the_listener_reconnects_after_losing_its_connection(
    two: tuple[PostgresBackend, PostgresBackend], postgres_dsn: str
) -> None:
    first, second = two
    until_delivered(first, second)
    before = listener_pids(postgres_dsn)
    assert before
    pg.execute(postgres_dsn, f"SELECT pg_terminate_backend(pid) FROM ({_LISTENERS}) AS l")
    until_delivered(first, second)
    assert not listener_pids(postgres_dsn) & before  # new connections
    token, after = handed_over(first, second, "release", poll=NEVER, timeout=GIVE_UP)
    assert token.holder_id == "waiter"
    assert after < HANDOVER


def test_close_stops_listening(postgres_dsn: str) -> None:
    pg.reset(postgres_dsn)
    first = open_backend(postgres_dsn)
    second = open_backend(postgres_dsn)
    try:
        until_delivered(first, second)
        assert listener_pids(postgres_dsn)
        second.close()
        assert second.watch_releases(["x"]) is None
        deadline = monotonic() + SETTLE
        while listener_pids(postgres_dsn):
            assert monotonic() < deadline, "the listener connection outlived close()"
            sleep(0.05)
    finally:
        close_backend(first)
        close_backend(second)


def test_listen_false_polls(postgres_dsn: str) -> None:
    pg.reset(postgres_dsn)
    first = open_backend(postgres_dsn)
    second = open_backend(postgres_dsn, listen=False)
    owned = PostgresBackend.connect(postgres_dsn, listen=False)
    try:
        assert second.watch_releases(["x"]) is None
        assert owned.watch_releases(["x"]) is None
        holder = Lease(first, holder_id="holder", ttl=LONG)
        waiter = Lease(second, holder_id="waiter", ttl=LONG)
        token = holder.acquire("polled")
        holder.release(token, ExitMode.FINISHED)
        assert (waiter.acquire("polled", wait=True, timeout=LONG)).holder_id == "waiter"
        assert not listener_pids(postgres_dsn)
    finally:
        owned.close()
        close_backend(first)
        close_backend(second)


def no_probe(self: Any, conn: Any, payload: str) -> None:
    """A probe that is never sent: as if the notification got lost behind a proxy."""


@pytest.mark.parametrize("failure", ["probe lost", "listen refused"])
def test_without_notifications_one_warning_and_polling(
    postgres_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    failure: str,
) -> None:
    if failure == "probe lost":
        monkeypatch.setattr(Listener, "_send_probe", no_probe)
        monkeypatch.setattr(Listener, "probe_timeout", 0.3)
    else:
        monkeypatch.setattr(_listener_module, "_LISTEN", sql.SQL("LISTEN"))  # a syntax error
    pg.reset(postgres_dsn)
    first = open_backend(postgres_dsn)
    second = open_backend(postgres_dsn)
    try:
        with caplog.at_level(logging.WARNING, logger="worklease"):

            def warnings() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "fall back to polling" in r.getMessage()]

            holder = Lease(first, holder_id="holder", ttl=LONG)
            waiter = Lease(second, holder_id="waiter", ttl=LONG)
            watch = second.watch_releases(["polled"])
            assert watch is not None
            deadline = monotonic() + SETTLE
            while not warnings():
                assert monotonic() < deadline, "no fallback warning"
                sleep(0.05)
            token = holder.acquire("polled")
            holder.release(token, ExitMode.FINISHED)
            # The watch opened before the listener gave up was woken once then, so its waiter
            # looked again; no new watch is handed out (waits poll).
            assert watch.wait(0) is True
            watch.close()
            assert second.watch_releases(["polled"]) is None
            token = waiter.acquire("polled", wait=True, timeout=LONG, poll_interval=0.1)
            waiter.release(token, ExitMode.FINISHED)  # a release nobody hears
            sleep(0.5)
            assert len(warnings()) == 1
        assert warnings()[0].levelno == logging.WARNING
        deadline = monotonic() + SETTLE
        while listener_pids(postgres_dsn):  # it gave its connection back
            assert monotonic() < deadline, "the listener kept its connection"
            sleep(0.05)
    finally:
        close_backend(first)
        close_backend(second)


def test_watches_opened_before_the_listener_listens_are_woken_once_it_does(
    postgres_dsn: str,
) -> None:
    """A release between opening a watch and the listener's LISTEN would go unseen: once
    listening, the listener wakes every watch so each waiter looks again (no release here)."""
    pg.reset(postgres_dsn)
    backend = open_backend(postgres_dsn)
    try:
        watch = backend.watch_releases(["nobody-releases-this"])
        assert watch is not None
        with watch:
            started = monotonic()
            assert watch.wait(SETTLE)
            assert monotonic() - started < SETTLE
    finally:
        close_backend(backend)


def test_a_waiter_woken_before_the_expiry_still_takes_over_at_the_expiry(
    two: tuple[PostgresBackend, PostgresBackend],
) -> None:
    """An early wake-up that finds the same holder (here: the listener's start) must not
    push the next attempt to the poll interval: the waiter still takes over at the expiry."""
    first, second = two
    Lease(first, holder_id="crashed", ttl=1.0).acquire("job")
    started = monotonic()
    token = Lease(second, holder_id="successor", ttl=LONG).acquire(
        "job", wait=True, poll_interval=LONG, timeout=LONG
    )
    assert token.holder_id == "successor"
    assert monotonic() - started < PROMPT  # the expiry (1 s), not the poll interval (30 s)


def test_the_listener_works_whatever_the_pools_row_factory(postgres_dsn: str) -> None:
    """The listener copies the application pool's kwargs; a dict row factory there must not
    stop it from reading its own checks (it used to retry forever, silently)."""
    pg.reset(postgres_dsn)
    pool: ConnectionPool[Any] = ConnectionPool(
        postgres_dsn, min_size=1, max_size=2, open=False, kwargs={"row_factory": dict_row}
    )
    pool.open()
    backend = PostgresBackend(pool)
    try:
        other = open_backend(postgres_dsn)
        try:
            until_delivered(other, backend)
        finally:
            close_backend(other)
    finally:
        close_backend(backend)
