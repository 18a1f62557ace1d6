"""The thread half of the flavour pairs the generated code is written against.

The generated sync twin imports these where the asyncio source imports their ``a``/``A``
twins from ``_acompat``; shared modules take their locks from here too. Nothing here imports
asyncio, so a program using the thread flavour never loads it.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from ._deadline import bounded_by, cutting_off_at
from .errors import BackendError

__all__ = [
    "BATCH_LINGER",
    "CUT_OFF_MARGIN",
    "RENEWER_LINGER",
    "Abandoned",
    "CancelGuard",
    "Event",
    "HostCanceller",
    "ThreadLock",
    "ThreadRLock",
    "Worker",
    "abandonable",
    "bounded",
    "call",
    "start_pending",
    "cancel_worker",
    "cleanup",
    "join_all",
    "loop_gone",
    "loop_key",
    "shielded",
    "sleep",
    "spawn",
    "spawn_after",
    "start_within",
    "within",
    "worker_alive",
]

logger = logging.getLogger("worklease")

T = TypeVar("T")


ThreadLock = threading.Lock
"""A lock for critical sections that never wait (used by both flavours)."""


ThreadRLock = threading.RLock
"""A re-entrant variant, for stores whose operations compose under one lock."""


# -- sleeping -------------------------------------------------------------------------------


def sleep(seconds: float) -> None:
    time.sleep(max(seconds, 0.0))


# -- events ---------------------------------------------------------------------------------


Event = threading.Event


# -- background workers ---------------------------------------------------------------------


Worker = threading.Thread


def spawn(fn: Callable[..., None], *args: Any, name: str) -> Worker:
    """Run ``fn(*args)`` in a daemon thread (so a stuck call never blocks interpreter exit)."""
    thread = threading.Thread(target=fn, args=args, name=name, daemon=True)
    thread.start()
    return thread


def join_all(workers: Sequence[Worker], timeout: float | None = None) -> bool:
    """Wait until every thread finished; False if ``timeout`` seconds passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for worker in workers:
        worker.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
    return not any(worker.is_alive() for worker in workers)


def spawn_after(
    delay: float,
    fn: Callable[..., None],
    *args: Any,
    name: str,
    unstarted: Callable[[], object] | None = None,
    idle: Callable[[], bool] | None = None,
) -> Worker:
    """A thread is started at once (it lingers between uses, ``RENEWER_LINGER``, so deferring
    its start would save nothing) and always runs: ``unstarted`` and ``idle`` are never
    called."""
    return spawn(fn, *args, name=name)


def start_within(worker: Worker, delay: float) -> None:
    """A thread started already."""


def start_pending(worker: Worker) -> bool:
    """A thread started already."""
    return False


def worker_alive(worker: Worker) -> bool:
    return worker.is_alive()


def cancel_worker(worker: Worker) -> None:
    """Threads cannot be cancelled: a worker thread notices its stop event (or its
    renewal's shed) instead."""


def loop_key() -> object:
    """What shares one background worker: every thread of the process."""
    return None


def loop_gone(key: object) -> bool:
    """The process's threads never close."""
    return False


BATCH_LINGER = 0.002
"""Threads arrive less in step: a batch waits two milliseconds for more to join."""


RENEWER_LINGER = 5.0
"""A thread is not: the renewal thread waits this long for new work before it ends, so a
runner cycling through work IDs starts no thread per cycle."""


# -- calling user code ----------------------------------------------------------------------


