# Generated from tests/_async/test_pgbouncer.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Release notifications behind PgBouncer (issue 13): what the listener does on each route.

The rest of the suite runs through the transaction-mode PgBouncer as the ``pgbouncer``
backend (conftest). Here: with default settings the listener sees that the pooler shares
server sessions, never leaves a LISTEN on a pooled server connection, warns once, and waits
poll; ``listen_dsn`` straight to the server keeps handoff instant; session mode listens as a
direct connection does. Time bounds are generous (a few seconds against poll intervals of
30 s): they tell a wake-up at the release from one at the next poll.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from time import monotonic
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from tests import pg
from tests._compat import sleep, spawn_all
from worklease import ConfigError, ExitMode, Lease, PostgresBackend, Token

from .helpers import close_backend, handed_over, open_backend

BOUNCED = {"prepare_threshold": None}
"""The documented setting for an application's own statements behind PgBouncer."""

pytestmark = [pytest.mark.postgres, pytest.mark.pgbouncer]

LONG = 30.0
PROMPT = 5.0
SETTLE = 20.0
FALLBACK = "fall back to polling"
STRAY = "when not linked"  # PgBouncer's log line for a notification on a pooled connection


def fallbacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if FALLBACK in r.getMessage()]


def until_settled(backend: PostgresBackend) -> bool:
    """Start the listener and wait until it listens (True) or gave up (False)."""
    deadline = monotonic() + SETTLE
    watch = backend.watch_releases(["settle"])
    assert watch is not None
    with watch:
        watch.wait(SETTLE)
    listener: Any = backend._listener
    while not (listener.listening or listener.fell_back):
        assert monotonic() < deadline, "the listener neither listened nor gave up"
        sleep(0.05)
    return bool(listener.listening)


@pytest.fixture
def routed(
    postgres_dsn: str, pgbouncer_dsn: str
) -> Iterator[tuple[PostgresBackend, PostgresBackend]]:
    """Two backends through the transaction-mode PgBouncer, default settings."""
    pg.reset(postgres_dsn)
    first = open_backend(pgbouncer_dsn, pool_kwargs=BOUNCED)
    second = open_backend(pgbouncer_dsn, pool_kwargs=BOUNCED)
    try:
        yield first, second
    finally:
        close_backend(first)
        close_backend(second)


