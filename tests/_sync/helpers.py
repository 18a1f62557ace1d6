# Generated from tests/_async/helpers.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Test doubles for the lease-level tests: a scripted backend with a call log."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from time import monotonic
from typing import Any, Protocol

from psycopg import Connection
from psycopg_pool import ConnectionPool

from tests._compat import sleep, spawn_all
from worklease import (
    BackendError,
    Checkpoint,
    EtcdBackend,
    ExitMode,
    Lease,
    MemoryBackend,
    PostgresBackend,
    RedisBackend,
    Token,
)
from worklease._compat import ThreadLock
from worklease.testing import FakeClock

__all__ = [
    "METHODS",
    "Call",
    "ScriptedBackend",
    "lock_waiters",
    "spin",
    "transient",
    "until_lock_waiters",
]

StateLike = bytes | bytearray | memoryview

METHODS = ("acquire", "read_checkpoint", "checkpoint", "renew", "release", "forget", "sweep")
"""The backend methods a script can target."""


def transient(message: str = "connection reset (injected)") -> BackendError:
    """A retryable backend failure, as a driver error would be reported."""
    return BackendError(message, transient=True)


@dataclass(frozen=True)
class Call:
    """One backend call as the scripted backend saw it (before any injected failure)."""

    method: str
    args: tuple[object, ...]


class ScriptedBackend:
    """A memory backend whose calls are logged and can be made to fail or stall.

    Every call is appended to :attr:`calls` first; then a queued delay for the method (if
    any) is slept, then a queued exception (if any) is raised, else ``fail_always``'s factory
    (if set) builds one to raise, else the call goes to the wrapped memory backend, after
    which a queued ``delay_after`` (if any) is slept before returning.
    """

    def __init__(
        self, inner: MemoryBackend | None = None, *, clock: FakeClock | None = None
    ) -> None:
        self.inner = inner if inner is not None else MemoryBackend(clock=clock)
        self.calls: list[Call] = []
        self._errors: dict[str, deque[BaseException]] = {m: deque() for m in METHODS}
        self._delays: dict[str, deque[float]] = {m: deque() for m in METHODS}
        self._always: dict[str, Callable[[], BaseException]] = {}
        self._always_delay: dict[str, float] = {}
        self._after: dict[str, deque[float]] = {m: deque() for m in METHODS}
        self._atomic = ThreadLock()  # makes take_over atomic w.r.t. calls from other threads

    # -- scripting ----------------------------------------------------------------------------

    def fail(self, method: str, *errors: BaseException) -> None:
        """Make the next calls of ``method`` raise ``errors``, one per call, in order."""
        self._errors[method].extend(errors)

    def fail_always(self, method: str, factory: Callable[[], BaseException] = transient) -> None:
        """Make every later call of ``method`` raise a fresh ``factory()``."""
        self._always[method] = factory

    def delay(self, method: str, *seconds: float) -> None:
        """Make the next calls of ``method`` sleep ``seconds`` first, one per call."""
        self._delays[method].extend(seconds)

    def delay_after(self, method: str, *seconds: float) -> None:
        """Make the next calls of ``method`` sleep ``seconds`` after the wrapped call
        succeeded, one per call (a write that is stored but whose answer is slow).
        """
        self._after[method].extend(seconds)

    def delay_always(self, method: str, seconds: float) -> None:
        """Make every later call of ``method`` sleep ``seconds`` first."""
        self._always_delay[method] = seconds

    def heal(self, method: str | None = None) -> None:
        """Drop every scripted failure and delay (of one method, or all)."""
        for name in METHODS if method is None else (method,):
            self._errors[name].clear()
            self._delays[name].clear()
            self._after[name].clear()
            self._always.pop(name, None)
            self._always_delay.pop(name, None)

    # -- inspection ---------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The called method names, in order."""
        return [call.method for call in list(self.calls)]

    def count(self, method: str) -> int:
        """How many times ``method`` was called."""
        return sum(1 for call in list(self.calls) if call.method == method)

    def of(self, method: str) -> list[Call]:
        """The calls of ``method``, in order."""
        return [call for call in list(self.calls) if call.method == method]

    def take_over(self, work_id: str, holder_id: str, clock: FakeClock, ttl: float = 10.0) -> Token:
        """Let ``holder_id`` take ``work_id`` over: move ``clock`` past the row's expiry and
        acquire, in one step that no concurrent backend call can interleave with (so a
        renewal running meanwhile sees a fenced lease, never a lapsed one). Not logged.
        """
        with self._atomic:
            (row,) = [r for r in self.inner.rows() if r.work_id == work_id]
            if clock.now() <= row.expires_at:
                clock.set(row.expires_at + timedelta(seconds=1))
            return self.inner.acquire(work_id, holder_id, ttl)

    def _leave(self, method: str) -> None:
        queued = self._after[method]
        if queued:
            sleep(queued.popleft())

    # -- the backend --------------------------------------------------------------------------

    def _enter(self, method: str, *args: object) -> None:
        self.calls.append(Call(method, args))
        queued = self._delays[method]
        pause = queued.popleft() if queued else self._always_delay.get(method, 0.0)
        if pause > 0:
            sleep(pause)
        errors = self._errors[method]
        if errors:
            raise errors.popleft()
        factory = self._always.get(method)
        if factory is not None:
            raise factory()

    def acquire(self, work_id: str, holder_id: str, ttl: float) -> Token:
        self._enter("acquire", work_id, holder_id, ttl)
        with self._atomic:
            token = self.inner.acquire(work_id, holder_id, ttl)
        self._leave("acquire")
        return token

    def read_checkpoint(self, token: Token) -> Checkpoint:
        self._enter("read_checkpoint", token)
        with self._atomic:
            prior = self.inner.read_checkpoint(token)
        self._leave("read_checkpoint")
        return prior

    def checkpoint(self, token: Token, state: StateLike | None, ttl: float) -> None:
        self._enter("checkpoint", token, state, ttl)
        with self._atomic:
            self.inner.checkpoint(token, state, ttl)
        self._leave("checkpoint")

    def renew(self, token: Token, ttl: float) -> None:
        self._enter("renew", token, ttl)
        with self._atomic:
            self.inner.renew(token, ttl)
        self._leave("renew")

    def release(self, token: Token, mode: ExitMode) -> None:
        self._enter("release", token, mode)
        with self._atomic:
            self.inner.release(token, mode)
        self._leave("release")

    def forget(self, token: Token) -> None:
        self._enter("forget", token)
        with self._atomic:
            self.inner.forget(token)
        self._leave("forget")

    def sweep(self, retention: float, include_expired: bool) -> int:
        self._enter("sweep", retention, include_expired)
        with self._atomic:
            deleted = self.inner.sweep(retention, include_expired)
        self._leave("sweep")
        return deleted


