"""The one place that touches asyncio and threading: async/sync pairs for the generated code.

Each async helper (prefixed ``a``/``A``) has a sync twin with the plain name; the generator
(``scripts/unasync.py``) renames one to the other. Call wrappers (``abounded``/``bounded``,
``acleanup``/``cleanup``) take the function and its arguments, so the same source line reads
correctly in both flavours.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar, cast

__all__ = [
    "ABATCH_LINGER",
    "ACancelGuard",
    "ARENEWER_LINGER",
    "BATCH_LINGER",
    "Abandoned",
    "CancelGuard",
    "RENEWER_LINGER",
    "AEvent",
    "AHostCanceller",
    "ADeferredWorker",
    "AWorker",
    "Event",
    "HostCanceller",
    "ThreadLock",
    "ThreadRLock",
    "Worker",
    "aabandonable",
    "abandonable",
    "abounded",
    "acall",
    "acancel_start",
    "acancel_worker",
    "acleanup",
    "aloop_key",
    "aspawn_after",
    "astart_within",
    "ajoin_all",
    "ashielded",
    "asleep",
    "aspawn",
    "awithin",
    "aworker_alive",
    "bounded",
    "call",
    "cancel_start",
    "cancel_worker",
    "cleanup",
    "join_all",
    "shielded",
    "loop_key",
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


async def asleep(seconds: float) -> None:
    await asyncio.sleep(max(seconds, 0.0))


def sleep(seconds: float) -> None:
    time.sleep(max(seconds, 0.0))


# -- events ---------------------------------------------------------------------------------


class AEvent(asyncio.Event):
    """An event whose ``wait_timeout`` returns like ``threading.Event.wait``."""

    def __init__(self) -> None:
        super().__init__()
        try:
            self._home: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._home = None

    def set_threadsafe(self) -> None:
        """Set the event from any thread (``set`` must run on the loop that waits).

        From another thread than the loop the event was created on, the set is handed to
        that loop; a loop already closed has nobody left to wake.
        """
        home = self._home
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if home is None or running is home:
            self.set()
            return
        try:
            home.call_soon_threadsafe(self.set)
        except RuntimeError:
            pass  # the loop is closed

    async def wait_timeout(self, timeout: float | None = None) -> bool:
        """Wait until set or ``timeout`` seconds passed; return whether it is set."""
        if self.is_set():
            return True
        if timeout is None:
            await self.wait()
            return True
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                await self.wait()
        except TimeoutError:
            return self.is_set()
        return True


Event = threading.Event

# -- background workers ---------------------------------------------------------------------

AWorker = asyncio.Task[None]
Worker = threading.Thread


def aspawn(fn: Callable[..., Coroutine[Any, Any, None]], *args: Any, name: str) -> AWorker:
    """Run ``fn(*args)`` as a task on the running loop."""
    return asyncio.get_running_loop().create_task(fn(*args), name=name)


def spawn(fn: Callable[..., None], *args: Any, name: str) -> Worker:
    """Run ``fn(*args)`` in a daemon thread (so a stuck call never blocks interpreter exit)."""
    thread = threading.Thread(target=fn, args=args, name=name, daemon=True)
    thread.start()
    return thread


async def ajoin_all(workers: Sequence[AWorker], timeout: float | None = None) -> bool:
    """Wait until every task finished; False if ``timeout`` seconds passed first."""
    if not workers:
        return True
    _, pending = await asyncio.wait(workers, timeout=timeout)
    return not pending


def join_all(workers: Sequence[Worker], timeout: float | None = None) -> bool:
    """Wait until every thread finished; False if ``timeout`` seconds passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for worker in workers:
        worker.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
    return not any(worker.is_alive() for worker in workers)


