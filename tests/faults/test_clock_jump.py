"""The client's wall clock off by ±1 h (from the start, or jumping while a lease is held).

Expiry is decided by the database clock and the lease window by the monotonic clock, so the
client's wall clock should change nothing. The client clock is simulated by replacing the
``datetime`` the library reads the wall clock through on the client side
(``worklease._pacing``, which paces a waiting acquire; the lease window no longer reads the
wall clock at all); the database, and the memory backend's own clock, keep real time.

This suite found that a client clock 1 h *ahead* used to empty the initial lease window (the
token's expiry was converted through the wall clock); the window now comes from the
monotonic clock only, and every offset below behaves the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, tzinfo

import pytest

from tests import pg
from tests.faults import audit
from worklease import (
    BackendError,
    Backoff,
    ExitMode,
    Lease,
    LeaseHeldError,
    MemoryBackend,
    PostgresBackend,
    Token,
    _pacing,
)
from worklease._compat import sleep
from worklease.observers import RenewEvent
from worklease.testing import RecordingObserver

pytestmark = [pytest.mark.postgres, pytest.mark.faults]

TTL = 1.0
HOUR = timedelta(hours=1)


class SkewedClock:
    """Stands in for ``datetime`` where the library reads the client's wall clock."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self, tz: tzinfo | None = None) -> datetime:
        return datetime.now(tz) + self.offset


@pytest.fixture
def client_clock(monkeypatch: pytest.MonkeyPatch) -> SkewedClock:
    clock = SkewedClock()
    monkeypatch.setattr(_pacing, "datetime", clock)
    return clock


@pytest.fixture
def backend(cluster_dsn: str) -> Iterator[PostgresBackend]:
    audit.install(cluster_dsn)
    with PostgresBackend.connect(cluster_dsn, min_size=1, max_size=4) as backend:
        yield backend


def db_now(dsn: str) -> datetime:
    value: datetime = pg.execute(dsn, "SELECT now()")[0][0]
    return value


def row(dsn: str, work_id: str) -> tuple[str, int, datetime, datetime]:
    holder, token, expires_at, updated_at = pg.execute(
        dsn,
        "SELECT holder_id, fencing_token, expires_at, updated_at FROM worklease_leases"
        " WHERE work_id = %s",
        (work_id,),
    )[0]
    return holder, token, expires_at, updated_at


def renewals(observer: RecordingObserver, token: Token) -> list[RenewEvent]:
    return [event for event in observer.of_type(RenewEvent) if event.token == token]


