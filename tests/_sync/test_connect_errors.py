# Generated from tests/_async/test_connect_errors.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

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
from psycopg import Connection, sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from tests import pg
from tests._compat import sleep, spawn_all
from tests.proxy import proxied
from worklease import (
    BackendError,
    ConfigError,
    ExitMode,
    Lease,
    LeaseHeldError,
    PostgresBackend,
)
from worklease._sync import postgres as backend_module

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
def test_a_wrong_password_fails_at_once_and_for_good(password_server: str, owned: bool) -> None:
    dsn = password_server + f" password={WRONG}"
    if owned:
        backend = PostgresBackend.connect(dsn, max_size=2, timeout=POOL_TIMEOUT)
    else:
        pool: ConnectionPool[Any] = ConnectionPool(
            dsn, min_size=1, max_size=2, timeout=POOL_TIMEOUT, open=False
        )
        pool.open()  # as an application opens it: not waiting for a connection
        backend = PostgresBackend(pool, listen=False)
    try:
        lease = Lease(backend, holder_id="h", ttl=30.0)
        begin = monotonic()
        with pytest.raises(BackendError) as caught:
            lease.acquire("wrong-password")
        # Well inside the pool's own timeout: the cause was found, not waited out.
        assert monotonic() - begin < POOL_TIMEOUT / 2
        assert_permanent(caught.value, "password authentication failed", "cannot connect")
    finally:
        backend.close()
        if not owned:
            backend.pool.close()


def test_the_right_password_works(password_server: str) -> None:
    backend = PostgresBackend.connect(password_server + f" password={RIGHT}", max_size=2)
    with backend:
        PostgresBackend.apply_schema(backend.pool)
        lease = Lease(backend, holder_id="h", ttl=30.0)
        lease.release(lease.acquire("right-password"), ExitMode.FINISHED)


def test_an_unknown_database_fails_at_once_and_for_good(postgres_dsn: str) -> None:
    dsn = make_conninfo(postgres_dsn, dbname=f"worklease_nowhere_{uuid.uuid4().hex[:8]}")
    with PostgresBackend.connect(dsn, timeout=POOL_TIMEOUT) as backend:
        lease = Lease(backend, holder_id="h", ttl=30.0)
        begin = monotonic()
        with pytest.raises(BackendError) as caught:
            lease.acquire("unknown-database")
        assert monotonic() - begin < POOL_TIMEOUT / 2
        assert_permanent(caught.value, "does not exist")


def test_a_conninfo_libpq_cannot_parse_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not a valid conninfo"):
        PostgresBackend.connect("host=127.0.0.1 password=hunter2 nonsense")
    with pytest.raises(ConfigError) as caught:
        PostgresBackend.connect("postgresql://u:hunter2@127.0.0.1/db?bogus=1")
    assert "hunter2" not in str(caught.value)


def test_connect_with_a_small_max_size_alone(postgres_dsn: str) -> None:
    """psycopg_pool's min_size is 4 by default: max_size=1 alone used to fail."""
    with PostgresBackend.connect(postgres_dsn, max_size=1) as backend:
        assert backend.pool.min_size == 1
        assert backend.pool.max_size == 1
        lease = Lease(backend, holder_id="h", ttl=30.0)
        token = lease.acquire("small-pool")
        lease.checkpoint(token, b"one connection")
        lease.release(token, ExitMode.FINISHED)
    with PostgresBackend.connect(postgres_dsn, max_size=8) as backend:
        assert (backend.pool.min_size, backend.pool.max_size) == (4, 8)


CUT_TIMEOUT = 3.0
"""The pool timeout while the server is unreachable: a call waits this long, then fails."""


