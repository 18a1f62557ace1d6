"""Threads make a hold's final writes themselves when the backend bounds its own calls.

Handing them to a helper thread and waiting for it costs two thread switches per hold,
more than a whole in-memory cycle (ADR-0023). A backend class declares the promise in its own
body (``worklease._deadline.SELF_BOUNDED``); a subclass, or a proxy, makes no such promise
and gets the helper thread, which bounds the wait whatever the calls do.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from worklease import ExitMode, Lease, MemoryBackend, PostgresBackend, Runner, Token, _compat
from worklease._deadline import cutting_off_at, self_bounded
from worklease._sync import postgres as sync_postgres

from .. import pg


class Recorder(MemoryBackend):
    """Records the thread each release runs in (and, with ``delay``, takes its time)."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.release_threads: list[threading.Thread] = []

    def release(self, token: Token, mode: ExitMode) -> None:
        self.release_threads.append(threading.current_thread())
        time.sleep(self.delay)
        super().release(token, mode)


class Delegating:
    """A proxy that passes every attribute through to the backend it wraps."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def no_helper(job: object) -> None:
    raise AssertionError("the final writes went to a helper thread")


def test_the_memory_backend_writes_in_the_calling_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_compat._cleanup_helpers, "submit", no_helper)
    backend = MemoryBackend()
    lease = Lease(backend, holder_id="w", ttl=30)
    runner = Runner(lease, lambda token, prior: b"done")
    runner.run("job")
    with lease.hold("job") as hold:
        assert hold.prior.state == b"done"
        assert hold.prior.prev_exit is ExitMode.FINISHED
        hold.finish_with(b"again")
    assert lease.read_checkpoint(lease.acquire("job")).state == b"again"


def test_the_promise_is_not_inherited_nor_passed_through_a_proxy() -> None:
    assert self_bounded(MemoryBackend())
    assert not self_bounded(Recorder())
    assert not self_bounded(Delegating(MemoryBackend()))


def test_a_subclass_gets_the_helper_thread_and_its_bound() -> None:
    """A subclass whose release takes 3 s: the hold gives up at its 0.6 s cleanup timeout,
    as before (in the calling thread the wait would last the 3 s)."""
    backend = Recorder(delay=3.0)
    lease = Lease(backend, holder_id="w", ttl=30)
    start = time.monotonic()
    with pytest.raises(TimeoutError), lease.hold("slow", cleanup_timeout=0.6):
        pass
    assert time.monotonic() - start < 2.5
    assert backend.release_threads[0] is not threading.current_thread()


def test_a_cleanup_timeout_too_short_for_the_margin_uses_the_helper_thread() -> None:
    """Below twice ``CUT_OFF_MARGIN`` nothing would be left for the writes themselves."""
    seen: list[threading.Thread] = []

    def write() -> None:
        seen.append(threading.current_thread())

    _compat.cleanup(1.0, write, self_bounded=True)
    _compat.cleanup(2 * _compat.CUT_OFF_MARGIN - 0.01, write, self_bounded=True)
    assert seen[0] is threading.current_thread()
    assert seen[1] is not threading.current_thread()


def test_which_postgres_pools_the_promise_covers(postgres_dsn: str) -> None:
    """A pool that checks each connection before handing it out makes a round trip inside
    the checkout, where no cut-off reaches: unless it is the check ``connect()`` installs
    (which the cut-off bounds), the final writes go to the helper thread."""
    plain: ConnectionPool[Any] = ConnectionPool(postgres_dsn, open=False)
    checked: ConnectionPool[Any] = ConnectionPool(
        postgres_dsn, open=False, check=ConnectionPool.check_connection
    )
    assert self_bounded(PostgresBackend(plain))
    assert not self_bounded(PostgresBackend(checked))
    assert self_bounded(PostgresBackend.connect(postgres_dsn))
    assert not self_bounded(
        PostgresBackend.connect(postgres_dsn, check=ConnectionPool.check_connection)
    )


def test_a_connection_cut_off_after_it_answered_never_goes_back(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut comes after the statement answered, before the connection is handed back: the
    call keeps its outcome, and the connection (its socket shut down) is discarded, not
    handed to the next caller."""
    used: list[Any] = []
    real_run = sync_postgres.run_statement

    def answered_then_slow(conn: Any, *args: Any, **kwargs: Any) -> Any:
        outcome = real_run(conn, *args, **kwargs)
        used.append(conn)
        time.sleep(0.6)  # the cut at 0.2 s falls here
        return outcome

    pg.reset(postgres_dsn)
    with (
        ConnectionPool(postgres_dsn, min_size=1, max_size=1, open=False) as pool,
        PostgresBackend(pool) as backend,
    ):
        lease = Lease(backend, holder_id="w", ttl=30)
        token = lease.acquire("cut-late")
        monkeypatch.setattr(sync_postgres, "run_statement", answered_then_slow)
        with cutting_off_at(time.monotonic() + 0.2):
            backend.checkpoint(token, b"kept", 30)
        monkeypatch.undo()
        assert used[0].closed
        assert lease.read_checkpoint(token).state == b"kept"  # served by a new connection
