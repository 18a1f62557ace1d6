"""Connection trouble on PostgreSQL (issue 23): settings that can never work fail at once and
for good, naming the cause; a pool that is reconnecting after an outage is gone around, so
writes resume when the server answers, not at psycopg_pool's next reconnect attempt; a
read-only role is refused for good, not retried forever."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from time import monotonic
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection, sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from tests import pg
from tests._acompat import asleep, aspawn_all
from tests.proxy import proxied
from worklease import (
    AsyncLease,
    AsyncPostgresBackend,
    BackendError,
    ConfigError,
    ExitMode,
    LeaseHeldError,
)
from worklease._async import postgres as backend_module

pytestmark = pytest.mark.postgres

POOL_TIMEOUT = 120.0
"""The pools here wait this long for a connection: an error long before it came from the
direct attempt, not from the pool giving up."""

RIGHT = "right-horse-battery"
WRONG = "wrong-staple-7319"


@pytest.fixture(scope="module")
def password_server() -> Iterator[str]:
    """A private cluster whose TCP connections need a password (scram-sha-256)."""
    bindir = pg.find_bindir()
    if bindir is None:
        pytest.fail("no PostgreSQL server binaries for a password-protected cluster")
    cluster = pg.ThrowawayCluster(bindir)
    try:
        cluster.start()
        pg.execute(cluster.dsn, f"ALTER ROLE postgres PASSWORD '{RIGHT}'")
        hba = cluster.data / "pg_hba.conf"
        hba.write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
        if cluster.user is not None:
            shutil.chown(hba, user=cluster.user, group=None)
        pg.execute(cluster.dsn + f" password={RIGHT}", "SELECT pg_reload_conf()")
        yield cluster.dsn
    finally:
        cluster.stop()


def assert_permanent(error: BackendError, *fragments: str) -> None:
    assert not error.transient, error
    for fragment in fragments:
        assert fragment in str(error), error
    assert RIGHT not in str(error)
    assert WRONG not in str(error)


@pytest.mark.parametrize("owned", [True, False], ids=["connect()", "own pool"])
async def test_a_wrong_password_fails_at_once_and_for_good(
    password_server: str, owned: bool
) -> None:
    dsn = password_server + f" password={WRONG}"
    if owned:
        backend = AsyncPostgresBackend.connect(dsn, max_size=2, timeout=POOL_TIMEOUT)
    else:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn, min_size=1, max_size=2, timeout=POOL_TIMEOUT, open=False
        )
        await pool.open()  # as an application opens it: not waiting for a connection
        backend = AsyncPostgresBackend(pool, listen=False)
    try:
        lease = AsyncLease(backend, holder_id="h", ttl=30.0)
        begin = monotonic()
        with pytest.raises(BackendError) as caught:
            await lease.acquire("wrong-password")
        # Well inside the pool's own timeout: the cause was found, not waited out.
        assert monotonic() - begin < POOL_TIMEOUT / 2
        assert_permanent(caught.value, "password authentication failed", "cannot connect")
    finally:
        await backend.close()
        if not owned:
            await backend.pool.close()


async def test_the_right_password_works(password_server: str) -> None:
    backend = AsyncPostgresBackend.connect(password_server + f" password={RIGHT}", max_size=2)
    async with backend:
        await AsyncPostgresBackend.apply_schema(backend.pool)
        lease = AsyncLease(backend, holder_id="h", ttl=30.0)
        await lease.release(await lease.acquire("right-password"), ExitMode.FINISHED)


async def test_an_unknown_database_fails_at_once_and_for_good(postgres_dsn: str) -> None:
    dsn = make_conninfo(postgres_dsn, dbname=f"worklease_nowhere_{uuid.uuid4().hex[:8]}")
    async with AsyncPostgresBackend.connect(dsn, timeout=POOL_TIMEOUT) as backend:
        lease = AsyncLease(backend, holder_id="h", ttl=30.0)
        begin = monotonic()
        with pytest.raises(BackendError) as caught:
            await lease.acquire("unknown-database")
        assert monotonic() - begin < POOL_TIMEOUT / 2
        assert_permanent(caught.value, "does not exist")


async def test_a_conninfo_libpq_cannot_parse_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not a valid conninfo"):
        AsyncPostgresBackend.connect("host=127.0.0.1 password=hunter2 nonsense")
    with pytest.raises(ConfigError) as caught:
        AsyncPostgresBackend.connect("postgresql://u:hunter2@127.0.0.1/db?bogus=1")
    assert "hunter2" not in str(caught.value)


async def test_connect_with_a_small_max_size_alone(postgres_dsn: str) -> None:
    """psycopg_pool's min_size is 4 by default: max_size=1 alone used to fail."""
    async with AsyncPostgresBackend.connect(postgres_dsn, max_size=1) as backend:
        assert backend.pool.min_size == 1
        assert backend.pool.max_size == 1
        lease = AsyncLease(backend, holder_id="h", ttl=30.0)
        token = await lease.acquire("small-pool")
        await lease.checkpoint(token, b"one connection")
        await lease.release(token, ExitMode.FINISHED)
    async with AsyncPostgresBackend.connect(postgres_dsn, max_size=8) as backend:
        assert (backend.pool.min_size, backend.pool.max_size) == (4, 8)


