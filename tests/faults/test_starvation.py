"""Starved renewals: the event loop blocked, the renewal thread starved or stuck.

Whatever starves the renewal, the outcome must be the same: the lease lapses in the database
(another holder acquires it), the next write through the stale token is refused (fenced by the
database, or refused by the lease without I/O once the loss is known), ``remaining()`` never
claims time that is not there and is ``None`` once the loss is known, and the block raises a
``LeaseLostError`` instead of ending as if all was well.

How the starvation is produced:

* asyncio: a blocking ``time.sleep(2 * TTL)`` inside the ``async with lease.renewal(...)``
  body, either while the renewal task idles between attempts or while one of its attempts is
  in flight (awaiting the database).
* sync, CPU-bound thread: ``sys.setswitchinterval(30)`` plus a busy loop in another thread. A
  thread waiting for the GIL only asks the running thread to drop it after the switch
  interval, so the busy thread keeps the GIL and the renewal thread cannot run at all.
* sync, stuck renewal thread: a backend whose ``renew`` blocks on a gate, so an attempt that
  began inside the window cannot finish (deterministic, no GIL games).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pytest

from tests import pg
from tests.faults import audit
from worklease import (
    AsyncLease,
    AsyncMemoryBackend,
    AsyncPostgresBackend,
    ExitMode,
    FencedError,
    Lease,
    LeaseLostError,
    LeaseWindowExhaustedError,
    PostgresBackend,
    Token,
)
from worklease._compat import sleep
from worklease.observers import RenewEvent
from worklease.testing import RecordingObserver

pytestmark = [pytest.mark.postgres, pytest.mark.faults]

TTL = 1.0
INTERVAL = TTL / 5
WAIT = 15.0


# -- helpers ------------------------------------------------------------------------------------


def db_expired(dsn: str, work_id: str) -> bool:
    (expired,) = pg.execute(
        dsn, "SELECT expires_at < now() FROM worklease_leases WHERE work_id = %s", (work_id,)
    )[0]
    return bool(expired)


def renewed_ok(observer: RecordingObserver, token: Token) -> int:
    return sum(
        1 for event in observer.of_type(RenewEvent) if event.token == token and event.error is None
    )


def wait_until(condition: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        sleep(0.01)


async def await_until(condition: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.01)


def stale_updates_after_takeover(dsn: str, work_id: str, stale: Token, successor: Token) -> int:
    """Accepted changes made with the stale token after the successor's grant."""
    history = audit.rows(dsn, work_id)
    granted = next(i for i, row in enumerate(history) if row.new_token == successor.fencing_token)
    return sum(1 for row in history[granted:] if row.new_token == stale.fencing_token)


def take_over(dsn: str, work_id: str, stale: Token) -> Token:
    """Another holder acquires the lapsed lease (a separate backend and pool)."""
    with PostgresBackend.connect(dsn, min_size=1, max_size=1) as backend:
        token = Lease(backend, holder_id="rival", ttl=30.0).acquire(work_id)
    assert token.fencing_token > stale.fencing_token
    return token


# -- asyncio: the event loop blocked -------------------------------------------------------------


async def test_blocked_event_loop_loses_the_lease(cluster_dsn: str) -> None:
    audit.install(cluster_dsn)
    observer = RecordingObserver()
    write_error: list[BaseException] = []
    async with AsyncPostgresBackend.connect(cluster_dsn, min_size=1, max_size=4) as backend:
        lease = AsyncLease(backend, holder_id="starved", ttl=TTL, observer=observer)
        token = await lease.acquire("work")
        with pytest.raises(LeaseLostError) as lost:  # noqa: PT012
            async with lease.renewal(token, interval=INTERVAL) as renewal:
                await await_until(lambda: renewed_ok(observer, token) >= 1, "a renewal")
                await lease.checkpoint(token, b"before")
                time.sleep(2 * TTL)  # noqa: ASYNC251 -- blocks the loop: no renewal can run
                left = renewal.remaining()
                assert not left, f"remaining() claims {left}s after the window closed"
                assert db_expired(cluster_dsn, "work")
                successor = take_over(cluster_dsn, "work", token)  # still blocking the loop
                try:
                    await lease.checkpoint(token, b"stale")
                except LeaseLostError as exc:
                    write_error.append(exc)
                for _ in range(int(WAIT / 0.01)):  # the renewal finds the loss and cancels us
                    await asyncio.sleep(0.01)
                pytest.fail("the block went on as if the lease were still held")
        # Fenced (the rival came first), lapsed (the renewal came first), or loss by window (an
        # attempt was in flight when the starvation began).
        assert isinstance(lost.value, FencedError | LeaseWindowExhaustedError)
        assert renewal.cause is lost.value
        assert renewal.remaining() is None
        if write_error:  # the body's write reached the database before the cancellation
            assert isinstance(write_error[0], FencedError | LeaseWindowExhaustedError)
        with pytest.raises(LeaseLostError):
            await lease.checkpoint(token, b"later")  # refused without I/O
    assert stale_updates_after_takeover(cluster_dsn, "work", token, successor) == 0
    assert audit.stale_writes(cluster_dsn) == 0