class ADeferredWorker:
    """A task started only when it is first needed: ``delay`` seconds from now (sooner with
    ``astart_within``), unless ``acancel_start`` comes first, in which case it never runs.
    A renewal that ends before its first attempt is due (a short hold, a runner's cycle)
    then costs a timer, not a task and the turns of the loop that start and end it."""

    __slots__ = ("_args", "_at", "_fn", "_loop", "_name", "_task", "_timer")

    def __init__(
        self, delay: float, fn: Callable[..., Coroutine[Any, Any, None]], args: Any, name: str
    ) -> None:
        self._fn = fn
        self._args = args
        self._name = name
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0
        self._arm(delay)

    def _arm(self, delay: float) -> None:
        if delay <= 0:
            self._start()
        else:
            self._at = self._loop.time() + delay
            self._timer = self._loop.call_at(self._at, self._start)

    def _start(self) -> None:
        self._timer = None
        if self._task is None:
            self._task = aspawn(self._fn, *self._args, name=self._name)

    def done(self) -> bool:
        return self._timer is None and (self._task is None or self._task.done())

    def start_within(self, delay: float) -> None:
        if self._timer is not None and self._loop.time() + delay < self._at:
            self._timer.cancel()
            self._timer = None
            self._arm(delay)

    def cancel_start(self) -> bool:
        if self._timer is None:
            return False
        self._timer.cancel()
        self._timer = None
        return True


def aspawn_after(
    delay: float, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any, name: str
) -> ADeferredWorker:
    """Run ``fn(*args)`` as a task on the running loop ``delay`` seconds from now."""
    return ADeferredWorker(delay, fn, args, name)


def spawn_after(delay: float, fn: Callable[..., None], *args: Any, name: str) -> Worker:
    """A thread is started at once: it lingers between uses (``RENEWER_LINGER``), so
    deferring its start would save nothing."""
    return spawn(fn, *args, name=name)


def astart_within(worker: ADeferredWorker, delay: float) -> None:
    """Start a deferred task no later than ``delay`` seconds from now."""
    worker.start_within(delay)


def start_within(worker: Worker, delay: float) -> None:
    """A thread started already."""


def acancel_start(worker: ADeferredWorker) -> bool:
    """Cancel a deferred task that has not started yet; whether it was cancelled so."""
    return worker.cancel_start()


def cancel_start(worker: Worker) -> bool:
    """A thread started already."""
    return False


def aworker_alive(worker: AWorker | ADeferredWorker) -> bool:
    """Whether the task has not finished (a task cancelled before it started never runs)."""
    return not worker.done()


def worker_alive(worker: Worker) -> bool:
    return worker.is_alive()


def acancel_worker(worker: AWorker) -> None:
    """Cancel a task without waiting for it."""
    worker.cancel()


def cancel_worker(worker: Worker) -> None:
    """Threads cannot be cancelled: a worker thread notices its stop event (or its
    renewal's shed) instead."""


def aloop_key() -> object:
    """What shares one background worker: the running event loop."""
    return asyncio.get_running_loop()


def loop_key() -> object:
    """What shares one background worker: every thread of the process."""
    return None


ABATCH_LINGER = 0.0
"""How long a batch waits for more to join: one turn of the event loop (every task woken
together, a pool's cancelled slots, gets there first)."""

BATCH_LINGER = 0.002
"""Threads arrive less in step: a batch waits two milliseconds for more to join."""

ARENEWER_LINGER = 0.0
"""A task is cheap to start again: the renewal task ends as soon as nothing is renewed."""

RENEWER_LINGER = 5.0
"""A thread is not: the renewal thread waits this long for new work before it ends, so a
runner cycling through work IDs starts no thread per cycle."""

# -- calling user code ----------------------------------------------------------------------


def acall(fn: Callable[..., T | Awaitable[T]], *args: Any) -> Awaitable[T]:
    """Call ``fn``; await what this returns to get its result (sync or async callables).

    An async ``fn``'s own awaitable is handed back as it is, so awaiting it costs no
    coroutine frame of this helper (a pool keeps one such call waiting per held lease)."""
    result = fn(*args)
    if inspect.isawaitable(result):
        return cast(Awaitable[T], result)
    return _ready(result)


async def _ready(value: T) -> T:
    return value