CUT_TIMEOUT = 3.0
"""The pool timeout while the server is unreachable: a call waits this long, then fails."""


async def test_writes_go_around_a_pool_that_is_reconnecting(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an outage psycopg_pool reconnects on a backoff (1 s, doubling). Here its next
    attempt is an hour away: every write that succeeds once the server is back went around
    the pool, on a connection of its own; one that runs out of time says why."""
    monkeypatch.setattr(AttemptWithBackoff, "INITIAL_DELAY", 3600.0)
    pg.reset(postgres_dsn)
    host, port = pg.address(postgres_dsn)
    with proxied(host, port) as proxy:
        dsn = pg.via(postgres_dsn, proxy.port)
        backend = AsyncPostgresBackend.connect(
            dsn, min_size=2, max_size=2, timeout=CUT_TIMEOUT, listen=False
        )
        async with backend:
            lease = AsyncLease(backend, holder_id="h", ttl=60.0)
            token = await lease.acquire("around")
            await lease.checkpoint(token, b"before")
            proxy.cut()  # the server is gone: connections dropped, new ones refused
            with pytest.raises(BackendError) as caught:
                await lease.checkpoint(token, b"during")
            assert caught.value.transient  # it may come back
            assert "cannot connect" in str(caught.value)  # why, not a bare PoolTimeout

            # The server comes back while a write waits: the write goes through, in the
            # same call, although the pool will not reconnect for an hour.
            async def step(index: int) -> None:
                if index == 0:
                    await lease.checkpoint(token, b"resumed")
                else:
                    await asleep(1.0)
                    proxy.restore()

            assert await aspawn_all(step, 2) == [None, None]
            await lease.renew(token)
            async with lease.transaction(token) as tx:
                await tx.connection.execute(b"SELECT 1")
                tx.checkpoint(b"stepped")
            assert (await lease.read_checkpoint(token)).state == b"stepped"
            await lease.release(token, ExitMode.FINISHED)
            assert backend.pool.get_stats()["pool_available"] == 0  # the pool never came back


async def test_a_busy_pool_is_waited_for_even_after_an_old_loss(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool that lost a connection once, served since, and is now busy with the
    application's own work is waited for: no connection of worklease's own is opened."""
    opened: list[str] = []
    real = backend_module._connect_direct

    async def counting(pool: Any, timeout: Any, operation: str) -> Any:
        opened.append(operation)
        return await real(pool, timeout, operation)

    monkeypatch.setattr(backend_module, "_connect_direct", counting)
    pg.reset(postgres_dsn)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        postgres_dsn,
        min_size=2,
        max_size=2,
        open=False,
        check=AsyncConnectionPool.check_connection,
    )
    await pool.open(wait=True)
    backend = AsyncPostgresBackend(pool, listen=False)
    try:
        lease = AsyncLease(backend, holder_id="h", ttl=60.0)
        tokens = [await lease.acquire(f"busy-{i}") for i in range(6)]
        # One of the pool's connections is killed while idle: its next check finds it lost.
        pids = pg.execute(
            postgres_dsn,
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state = 'idle'",
        )
        pg.execute(postgres_dsn, "SELECT pg_terminate_backend(%s)", (pids[0][0],))
        for token in tokens:
            await lease.checkpoint(token, b"after the loss")
        await asleep(1.1)  # the baseline moves past the loss at the next served call
        await lease.checkpoint(tokens[0], b"baseline")
        held = [await pool.getconn() for _ in range(2)]  # the application is busy

        async def writer(index: int) -> None:
            await lease.checkpoint(tokens[index], b"waited")

        async def free_later(index: int) -> None:
            await asleep(1.5)
            for conn in held:
                await pool.putconn(conn)

        async def step(index: int) -> None:
            if index < len(tokens):
                await writer(index)
            else:
                await free_later(index)

        assert await aspawn_all(step, len(tokens) + 1) == [None] * (len(tokens) + 1)
        assert opened == []
    finally:
        await backend.close()
        await pool.close()


