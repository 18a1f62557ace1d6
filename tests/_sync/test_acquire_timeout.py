# Generated from tests/_async/test_acquire_timeout.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""A waiting acquire's ``timeout`` bounds the backend call in flight too (issue 11, defect 3).

Before, ``acquire(wait=True, timeout=0.5)`` returned only when the call in flight returned:
after 3-4 s behind a row another session had locked, after a whole stall of a backend call.
Now the call is abandoned at the deadline (cancelled with asyncio, left in a helper thread
otherwise), and PostgreSQL ends the statement itself (``statement_timeout``), so it rolls
back instead of committing a grant nobody waits for.
"""

from __future__ import annotations

from collections.abc import Iterator
from time import monotonic
from typing import Any

import pytest
from psycopg import Connection
from psycopg_pool import ConnectionPool

from tests import pg
from tests._compat import sleep, spawn_all
from worklease import AcquireEvent, ExitMode, Lease, LeaseHeldError, PostgresBackend
from worklease.testing import RecordingObserver

from .helpers import ScriptedBackend, lock_waiters

TIMEOUT = 0.5
STALL = 6.0
"""Far longer than the timeout: a wait that ends near TIMEOUT was cut short by it."""
LATE = 2.5
"""A generous upper bound for 'close to the deadline' (the deadline is 0.5 s)."""
SETTLE = 5.0
"""How long the server may take to act on a cancel request on a loaded machine."""


def test_a_stalled_backend_call_ends_at_the_deadline() -> None:
    """The backend stalls for 6 s in the acquire: the waiting acquire still ends with
    TimeoutError close to its 0.5 s deadline, reports the attempt as failed, and leaves no
    grant behind that would block the work ID for a TTL."""
    backend = ScriptedBackend()
    observer = RecordingObserver()
    lease = Lease(backend, holder_id="waiter", ttl=60, observer=observer)
    backend.delay("acquire", STALL)
    start = monotonic()
    with pytest.raises(TimeoutError):
        lease.acquire("stalled", wait=True, timeout=TIMEOUT, poll_interval=0.1)
    elapsed = monotonic() - start
    assert TIMEOUT * 0.9 <= elapsed < LATE, elapsed
    (event,) = observer.events
    assert isinstance(event, AcquireEvent)
    assert event.token is None
    assert isinstance(event.error, TimeoutError)
    # The abandoned call either never granted (cancelled) or its late grant was handed back
    # at once: a rival gets the work ID long before the 60 s TTL.
    rival = Lease(backend, holder_id="rival", ttl=60)
    token = rival.acquire("stalled", wait=True, timeout=STALL + 10, poll_interval=0.1)
    prior = rival.read_checkpoint(token)
    assert prior.prev_exit in (ExitMode.NONE, ExitMode.ABANDONED)


def test_a_slow_attempt_inside_the_timeout_still_succeeds() -> None:
    """A call that answers before the deadline is not abandoned."""
    backend = ScriptedBackend()
    lease = Lease(backend, holder_id="waiter", ttl=60)
    backend.delay("acquire", 0.1)
    token = lease.acquire("slow", wait=True, timeout=5.0)
    assert token.holder_id == "waiter"


def test_the_last_attempt_at_the_deadline_gets_a_fair_chance() -> None:
    """timeout=0 still makes one attempt (a free work ID is acquired)."""
    lease = Lease(ScriptedBackend(), holder_id="waiter", ttl=60)
    token = lease.acquire("free", wait=True, timeout=0)
    assert token.work_id == "free"


def test_a_held_work_id_still_times_out_with_lease_held_as_cause() -> None:
    backend = ScriptedBackend()
    Lease(backend, holder_id="holder", ttl=60).acquire("kept")
    lease = Lease(backend, holder_id="waiter", ttl=60)
    with pytest.raises(TimeoutError) as caught:
        lease.acquire("kept", wait=True, timeout=0.2, poll_interval=0.05)
    assert isinstance(caught.value.__cause__, LeaseHeldError)


# -- PostgreSQL: a row locked by another session ------------------------------------------------


@pytest.fixture
def pg_backend(postgres_dsn: str) -> Iterator[PostgresBackend]:
    pg.reset(postgres_dsn)
    with (
        ConnectionPool(postgres_dsn, min_size=1, max_size=4, open=False) as pool,
        PostgresBackend(pool) as backend,
    ):
        yield backend


@pytest.mark.postgres
@pytest.mark.parametrize("reading", [False, True], ids=["acquire", "hold"])
def test_a_locked_row_ends_the_wait_at_the_deadline(
    pg_backend: PostgresBackend, postgres_dsn: str, reading: bool
) -> None:
    """Another session holds the lease row locked (a long transaction): the waiting acquire
    ends with TimeoutError close to its deadline, the server ends the statement (no session
    is left waiting on the lock, within SETTLE s of the call's end), and nothing was granted:
    the row is unchanged when the blocker lets go. The blocker lets go after 11 s in any
    case, so a regression fails on the elapsed time instead of hanging."""
    owner = Lease(pg_backend, holder_id="owner", ttl=60)
    first = owner.acquire("locked")
    owner.release(first, ExitMode.FINISHED)  # free, but the row exists to be locked
    waiter = Lease(pg_backend, holder_id="waiter", ttl=60)
    outcome: dict[str, Any] = {}
    with (
        Connection.connect(postgres_dsn) as blocker,
        Connection.connect(postgres_dsn, autocommit=True) as watcher,
    ):
        blocker.execute("SELECT 1 FROM worklease_leases WHERE work_id = %s FOR UPDATE", ("locked",))

        def side(index: int) -> None:
            if index == 0:
                start = monotonic()
                try:
                    if reading:  # the path of hold() and the runner: the checkpoint comes along
                        with waiter.hold("locked", wait=True, timeout=TIMEOUT):
                            raise AssertionError("acquired a row another session locked")
                    else:
                        waiter.acquire("locked", wait=True, timeout=TIMEOUT)
                except TimeoutError as exc:
                    outcome["error"] = exc
                outcome["elapsed"] = monotonic() - start
                # The server ends the statement on the cancel request, which it handles a
                # moment after the call returned (later on a loaded machine): polled, with
                # the row still locked, so a session left waiting on it shows for SETTLE s.
                waiters = lock_waiters(watcher)
                for _ in range(int(SETTLE / 0.05)):
                    if not waiters:
                        break
                    sleep(0.05)
                    waiters = lock_waiters(watcher)
                outcome["waiters"] = waiters
                return
            for _ in range(int((STALL + SETTLE) / 0.05)):
                if "waiters" in outcome:
                    break
                sleep(0.05)
            blocker.rollback()

        spawn_all(side, 2)
    assert isinstance(outcome.get("error"), TimeoutError), outcome
    assert TIMEOUT * 0.9 <= outcome["elapsed"] < LATE, outcome
    assert outcome["waiters"] == 0  # the server ended the statement: nobody waits on the row
    rows = pg.execute(
        postgres_dsn,
        "SELECT holder_id, fencing_token FROM worklease_leases WHERE work_id = %s",
        ("locked",),
    )
    assert rows == [("owner", first.fencing_token)]  # rolled back: nothing granted
