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
from collections.abc import AsyncIterator, Iterator
from time import monotonic
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from tests import pg
from tests._acompat import asleep, aspawn_all
from worklease import AsyncLease, AsyncPostgresBackend, ConfigError, ExitMode, Token

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


async def until_settled(backend: AsyncPostgresBackend) -> bool:
    """Start the listener and wait until it listens (True) or gave up (False)."""
    deadline = monotonic() + SETTLE
    watch = backend.watch_releases(["settle"])
    assert watch is not None
    with watch:
        await watch.wait(SETTLE)
    listener: Any = backend._listener
    while not (listener.listening or listener.fell_back):
        assert monotonic() < deadline, "the listener neither listened nor gave up"
        await asleep(0.05)
    return bool(listener.listening)


@pytest.fixture
async def routed(
    postgres_dsn: str, pgbouncer_dsn: str
) -> AsyncIterator[tuple[AsyncPostgresBackend, AsyncPostgresBackend]]:
    """Two backends through the transaction-mode PgBouncer, default settings."""
    pg.reset(postgres_dsn)
    first = await open_backend(pgbouncer_dsn, pool_kwargs=BOUNCED)
    second = await open_backend(pgbouncer_dsn, pool_kwargs=BOUNCED)
    try:
        yield first, second
    finally:
        await close_backend(first)
        await close_backend(second)