async def test_going_around_keeps_the_pool_s_configure(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool whose configure callback sets the search_path: a call that goes around it
    (after an outage, the pool's reconnect an hour away) resolves the same table, so a held
    lease stays held."""
    monkeypatch.setattr(AttemptWithBackoff, "INITIAL_DELAY", 3600.0)
    schema = f"wl_configured_{uuid.uuid4().hex[:8]}"
    setup = await AsyncConnection.connect(postgres_dsn, autocommit=True)
    async with setup:
        await AsyncPostgresBackend.apply_schema(setup, schema=schema)
    pg.reset(postgres_dsn)

    async def configure(conn: Any) -> None:
        await conn.execute(f"SET search_path TO {schema}".encode())
        await conn.commit()

    try:
        # A holder on the configured schema.
        first: AsyncConnectionPool[Any] = AsyncConnectionPool(
            postgres_dsn, min_size=1, max_size=1, open=False, configure=configure
        )
        await first.open(wait=True)
        holder = AsyncPostgresBackend(first, listen=False)
        await AsyncLease(holder, holder_id="a", ttl=60.0).acquire("job")
        # A second backend whose pool loses its connection and will not reconnect soon.
        with proxied(*pg.address(postgres_dsn)) as proxy:
            second: AsyncConnectionPool[Any] = AsyncConnectionPool(
                pg.via(postgres_dsn, proxy.port),
                min_size=1,
                max_size=1,
                open=False,
                configure=configure,
                check=AsyncConnectionPool.check_connection,
                timeout=CUT_TIMEOUT,
            )
            await second.open(wait=True)
            other = AsyncPostgresBackend(second, listen=False)
            lease = AsyncLease(other, holder_id="b", ttl=60.0)
            with pytest.raises(LeaseHeldError):  # served by the pool: the configured table
                await lease.acquire("job")
            proxy.cut()
            await second.check()  # finds its connection gone; the reconnect attempt fails
            while not second.get_stats().get("connections_errors"):
                await asleep(0.01)
            proxy.restore()
            with pytest.raises(LeaseHeldError):  # around the pool: the same table
                await lease.acquire("job")
            assert second.get_stats()["pool_available"] == 0  # the pool did not serve it
            await other.close()
            await second.close()
        await holder.close()
        await first.close()
    finally:
        pg.execute(postgres_dsn, f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def read_only_role(postgres_dsn: str) -> Iterator[str]:
    """A role whose sessions are read-only by default, allowed to use the lease table."""
    role = f"worklease_ro_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        name = sql.Identifier(role)
        conn.execute(  # a server that wants passwords gets one
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(name, sql.Literal(password))
        )
        conn.execute(sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(name))
        conn.execute(sql.SQL("GRANT ALL ON worklease_leases TO {}").format(name))
        conn.execute(sql.SQL("GRANT ALL ON SEQUENCE worklease_fencing_seq TO {}").format(name))
    try:
        yield make_conninfo(postgres_dsn, user=role, password=password)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def test_a_read_only_role_on_a_primary_is_refused_for_good(read_only_role: str) -> None:
    """A standby refuses writes as read-only too, during a failover, and that stays
    transient; on a primary it is the role's setting and retrying never helps."""
    async with AsyncPostgresBackend.connect(read_only_role, max_size=2) as backend:
        lease = AsyncLease(backend, holder_id="h", ttl=30.0)
        with pytest.raises(BackendError) as caught:
            await lease.acquire("read-only")
        assert_permanent(caught.value, "default_transaction_read_only = on", "primary")
