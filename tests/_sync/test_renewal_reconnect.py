# Generated from tests/_async/test_renewal_reconnect.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Renewals reconnect at their own pace after an outage, not at psycopg_pool's (issue 13).

The database goes away (a proxy in between drops every connection and refuses new ones)
long enough for the renewal pool's own reconnection delay to double several times (1 s, 2 s,
4 s: its next attempt lands about 7 s after the restore); renewals keep being attempted, as
the renewal loop does. Once the server answers again, the next renewal gets through at once
on a connection of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from time import monotonic

import pytest
from psycopg_pool import ConnectionPool

from tests import pg
from tests._compat import sleep
from tests.proxy import Proxy, proxied
from worklease import BackendError, Lease, PostgresBackend

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

OUTAGE = 8.0
"""Long enough for psycopg_pool's reconnect delay to reach 4 s (attempts at 0, 1, 3, 7 s)."""
RECOVERED_WITHIN = 2.5
"""A renewal after the restore lands within this (the pool on its own: about 7 s)."""


@pytest.fixture
def proxy(postgres_dsn: str) -> Iterator[Proxy]:
    with proxied(*pg.address(postgres_dsn)) as running:
        yield running


def test_a_renewal_after_an_outage_does_not_wait_for_the_pools_backoff(
    postgres_dsn: str, proxy: Proxy
) -> None:
    pg.reset(postgres_dsn)
    dsn = pg.via(postgres_dsn, proxy.port)
    with (
        ConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool,
        PostgresBackend(pool, listen=False) as backend,
    ):
        lease = Lease(backend, holder_id="holder", ttl=60)
        token = lease.acquire("outage")
        backend.renew(token, 60)  # the renewal pool is open and has a connection
        proxy.cut()
        failures: list[BackendError] = []
        outage_ends = monotonic() + OUTAGE
        while monotonic() < outage_ends:
            try:
                backend.renew(token, 60)
            except BackendError as exc:
                failures.append(exc)
            sleep(0.3)
        # Renewals really were attempted, and failed transiently, during the outage.
        assert len(failures) >= 5
        assert all(exc.transient for exc in failures)
        proxy.restore()
        restored = monotonic()
        renewed_after: float | None = None
        late: list[BackendError] = []
        while monotonic() - restored < 15:
            try:
                backend.renew(token, 60)
            except BackendError as exc:
                late.append(exc)
                sleep(0.1)
                continue
            renewed_after = monotonic() - restored
            break
        assert all(exc.transient for exc in late)
        assert renewed_after is not None, "no renewal got through within 15 s of the restore"
        assert renewed_after < RECOVERED_WITHIN
        # The lease is intact: same holder and token, expiry a full TTL ahead.
        ((holder, fencing_token, left),) = pg.execute(
            postgres_dsn,
            "SELECT holder_id, fencing_token, extract(epoch FROM expires_at - now()) "
            "FROM worklease_leases WHERE work_id = 'outage'",
        )
        assert (holder, fencing_token) == ("holder", token.fencing_token)
        assert 50 < float(left) <= 60
