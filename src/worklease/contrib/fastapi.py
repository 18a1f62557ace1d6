"""FastAPI (and Starlette) integration: pools and leaders run with the application, and routes
that hold a lease while they run.

``lifespan(...)`` starts asyncio pools and leaders when the application starts and stops them
gracefully when it shuts down (each pool hands its work IDs over ABANDONED with their
checkpoints, each leader steps down), so a rolling deploy moves the work at once instead of
after a TTL. ``held(lease, work_id)`` is a route dependency that holds the lease on a work ID
for the duration of the request: a second request for the same work ID, in this process or
any other, gets ``409 Conflict`` naming the holder. Needs FastAPI (imported only by this
module; ``import worklease.contrib`` never needs it).

    from fastapi import Depends, FastAPI
    from worklease.contrib.fastapi import held, lifespan

    app = FastAPI(lifespan=lifespan(pools=[tenants], leaders=[(scheduler, run_scheduler)]))

    @app.post("/reports/{report_id}/rebuild")
    async def rebuild(
        hold: worklease.AsyncHold = Depends(held(lease, path="report_id"), scope="function"),
    ):
        ...
        await hold.checkpoint(progress)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

try:
    from fastapi import HTTPException, Request
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "worklease.contrib.fastapi needs FastAPI: pip install fastapi", name=exc.name
    ) from exc

from .. import (
    AsyncHold,
    AsyncLeader,
    AsyncLease,
    AsyncPool,
    AsyncTokenCallback,
    BackendError,
    ConfigError,
    Duration,
    LeaseHeldError,
)
from .._options import configuring, hold_options

__all__ = ["held", "lifespan"]

logger = logging.getLogger("worklease.contrib.fastapi")

WorkIdOf = Callable[[Request], str]
"""How a dependency finds the work ID of a request."""


def lifespan(
    *,
    resources: Sequence[contextlib.AbstractAsyncContextManager[Any]] = (),
    pools: Sequence[AsyncPool] = (),
    leaders: Sequence[tuple[AsyncLeader, AsyncTokenCallback]] = (),
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    """A ``lifespan`` for ``FastAPI(lifespan=...)`` (or Starlette) that runs ``pools``
    (``pool.run()``) and ``leaders`` (``leader.run_forever(fn)`` for each ``(leader, fn)``)
    as tasks while the application runs.

    ``resources`` are entered first, in order, and left last, in reverse: what must be open
    on the application's event loop, such as the psycopg ``AsyncConnectionPool`` (``async
    with`` opens and closes it) and the ``AsyncPostgresBackend`` (closing it closes the pools
    it made of its own). At shutdown every pool and leader is stopped (``stop()``) and
    awaited before that: pools cancel their work functions and hand their work IDs over
    ABANDONED with their checkpoints, as ``pool.stop()`` documents; a leader's term in
    progress is cancelled, and its lease released ABANDONED. A pool or leader
    that ends with an error while the application runs is logged (``worklease.contrib.fastapi``,
    ERROR) and not restarted; the application keeps serving. Give the process time to stop:
    the server's graceful shutdown timeout (and a container's termination grace period)
    should exceed the leases' TTL.

    The result is an async context manager factory: to run more at startup, enter it inside a
    lifespan of your own (``async with worklease_lifespan(app): yield``).
    """
    resources = list(resources)
    for resource in resources:
        if not hasattr(resource, "__aenter__") or not hasattr(resource, "__aexit__"):
            raise TypeError(f"lifespan: resources are async context managers, not {resource!r}")
    pools = list(pools)
    leaders = list(leaders)
    for pool in pools:
        if not isinstance(pool, AsyncPool):
            raise TypeError(f"lifespan: pools takes AsyncPool objects, not {pool!r}")
    for entry in leaders:
        if (
            not isinstance(entry, tuple)
            or len(entry) != 2
            or not isinstance(entry[0], AsyncLeader)
            or not callable(entry[1])
        ):
            raise TypeError(f"lifespan: leaders takes (AsyncLeader, function) pairs, not {entry!r}")

    @contextlib.asynccontextmanager
    async def run(app: Any) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for resource in resources:
                await stack.enter_async_context(resource)
            async with _services(pools, leaders):
                yield

    return run


@contextlib.asynccontextmanager
async def _services(
    pools: list[AsyncPool], leaders: list[tuple[AsyncLeader, AsyncTokenCallback]]
) -> AsyncIterator[None]:
    """Run the pools and leaders as tasks; stop and await them all on the way out."""
    running: dict[asyncio.Task[None], str] = {}
    terms: list[asyncio.Task[None]] = []
    for pool in pools:
        task = asyncio.create_task(pool.run(), name="worklease-pool")
        running[task] = repr(pool)
    for leader, fn in leaders:
        task = asyncio.create_task(leader.run_forever(fn), name="worklease-leader")
        running[task] = f"the leader of {leader.work_id!r}"
        terms.append(task)
    reporters = {task: _report_early_end(name) for task, name in running.items()}
    for task, reporter in reporters.items():
        task.add_done_callback(reporter)
    try:
        yield
    finally:
        for task, reporter in reporters.items():
            task.remove_done_callback(reporter)  # what ends from here on is reported below
        for pool in pools:
            pool.stop()  # its work functions are cancelled, its work IDs handed over
        for leader, _ in leaders:
            leader.stop()
        for task in terms:
            # A leader's stop() lets a term in progress finish; an application shutting down
            # cancels it instead: the term's lease is released ABANDONED, its final writes
            # surviving the cancellation.
            task.cancel()
        stopping = [task for task in running if not task.done()]
        results = await asyncio.gather(*stopping, return_exceptions=True)
        for task, result in zip(stopping, results, strict=True):
            if isinstance(result, Exception):
                logger.error("%s ended with %r as it stopped", running[task], result)


def _report_early_end(name: str) -> Callable[[asyncio.Task[None]], None]:
    """Log a pool or leader that ends with an error while the application runs."""

    def report(task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            logger.error("%s ended with an error while the application ran", name, exc_info=error)

    return report


def held(
    lease: AsyncLease,
    work_id: str | WorkIdOf | None = None,
    *,
    path: str | None = None,
    wait: bool = False,
    timeout: Duration | None = None,
    cleanup_timeout: Duration | None = None,
) -> Callable[[Request], AsyncIterator[AsyncHold]]:
    """A route dependency holding the lease on a work ID while the request runs:
    ``Depends(held(lease, path="report_id"), scope="function")``.

    The work ID is ``work_id`` (a string, or a function of the ``Request``), or the path
    parameter named ``path`` (missing from the request: ``404``). The route receives the
    ``AsyncHold`` (``token``, ``prior``, ``checkpoint(state)``, ``finish_with(state)``) and
    runs with the lease renewed in the background. When the dependency ends, the lease is
    released FINISHED if the route returned (after the state given to ``finish_with``),
    ABANDONED with its last checkpoint if it raised (the error goes on to FastAPI's
    handlers), RETIRED if it raised ``Retire`` (which then reaches FastAPI too: answer it
    with an exception handler). With ``scope="function"`` (FastAPI 0.121+) it ends before the
    response is sent, so a client that got its answer finds the work ID free; with the default
    scope FastAPI ends it after the response. A lease lost while an ``async def`` route runs
    cancels it (the request then fails with the loss: ``500``); a ``def`` route runs in a
    thread and is not interrupted, and its next ``hold.checkpoint`` raises the loss.

    A work ID somebody holds answers ``409 Conflict`` with ``work_id``, ``holder_id`` and
    ``expires_at`` in the detail (with ``wait=True`` the request waits for the lease instead,
    up to ``timeout``, then ``409``); a path that is no valid work ID answers ``400``; a
    backend that does not answer, ``503``. Bad options raise when the route is defined.
    """
    if not isinstance(lease, AsyncLease):
        raise TypeError(f"held: needs an AsyncLease, not {lease!r}")
    if (work_id is None) == (path is None):
        raise TypeError("held: give the work ID (work_id=...) or its path parameter (path=...)")
    if work_id is not None and not isinstance(work_id, str) and not callable(work_id):
        raise TypeError(f"held: work_id is a string or a function of the request, not {work_id!r}")
    options: dict[str, Any] = {"wait": wait, "timeout": timeout}
    if cleanup_timeout is not None:
        options["cleanup_timeout"] = cleanup_timeout
    with configuring(ConfigError):  # refuse bad options when the route is defined
        hold_options(**options)

    def work_id_of(request: Request) -> str:
        if path is not None:
            value = request.path_params.get(path)
            if not isinstance(value, str):
                raise HTTPException(404, f"no path parameter {path!r} to hold a lease on")
            return value
        if isinstance(work_id, str):
            return work_id
        assert work_id is not None
        return work_id(request)

    async def dependency(request: Request) -> AsyncIterator[AsyncHold]:
        try:
            hold = lease.hold(work_id_of(request), **options)
        except ConfigError as bad:  # the request names no valid work ID
            raise HTTPException(400, str(bad)) from bad
        try:
            entered = await hold.__aenter__()
        except LeaseHeldError as taken:
            raise HTTPException(409, _conflict(taken)) from taken
        except TimeoutError as waited:  # wait=True: still held at the deadline, or no answer
            cause = waited.__cause__
            if isinstance(cause, LeaseHeldError):
                raise HTTPException(409, _conflict(cause)) from waited
            raise HTTPException(503, str(waited)) from waited
        except BackendError as failed:  # the backend did not answer: not the client's fault
            raise HTTPException(503, str(failed)) from failed
        try:
            yield entered
        except BaseException as exc:
            # Released ABANDONED (RETIRED for Retire, nothing when the lease was lost); the
            # route's exception goes on to FastAPI either way.
            await hold.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await hold.__aexit__(None, None, None)  # FINISHED (after the finish_with state)

    return dependency


def _conflict(taken: LeaseHeldError) -> dict[str, Any]:
    return {
        "error": "lease held",
        "work_id": taken.work_id,
        "holder_id": taken.holder_id,
        "expires_at": None if taken.expires_at is None else taken.expires_at.isoformat(),
    }