class SignallingBackend(AsyncPostgresBackend):
    """Sets ``renewing`` when a renewal attempt starts."""

    renewing: asyncio.Event

    async def renew(self, token: Token, ttl: float) -> None:
        self.renewing.set()
        await super().renew(token, ttl)


async def test_event_loop_blocked_during_a_renewal_attempt(cluster_dsn: str) -> None:
    """Blocked while an attempt awaits the database: loss by window, known at once."""
    audit.install(cluster_dsn)
    backend = SignallingBackend.connect(cluster_dsn, min_size=1, max_size=4)
    assert isinstance(backend, SignallingBackend)
    backend.renewing = asyncio.Event()
    async with backend:
        lease = AsyncLease(backend, holder_id="starved", ttl=TTL)
        token = await lease.acquire("work")
        with pytest.raises(LeaseWindowExhaustedError) as lost:  # noqa: PT012
            async with lease.renewal(token, interval=INTERVAL) as renewal:
                await asyncio.wait_for(backend.renewing.wait(), WAIT)
                await asyncio.sleep(0)  # let the attempt reach the driver
                time.sleep(2 * TTL)  # noqa: ASYNC251 -- the attempt cannot complete
                assert renewal.remaining() is None
                assert renewal.lost
                with pytest.raises(LeaseWindowExhaustedError):
                    renewal.raise_if_lost()
                with pytest.raises(LeaseWindowExhaustedError):
                    await lease.checkpoint(token, b"stale")  # refused without I/O
                assert db_expired(cluster_dsn, "work")
                successor = take_over(cluster_dsn, "work", token)
                for _ in range(int(WAIT / 0.01)):
                    await asyncio.sleep(0.01)
                pytest.fail("the block went on as if the lease were still held")
        assert renewal.cause is lost.value
    assert stale_updates_after_takeover(cluster_dsn, "work", token, successor) == 0
    assert audit.stale_writes(cluster_dsn) == 0


async def test_window_closing_while_renewal_starved_between_attempts_is_a_loss() -> None:
    """No database needed: the renewal task is due (interval < TTL) but never gets to run."""
    lease = AsyncLease(AsyncMemoryBackend(), holder_id="starved", ttl=0.3)
    token = await lease.acquire("work")
    with pytest.raises(LeaseLostError):  # noqa: PT012
        async with lease.renewal(token, interval=0.05) as renewal:
            time.sleep(0.6)  # noqa: ASYNC251 -- the renewal was due many times; none ran
            assert renewal.remaining() is None  # observed: 0.0
            assert renewal.lost  # observed: False, raise_if_lost() silent
            await asyncio.sleep(1.0)


# -- sync: the renewal thread starved or stuck -----------------------------------------------------


def busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_cpu_bound_thread_starves_the_renewal_thread(cluster_dsn: str) -> None:
    audit.install(cluster_dsn)
    observer = RecordingObserver()
    with PostgresBackend.connect(cluster_dsn, min_size=1, max_size=4) as backend:
        lease = Lease(backend, holder_id="starved", ttl=TTL, observer=observer)
        token = lease.acquire("work")
        with (  # noqa: PT012
            pytest.raises(LeaseLostError) as lost,
            lease.renewal(token, interval=INTERVAL) as renewal,
        ):
            wait_until(lambda: renewed_ok(observer, token) >= 1, "a renewal")
            lease.checkpoint(token, b"before")
            renewals_before = renewed_ok(observer, token)
            previous = sys.getswitchinterval()
            sys.setswitchinterval(30.0)
            try:
                hog = threading.Thread(target=busy, args=(2.5 * TTL,), daemon=True)
                hog.start()
                hog.join(WAIT)
            finally:
                sys.setswitchinterval(previous)
            left = renewal.remaining()
            assert not left, f"remaining() claims {left}s after the window closed"
            # The starvation was real: no renewal succeeded while the hog ran.
            assert renewed_ok(observer, token) == renewals_before
            assert db_expired(cluster_dsn, "work")
            successor = take_over(cluster_dsn, "work", token)
            wait_until(lambda: renewal.lost, "the renewal thread to find the loss")
            assert renewal.remaining() is None
            with pytest.raises(LeaseLostError):
                lease.checkpoint(token, b"stale")
        # Fenced (the rival came first), lapsed (the renewal came first), or loss by window (an
        # attempt was in flight when the starvation began).
        assert isinstance(lost.value, FencedError | LeaseWindowExhaustedError)
        assert renewal.remaining() is None
        with pytest.raises(LeaseLostError):
            lease.release(token, ExitMode.FINISHED)
    assert stale_updates_after_takeover(cluster_dsn, "work", token, successor) == 0
    assert audit.stale_writes(cluster_dsn) == 0


class GatedBackend(PostgresBackend):
    """``renew`` blocks while ``gate`` is closed (a stuck renewal thread)."""

    gate: threading.Event
    entered: threading.Event

    def renew(self, token: Token, ttl: float) -> None:
        self.entered.set()
        self.gate.wait(WAIT)
        super().renew(token, ttl)


def test_stuck_renewal_thread_never_claims_the_lease(cluster_dsn: str) -> None:
    audit.install(cluster_dsn)
    observer = RecordingObserver()
    backend = GatedBackend.connect(cluster_dsn, min_size=1, max_size=4)
    assert isinstance(backend, GatedBackend)
    backend.gate = threading.Event()
    backend.entered = threading.Event()
    backend.gate.set()
    samples: list[tuple[float, bool]] = []
    with backend:
        lease = Lease(backend, holder_id="stuck", ttl=TTL, observer=observer)
        token = lease.acquire("work")
        with (  # noqa: PT012
            pytest.raises(LeaseWindowExhaustedError) as lost,
            lease.renewal(token, interval=INTERVAL) as renewal,
        ):
            wait_until(lambda: renewed_ok(observer, token) >= 1, "a renewal")
            backend.gate.clear()
            backend.entered.clear()
            assert backend.entered.wait(WAIT), "no renewal attempt started"
            deadline = time.monotonic() + 3 * TTL
            while (left := renewal.remaining()) is not None:
                samples.append((left, not db_expired(cluster_dsn, "work")))
                assert time.monotonic() < deadline, "the window never closed"
            assert renewal.lost
            with pytest.raises(LeaseWindowExhaustedError):
                renewal.raise_if_lost()
            with pytest.raises(LeaseWindowExhaustedError):
                lease.checkpoint(token, b"stale")  # refused without I/O
            wait_until(lambda: db_expired(cluster_dsn, "work"), "the database expiry")
            successor = take_over(cluster_dsn, "work", token)
            backend.gate.set()  # the stuck attempt now reaches the database: fenced
            wait_until(
                lambda: any(isinstance(e.error, FencedError) for e in observer.of_type(RenewEvent)),
                "the late renewal to be fenced",
            )
        assert renewal.cause is lost.value
        assert renewal.remaining() is None
    assert samples, "no sample taken while the window was open"
    # Every sample claiming time left was taken while the database still held the lease (the
    # database check follows the claim, so a claim of more than a few ms must still hold).
    false_claims = [left for left, held in samples if left > 0.05 and not held]
    assert false_claims == []
    assert all(left <= TTL for left, _ in samples)
    assert stale_updates_after_takeover(cluster_dsn, "work", token, successor) == 0
    assert audit.stale_writes(cluster_dsn) == 0
