"""The in-memory backend: for tests and single-process use."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Protocol

from .._fairshare import PoolSurvey
from .._memory import MemoryStore, RowSnapshot
from .._models import Checkpoint, ExitMode, Token
from .._validation import backend_ttl, check_flag, non_negative_seconds, normalize_state
from ..errors import ConfigError, LeaseLostError
from .backend import StateLike
from .watch import AsyncReleaseHub, AsyncReleaseWatch

__all__ = ["AsyncMemoryBackend", "Clock"]


class Clock(Protocol):
    """Anything with a ``now()`` returning a timezone-aware datetime (e.g. ``FakeClock``)."""

    def now(self) -> datetime: ...


class AsyncMemoryBackend:
    """Lease rows kept in this process's memory, safe to share between tasks and threads.

    ``clock`` (for example ``worklease.testing.FakeClock``) supplies the backend's notion of
    now; by default the system clock. Fencing tokens come from a counter per instance that
    starts at 1 and advances only on a successful acquire. Work IDs are validated exactly as
    the PostgreSQL backend validates them. State is copied in and out. A release or forget
    wakes the waiting acquires, leaders and pools of this backend at once.

    The batch methods and ``sweep`` and ``rows`` hold the store's lock for a few hundred items
    at a time (a few milliseconds at most at 100,000 leases), so other threads' operations
    get in between; each item's outcome is still the one its single operation would have had
    then, but a batch is no longer one instant (see each method). They never await: a batch
    is not a cancellation point and runs to its end once called.
    """

    __module__ = "worklease"

    # Its calls never wait on anything but the store's lock: a thread makes a hold's final
    # writes itself (worklease._deadline.SELF_BOUNDED).
    _worklease_self_bounded = True

    def __init__(self, clock: Clock | None = None) -> None:
        if clock is not None and not callable(getattr(clock, "now", None)):
            raise ConfigError(f"clock must have a now() method (a FakeClock, say), not {clock!r}")
        self._hub = AsyncReleaseHub()
        self._store = MemoryStore(
            clock.now if clock is not None else None, on_release=self._hub.publish
        )

    async def acquire(self, work_id: str, holder_id: str, ttl: float) -> Token:
        return self._store.acquire(work_id, holder_id, backend_ttl(ttl))

    async def acquire_with_checkpoint(
        self, work_id: str, holder_id: str, ttl: float
    ) -> tuple[Token, Checkpoint]:
        """Acquire and read the new holder's checkpoint in one step (optional method)."""
        return self._store.acquire_with_checkpoint(work_id, holder_id, backend_ttl(ttl))

    async def acquire_many(
        self, work_ids: Sequence[str], holder_id: str, ttl: float
    ) -> list[tuple[Token, Checkpoint]]:
        """Acquire every free work ID of ``work_ids`` in one call (optional method; in
        chunks, each work ID granted as ``acquire`` would grant it at that moment)."""
        return self._store.acquire_many(work_ids, holder_id, backend_ttl(ttl))

    async def find_available(self, work_ids: Sequence[str]) -> list[str]:
        """The work IDs ``acquire`` would grant now, in input order (optional method; in
        chunks, each judged at one instant)."""
        return self._store.find_available(work_ids)

    async def renew_many(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        """Renew every token in one call (optional method; in chunks, each token's outcome
        that of ``renew`` at that moment)."""
        return self._store.renew_many(tokens, backend_ttl(ttl))

    async def checkpoint_many(
        self, items: Sequence[tuple[Token, StateLike | None]], ttl: float
    ) -> list[LeaseLostError | None]:
        """Checkpoint every ``(token, state)`` in one call (optional method; in chunks,
        each item's outcome that of ``checkpoint`` at that moment)."""
        normalized = [(token, normalize_state(state)) for token, state in items]
        return self._store.checkpoint_many(normalized, backend_ttl(ttl))

    async def release_many(
        self, tokens: Sequence[Token], mode: ExitMode
    ) -> list[LeaseLostError | None]:
        """Release every token with ``mode`` in one call (optional method; in chunks, each
        token's outcome that of ``release`` at that moment)."""
        return self._store.release_many(tokens, mode)

    async def survey(self, work_ids: Sequence[str], prefix: str) -> PoolSurvey:
        """Who holds which of ``work_ids``, and the live members under ``prefix`` (optional
        method): the work IDs are read in chunks, each at one instant (a pool re-surveys at
        its next scan); a pool's members are read in one hold, with the last chunk."""
        return self._store.survey(work_ids, prefix)

    def watch_releases(self, work_ids: Iterable[str]) -> AsyncReleaseWatch | None:
        """A watch woken when one of ``work_ids`` is released or forgotten through this
        backend (optional method of the backend protocol); ``None`` once closed."""
        if self._store.closed:
            return None
        return self._hub.watch(work_ids)

    async def read_checkpoint(self, token: Token) -> Checkpoint:
        return self._store.read_checkpoint(token)

    async def checkpoint(self, token: Token, state: StateLike | None, ttl: float) -> None:
        self._store.checkpoint(token, state, backend_ttl(ttl))

    def transaction(self, token: Token) -> AsyncMemoryTransaction:
        """A transactional step (optional method of the backend protocol): there is no
        connection (``connection`` is ``None``); the staged checkpoint is written at the
        commit with the same fencing as on PostgreSQL (the token must be the current,
        unlapsed grant), so code under test sees the same outcomes."""
        return AsyncMemoryTransaction(self._store, token)

    async def renew(self, token: Token, ttl: float) -> None:
        self._store.renew(token, backend_ttl(ttl))

    async def release(self, token: Token, mode: ExitMode) -> None:
        self._store.release(token, mode)

    async def forget(self, token: Token) -> None:
        self._store.forget(token)

    async def expire(self, work_id: str) -> bool:
        """End the current grant of ``work_id`` now (an operator's action, optional method):
        the holder's next write is fenced; ``False`` when it is not held."""
        return self._store.expire(work_id)

    async def sweep(self, retention: float, include_expired: bool) -> int:
        return self._store.sweep(
            non_negative_seconds(retention, "retention"),
            check_flag(include_expired, "include_expired"),
        )

    def rows(self) -> list[RowSnapshot]:
        """A copy of every stored row, sorted by work ID (read in chunks: each row whole,
        but with writers about, not all rows of one instant)."""
        return self._store.rows()

    async def close(self) -> None:
        """Close the backend (idempotent): like a closed PostgreSQL backend, every later
        operation raises ``BackendError`` and ``watch_releases`` returns ``None``; ``rows()``
        still shows what is stored."""
        self._store.close()

    async def __aenter__(self) -> AsyncMemoryBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncMemoryTransaction:
    """A transactional step on the memory backend: nothing to begin or roll back but the
    staged checkpoint, which the commit writes under the store's lock."""

    def __init__(self, store: MemoryStore, token: Token) -> None:
        self._store = store
        self._token = token
        self._open = False

    @property
    def connection(self) -> None:
        return None

    async def begin(self, limit: float | None) -> None:
        self._store.check_open("transaction")
        self._open = True

    async def commit(self, state: bytes | None, write: bool, ttl: float) -> None:
        if not self._open:
            raise RuntimeError("the transaction is not open")
        self._open = False
        self._store.commit_step(self._token, state, write, backend_ttl(ttl))

    async def rollback(self, *, discard: bool = False) -> None:
        self._open = False
