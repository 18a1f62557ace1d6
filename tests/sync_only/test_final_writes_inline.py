"""A hold's final writes in the sync flavour: inline on backends that bound their own calls.

The memory and PostgreSQL backends end each call by the deadline set around it, so a hold's
final checkpoint and release run in the calling thread under the cleanup timeout, with no
helper thread per cycle; on the main thread a Ctrl-C arriving meanwhile is held back until
they end. Any other backend (a subclass included) keeps the helper thread.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests import pg
from tests._sync.helpers import close_backend, open_backend
from worklease import ExitMode, Lease, LeaseObserver, MemoryBackend
from worklease.observers import CheckpointEvent, ReleaseEvent


class ThreadsOfWrites(LeaseObserver):
    """Records the thread each checkpoint and release ran in; ``during_checkpoint`` runs in
    the final checkpoint's thread."""

    def __init__(self) -> None:
        self.threads: dict[str, list[int]] = {"checkpoint": [], "release": []}
        self.during_checkpoint: Callable[[], None] | None = None

    def on_checkpoint(self, event: CheckpointEvent) -> None:
        self.threads["checkpoint"].append(threading.get_ident())
        if self.during_checkpoint is not None:
            self.during_checkpoint()

    def on_release(self, event: ReleaseEvent) -> None:
        self.threads["release"].append(threading.get_ident())


class SubclassedMemory(MemoryBackend):
    """A subclass may add waits of its own: it does not inherit the inline final writes."""


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for the test (the case the inline writes hold back)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_hold(lease: Lease, work_id: str) -> None:
    with lease.hold(work_id) as held:
        held.finish_with(b"final")


def in_worker(fn: Callable[[], None]) -> int:
    """Run ``fn`` in a new thread; that thread's ident."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert not errors, errors
    assert thread.ident is not None
    return thread.ident


def test_final_writes_run_in_the_calling_thread(default_sigint: None) -> None:
    observer = ThreadsOfWrites()
    lease = Lease(MemoryBackend(), holder_id="h", ttl=30.0, observer=observer)
    run_hold(lease, "main")
    worker = in_worker(lambda: run_hold(lease, "worker"))
    main = threading.get_ident()
    assert observer.threads == {"checkpoint": [main, worker], "release": [main, worker]}
    rival = Lease(lease.backend, holder_id="rival", ttl=30.0)
    for work_id in ("main", "worker"):
        token = rival.acquire(work_id)
        prior = rival.read_checkpoint(token)
        assert (prior.state, prior.prev_exit) == (b"final", ExitMode.FINISHED)


def test_a_subclass_keeps_the_helper_thread(default_sigint: None) -> None:
    observer = ThreadsOfWrites()
    lease = Lease(SubclassedMemory(), holder_id="h", ttl=30.0, observer=observer)
    run_hold(lease, "job")
    [checkpointed] = observer.threads["checkpoint"]
    assert checkpointed != threading.get_ident()
    assert observer.threads["release"] == [checkpointed]


def test_an_application_sigint_handler_keeps_the_helper_thread() -> None:
    """A SIGINT handler of the application's own is not swapped out: the helper thread runs
    the writes, as before."""
    observer = ThreadsOfWrites()
    lease = Lease(MemoryBackend(), holder_id="h", ttl=30.0, observer=observer)
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        run_hold(lease, "job")
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # left alone
    finally:
        signal.signal(signal.SIGINT, previous)
    assert observer.threads["release"] != [threading.get_ident()]


def test_ctrl_c_during_the_final_writes_is_raised_once_they_end(default_sigint: None) -> None:
    """Ctrl-C arrives during the final checkpoint: the release still lands (FINISHED, with
    the final state), then KeyboardInterrupt is raised, and Python's handler is back."""
    observer = ThreadsOfWrites()
    observer.during_checkpoint = lambda: signal.raise_signal(signal.SIGINT)
    lease = Lease(MemoryBackend(), holder_id="h", ttl=30.0, observer=observer)
    with pytest.raises(KeyboardInterrupt):
        run_hold(lease, "job")
    assert observer.threads["release"] == [threading.get_ident()]  # after the interrupt came
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    rival = Lease(lease.backend, holder_id="rival", ttl=30.0)
    prior = rival.read_checkpoint(rival.acquire("job"))
    assert (prior.state, prior.prev_exit) == (b"final", ExitMode.FINISHED)


@pytest.mark.postgres
def test_inline_final_writes_end_at_the_cleanup_timeout(
    postgres_dsn: str, default_sigint: None
) -> None:
    """On PostgreSQL the final release waits on a row another session locked: it is
    cancelled server-side at the cleanup timeout (TimeoutError, nothing written), in the
    calling thread."""
    pg.reset(postgres_dsn)
    backend = open_backend(postgres_dsn)
    observer = ThreadsOfWrites()
    lease = Lease(backend, holder_id="h", ttl=30.0, observer=observer)
    blocker: Any = psycopg.connect(postgres_dsn)
    try:
        hold = lease.hold("locked", cleanup_timeout=0.5)
        hold.__enter__()
        blocker.execute("SELECT 1 FROM worklease_leases WHERE work_id = 'locked' FOR UPDATE")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            hold.__exit__(None, None, None)
        elapsed = time.monotonic() - started
        assert 0.4 <= elapsed < 5.0, elapsed
        assert observer.threads["release"] == [threading.get_ident()]
        blocker.rollback()
        row = blocker.execute(
            "SELECT exit_mode, expires_at > now() FROM worklease_leases WHERE work_id = 'locked'"
        ).fetchone()
        blocker.rollback()
        assert row == (None, True)  # the release was rolled back: still held, no exit
    finally:
        blocker.close()
        close_backend(backend)