def call(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


# -- bounding and shielding calls -----------------------------------------------------------


async def abounded(timeout: float | None, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Await ``fn(*args)`` for at most ``timeout`` seconds (``None``: no bound).

    On timeout the call is abandoned at once: it is cancelled in the background (a driver may
    take its time to cancel a query; nobody waits for it) and ``TimeoutError`` is raised.
    """
    if timeout is None:
        return await fn(*args)
    return await awithin(timeout, None, fn, *args)


class Abandoned(Exception):
    """The call was abandoned: nobody wants its result any more."""


async def aabandonable(
    abandon: AEvent,
    check: Callable[[], float | None],
    fn: Callable[..., Awaitable[T]],
    *args: Any,
) -> T:
    """Await ``fn(*args)`` unless ``abandon`` is set first: the call is then cancelled in the
    background and ``Abandoned`` raised. Meanwhile ``check()`` runs whenever the seconds it
    returned (``None``: no need) have passed."""
    task = asyncio.ensure_future(fn(*args))
    watcher = asyncio.ensure_future(abandon.wait())
    try:
        while True:
            timeout = check()
            if abandon.is_set():
                break  # abandoned by the check itself: cancel the call before anything else
            done, _ = await asyncio.wait(
                (task, watcher), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                break
    except asyncio.CancelledError:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        task.add_done_callback(_retrieve)
        raise Abandoned
    return task.result()


def abandonable(
    abandon: Event, check: Callable[[], float | None], fn: Callable[..., T], *args: Any
) -> T:
    """A thread cannot abandon a blocking call: the call runs to its end (and its holders
    learn of a window closing meanwhile from the clock, whenever they look)."""
    return fn(*args)


async def ashielded(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Await ``fn(*args)`` in a task of its own that a cancellation of the caller does not
    reach: the call runs to its end (others may be waiting for it) and the caller's
    cancellation is raised at once."""
    task = asyncio.ensure_future(fn(*args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_retrieve)
        raise


def shielded(fn: Callable[..., T], *args: Any) -> T:
    """A thread is not cancelled: the call simply runs."""
    return fn(*args)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # an abandoned call's failure is not news to anybody


def bounded(timeout: float | None, fn: Callable[..., T], *args: Any) -> T:
    """A thread cannot abandon a blocking call: the call runs unbounded (the lease window is
    still decided by the clock, and backends bound their own statements)."""
    return fn(*args)


async def awithin(
    timeout: float,
    late: Callable[[T], Coroutine[Any, Any, object]] | None,
    fn: Callable[..., Awaitable[T]],
    *args: Any,
) -> T:
    """Await ``fn(*args)`` for at most ``timeout`` seconds, then raise ``TimeoutError``.

    The call is cancelled then (in the background: nobody waits for it). Should it still
    finish with a result (it ignored the cancellation), ``late(result)`` runs in a task of its
    own to undo what it did.
    """
    task = asyncio.ensure_future(fn(*args))

    def abandoned(done: asyncio.Future[T]) -> None:
        if done.cancelled() or done.exception() is not None or late is None:
            return  # an abandoned call's failure is not news to anybody
        undo = asyncio.ensure_future(late(done.result()))
        undo.add_done_callback(_log_late_failure)

    try:
        finished, _ = await asyncio.wait((task,), timeout=max(timeout, 0.0))
    except asyncio.CancelledError:
        task.cancel()
        task.add_done_callback(abandoned)
        raise
    if not finished:
        task.cancel()
        task.add_done_callback(abandoned)
        raise TimeoutError(f"call did not finish within {timeout:g}s")
    return task.result()


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


def _log_late_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("worklease: undoing a late call failed: %r", task.exception())


def _start_eagerly(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]
) -> asyncio.Task[T]:
    """A task whose coroutine runs at once, up to its first wait (Python 3.12+; earlier a
    plain task, started on the next turn of the loop)."""
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)
    return loop.create_task(coro)


async def acleanup(timeout: float, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    """Run final writes ``fn(*args)`` to completion despite cancellation, within ``timeout``.

    A cancellation that arrives meanwhile is held back until the writes finish (or time
    out) and then re-raised. At the deadline ``TimeoutError`` is raised at once and the writes
    are cancelled in the background (a driver may take its time to cancel a query; nobody
    waits for it).
    """
    loop = asyncio.get_running_loop()
    waiting: asyncio.Future[None] | None = None

    async def writes() -> T:
        try:
            return await fn(*args)
        finally:
            # The caller is woken from the writes' own last step: a turn of the loop sooner
            # than through a done callback (or a shield), which runs a turn after the task.
            if waiting is not None and not waiting.done():
                waiting.set_result(None)

    # One task, one timer and one future per call (a pool stopping ends thousands of holds
    # at once: asyncio.wait would cost a future and two callbacks per round).
    task = _start_eagerly(loop, writes())
    if task.done():  # finished without waiting (nothing to send, or an in-memory store)
        return task.result()
    expired = False

    def expire() -> None:
        nonlocal expired
        if task.done():
            return
        expired = True
        task.cancel()
        task.add_done_callback(_retrieve)
        if waiting is not None and not waiting.done():
            waiting.cancel()  # ends the wait below now, not when the writes end

    timer = loop.call_later(max(timeout, 0.0), expire)
    cancelled = False
    try:
        while not task.done():
            waiting = loop.create_future()
            try:
                await waiting
            except asyncio.CancelledError:
                if expired:
                    error = TimeoutError(f"cleanup did not finish within {timeout:g}s")
                    if cancelled:  # the outside cancellation wins over our own timeout
                        raise asyncio.CancelledError from error
                    raise error from None
                cancelled = True  # from outside: held back until the writes end
    finally:
        timer.cancel()
    if cancelled:
        if not task.cancelled():
            task.exception()  # the writes failed after all: the cancellation takes precedence
        raise asyncio.CancelledError
    return task.result()  # the writes' own failure, or their own cancellation, propagates


def cleanup(timeout: float, fn: Callable[..., T], *args: Any) -> T:
    """Run final writes ``fn(*args)`` in a helper thread, waiting at most ``timeout`` seconds.

    On timeout ``TimeoutError`` is raised and the writes are left to finish (or fail) on
    their own: each is a single atomic statement, so nothing is half-written. Helper threads
    are daemon threads kept for reuse, so the common case starts no thread.
    """
    job = _CleanupJob(fn, args)
    _cleanup_helpers.submit(job)
    if not job.done.wait(timeout):
        raise TimeoutError(f"cleanup did not finish within {timeout:g}s")
    if job.error is not None:
        raise job.error
    return cast(T, job.result)


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


class ACancelGuard:
    """Re-raises a cancellation that a call lost on its way through.

    Before Python 3.12, ``asyncio.wait_for`` drops a cancellation that arrives just as the
    awaited thing finishes (CPython gh-86296); psycopg_pool waits for a free connection that
    way. The caller would carry on as if never cancelled, and whoever cancelled it (a pool
    stopping) would wait for ever. Create the guard before the call and ``check()`` after it:
    a cancellation requested meanwhile that never arrived is raised there.
    """

    __slots__ = ("_baseline", "_task")

    def __init__(self) -> None:
        self._task = asyncio.current_task()
        self._baseline = self._task.cancelling() if self._task is not None else 0

    def check(self) -> None:
        """Raise ``CancelledError`` if the task was cancelled since the guard was made and
        the call returned anyway."""
        if self._task is not None and self._task.cancelling() > self._baseline:
            raise asyncio.CancelledError("cancelled while waiting (the wait lost it)")


class CancelGuard:
    """A thread cannot be cancelled: nothing to lose."""

    __slots__ = ()

    def check(self) -> None:
        pass


# -- cancelling the body of a renewal -------------------------------------------------------


class AHostCanceller:
    """Cancels the task that entered a block, the way ``asyncio.timeout`` does.

    ``bind`` records the current task; ``cancel`` (called from another task) cancels it;
    ``consume`` in the block's exit tells whether a ``CancelledError`` was ours (and undoes our
    cancellation request), so an outside cancellation still propagates.
    """

    __slots__ = ("_baseline", "_requested", "_task")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._baseline = 0
        self._requested = False

    def bind(self) -> None:
        self._task = asyncio.current_task()
        self._baseline = self._task.cancelling() if self._task is not None else 0

    @property
    def requested(self) -> bool:
        """Whether ``cancel`` cancelled the task (and ``consume`` has not run yet)."""
        return self._requested

    def cancel(self) -> None:
        task = self._task
        if task is not None and not self._requested and not task.done():
            self._requested = True
            task.cancel()

    def consume(self, error: BaseException | None) -> bool:
        task = self._task
        if task is None or not self._requested:
            return False
        self._requested = False
        if task.uncancel() > self._baseline:
            return False
        return error is None or isinstance(error, asyncio.CancelledError)


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
