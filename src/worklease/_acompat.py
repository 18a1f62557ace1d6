"""The asyncio half of the flavour pairs the generated code is written against.

Each helper here (prefixed ``a``/``A``) has a thread twin with the plain name in
``_compat``; the generator (``scripts/unasync.py``) renames one to the other, and this
module's name to that one's. Call wrappers (``abounded``/``bounded``, ``acleanup``/``cleanup``)
take the function and its arguments, so the same source line reads correctly in both
flavours. Only this half imports asyncio: a program using the thread flavour never loads it.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar, cast

from ._compat import Abandoned, ThreadLock, ThreadRLock, logger

__all__ = [
    "ABATCH_LINGER",
    "ARENEWER_LINGER",
    "ACancelGuard",
    "ADeferredWorker",
    "AEvent",
    "AHostCanceller",
    "AWorker",
    "Abandoned",
    "ThreadLock",
    "ThreadRLock",
    "aabandonable",
    "abounded",
    "acall",
    "astart_pending",
    "acancel_worker",
    "acleanup",
    "ajoin_all",
    "aloop_gone",
    "aloop_key",
    "ashielded",
    "asleep",
    "aspawn",
    "aspawn_after",
    "astart_within",
    "awithin",
    "aworker_alive",
]

T = TypeVar("T")


# -- sleeping -------------------------------------------------------------------------------


async def asleep(seconds: float) -> None:
    await asyncio.sleep(max(seconds, 0.0))


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


# -- background workers ---------------------------------------------------------------------


AWorker = asyncio.Task[None]


def aspawn(fn: Callable[..., Coroutine[Any, Any, None]], *args: Any, name: str) -> AWorker:
    """Run ``fn(*args)`` as a task on the running loop."""
    return asyncio.get_running_loop().create_task(fn(*args), name=name)


async def ajoin_all(workers: Sequence[AWorker], timeout: float | None = None) -> bool:
    """Wait until every task finished; False if ``timeout`` seconds passed first."""
    if not workers:
        return True
    _, pending = await asyncio.wait(workers, timeout=timeout)
    return not pending


class ADeferredWorker:
    """A task started only when it is first needed: ``delay`` seconds from now (sooner with
    ``astart_within``). Renewals that end before the first attempt is due (short holds, a
    runner's cycles) then cost one timer among them all, not a task each and the turns of
    the loop that start and end it; a start that comes when nothing is left to do starts no
    task (``idle``).

    ``unstarted`` is called if the task is cancelled before its first step (a "cancel every
    task" sweep right after it was created): its coroutine then never runs at all, so it
    could not say so itself. ``idle`` is asked when the timer fires: ``True`` (nothing to
    do by then) and no task starts at all, so none is left pending when a loop shuts down."""

    __slots__ = (
        "_args", "_at", "_fn", "_idle", "_loop", "_name", "_ran", "_task", "_timer",
        "_unstarted",
    )  # fmt: skip

    def __init__(
        self,
        delay: float,
        fn: Callable[..., Coroutine[Any, Any, None]],
        args: Any,
        name: str,
        unstarted: Callable[[], object] | None = None,
        idle: Callable[[], bool] | None = None,
    ) -> None:
        self._fn = fn
        self._args = args
        self._name = name
        self._unstarted = unstarted
        self._idle = idle
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._ran = False
        self._at = 0.0
        self._arm(delay)

    def _arm(self, delay: float) -> None:
        if delay <= 0:
            self._start()
        else:
            self._at = self._loop.time() + delay
            self._timer = self._loop.call_at(self._at, self._fire)

    def _fire(self) -> None:
        if self._idle is not None and self._idle():
            self._timer = None  # nothing to do: it never starts (done from now on)
            return
        self._start()

    def _start(self) -> None:
        self._timer = None
        if self._task is None:
            self._task = task = aspawn(self._body, name=self._name)
            task.add_done_callback(self._ended)

    async def _body(self) -> None:
        self._ran = True
        await self._fn(*self._args)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() and not self._ran and self._unstarted is not None:
            self._unstarted()

    def done(self) -> bool:
        return self._timer is None and (self._task is None or self._task.done())

    def start_pending(self) -> bool:
        return self._timer is not None

    def start_within(self, delay: float) -> None:
        timer = self._timer
        if timer is not None and self._loop.time() + delay < self._at:
            timer.cancel()
            self._timer = None
            self._arm(delay)


def aspawn_after(
    delay: float,
    fn: Callable[..., Coroutine[Any, Any, None]],
    *args: Any,
    name: str,
    unstarted: Callable[[], object] | None = None,
    idle: Callable[[], bool] | None = None,
) -> ADeferredWorker:
    """Run ``fn(*args)`` as a task on the running loop ``delay`` seconds from now
    (``unstarted``, ``idle``: see ``ADeferredWorker``)."""
    return ADeferredWorker(delay, fn, args, name, unstarted, idle)


def astart_within(worker: ADeferredWorker, delay: float) -> None:
    """Start a deferred task no later than ``delay`` seconds from now."""
    worker.start_within(delay)


def astart_pending(worker: ADeferredWorker) -> bool:
    """Whether a deferred task's start is still to come (its timer not fired or cancelled)."""
    return worker.start_pending()


def aworker_alive(worker: AWorker | ADeferredWorker) -> bool:
    """Whether the task has not finished (a task cancelled before it started never runs)."""
    return not worker.done()


def acancel_worker(worker: AWorker) -> None:
    """Cancel a task without waiting for it."""
    worker.cancel()


def aloop_key() -> object:
    """What shares one background worker: the running event loop."""
    return asyncio.get_running_loop()


def aloop_gone(key: object) -> bool:
    """Whether the loop ``aloop_key`` returned has closed (its worker can never run)."""
    return isinstance(key, asyncio.AbstractEventLoop) and key.is_closed()


ABATCH_LINGER = 0.0
"""How long a batch waits for more to join: one turn of the event loop (every task woken
together, a pool's cancelled slots, gets there first)."""


ARENEWER_LINGER = 0.0
"""A task is cheap to start again: the renewal task ends as soon as nothing is renewed."""


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


# -- bounding and shielding calls -----------------------------------------------------------


async def abounded(timeout: float | None, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Await ``fn(*args)`` for at most ``timeout`` seconds (``None``: no bound).

    On timeout the call is abandoned at once: it is cancelled in the background (a driver may
    take its time to cancel a query; nobody waits for it) and ``TimeoutError`` is raised.
    """
    if timeout is None:
        return await fn(*args)
    return await awithin(timeout, None, fn, *args)


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


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # an abandoned call's failure is not news to anybody


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


async def acleanup(
    timeout: float,
    fn: Callable[..., Coroutine[Any, Any, T]],
    *args: Any,
    self_bounded: bool = False,
) -> T:
    """Run final writes ``fn(*args)`` to completion despite cancellation, within ``timeout``.

    ``self_bounded`` matters to threads only (see ``_compat.cleanup``): a task is cancelled
    at the deadline whatever its backend promises.

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
