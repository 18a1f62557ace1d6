"""``lease.transaction(token)``: the caller's own writes and a checkpoint, committed together
only while the token is the current grant."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from .._models import Token
from .._report import LeaseReporter
from .._validation import normalize_state
from .._window import TokenSeal, fresh
from .backend import AsyncBackendTransaction, StateLike

__all__ = ["AsyncLeaseTransaction"]


class AsyncLeaseTransaction:
    """One transactional step (from ``lease.transaction(token)``; use it with ``with``).

    Entering begins a transaction (PostgreSQL: on a connection of the application's pool,
    READ COMMITTED); run your statements on ``connection``, and stage the step's checkpoint
    with ``checkpoint(state)``. Leaving the block normally commits: the staged checkpoint is
    written and the lease extended in the same transaction, which commits only if the token
    is still the current grant and the lease has not lapsed at that moment (the database
    clock). Otherwise everything rolls back and the block raises ``FencedError`` (a newer
    token exists), ``LeaseLapsedError`` (the lease lapsed, even if nobody took it yet),
    ``LeaseExpiredError`` (this holder already released it) or, when the renewal reported a
    loss meanwhile, that loss. An exception in the block rolls back and propagates. A commit
    whose outcome is unknown (the connection was lost during COMMIT) raises a non-transient
    ``BackendError``: read the checkpoint to find out, never retry blindly.

    The guard runs just before COMMIT, so the lease's renewal keeps working while the
    transaction is open; a successor cannot be granted the work ID between the guard and the
    COMMIT, and once one was granted no transaction of this token commits. Each statement,
    and each idle gap between statements, is bounded server-side by the lease TTL; with
    asyncio a renewal that loses the lease cancels the block (and the transaction rolls back).
    Do not commit or roll back ``connection`` yourself.
    """

    __module__ = "worklease"

    def __init__(
        self,
        step: AsyncBackendTransaction,
        token: Token,
        seal: TokenSeal,
        ttl: float,
        reporter: LeaseReporter,
    ) -> None:
        self._step = step
        self._token = token
        self._seal = seal
        self._ttl = ttl
        self._report = reporter
        self._state: bytes | None = None
        self._staged = False
        self._entered = False

    @property
    def token(self) -> Token:
        """The token this step is fenced by."""
        return self._token

    @property
    def connection(self) -> Any:
        """What your statements run on: the psycopg connection inside the transaction on
        PostgreSQL, ``None`` on the memory backend."""
        return self._step.connection

    @property
    def staged(self) -> bytes | None:
        """The checkpoint staged so far (``None`` when none, or staged as ``None``)."""
        return self._state

    def checkpoint(self, state: StateLike | None) -> None:
        """Stage ``state`` as the step's checkpoint, written by the commit (the last call
        wins; ``None`` or empty bytes clear the checkpoint). Without one, the commit keeps
        the stored checkpoint and only extends the lease."""
        self._state = normalize_state(state)
        self._staged = True

    async def __aenter__(self) -> AsyncLeaseTransaction:
        if self._entered:
            raise RuntimeError("a transaction object can be used once")
        self._entered = True
        cause = self._seal.lost_cause()
        if cause is not None:
            raise fresh(cause)
        await self._step.begin(self._ttl)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            # Interrupted (cancelled, KeyboardInterrupt): drop the connection rather than
            # wait for a ROLLBACK's answer; the server aborts the transaction either way.
            await self._step.rollback(discard=not isinstance(exc, Exception))
            return
        cause = self._seal.lost_cause()
        if cause is not None:  # the renewal lost the lease meanwhile: never commit
            await self._step.rollback()
            raise fresh(cause)
        with self._report.checkpoint(self._token, self._state if self._staged else None) as start:
            await self._step.commit(self._state, self._staged, self._ttl)
            self._seal.extend(start, self._ttl)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} work_id={self._token.work_id!r} staged={self._staged}>"
