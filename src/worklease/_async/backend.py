"""The storage contract every backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from .._fairshare import PoolSurvey
from .._models import Checkpoint, ExitMode, Token
from ..errors import LeaseLostError
from .watch import AsyncReleaseWatching

__all__ = [
    "AsyncAcquireMany",
    "AsyncAcquireWithCheckpoint",
    "AsyncBackend",
    "AsyncCapabilities",
    "AsyncFindAvailable",
    "AsyncReleaseMany",
    "AsyncRenewMany",
    "AsyncSurvey",
    "AsyncReleaseWatching",
]

StateLike = bytes | bytearray | memoryview


@runtime_checkable
class AsyncBackend(Protocol):
    """Storage for lease rows. Every method is one attempt: backends never retry.

    Semantics (the conformance suite in ``worklease.conformance`` checks them):

    - ``acquire`` grants the work ID when it has no row, or its row expired (strictly past its
      expiry) or was released, with a fencing token greater than any issued before; the new
      row keeps the checkpoint and records how the previous holder left. A held row raises
      ``LeaseHeldError`` (also for the same holder). A non-positive ``ttl`` yields an
      already-expired lease (a test affordance).
    - ``checkpoint`` stores a private copy of ``state`` (``None`` for ``None`` or empty) and
      extends expiry to now + ``ttl`` in one atomic step. It needs the holder and the token to
      match (``FencedError``) and no exit declared (``LeaseExpiredError``); it does not check
      expiry, so it revives a lapsed, unsuperseded lease.
    - ``renew`` extends expiry; ``FencedError`` before ``LeaseExpiredError`` (lapsed or
      released).
    - ``release`` refuses a non-declarable mode first (``InvalidExitModeError``), then records
      the exit and sets expiry just before now; ``FencedError`` before ``LeaseExpiredError``.
    - ``read_checkpoint`` checks the token only (not the holder); ``FencedError`` when the
      row is gone or has another token.
    - ``forget`` deletes the row when holder and token match (``FencedError`` otherwise).
    - ``sweep`` deletes unheld rows last updated more than ``retention`` seconds ago that were
      retired, or, with ``include_expired``, lapsed without a declared exit; returns the count.

    Durations are float seconds. Expiry is decided by the backend's own clock.

    Optional methods, used when a backend has them (the library falls back to the methods
    above otherwise, with the same results and more round trips):

    - ``acquire_with_checkpoint(work_id, holder_id, ttl) -> (Token, Checkpoint)`` acquires
      and returns what ``read_checkpoint`` would return right after, in one step (the runner
      and ``hold()`` use it).
    - ``renew_many(tokens, ttl) -> list[LeaseLostError | None]`` renews many leases in one
      step: item ``i`` is ``None`` when ``tokens[i]`` was renewed, else the ``FencedError`` or
      ``LeaseExpiredError`` that ``renew`` would have raised for it. A failure of the step as a
      whole is raised. Work IDs must be distinct (``ValueError``). Background renewals of one
      lease object use it to renew all their tokens with one statement.
    - ``checkpoint_many(items, ttl) -> list[LeaseLostError | None]`` checkpoints many leases
      in one step: ``items`` are ``(token, state)`` pairs with distinct work IDs
      (``ValueError``), states as ``checkpoint`` takes them (``TypeError`` before any write);
      per item ``None`` when written, else the error ``checkpoint`` would have raised. A
      failure of the step as a whole is raised. Concurrent checkpoints through one lease
      object are grouped into it (group commit).
    - ``find_available(work_ids) -> list[str]`` returns, in input order, the work IDs that
      ``acquire`` would grant now (no row, expired, or released); it writes nothing.
    - ``acquire_many(work_ids, holder_id, ttl) -> list[(Token, Checkpoint)]`` acquires, in one
      step, every listed work ID that is free (as ``acquire`` would) and returns a grant with
      the new holder's checkpoint for each, in input order; work IDs held by somebody are left
      out. Work IDs must be valid and distinct (checked before any I/O). Pools use
      ``find_available`` and ``acquire_many`` to scan for and take free work.
    - ``release_many(tokens, mode) -> list[LeaseLostError | None]`` releases many leases with
      one exit mode in one step, per token like ``renew_many`` (``None``: released, else what
      ``release`` would have raised); the mode is checked first (``InvalidExitModeError``).
      A pool stops, and sheds, with it.
    - ``survey(work_ids, prefix) -> PoolSurvey`` reads, in one step, the holder of every
      listed work ID whose lease is held, and every held lease whose work ID starts with
      ``prefix`` with its checkpoint (a pool group's memberships); it writes nothing.
      Fair-share pools need it (without it a pool takes whatever is free).
    - ``watch_releases(work_ids)`` returns a watch (a context manager with ``wait(timeout)``
      returning whether a release of one of the work IDs was seen, see ``ReleaseWatch``) or
      ``None`` when the backend cannot notify; waiting acquires, leaders and pools then wake
      at a release instead of at their next poll.
    """

    async def acquire(self, work_id: str, holder_id: str, ttl: float) -> Token: ...

    async def read_checkpoint(self, token: Token) -> Checkpoint: ...

    async def checkpoint(self, token: Token, state: StateLike | None, ttl: float) -> None: ...

    async def renew(self, token: Token, ttl: float) -> None: ...

    async def release(self, token: Token, mode: ExitMode) -> None: ...

    async def forget(self, token: Token) -> None: ...

    async def sweep(self, retention: float, include_expired: bool) -> int: ...


AsyncBackend.__module__ = "worklease"  # set outside the body: not a protocol member


# -- optional capabilities ------------------------------------------------------------------
# A backend offers one by having the method; an attribute set to ``None`` does not count.


@runtime_checkable
class AsyncAcquireWithCheckpoint(Protocol):
    """Acquires and returns the new holder's checkpoint in one step."""

    async def acquire_with_checkpoint(
        self, work_id: str, holder_id: str, ttl: float
    ) -> tuple[Token, Checkpoint]: ...


@runtime_checkable
class AsyncRenewMany(Protocol):
    """Renews many leases in one step; one outcome per token."""

    async def renew_many(
        self, tokens: Sequence[Token], ttl: float
    ) -> list[LeaseLostError | None]: ...


@runtime_checkable
class AsyncCheckpointMany(Protocol):
    """Checkpoints many leases in one step; one outcome per item."""

    async def checkpoint_many(
        self, items: Sequence[tuple[Token, StateLike | None]], ttl: float
    ) -> list[LeaseLostError | None]: ...


@runtime_checkable
class AsyncReleaseMany(Protocol):
    """Releases many leases with one exit mode in one step; one outcome per token."""

    async def release_many(
        self, tokens: Sequence[Token], mode: ExitMode
    ) -> list[LeaseLostError | None]: ...


@runtime_checkable
class AsyncSurvey(Protocol):
    """Reads who holds which work IDs of a pool group, and its live members, in one step."""

    async def survey(self, work_ids: Sequence[str], prefix: str) -> PoolSurvey: ...


@runtime_checkable
class AsyncFindAvailable(Protocol):
    """Tells which work IDs an acquire would grant now, writing nothing."""

    async def find_available(self, work_ids: Sequence[str]) -> list[str]: ...


@runtime_checkable
class AsyncAcquireMany(Protocol):
    """Acquires every free work ID of a batch in one step."""

    async def acquire_many(
        self, work_ids: Sequence[str], holder_id: str, ttl: float
    ) -> list[tuple[Token, Checkpoint]]: ...


class AsyncBackendTransaction(Protocol):
    """One transactional step of a backend (from ``transaction(token)``): ``begin``, then the
    caller's statements on ``connection``, then ``commit`` or ``rollback``, once each."""

    @property
    def connection(self) -> Any:
        """What the caller's statements run on (PostgreSQL: the psycopg connection inside
        the transaction; the memory backend: ``None``)."""
        ...

    async def begin(self, limit: float | None) -> None:
        """Open the transaction; ``limit`` (seconds) bounds it server-side when given."""
        ...

    async def commit(self, state: bytes | None, write: bool, ttl: float) -> None:
        """Write ``state`` (when ``write``) and extend the lease by ``ttl`` only while the
        token is the current, unlapsed grant, then commit; otherwise roll back and raise the
        loss. A commit whose outcome is unknown raises a non-transient ``BackendError``."""
        ...

    async def rollback(self, *, discard: bool = False) -> None:
        """Undo everything since ``begin`` (idempotent, never raises for a lost
        connection); ``discard``: the step was interrupted, drop its connection rather than
        wait for an answer."""
        ...


@runtime_checkable
class AsyncTransactional(Protocol):
    """Runs a step's own writes and its checkpoint in one transaction fenced by the lease."""

    def transaction(self, token: Token) -> AsyncBackendTransaction: ...


for _protocol in (
    AsyncBackendTransaction,
    AsyncTransactional,
    AsyncAcquireWithCheckpoint,
    AsyncRenewMany,
    AsyncCheckpointMany,
    AsyncReleaseMany,
    AsyncSurvey,
    AsyncFindAvailable,
    AsyncAcquireMany,
):
    _protocol.__module__ = "worklease"


@dataclass(frozen=True, slots=True)
class AsyncCapabilities:
    """The optional methods a backend offers, looked up once (when a lease is built).

    Each field is the backend itself, typed as the capability, or ``None`` when it lacks it;
    the library then falls back to the protocol's required methods.
    """

    acquire_with_checkpoint: AsyncAcquireWithCheckpoint | None
    renew_many: AsyncRenewMany | None
    find_available: AsyncFindAvailable | None
    acquire_many: AsyncAcquireMany | None
    watch_releases: AsyncReleaseWatching | None
    release_many: AsyncReleaseMany | None = None
    survey: AsyncSurvey | None = None
    transaction: AsyncTransactional | None = None
    checkpoint_many: AsyncCheckpointMany | None = None

    @classmethod
    def of(cls, backend: object) -> AsyncCapabilities:
        # Looked up with getattr, not isinstance: since Python 3.12 a runtime protocol check
        # reads attributes statically and would miss a proxy that delegates __getattr__.
        def offered(name: str) -> bool:
            return callable(getattr(backend, name, None))

        return cls(
            cast(AsyncAcquireWithCheckpoint, backend)
            if offered("acquire_with_checkpoint")
            else None,
            cast(AsyncRenewMany, backend) if offered("renew_many") else None,
            cast(AsyncFindAvailable, backend) if offered("find_available") else None,
            cast(AsyncAcquireMany, backend) if offered("acquire_many") else None,
            cast(AsyncReleaseWatching, backend) if offered("watch_releases") else None,
            cast(AsyncReleaseMany, backend) if offered("release_many") else None,
            cast(AsyncSurvey, backend) if offered("survey") else None,
            cast(AsyncTransactional, backend) if offered("transaction") else None,
            cast(AsyncCheckpointMany, backend) if offered("checkpoint_many") else None,
        )