def test_transaction_mode_falls_back_once_and_leaves_no_listen_behind(
    routed: tuple[PostgresBackend, PostgresBackend],
    pgbouncer: pg.PgBouncer,
    pgbouncer_dsn: str,
    postgres_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = routed
    log_before = len(pgbouncer.log_text())
    with caplog.at_level(logging.WARNING, logger="worklease"):
        assert until_settled(second) is False
        assert until_settled(first) is False
        # Given up for good: no more watches, so waits poll instead of sitting out a watch.
        assert second.watch_releases(["anything"]) is None
        holder = Lease(first, holder_id="holder", ttl=LONG)
        waiter = Lease(second, holder_id="waiter", ttl=LONG)
        for _ in range(20):
            holder.release(holder.acquire("bounced"), ExitMode.FINISHED)
        assert pg.pooled_listeners(pgbouncer_dsn, postgres_dsn) == 0
        token = holder.acquire("bounced")
        got: list[Token] = []

        def step(index: int) -> None:
            if index == 0:
                got.append(waiter.acquire("bounced", wait=True, timeout=LONG, poll_interval=0.2))
            else:
                sleep(0.3)
                holder.release(token, ExitMode.FINISHED)

        begin = monotonic()
        assert spawn_all(step, 2) == [None, None]
        assert got[0].holder_id == "waiter"
        assert monotonic() - begin < PROMPT  # by polling, every 0.2 s
        waiter.release(got[0], ExitMode.FINISHED)
        sleep(0.5)
    records = fallbacks(caplog)
    assert len(records) == 2  # one per backend (listener), not one per watch or release
    assert all(r.levelno == logging.WARNING for r in records)
    assert "transaction-pooling proxy" in records[0].getMessage()
    # No LISTEN reached a pooled server connection: PgBouncer saw no stray notification.
    assert STRAY not in pgbouncer.log_text()[log_before:]


def test_transaction_mode_with_a_direct_listen_dsn_hands_over_at_once(
    postgres_dsn: str, pgbouncer_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    pg.reset(postgres_dsn)
    holder_side = open_backend(pgbouncer_dsn, pool_kwargs=BOUNCED)
    waiter_side = open_backend(pgbouncer_dsn, listen_dsn=postgres_dsn, pool_kwargs=BOUNCED)
    try:
        with caplog.at_level(logging.WARNING, logger="worklease"):
            assert until_settled(waiter_side) is True
            token, after = handed_over(holder_side, waiter_side, "release")
        assert token.holder_id == "waiter"
        assert after < PROMPT  # not the 30 s poll interval
        assert fallbacks(caplog) == []
    finally:
        close_backend(holder_side)
        close_backend(waiter_side)


@pytest.fixture
def session_bouncer(postgres_server: str) -> Iterator[pg.PgBouncer]:
    bouncer = pg.PgBouncer(postgres_server, pool_mode="session")
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


def test_session_mode_listens_with_default_settings(
    postgres_dsn: str, session_bouncer: pg.PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    pg.reset(postgres_dsn)
    dsn = session_bouncer.route(postgres_dsn)
    holder_side = open_backend(dsn, pool_kwargs=BOUNCED)
    waiter_side = open_backend(dsn, pool_kwargs=BOUNCED)
    try:
        with caplog.at_level(logging.WARNING, logger="worklease"):
            assert until_settled(waiter_side) is True
            token, after = handed_over(holder_side, waiter_side, "forget")
        assert token.holder_id == "waiter"
        assert after < PROMPT
        assert fallbacks(caplog) == []
    finally:
        close_backend(holder_side)
        close_backend(waiter_side)


def test_listen_dsn_is_checked_before_any_io(postgres_dsn: str) -> None:
    pool: ConnectionPool[Any] = ConnectionPool(postgres_dsn, open=False)
    with pytest.raises(ConfigError, match="listen=False"):
        PostgresBackend(pool, listen=False, listen_dsn=postgres_dsn)
    with pytest.raises(ConfigError, match="conninfo string"):
        PostgresBackend(pool, listen_dsn=b"host=x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not a valid conninfo"):
        PostgresBackend(pool, listen_dsn="host='unterminated")
    with pytest.raises(ConfigError, match="not a valid conninfo"):
        PostgresBackend.connect(postgres_dsn, listen_dsn="nonsense without equals")
    assert pool.closed  # nothing was opened


def test_unlisten_reaches_the_listening_session_past_the_one_released_last(
    postgres_dsn: str, pgbouncer_dsn: str
) -> None:
    """The LISTEN landed on one pooled server session; PgBouncer then keeps handing this
    client the session released last (another one): the listener still takes it back."""
    from psycopg import Connection, sql

    from worklease._pg import RELEASE_CHANNEL
    from worklease._sync.listener import ReleaseListener, _run_reporting_pid
    from worklease._sync.watch import ReleaseHub

    listen = sql.SQL("LISTEN {}").format(sql.Identifier(RELEASE_CHANNEL))
    with (
        Connection.connect(pgbouncer_dsn, autocommit=True, prepare_threshold=None) as client,
        Connection.connect(pgbouncer_dsn, prepare_threshold=None) as busy,
        ConnectionPool(pgbouncer_dsn, kwargs=BOUNCED, min_size=0, max_size=1, open=False) as app,
    ):
        busy.execute("SELECT 1")  # holds a session in an open transaction
        listening_at = _run_reporting_pid(client, listen)  # lands on another one
        busy.rollback()  # released last: the client's next statements go there
        assert pg.pooled_listeners(pgbouncer_dsn, postgres_dsn) == 1
        listener = ReleaseListener(app, ReleaseHub())
        listener._unlisten(client, listening_at)
        assert pg.pooled_listeners(pgbouncer_dsn, postgres_dsn) == 0


def test_a_listener_stopped_during_its_probe_takes_the_listen_back(
    postgres_dsn: str, pgbouncer_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route check was fooled (a race it cannot always win), LISTEN ran on a pooled
    session, and the listener is stopped while its probe waits: the LISTEN is taken back."""
    from worklease._sync.listener import ReleaseListener
    from worklease._sync.watch import ReleaseHub

    probing: list[bool] = []

    def fooled(self: Any, conn: Any, mine: int) -> bool:
        return False

    def slow_probe(self: Any, conn: Any) -> bool:
        probing.append(True)
        sleep(3.0)
        return False

    monkeypatch.setattr(ReleaseListener, "_shares_server", fooled)
    monkeypatch.setattr(ReleaseListener, "_probe", slow_probe)
    with ConnectionPool(pgbouncer_dsn, kwargs=BOUNCED, min_size=1, max_size=2, open=False) as app:
        for _ in range(10):  # the LISTEN runs only while the client kept its session
            listener = ReleaseListener(app, ReleaseHub())
            listener.start()
            deadline = monotonic() + 10.0
            while not probing and not listener.fell_back and monotonic() < deadline:
                sleep(0.01)
            if probing:
                listener.stop()
                break
            listener.stop()
        assert probing, "the LISTEN never ran on the client's own session"
    assert pg.pooled_listeners(pgbouncer_dsn, postgres_dsn) == 0


UNTOUCHED_ROWS = "worklease_test_untouched"


def test_library_defaults_through_a_transaction_pooler_never_mix_up_statements(
    postgres_dsn: str,
    pgbouncer_dsn: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain pool (psycopg's defaults: statements prepared after 5 runs) and the backend's
    defaults behind PgBouncer 1.18 in transaction mode. Prepared by name, the statements of
    different clients met on shared server sessions (DuplicatePreparedStatement,
    InvalidSqlStatementName, or another client's statement bound to these parameters). Now
    worklease sends them unprepared there and warns once; a transactional step's own
    statements are not prepared either, however often they run."""
    monkeypatch.setattr("worklease._pg._WARNED_ROUTES", set())
    pg.reset(postgres_dsn)
    pg.execute(
        postgres_dsn,
        f"CREATE TABLE IF NOT EXISTS {UNTOUCHED_ROWS} (work_id TEXT, fencing_token BIGINT)",
    )
    pg.execute(postgres_dsn, f"TRUNCATE {UNTOUCHED_ROWS}")
    backends = [open_backend(pgbouncer_dsn) for _ in range(3)]
    try:
        assert all(backend.prepare is None for backend in backends)
        leases = [Lease(backend, holder_id=f"h{i}", ttl=LONG) for i, backend in enumerate(backends)]

        def cycle(lease: Lease, work_id: str) -> None:
            token = lease.acquire(work_id)
            lease.read_checkpoint(token)
            lease.checkpoint(token, b"state")
            lease.renew(token)
            with lease.transaction(token) as tx:
                tx.connection.execute(
                    f"INSERT INTO {UNTOUCHED_ROWS} VALUES (%s, %s)".encode(),
                    (work_id, token.fencing_token),
                )
                tx.checkpoint(b"stepped")
            lease.release(token, ExitMode.FINISHED)

        with caplog.at_level(logging.WARNING, logger="worklease"):
            # One after another: PgBouncer lends the idle server session to the next client
            # (last in, first out), where same-named statements of two clients meet.
            for _ in range(8):
                for index, lease in enumerate(leases):
                    cycle(lease, f"untouched-{index}")

            # And at once, on every connection of every pool.
            def worker(index: int) -> None:
                for _ in range(6):
                    cycle(leases[index % 3], f"untouched-many-{index}")

            outcomes = spawn_all(worker, 12)
        assert [o for o in outcomes if isinstance(o, BaseException)] == []
        warnings = [r.getMessage() for r in caplog.records if "through a proxy" in r.getMessage()]
        assert len(warnings) == 1, warnings  # one per process and route
        assert "prepare_threshold" in warnings[0]  # the application's own statements
        stored = pg.execute(postgres_dsn, f"SELECT count(*) FROM {UNTOUCHED_ROWS}")
        assert stored[0][0] == 8 * 3 + 12 * 6
    finally:
        for backend in backends:
            close_backend(backend)