async def test_transaction_mode_falls_back_once_and_leaves_no_listen_behind(
    routed: tuple[AsyncPostgresBackend, AsyncPostgresBackend],
    pgbouncer: pg.PgBouncer,
    pgbouncer_dsn: str,
    postgres_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = routed
    log_before = len(pgbouncer.log_text())
    with caplog.at_level(logging.WARNING, logger="worklease"):
        assert await until_settled(second) is False
        assert await until_settled(first) is False
        # Given up for good: no more watches, so waits poll instead of sitting out a watch.
        assert second.watch_releases(["anything"]) is None
        holder = AsyncLease(first, holder_id="holder", ttl=LONG)
        waiter = AsyncLease(second, holder_id="waiter", ttl=LONG)
        for _ in range(20):
            await holder.release(await holder.acquire("bounced"), ExitMode.FINISHED)
        assert pg.pooled_listeners(pgbouncer_dsn, postgres_dsn) == 0
        token = await holder.acquire("bounced")
        got: list[Token] = []

        async def step(index: int) -> None:
            if index == 0:
                got.append(
                    await waiter.acquire("bounced", wait=True, timeout=LONG, poll_interval=0.2)
                )
            else:
                await asleep(0.3)
                await holder.release(token, ExitMode.FINISHED)

        begin = monotonic()
        assert await aspawn_all(step, 2) == [None, None]
        assert got[0].holder_id == "waiter"
        assert monotonic() - begin < PROMPT  # by polling, every 0.2 s
        await waiter.release(got[0], ExitMode.FINISHED)
        await asleep(0.5)
    records = fallbacks(caplog)
    assert len(records) == 2  # one per backend (listener), not one per watch or release
    assert all(r.levelno == logging.WARNING for r in records)
    assert "transaction-pooling proxy" in records[0].getMessage()
    # No LISTEN reached a pooled server connection: PgBouncer saw no stray notification.
    assert STRAY not in pgbouncer.log_text()[log_before:]


async def test_transaction_mode_with_a_direct_listen_dsn_hands_over_at_once(
    postgres_dsn: str, pgbouncer_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    pg.reset(postgres_dsn)
    holder_side = await open_backend(pgbouncer_dsn, pool_kwargs=BOUNCED)
    waiter_side = await open_backend(pgbouncer_dsn, listen_dsn=postgres_dsn, pool_kwargs=BOUNCED)
    try:
        with caplog.at_level(logging.WARNING, logger="worklease"):
            assert await until_settled(waiter_side) is True
            token, after = await handed_over(holder_side, waiter_side, "release")
        assert token.holder_id == "waiter"
        assert after < PROMPT  # not the 30 s poll interval
        assert fallbacks(caplog) == []
    finally:
        await close_backend(holder_side)
        await close_backend(waiter_side)


@pytest.fixture
def session_bouncer(postgres_server: str) -> Iterator[pg.PgBouncer]:
    bouncer = pg.PgBouncer(postgres_server, pool_mode="session")
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


async def test_session_mode_listens_with_default_settings(
    postgres_dsn: str, session_bouncer: pg.PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    pg.reset(postgres_dsn)
    dsn = session_bouncer.route(postgres_dsn)
    holder_side = await open_backend(dsn, pool_kwargs=BOUNCED)
    waiter_side = await open_backend(dsn, pool_kwargs=BOUNCED)
    try:
        with caplog.at_level(logging.WARNING, logger="worklease"):
            assert await until_settled(waiter_side) is True
            token, after = await handed_over(holder_side, waiter_side, "forget")
        assert token.holder_id == "waiter"
        assert after < PROMPT
        assert fallbacks(caplog) == []
    finally:
        await close_backend(holder_side)
        await close_backend(waiter_side)


async def test_listen_dsn_is_checked_before_any_io(postgres_dsn: str) -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(postgres_dsn, open=False)
    with pytest.raises(ConfigError, match="listen=False"):
        AsyncPostgresBackend(pool, listen=False, listen_dsn=postgres_dsn)
    with pytest.raises(ConfigError, match="conninfo string"):
        AsyncPostgresBackend(pool, listen_dsn=b"host=x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not a valid conninfo"):
        AsyncPostgresBackend(pool, listen_dsn="host='unterminated")
    with pytest.raises(ConfigError, match="not a valid conninfo"):
        AsyncPostgresBackend.connect(postgres_dsn, listen_dsn="nonsense without equals")
    assert pool.closed  # nothing was opened


async def test_unlisten_reaches_the_listening_session_past_the_one_released_last(
    postgres_dsn: str, pgbouncer_dsn: str
) -> None:
    """The LISTEN landed on one pooled server session; PgBouncer then keeps handing this
    client the session released last (another one): the listener still takes it back."""
    from psycopg import AsyncConnection, sql

    from worklease._async.listener import AsyncReleaseListener, _run_reporting_pid
    from worklease._async.watch import AsyncReleaseHub
    from worklease._pg import RELEASE_CHANNEL

    listen = sql.SQL("LISTEN {}").format(sql.Identifier(RELEASE_CHANNEL))
    async with (
        await AsyncConnection.connect(
            pgbouncer_dsn, autocommit=True, prepare_threshold=None
        ) as client,
        await AsyncConnection.connect(pgbouncer_dsn, prepare_threshold=None) as busy,
        AsyncConnectionPool(
            pgbouncer_dsn, kwargs=BOUNCED, min_size=0, max_size=1, open=False
        ) as app,
    ):
        await busy.execute("SELECT 1")  # holds a session in an open transaction
        listening_at = await _run_reporting_pid(client, listen)  # lands on another one
        await busy.rollback()  # released last: the client's next statements go there
        assert pg.pooled_listeners(pgbouncer_dsn, postgres_dsn) == 1
        listener = AsyncReleaseListener(app, AsyncReleaseHub())
        await listener._unlisten(client, listening_at)
        assert pg.pooled_listeners(pgbouncer_dsn, postgres_dsn) == 0


async def test_a_listener_stopped_during_its_probe_takes_the_listen_back(
    postgres_dsn: str, pgbouncer_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route check was fooled (a race it cannot always win), LISTEN ran on a pooled
    session, and the listener is stopped while its probe waits: the LISTEN is taken back."""
    from worklease._async.listener import AsyncReleaseListener
    from worklease._async.watch import AsyncReleaseHub

    probing: list[bool] = []

    async def fooled(self: Any, conn: Any, mine: int) -> bool:
        return False

    async def slow_probe(self: Any, conn: Any) -> bool:
        probing.append(True)
        await asleep(3.0)
        return False

    monkeypatch.setattr(AsyncReleaseListener, "_shares_server", fooled)
    monkeypatch.setattr(AsyncReleaseListener, "_probe", slow_probe)
    async with AsyncConnectionPool(
        pgbouncer_dsn, kwargs=BOUNCED, min_size=1, max_size=2, open=False
    ) as app:
        for _ in range(10):  # the LISTEN runs only while the client kept its session
            listener = AsyncReleaseListener(app, AsyncReleaseHub())
            listener.start()
            deadline = monotonic() + 10.0
            while not probing and not listener.fell_back and monotonic() < deadline:
                await asleep(0.01)
            if probing:
                await listener.stop()
                break
            await listener.stop()
        assert probing, "the LISTEN never ran on the client's own session"
    assert pg.pooled_listeners(pgbouncer_dsn, postgres_dsn) == 0


UNTOUCHED_ROWS = "worklease_test_untouched"


async def test_library_defaults_through_a_transaction_pooler_never_mix_up_statements(
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
    backends = [await open_backend(pgbouncer_dsn) for _ in range(3)]
    try:
        assert all(backend.prepare is None for backend in backends)
        leases = [
            AsyncLease(backend, holder_id=f"h{i}", ttl=LONG) for i, backend in enumerate(backends)
        ]

        async def cycle(lease: AsyncLease, work_id: str) -> None:
            token = await lease.acquire(work_id)
            await lease.read_checkpoint(token)
            await lease.checkpoint(token, b"state")
            await lease.renew(token)
            async with lease.transaction(token) as tx:
                await tx.connection.execute(
                    f"INSERT INTO {UNTOUCHED_ROWS} VALUES (%s, %s)".encode(),
                    (work_id, token.fencing_token),
                )
                tx.checkpoint(b"stepped")
            await lease.release(token, ExitMode.FINISHED)

        with caplog.at_level(logging.WARNING, logger="worklease"):
            # One after another: PgBouncer lends the idle server session to the next client
            # (last in, first out), where same-named statements of two clients meet.
            for _ in range(8):
                for index, lease in enumerate(leases):
                    await cycle(lease, f"untouched-{index}")

            # And at once, on every connection of every pool.
            async def worker(index: int) -> None:
                for _ in range(6):
                    await cycle(leases[index % 3], f"untouched-many-{index}")

            outcomes = await aspawn_all(worker, 12)
        assert [o for o in outcomes if isinstance(o, BaseException)] == []
        warnings = [r.getMessage() for r in caplog.records if "through a proxy" in r.getMessage()]
        assert len(warnings) == 1, warnings  # one per process and route
        assert "prepare_threshold" in warnings[0]  # the application's own statements
        stored = pg.execute(postgres_dsn, f"SELECT count(*) FROM {UNTOUCHED_ROWS}")
        assert stored[0][0] == 8 * 3 + 12 * 6
    finally:
        for backend in backends:
            await close_backend(backend)
