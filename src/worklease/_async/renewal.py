"""Background renewal of one lease, with loss detection."""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING

from .._acompat import AEvent, AHostCanceller, AWorker, acancel_worker, aspawn
from .._context import _current
from .._models import Token
from .._window import Backoff, LeaseWindow, TokenSeal, chain_loss, fresh, monotonic
from ..errors import LeaseExpiredError, LeaseLapsedError, LeaseLostError

if TYPE_CHECKING:
    from contextvars import Token as ContextToken

    from .._context import ActiveRenewal
    from .lease import AsyncLease

__all__ = ["AsyncRenewal"]

logger = logging.getLogger("worklease")


class AsyncRenewal:
    """Keeps one lease renewed in the background while its ``with`` block runs.

    Renewal attempts run every ``interval`` seconds; transient failures are retried with the
    backoff until the lease window closes. The window is tracked on the local monotonic clock
    and never exceeds the real expiry. The lease is lost when a renewal is fenced
    (``FencedError``), finds the lease lapsed (``LeaseLapsedError``), or the window closes
    before a renewal succeeded (``LeaseWindowExhaustedError``); ``cause`` then holds the
    error, ``remaining()`` returns ``None``, and every later write with the token through the
    same lease raises it without touching the backend.

    How the block learns of a loss depends on the flavour. With asyncio the task running the
    block is cancelled and the block raises the cause (an outside cancellation still raises
    ``CancelledError``). A thread cannot be cancelled: call ``raise_if_lost()`` between steps;
    leaving the block raises the cause. The block's own exception is never masked; the loss
    is chained to it.
    """

    __module__ = "worklease"

    def __init__(
        self,
        lease: AsyncLease,
        token: Token,
        seal: TokenSeal,
        interval: float,
        backoff: Backoff,
    ) -> None:
        self._lease = lease
        self._token = token
        self._seal = seal
        self._interval = interval
        self._backoff = backoff
        self._window = LeaseWindow(token, seal.window_end)
        self._wake = AEvent()
        self._canceller = AHostCanceller()
        self._worker: AWorker | None = None
        self._context: ContextToken[ActiveRenewal | None] | None = None
        self._entered = False
        self._stopped = False

    @property
    def token(self) -> Token:
        """The token being renewed."""
        return self._token

    @property
    def interval(self) -> float:
        """Seconds between renewal attempts."""
        return self._interval

    @property
    def cause(self) -> LeaseLostError | None:
        """Why the lease was lost, or ``None`` while it is held (or after a normal stop)."""
        return self._window.cause()

    @property
    def lost(self) -> bool:
        """Whether the lease was lost."""
        return self._window.cause() is not None

    def remaining(self) -> float | None:
        """Seconds of guaranteed lease left; ``None`` once lost or stopped."""
        return self._window.remaining()

    def raise_if_lost(self) -> None:
        """Raise the loss cause if the lease was lost; otherwise do nothing."""
        cause = self._window.cause()
        if cause is not None:
            raise fresh(cause)

    def stop(self) -> None:
        """Stop renewing, without waiting for an attempt in flight. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._window.stop()
        self._wake.set()
        if self._worker is not None:
            acancel_worker(self._worker)

    def __repr__(self) -> str:
        state = "lost" if self.lost else "stopped" if self._stopped else "active"
        return f"<{type(self).__name__} {state} {self._token!r}>"

    async def __aenter__(self) -> AsyncRenewal:
        if self._entered:
            raise RuntimeError("a renewal runs once; ask the lease for a new one")
        self._entered = True
        self._window.start(self._seal.window_end)
        self._window.schedule(monotonic() + self._interval)  # due even if never scheduled
        self._seal.attach(self._window, self.stop)
        self._canceller.bind()
        self._context = _current.set(self)
        self._worker = aspawn(self._run, name=f"worklease-renewal:{self._token.work_id}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cause = self._window.stop()  # the final verdict, decided atomically with the stop
        self.stop()
        if self._context is not None:
            _current.reset(self._context)
            self._context = None
        requested = self._canceller.requested
        ours = self._canceller.consume(exc)
        if cause is not None and ours:
            raise fresh(cause)  # replaces our own CancelledError
        if exc is not None:
            if cause is not None:
                chain_loss(exc, cause, cancelled=requested)
            return
        if cause is not None:
            raise fresh(cause)

    # -- the background loop ------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            # A window already closed at the start (a slow step between acquire and renewal):
            # renew at once, to learn whether the lease is still held.
            wait = 0.0 if self._window.end <= monotonic() else self._interval
            while True:
                self._window.schedule(monotonic() + wait)
                if await self._wake.wait_timeout(wait):
                    return
                if self._window.stopped or await self._cycle():
                    return
                wait = self._interval
        except Exception as exc:
            # A bug here must not leave the holder believing it holds a lease nobody renews.
            logger.exception("worklease renewal of %r failed unexpectedly", self._token)
            self._lose(self._window.lose_by_window(exc))

    async def _cycle(self) -> bool:
        """One renewal with its retries; True when the loop must end (lost or stopped)."""
        ttl = self._lease.ttl
        base = self._backoff.initial
        attempt = 1
        while True:
            start = monotonic()
            left = self._window.begin_attempt(start)
            try:
                await self._lease._renew_once(self._token, attempt, left if left > 0 else ttl)
            except LeaseLostError as exc:
                if self._window.stopped:  # released or stopped meanwhile: not a loss
                    return True
                return self._lose(self._window.lose(self._lapsed(exc)))
            except Exception as exc:
                error: Exception = exc
            else:
                if self._window.renewed(start, ttl):
                    self._seal.extend(start, ttl)
                    return False
                return self._lose(self._window.cause())
            if self._stopped:
                return True
            now = monotonic()
            if self._window.window_closed(now):
                return self._lose(self._window.lose_by_window(error))
            delay = min(self._backoff.delay(base), self._window.end - now)
            if await self._wake.wait_timeout(delay):
                return True
            if self._window.window_closed(monotonic()):
                return self._lose(self._window.lose_by_window(error))
            base = self._backoff.next_base(base)
            attempt += 1

    def _lapsed(self, error: LeaseLostError) -> LeaseLostError:
        """The loss cause for a renewal the backend refused (fenced is reported as is)."""
        if not isinstance(error, LeaseExpiredError) or isinstance(error, LeaseLapsedError):
            return error
        token = self._token
        lapsed = LeaseLapsedError(
            f"renewal found the lease on work ID {token.work_id!r} (holder "
            f"{token.holder_id!r}, token {token.fencing_token}) already lapsed",
            token=token,
        )
        lapsed.__cause__ = error
        return lapsed

    def _lose(self, cause: LeaseLostError | None) -> bool:
        if cause is not None and not self._stopped:
            self._canceller.cancel()
        return True