def wait_until(condition: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        sleep(0.01)


ALL_OFFSETS = [
    pytest.param(+HOUR, id="ahead"),
    pytest.param(-HOUR, id="behind"),
    pytest.param(timedelta(0), id="exact"),
]
SKEWED = [pytest.param(+HOUR, id="ahead"), pytest.param(-HOUR, id="behind")]
WINDOW_OFFSETS = [
    pytest.param(+HOUR, id="ahead"),
    pytest.param(-HOUR, id="behind"),
    pytest.param(timedelta(0), id="exact"),
]


@pytest.mark.parametrize("offset", WINDOW_OFFSETS)
def test_initial_window_is_the_ttl(
    backend: PostgresBackend, client_clock: SkewedClock, offset: timedelta
) -> None:
    client_clock.offset = offset
    lease = Lease(backend, holder_id="holder", ttl=TTL)
    token = lease.acquire("work")
    with lease.renewal(token) as renewal:
        left = renewal.remaining()
        assert left is not None
        assert TTL / 2 < left <= TTL, f"initial window {left}s for a {TTL}s lease"
    lease.release(token, ExitMode.FINISHED)


@pytest.mark.parametrize("offset", WINDOW_OFFSETS)
def test_first_renewal_failure_is_retried(client_clock: SkewedClock, offset: timedelta) -> None:
    """One transient failure of the first renewal attempt is retried, not a loss."""

    class FlakyOnce(MemoryBackend):  # the memory backend keeps real (server) time
        failed = False

        def renew(self, token: Token, ttl: float) -> None:
            if not self.failed:
                self.failed = True
                raise BackendError("connection reset (injected)", transient=True)
            super().renew(token, ttl)

    client_clock.offset = offset
    observer = RecordingObserver()
    lease = Lease(FlakyOnce(), holder_id="holder", ttl=1.0, observer=observer)
    token = lease.acquire("work")
    with lease.renewal(token, interval=0.3, backoff=Backoff(0.05, 0.05, 0.0)) as renewal:
        wait_until(
            lambda: renewal.lost or len(renewals(observer, token)) >= 3, "three renewal attempts"
        )
        renewal.raise_if_lost()
    assert [e.error is None for e in renewals(observer, token)[:2]] == [False, True]


@pytest.mark.parametrize("offset", SKEWED)
def test_holder_keeps_its_lease_across_renewals(
    backend: PostgresBackend, client_clock: SkewedClock, cluster_dsn: str, offset: timedelta
) -> None:
    client_clock.offset = offset
    observer = RecordingObserver()
    lease = Lease(backend, holder_id="holder", ttl=TTL, observer=observer)
    rival = Lease(backend, holder_id="rival", ttl=TTL)
    token = lease.acquire("work")
    samples: list[float | None] = []
    with lease.renewal(token, interval=TTL / 4) as renewal:
        wait_until(lambda: renewals(observer, token), "a first renewal")
        deadline = time.monotonic() + 2 * TTL
        while time.monotonic() < deadline:
            samples.append(renewal.remaining())
            sleep(0.02)
        with pytest.raises(LeaseHeldError) as held:
            rival.acquire("work")
        assert held.value.expires_at is not None
        assert held.value.expires_at > db_now(cluster_dsn)
        lease.checkpoint(token, b"still mine")
        renewal.raise_if_lost()
    assert not renewal.lost
    assert all(left is not None and 0 < left <= TTL for left in samples), samples
    assert all(event.error is None for event in renewals(observer, token))
    assert len(renewals(observer, token)) >= 5
    assert row(cluster_dsn, "work")[:2] == ("holder", token.fencing_token)
    lease.release(token, ExitMode.FINISHED)
    rival.release(rival.acquire("work"), ExitMode.FINISHED)  # released: acquirable at once
    assert audit.stale_writes(cluster_dsn) == 0


@pytest.mark.parametrize("offset", ALL_OFFSETS)
def test_takeover_only_after_real_expiry(
    backend: PostgresBackend, client_clock: SkewedClock, cluster_dsn: str, offset: timedelta
) -> None:
    client_clock.offset = offset
    lease = Lease(backend, holder_id="crashed", ttl=TTL)
    # The rival's own TTL does not decide when it may take over (the crashed holder's does);
    # a long one keeps its grant alive through the checks below on a loaded machine.
    rival = Lease(backend, holder_id="rival", ttl=30 * TTL)
    token = lease.acquire("work")  # never renewed: the holder "crashed"
    sleep(TTL / 2)
    with pytest.raises(LeaseHeldError):
        rival.acquire("work")
    started = time.monotonic()
    successor = rival.acquire("work", wait=True, timeout=5 * TTL, poll_interval=0.25)
    waited = time.monotonic() - started
    _, _, _, granted_at = row(cluster_dsn, "work")
    assert successor.fencing_token > token.fencing_token
    assert granted_at > token.expires_at  # database time: only after the real expiry
    assert granted_at - token.expires_at < timedelta(seconds=1.5)  # and promptly
    assert waited < 3 * TTL
    rival.release(successor, ExitMode.FINISHED)
    assert audit.stale_writes(cluster_dsn) == 0


@pytest.mark.parametrize(
    "offset", [pytest.param(+HOUR, id="ahead"), pytest.param(-HOUR, id="behind")]
)
def test_clock_jump_while_holding(
    backend: PostgresBackend, client_clock: SkewedClock, cluster_dsn: str, offset: timedelta
) -> None:
    observer = RecordingObserver()
    lease = Lease(backend, holder_id="holder", ttl=TTL, observer=observer)
    token = lease.acquire("work")
    samples: list[float | None] = []
    with lease.renewal(token, interval=TTL / 4) as renewal:
        wait_until(lambda: renewals(observer, token), "a first renewal")
        for jump in (offset, timedelta(0), offset):  # jump, jump back, jump again
            client_clock.offset = jump
            deadline = time.monotonic() + TTL
            while time.monotonic() < deadline:
                samples.append(renewal.remaining())
                sleep(0.02)
            lease.checkpoint(token, str(jump).encode())
        renewal.raise_if_lost()
    assert all(left is not None and 0 < left <= TTL for left in samples), samples
    assert all(event.error is None for event in renewals(observer, token))
    assert row(cluster_dsn, "work")[:2] == ("holder", token.fencing_token)
    lease.release(token, ExitMode.FINISHED)
    assert audit.stale_writes(cluster_dsn) == 0