class _Lossy(Protocol):
    def raise_if_lost(self) -> None: ...


def spin(renewal: _Lossy, seconds: float = 5.0, step: float = 0.01) -> None:
    """Wait up to ``seconds``, calling ``raise_if_lost()`` between short sleeps.

    Ends early in both flavours when the lease is lost: with asyncio the renewal cancels the
    sleeping body; with threads ``raise_if_lost()`` raises the cause.
    """
    for _ in range(round(seconds / step)):
        renewal.raise_if_lost()
        sleep(step)


def settle_listener(backend: object) -> None:
    """Let a PostgreSQL backend's release listener (an etcd or Redis backend's watch) start.

    Once listening it wakes every watch once (a release may have gone unseen before); a test
    that times an idle wait starts after that, so the wake-up cannot cut its wait short.
    """
    if isinstance(backend, EtcdBackend | RedisBackend):
        with backend.watch_releases(["worklease-test-settle"]) or contextlib.nullcontext():
            deadline = monotonic() + 10.0
            while not backend.watching and monotonic() < deadline:
                sleep(0.01)
        return
    if not isinstance(backend, PostgresBackend):
        return
    watch = backend.watch_releases(["worklease-test-settle"])
    if watch is None:
        return
    with watch:
        watch.wait(10.0)


def handed_over(
    holder_backend: object,
    waiter_backend: object,
    how: str,
    *,
    poll: float = 30.0,
    timeout: float | None = None,
) -> tuple[Token, float]:
    """A waiter (poll interval ``poll``, also the TTL of both leases) acquires while the
    holder lets go after 0.3 s by ``how`` ("release" or "forget"); the waiter's token and how
    long after the letting go it got the lease. The waiting acquire is bounded by ``timeout``
    seconds (default: two poll intervals); its last attempt, at that deadline, finds the row
    free."""
    holder = Lease(holder_backend, holder_id="holder", ttl=poll)  # type: ignore[arg-type]
    waiter = Lease(waiter_backend, holder_id="waiter", ttl=poll)  # type: ignore[arg-type]
    token = holder.acquire("handoff")
    released: list[float] = []
    got: list[tuple[Token, float]] = []
    limit = poll * 2 if timeout is None else timeout

    def step(index: int) -> None:
        if index == 0:
            acquired = waiter.acquire("handoff", wait=True, timeout=limit, poll_interval=poll)
            got.append((acquired, monotonic()))
        else:
            sleep(0.3)
            if how == "release":
                holder.release(token, ExitMode.FINISHED)
            else:
                holder.forget(token)
            released.append(monotonic())

    assert spawn_all(step, 2) == [None, None]
    ((acquired, at),) = got
    return acquired, at - released[0]


def lock_waiters(conn: Connection[Any]) -> int:
    """How many sessions of ``conn``'s database wait on a lock right now."""
    cursor = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    found = cursor.fetchone()
    return int(found[0]) if found else 0


def until_lock_waiters(conn: Connection[Any], count: int, what: str) -> None:
    """Wait (up to 30 s) until ``count`` sessions of ``conn``'s database wait on a lock;
    ``AssertionError`` naming ``what`` otherwise."""
    for _ in range(3000):
        if lock_waiters(conn) >= count:
            return
        sleep(0.01)
    raise AssertionError(f"{what} never waited on a lock")


def open_backend(
    dsn: str, *, pool_kwargs: dict[str, Any] | None = None, **options: Any
) -> PostgresBackend:
    """A backend on a pool of its own (min 1, max 4 connections; ``pool_kwargs`` go to its
    connections), opened; ``options`` go to the backend. Close with :func:`close_backend`."""
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=1, max_size=4, open=False, kwargs=pool_kwargs
    )
    pool.open()
    return PostgresBackend(pool, **options)


def close_backend(backend: PostgresBackend) -> None:
    backend.close()
    backend.pool.close()