def call(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


# -- bounding and shielding calls -----------------------------------------------------------


class Abandoned(Exception):
    """The call was abandoned: nobody wants its result any more."""


def abandonable(
    abandon: Event, check: Callable[[], float | None], fn: Callable[..., T], *args: Any
) -> T:
    """A thread cannot abandon a blocking call: the call runs to its end (and its holders
    learn of a window closing meanwhile from the clock, whenever they look)."""
    return fn(*args)


def shielded(fn: Callable[..., T], *args: Any) -> T:
    """A thread is not cancelled: the call simply runs."""
    return fn(*args)


def bounded(timeout: float | None, fn: Callable[..., T], *args: Any) -> T:
    """A thread cannot abandon a blocking call: the call runs unbounded (the lease window is
    still decided by the clock, and backends bound their own statements)."""
    return fn(*args)


def within(timeout: float, late: Callable[[T], object], fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in a helper thread for at most ``timeout`` seconds, then raise
    ``TimeoutError`` (a thread cannot be interrupted: the call is left to finish).

    Should it still finish with a result, ``late(result)`` runs in the helper thread to undo
    what it did. The call runs in a copy of the caller's context (context variables).
    """
    job = _CleanupJob(contextvars.copy_context().run, (fn, *args), late=late)
    _cleanup_helpers.submit(job)
    if not job.wait(timeout):
        raise TimeoutError(f"call did not finish within {timeout:g}s")
    if job.error is not None:
        raise job.error
    return cast(T, job.result)


CUT_OFF_MARGIN = 0.25
"""Final writes made in the calling thread are asked to end this long before the cleanup
timeout (a pool checkout waits no longer, and a simple query's server-side
``statement_timeout`` ends there, so both keep their connection); a backend cuts a
connection that has still not answered at the timeout itself, which also cancels what it
runs (a prepared statement gets that cancel only)."""


def cleanup(timeout: float, fn: Callable[..., T], *args: Any, self_bounded: bool = False) -> T:
    """Run final writes ``fn(*args)``, handing control back within ``timeout`` seconds.

    ``self_bounded``: every backend call the writes make hands control back by a deadline it
    is given (``worklease._deadline.SELF_BOUNDED``), so they run in the calling thread: they
    are asked to end ``CUT_OFF_MARGIN`` before the timeout and are cut off at it. Otherwise
    (or with a timeout too short to leave that margin) they run in a helper thread, and the
    caller waits for them at most ``timeout`` seconds. Either way ``TimeoutError`` is raised
    at the timeout and the writes' outcome is unknown (each is a single atomic statement, so
    nothing is half-written; a write left in a helper thread finishes or fails on its own).
    Helper threads are daemon threads kept for reuse, so the common case starts no thread.
    """
    if self_bounded and timeout >= 2 * CUT_OFF_MARGIN:
        return _cleanup_here(timeout, fn, args)
    job = _CleanupJob(fn, args)
    _cleanup_helpers.submit(job)
    if not job.done.wait(timeout):
        raise TimeoutError(f"cleanup did not finish within {timeout:g}s")
    if job.error is not None:
        raise job.error
    return cast(T, job.result)


def _cleanup_here(timeout: float, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """Final writes in the calling thread (see ``cleanup``): no hand-over to a helper thread
    and back, which on a busy machine costs more than an in-memory write or a round trip."""
    end = time.monotonic() + timeout
    with cutting_off_at(end), bounded_by(end - CUT_OFF_MARGIN):
        try:
            return fn(*args)
        except BackendError as exc:
            # Ended by its deadline (a statement cancelled, a connection cut off): the
            # timeout a helper thread's caller would have seen. A verdict (fenced, expired)
            # is not a timeout, however late it came.
            if not exc.transient or time.monotonic() < end - CUT_OFF_MARGIN:
                raise
            raise TimeoutError(f"cleanup did not finish within {timeout:g}s") from exc


class _CleanupJob:
    __slots__ = ("_abandoned", "_lock", "args", "done", "error", "fn", "late", "result")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        late: Callable[[Any], object] | None = None,
    ) -> None:
        self.fn = fn
        self.args = args
        self.late = late
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._abandoned = False
        self._lock = threading.Lock()

    def wait(self, timeout: float) -> bool:
        """Wait for the job; False (and the job is abandoned) when ``timeout`` passed first."""
        if self.done.wait(max(timeout, 0.0)):
            return True
        with self._lock:
            if self.done.is_set():
                return True
            self._abandoned = True
            return False

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:
            self.error = exc
        with self._lock:
            self.done.set()
            abandoned = self._abandoned
        if abandoned and self.error is None and self.late is not None:
            try:
                self.late(self.result)
            except Exception as exc:
                logger.warning("worklease: undoing a late call failed: %r", exc)


class _CleanupHelpers:
    """Daemon threads that run final writes; an idle one is reused, a stuck one is left."""

    IDLE_SECONDS = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: list[_CleanupJob] = []
        self._idle = 0
        self._wake = threading.Condition(self._lock)

    def submit(self, job: _CleanupJob) -> None:
        with self._lock:
            self._jobs.append(job)
            # An idle thread leaves the idle count only once it runs again: count the jobs
            # already waiting for one, so two quick submits never share one idle thread.
            if len(self._jobs) <= self._idle:
                self._wake.notify()
                return
        threading.Thread(target=self._serve, name="worklease-cleanup", daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    self._idle += 1
                    woken = self._wake.wait(self.IDLE_SECONDS)
                    self._idle -= 1
                    if not woken and not self._jobs:
                        return  # idle long enough: let the thread go
                job = self._jobs.pop(0)
            job.run()


_cleanup_helpers = _CleanupHelpers()


# -- cancellations lost by third-party waits ------------------------------------------------


class CancelGuard:
    """A thread cannot be cancelled: nothing to lose."""

    __slots__ = ()

    def check(self) -> None:
        pass


# -- cancelling the body of a renewal -------------------------------------------------------


class HostCanceller:
    """A thread cannot be cancelled: loss is reported through flags and the next write."""

    def bind(self) -> None:
        pass

    @property
    def requested(self) -> bool:
        return False

    def cancel(self) -> None:
        pass

    def consume(self, error: BaseException | None) -> bool:
        return False
