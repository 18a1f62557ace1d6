"""Background renewal of one lease, with loss detection."""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING

from .._acompat import (
    ARENEWER_LINGER,
    Abandoned,
    AEvent,
    AHostCanceller,
    AWorker,
    ThreadLock,
    aabandonable,
    aspawn,
    aworker_alive,
)
from .._context import _current
from .._models import Token
from .._window import Backoff, LeaseWindow, TokenSeal, chain_loss, fresh, monotonic
from ..errors import LeaseExpiredError, LeaseLapsedError, LeaseLostError

if TYPE_CHECKING:
    from contextvars import Token as ContextToken

    from .._context import ActiveRenewal
    from .lease import AsyncLease

__all__ = ["AsyncRenewal", "AsyncRenewer"]

logger = logging.getLogger("worklease")

_OVERDUE_GRACE = 0.01
"""How long after a window's end a shared call in flight is checked for it."""


class AsyncRenewal:
    """Keeps one lease renewed in the background while its ``with`` block runs.

    Renewal attempts run every ``interval`` seconds (up to half an interval early, to share a
    backend call with the lease object's other renewals); transient failures are retried with
    the backoff until the lease window closes. The window is tracked on the local monotonic clock
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
        self._canceller = AHostCanceller()
        self._renewer: AsyncRenewer | None = None
        self._due = 0.0
        self._retrying = False
        self._attempt = 1
        self._base = backoff.initial
        self._last_error: Exception | None = None
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
        if self._renewer is not None:
            self._renewer.discard(self)

    def __repr__(self) -> str:
        state = "lost" if self.lost else "stopped" if self._stopped else "active"
        return f"<{type(self).__name__} {state} {self._token!r}>"

    async def __aenter__(self) -> AsyncRenewal:
        if self._entered:
            raise RuntimeError("a renewal runs once; ask the lease for a new one")
        self._entered = True
        self._window.start(self._seal.window_end)
        now = monotonic()
        # A window already closed at the start (a slow step between acquire and renewal):
        # renew at once, to learn whether the lease is still held.
        self._plan(now if self._window.end <= now else now + self._interval)
        self._canceller.bind()
        self._context = _current.set(self)
        self._lease._renew_in_background(self)  # sets _renewer before stop() can be reached
        self._seal.attach(self._window, self.stop)
        if self._seal.given_up:  # released or forgotten meanwhile, from another thread
            self.stop()
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

    # -- driven by the lease's renewer ---------------------------------------------------------

    def _plan(self, due: float) -> None:
        self._due = due
        self._window.schedule(due)

    def _settle(self, start: float, outcome: Exception | None) -> None:
        """Take the outcome of an attempt that began at ``start`` (``None``: renewed)."""
        window = self._window
        if self._stopped or window.stopped:  # released or stopped meanwhile: not a loss
            return
        ttl = self._lease.ttl
        if outcome is None:
            if window.renewed(start, ttl):
                self._seal.extend(start, ttl)
                self._retrying = False
                self._attempt = 1
                self._base = self._backoff.initial
                self._plan(monotonic() + self._interval)
            else:
                self._lose(window.cause())
            return
        if isinstance(outcome, LeaseLostError):
            self._lose(window.lose(self._lapsed(outcome)))
            return
        self._last_error = outcome
        now = monotonic()
        if window.window_closed(now):
            self._lose(window.lose_by_window(outcome))
            return
        delay = min(self._backoff.delay(self._base), window.end - now)
        self._base = self._backoff.next_base(self._base)
        self._attempt += 1
        self._retrying = True
        self._plan(now + delay)

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

    def _lose(self, cause: LeaseLostError | None) -> None:
        if self._renewer is not None:
            self._renewer.discard(self)
        if cause is not None and not self._stopped:
            self._canceller.cancel()


class AsyncRenewer:
    """Renews every running renewal of one lease object together.

    One worker per lease object (per event loop with asyncio) waits until the earliest renewal
    is due, then renews it together with every other renewal already past half its interval,
    in one backend call (``renew_many`` when the backend has it, else one ``renew`` per
    token). Renewals thus fall into step and the process sends one statement per renewal
    interval, however many leases it holds. Each renewal keeps its own interval, window,
    retries and loss: the outcome of the shared call is settled token by token.
    """

    def __init__(self, lease: AsyncLease, key: object) -> None:
        self._lease = lease
        self._key = key
        self._lock = ThreadLock()
        self._members: dict[AsyncRenewal, None] = {}
        self._wake = AEvent()
        self._worker: AWorker | None = None
        self._in_flight: set[AsyncRenewal] = set()
        self._abandon = AEvent()
        self._wakes_at = 0.0
        """When the waiting worker wakes next (monotonic); 0 while it is busy. Read and
        written under the lock together with the member snapshot, so no wake-up is lost."""

    def add(self, renewal: AsyncRenewal) -> None:
        """Renew ``renewal`` from now on (called under the lease's renewer lock)."""
        with self._lock:
            self._members[renewal] = None
            renewal._renewer = self
            if self._worker is None or not aworker_alive(self._worker):
                self._wake = AEvent()
                self._wakes_at = 0.0
                self._worker = aspawn(self._run, name="worklease-renewals")
            elif renewal._due >= self._wakes_at > 0.0:
                return  # the worker wakes before this one is due anyway
            wake = self._wake
        wake.set()

    def discard(self, renewal: AsyncRenewal) -> None:
        with self._lock:
            if renewal not in self._members:
                return
            del self._members[renewal]
            wake = self._wake
            if renewal in self._in_flight:
                self._in_flight.discard(renewal)
                if not self._in_flight:
                    self._abandon.set()  # nobody wants the answer: let the call go
            if self._members or ARENEWER_LINGER:
                return  # the worker finds out when it next wakes
        wake.set()  # nothing left: a worker that ends at once should not wait for a due

    def retire_if_idle(self) -> bool:
        """End the worker if nothing is left to renew (under the lease's renewer lock)."""
        with self._lock:
            if self._members:
                return False
            self._worker = None
            return True

    async def _run(self) -> None:
        try:
            while await self._step():
                pass
        except Exception as exc:
            # A bug here must not leave a holder believing it holds a lease nobody renews.
            logger.exception("worklease renewals of %r failed unexpectedly", self._lease)
            self._abort(exc)
        except BaseException as exc:
            # Cancelled (the event loop shuts down, or somebody cancels every task): nobody
            # renews these leases any more, so report them lost rather than leave their
            # holders believing otherwise.
            self._abort(exc)
            raise

    def _abort(self, error: BaseException) -> None:
        self._lease._forget_renewer(self._key, self)
        with self._lock:
            members, self._members = list(self._members), {}
            self._worker = None
        for renewal in members:
            renewal._lose(renewal._window.lose_by_window(error))

    async def _step(self) -> bool:
        """One wait or one round of renewals; False when the worker ends."""
        now = monotonic()
        with self._lock:
            wake = self._wake
            wake.clear()
            for renewal in [r for r in self._members if r._stopped]:
                del self._members[renewal]  # stopped before it was ever added (defensive)
            members = list(self._members)
            due = [renewal for renewal in members if renewal._due <= now]
            if not members:
                self._wakes_at = now + ARENEWER_LINGER
            elif not due:
                self._wakes_at = min(renewal._due for renewal in members)
            else:
                self._wakes_at = 0.0
            wakes_at = self._wakes_at
        if not due:
            woken = await wake.wait_timeout(wakes_at - now)
            with self._lock:
                self._wakes_at = 0.0  # awake: whatever is added gets looked at
            if not members and not woken:
                return not self._lease._retire_renewer(self._key, self)
            return True
        # Renewals more than half way to their next attempt join this one: renewing a little
        # early costs nothing, and it brings every renewal into the same round.
        joining = [
            renewal
            for renewal in members
            if renewal._due > now
            and not renewal._retrying
            and renewal._due - renewal._interval / 2 <= now
        ]
        await self._round(due + joining)
        return True

    def _overdue(self, batch: list[AsyncRenewal], lost: dict[AsyncRenewal, bool]) -> float | None:
        """While a call is in flight: take out the renewals whose window closed meanwhile, so
        their holders learn it now rather than when the shared call ends, and return the
        seconds until the next open window closes. Their holders are told at once unless
        that leaves the call with nobody waiting for it: it is then abandoned first (see
        ``_round``), so an abandoned call is always cancelled before its holders hear."""
        now = monotonic()
        soonest: float | None = None
        for renewal in batch:
            window = renewal._window
            if renewal._stopped or window.stopped or renewal in lost:
                continue
            if window.end <= now:
                if window.cause(now) is not None:  # latched: lost by window
                    lost[renewal] = False  # not told yet
                    self.discard(renewal)
            elif soonest is None or window.end < soonest:
                soonest = window.end
        with self._lock:
            abandoning = not self._in_flight
        if not abandoning:
            self._tell(lost)
        # Looked at a little after the window's end: a single renewal's own call bound (the
        # same end) then gives up first and is cancelled before its holder hears.
        return None if soonest is None else soonest - now + _OVERDUE_GRACE

    @staticmethod
    def _tell(lost: dict[AsyncRenewal, bool]) -> None:
        for renewal, told in lost.items():
            if not told:
                lost[renewal] = True
                renewal._lose(renewal._window.cause())

    async def _round(self, renewals: list[AsyncRenewal]) -> None:
        start = monotonic()
        batch: list[AsyncRenewal] = []
        later: list[AsyncRenewal] = []
        seen: set[str] = set()
        for renewal in renewals:
            window = renewal._window
            if renewal._retrying and window.window_closed(start):
                renewal._lose(window.lose_by_window(renewal._last_error))
            elif renewal._token.work_id in seen:
                later.append(renewal)  # one token per work ID per call
            else:
                seen.add(renewal._token.work_id)
                batch.append(renewal)
        if not batch:
            return
        ttl = self._lease.ttl
        lefts = [renewal._window.begin_attempt(start) for renewal in batch]
        timeout = max(left if left > 0 else ttl for left in lefts)
        with self._lock:
            self._in_flight = set(batch)
            self._abandon = abandon = AEvent()
        lost: dict[AsyncRenewal, bool] = {}  # lost by window during the call: told yet?
        try:
            outcomes = await aabandonable(
                abandon,
                lambda: self._overdue(batch, lost),
                self._lease._renew_together,
                [renewal._token for renewal in batch],
                [renewal._attempt for renewal in batch],
                timeout,
            )
        except Abandoned:
            return  # every renewal of the call stopped (or lost its window) meanwhile
        finally:
            with self._lock:
                self._in_flight = set()
            self._tell(lost)
        for renewal, outcome in zip(batch, outcomes, strict=True):
            renewal._settle(start, outcome)
        if later:
            await self._round(later)