def test_writes_go_around_a_pool_that_is_reconnecting(
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
        backend = PostgresBackend.connect(
            dsn, min_size=2, max_size=2, timeout=CUT_TIMEOUT, listen=False
        )
        with backend:
            lease = Lease(backend, holder_id="h", ttl=60.0)
            token = lease.acquire("around")
            lease.checkpoint(token, b"before")
            proxy.cut()  # the server is gone: connections dropped, new ones refused
            with pytest.raises(BackendError) as caught:
                lease.checkpoint(token, b"during")
            assert caught.value.transient  # it may come back
            assert "cannot connect" in str(caught.value)  # why, not a bare PoolTimeout

            # The server comes back while a write waits: the write goes through, in the
            # same call, although the pool will not reconnect for an hour.
            def step(index: int) -> None:
                if index == 0:
                    lease.checkpoint(token, b"resumed")
                else:
                    sleep(1.0)
                    proxy.restore()

            assert spawn_all(step, 2) == [None, None]
            lease.renew(token)
            with lease.transaction(token) as tx:
                tx.connection.execute(b"SELECT 1")
                tx.checkpoint(b"stepped")
            assert (lease.read_checkpoint(token)).state == b"stepped"
            lease.release(token, ExitMode.FINISHED)
            assert backend.pool.get_stats()["pool_available"] == 0  # the pool never came back


def test_a_busy_pool_is_waited_for_even_after_an_old_loss(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool that lost a connection once, served since, and is now busy with the
    application's own work is waited for: no connection of worklease's own is opened."""
    opened: list[str] = []
    real = backend_module._connect_direct

    def counting(pool: Any, timeout: Any, operation: str) -> Any:
        opened.append(operation)
        return real(pool, timeout, operation)

    monkeypatch.setattr(backend_module, "_connect_direct", counting)
    pg.reset(postgres_dsn)
    pool: ConnectionPool[Any] = ConnectionPool(
        postgres_dsn,
        min_size=2,
        max_size=2,
        open=False,
        check=ConnectionPool.check_connection,
    )
    pool.open(wait=True)
    backend = PostgresBackend(pool, listen=False)
    try:
        lease = Lease(backend, holder_id="h", ttl=60.0)
        tokens = [lease.acquire(f"busy-{i}") for i in range(6)]
        # One of the pool's connections is killed while idle: its next check finds it lost.
        pids = pg.execute(
            postgres_dsn,
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state = 'idle'",
        )
        pg.execute(postgres_dsn, "SELECT pg_terminate_backend(%s)", (pids[0][0],))
        for token in tokens:
            lease.checkpoint(token, b"after the loss")
        sleep(1.1)  # the baseline moves past the loss at the next served call
        lease.checkpoint(tokens[0], b"baseline")
        held = [pool.getconn() for _ in range(2)]  # the application is busy

        def writer(index: int) -> None:
            lease.checkpoint(tokens[index], b"waited")

        def free_later(index: int) -> None:
            sleep(1.5)
            for conn in held:
                pool.putconn(conn)

        def step(index: int) -> None:
            if index < len(tokens):
                writer(index)
            else:
                free_later(index)

        assert spawn_all(step, len(tokens) + 1) == [None] * (len(tokens) + 1)
        assert opened == []
    finally:
        backend.close()
        pool.close()


def test_going_around_keeps_the_pool_s_configure(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool whose configure callback sets the search_path: a call that goes around it
    (after an outage, the pool's reconnect an hour away) resolves the same table, so a held
    lease stays held."""
    monkeypatch.setattr(AttemptWithBackoff, "INITIAL_DELAY", 3600.0)
    schema = f"wl_configured_{uuid.uuid4().hex[:8]}"
    setup = Connection.connect(postgres_dsn, autocommit=True)
    with setup:
        PostgresBackend.apply_schema(setup, schema=schema)
    pg.reset(postgres_dsn)

    def configure(conn: Any) -> None:
        conn.execute(f"SET search_path TO {schema}".encode())
        conn.commit()

    try:
        # A holder on the configured schema.
        first: ConnectionPool[Any] = ConnectionPool(
            postgres_dsn, min_size=1, max_size=1, open=False, configure=configure
        )
        first.open(wait=True)
        holder = PostgresBackend(first, listen=False)
        Lease(holder, holder_id="a", ttl=60.0).acquire("job")
        # A second backend whose pool loses its connection and will not reconnect soon.
        with proxied(*pg.address(postgres_dsn)) as proxy:
            second: ConnectionPool[Any] = ConnectionPool(
                pg.via(postgres_dsn, proxy.port),
                min_size=1,
                max_size=1,
                open=False,
                configure=configure,
                check=ConnectionPool.check_connection,
                timeout=CUT_TIMEOUT,
            )
            second.open(wait=True)
            other = PostgresBackend(second, listen=False)
            lease = Lease(other, holder_id="b", ttl=60.0)
            with pytest.raises(LeaseHeldError):  # served by the pool: the configured table
                lease.acquire("job")
            proxy.cut()
            second.check()  # finds its connection gone; the reconnect attempt fails
            while not second.get_stats().get("connections_errors"):
                sleep(0.01)
            proxy.restore()
            with pytest.raises(LeaseHeldError):  # around the pool: the same table
                lease.acquire("job")
            assert second.get_stats()["pool_available"] == 0  # the pool did not serve it
            other.close()
            second.close()
        holder.close()
        first.close()
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


def test_a_read_only_role_on_a_primary_is_refused_for_good(read_only_role: str) -> None:
    """A standby refuses writes as read-only too, during a failover, and that stays
    transient; on a primary it is the role's setting and retrying never helps."""
    with PostgresBackend.connect(read_only_role, max_size=2) as backend:
        lease = Lease(backend, holder_id="h", ttl=30.0)
        with pytest.raises(BackendError) as caught:
            lease.acquire("read-only")
        assert_permanent(caught.value, "default_transaction_read_only = on", "primary")
