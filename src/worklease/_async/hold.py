"""``lease.hold(work_id)``: acquire, read, renew and release around a block."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from .._acompat import acleanup
from .._models import Checkpoint, DeclaredExit, ExitMode, Token
from .._options import AcquireOptions, HoldOptions, RenewalOptions
from .._types import AsyncReleaser
from .._validation import normalize_state
from .._window import fresh
from ..errors import FencedError, LeaseShedError, Retire
from .backend import StateLike
from .renewal import AsyncRenewal
from .transaction import AsyncLeaseTransaction

__all__ = ["AsyncHold", "HoldingLease", "finish"]


class HoldingLease(Protocol):
    """What a hold needs of the lease it holds a work ID through."""

    async def _acquire_with_prior(
        self, work_id: str, options: AcquireOptions
    ) -> tuple[Token, Checkpoint | None]: ...

    async def read_checkpoint(self, token: Token) -> Checkpoint: ...

    async def checkpoint(self, token: Token, state: StateLike | None) -> None: ...

    def transaction(self, token: Token) -> AsyncLeaseTransaction: ...

    async def release(self, token: Token, mode: ExitMode | DeclaredExit) -> None: ...

    def _renewal(self, token: Token, options: RenewalOptions) -> AsyncRenewal: ...

    def _given_up(self, token: Token) -> bool: ...

    @property
    def _self_bounded(self) -> bool: ...


class AsyncHold:
    """Holds a work ID for the duration of a ``with`` block.

    Entering acquires the lease (waiting if asked), reads the checkpoint and starts a renewal;
    the object then offers ``token``, ``prior`` (the ``Checkpoint`` read at the start),
    ``renewal`` and ``checkpoint(state)``. Leaving releases the lease:

    - normal exit → FINISHED (after writing the state given to ``finish_with``, if any);
    - ``raise Retire(state)`` → ``state`` (if not ``None``) is checkpointed, then RETIRED; the
      ``Retire`` does not propagate;
    - any other exception, and cancellation → ABANDONED (the last checkpoint stays), and the
      exception propagates;
    - the lease was lost, or the block raised ``FencedError`` → nothing is written (the
      successor sees EXPIRED); the loss propagates (also when the block raised ``Retire``);
    - the block already released or forgot the lease itself → nothing more is written;
    - a fair-share pool handed the work ID over (the renewal was shed: the block was told to
      stop) → the state given to ``finish_with`` (if the block returned) is checkpointed,
      then ABANDONED, so the next member resumes from it; ``LeaseShedError`` from the block
      does not propagate.

    The final writes are bounded by ``cleanup_timeout`` seconds and survive a cancellation
    that arrives meanwhile. If reading the checkpoint fails, nothing is released (the lease
    lapses after its TTL).
    """

    __slots__ = (
        "__weakref__",
        "_cleanup_timeout",
        "_defer",
        "_final",
        "_granted",
        "_lease",
        "_options",
        "_prior",
        "_release",
        "_renewal",
        "_self_bounded",
        "_token",
        "_work_id",
    )

    __module__ = "worklease"

    def __init__(
        self,
        lease: HoldingLease,
        work_id: str,
        options: HoldOptions,
        granted: tuple[Token, Checkpoint | None] | None = None,
        release: AsyncReleaser | None = None,
        defer: Callable[[Token, ExitMode], bool] | None = None,
    ) -> None:
        self._lease = lease
        self._defer = defer
        """Offered a final release with nothing to write first; when it takes it (True),
        the caller releases the lease later, together with others (a stopping pool)."""
        self._release: AsyncReleaser = release if release is not None else lease.release
        # The final writes go through the lease alone: a thread makes them itself when its
        # backend bounds its own calls (a pool's batched releases wait on others).
        self._self_bounded = release is None and lease._self_bounded
        self._granted = granted
        self._work_id = work_id
        self._options = options
        self._cleanup_timeout = options.cleanup_timeout
        self._token: Token | None = None
        self._prior: Checkpoint | None = None
        self._renewal: AsyncRenewal | None = None
        self._final: StateLike | None = None

    @property
    def work_id(self) -> str:
        return self._work_id

    @property
    def token(self) -> Token:
        """The token of the held lease."""
        if self._token is None:
            raise RuntimeError("the hold has not been entered")
        return self._token

    @property
    def prior(self) -> Checkpoint:
        """The checkpoint and previous exit read right after acquiring."""
        if self._prior is None:
            raise RuntimeError("the hold has not been entered")
        return self._prior

    @property
    def renewal(self) -> AsyncRenewal:
        """The renewal keeping the lease alive during the block."""
        if self._renewal is None:
            raise RuntimeError("the hold has not been entered")
        return self._renewal

    async def checkpoint(self, state: StateLike | None) -> None:
        """Write a progress checkpoint (and extend the lease) with the held token."""
        await self._lease.checkpoint(self.token, state)

    def transaction(self) -> AsyncLeaseTransaction:
        """A transactional step with the held token (see ``lease.transaction``)."""
        return self._lease.transaction(self.token)

    def finish_with(self, state: StateLike | None) -> None:
        """Write ``state`` as the final checkpoint when the block exits normally, right before
        releasing FINISHED, as part of the final writes (bounded by the cleanup timeout and
        surviving cancellation). ``None`` keeps the last checkpoint; empty bytes clear it."""
        normalize_state(state)  # refuse a non-bytes state now, inside the block
        self._final = state

    async def __aenter__(self) -> AsyncHold:
        if self._token is not None:
            raise RuntimeError("a hold is entered once; ask the lease for a new one")
        lease = self._lease
        prior: Checkpoint | None
        if self._granted is not None:  # acquired beforehand (a pool's batched acquire)
            token, prior = self._granted
            self._granted = None
        else:
            token, prior = await lease._acquire_with_prior(self._work_id, self._options.acquire)
        self._token = token
        try:
            self._prior = prior if prior is not None else await lease.read_checkpoint(token)
            renewal = lease._renewal(token, self._options.renewal)
            await renewal.__aenter__()
        except Exception:
            raise  # the lease lapses after its TTL: the successor sees EXPIRED
        except BaseException as exc:  # cancelled or interrupted: hand the lease back
            try:
                await acleanup(
                    self._cleanup_timeout,
                    self._release,
                    token,
                    ExitMode.ABANDONED,
                    self_bounded=self._self_bounded,
                )
            except Exception as release_error:
                exc.add_note(f"worklease: releasing as abandoned failed: {release_error!r}")
            raise
        self._renewal = renewal
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        renewal = self.renewal
        try:
            await renewal.__aexit__(exc_type, exc, tb)  # raises the loss cause when lost
        except LeaseShedError as handed_over:
            exc = handed_over  # the block was cancelled to hand the work ID over
        cause = renewal.cause
        if cause is not None:
            if isinstance(exc, Retire):  # nothing was recorded: not a success
                raise fresh(cause) from exc
            return False
        token = self.token
        if isinstance(exc, FencedError) or self._lease._given_up(token):
            return False  # a zombie records nothing; a lease given up in the block is done
        release = self._release
        if isinstance(exc, Retire):
            await acleanup(
                self._cleanup_timeout,
                finish,
                self._lease,
                token,
                exc.state,
                ExitMode.RETIRED,
                release,
                self_bounded=self._self_bounded,
            )
            return True
        shed = renewal.shed
        mode = ExitMode.FINISHED if exc is None and not shed else ExitMode.ABANDONED
        final = self._final if exc is None else None
        if final is None and self._defer is not None and self._defer(token, mode):
            return shed and (exc is None or isinstance(exc, LeaseShedError))
        try:
            await acleanup(
                self._cleanup_timeout,
                finish,
                self._lease,
                token,
                final,
                mode,
                release,
                self_bounded=self._self_bounded,
            )
        except Exception as error:
            if exc is None or isinstance(exc, LeaseShedError):
                raise
            exc.add_note(f"worklease: releasing the lease as abandoned failed: {error!r}")
        return shed and (exc is None or isinstance(exc, LeaseShedError))


async def finish(
    lease: HoldingLease,
    token: Token,
    state: StateLike | None,
    mode: ExitMode,
    release: AsyncReleaser | None = None,
) -> None:
    """Write the final state (if any), then release with ``mode`` (through ``release`` when
    given: a pool batches its releases).

    A failed final write releases ABANDONED instead (the last good checkpoint stays) and
    re-raises; a fenced one releases nothing.
    """
    if release is None:
        release = lease.release
    if state is not None:
        try:
            await lease.checkpoint(token, state)
        except FencedError:
            raise
        except Exception as error:
            try:
                await release(token, ExitMode.ABANDONED)
            except Exception as release_error:
                error.add_note(f"worklease: releasing as abandoned failed too: {release_error!r}")
            raise
    await release(token, mode)
