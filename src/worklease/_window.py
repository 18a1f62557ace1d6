"""Renewal arithmetic shared by both flavours: the retry backoff and the lease window.

Nothing here waits or does I/O; the generated renewal loops call into it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from ._compat import ThreadLock
from ._models import Token
from ._validation import MAX_DURATION, to_seconds
from .errors import (
    ConfigError,
    InvalidTokenError,
    LeaseLostError,
    LeaseWindowExhaustedError,
)

__all__ = ["Backoff", "LeaseWindow", "TokenSeal", "monotonic", "seal_token", "unseal"]

monotonic = time.monotonic

_MIN_BACKOFF = 0.001


@dataclass(frozen=True, slots=True, init=False)
class Backoff:
    """Retry pacing for transient renewal failures.

    The n-th retry waits ``base + uniform(0, jitter * base)`` where ``base`` starts at
    ``initial`` and doubles per retry up to ``maximum``. Out-of-range values are clamped, in
    this order: ``initial`` or ``maximum`` not positive → 1 ms, above ``MAX_DURATION`` (100
    years, infinity included) → ``MAX_DURATION``; ``jitter`` into [0, 1]; ``initial`` above
    ``maximum`` → ``maximum``. Durations are seconds or ``timedelta``; a value that is not a
    number, or NaN, raises ``ConfigError``.
    """

    __module__ = "worklease"

    initial: float
    maximum: float
    jitter: float

    def __init__(
        self, initial: float | object = 0.1, maximum: float | object = 5.0, jitter: float = 0.2
    ) -> None:
        try:
            first = to_seconds(initial, "initial")
            cap = to_seconds(maximum, "maximum")
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"Backoff: {exc}") from None
        if isinstance(jitter, bool) or not isinstance(jitter, int | float):
            raise ConfigError(f"Backoff: jitter must be a number (a fraction), not {jitter!r}")
        spread = float(jitter)
        if math.isnan(first) or math.isnan(cap) or math.isnan(spread):
            raise ConfigError("backoff values must not be NaN")
        first = min(first, MAX_DURATION) if first > 0 else _MIN_BACKOFF
        cap = min(cap, MAX_DURATION) if cap > 0 else _MIN_BACKOFF
        spread = min(max(spread, 0.0), 1.0)
        first = min(first, cap)
        object.__setattr__(self, "initial", first)
        object.__setattr__(self, "maximum", cap)
        object.__setattr__(self, "jitter", spread)

    def delay(self, base: float) -> float:
        """The wait for one retry at ``base`` seconds, with jitter added."""
        return base + random.uniform(0.0, self.jitter * base) if self.jitter else base

    def next_base(self, base: float) -> float:
        """The base of the retry after one at ``base``."""
        return min(base * 2, self.maximum)


class TokenSeal:
    """The lease-private part of a token: who issued it, and its renewal state."""

    __slots__ = ("fields", "given_up", "issuer", "stop_renewal", "window", "window_end")

    def __init__(self, issuer: object, token: Token, window_end: float) -> None:
        self.issuer = issuer
        self.fields = (token.work_id, token.holder_id, token.fencing_token, token.expires_at)
        self.window_end = window_end
        """Best known monotonic instant up to which the lease is held."""
        self.window: LeaseWindow | None = None
        """The window of the most recent renewal, kept after it stops (its loss latches)."""
        self.stop_renewal: Callable[[], object] | None = None
        self.given_up = False
        """The holder released or forgot the lease through the lease object."""

    def lost_cause(self) -> LeaseLostError | None:
        window = self.window
        return window.cause() if window is not None else None

    def extend(self, call_start: float, ttl: float) -> None:
        """A successful write starting at ``call_start`` extended the lease."""
        self.window_end = max(self.window_end, call_start + ttl)
        window = self.window
        if window is not None:
            window.extend(call_start, ttl)

    def deadline(self) -> float | None:
        """The end of the window of the renewal running on this token (monotonic), or
        ``None`` without one: a write through the lease must not outlive it."""
        window = self.window
        if window is None or window.stopped:
            return None
        return window.end

    def attach(self, window: LeaseWindow, stop: Callable[[], object]) -> None:
        self.window = window
        self.stop_renewal = stop

    def finished(self) -> None:
        """The holder releases or forgets the lease: a renewal still running must stop."""
        self.given_up = True
        stop = self.stop_renewal
        if stop is not None:
            stop()


def seal_token(raw: Token, issuer: object, call_start: float, ttl: float) -> Token:
    """Return ``raw`` sealed for ``issuer``, with its initial lease window.

    The window ends at the start of the acquire call plus the TTL, on the local monotonic
    clock. The backend set the expiry to its own "now" (which is later than the call's
    start) plus the same TTL, so the window never outlasts the real lease, whatever the offset
    between the clocks. The token's ``expires_at`` (backend clock) is deliberately not read
    through the local wall clock: a wall clock that is off, or jumps, must not change what the
    holder believes (the backend protocol requires expiry = backend now + ttl).
    """
    if not isinstance(raw, Token):
        raise TypeError(f"backend acquire returned {type(raw).__name__}, expected Token")
    if raw.expires_at.tzinfo is None:
        raise ValueError("backend returned a naive expires_at; it must be timezone-aware")
    # A fresh token from the backend is sealed as it is (building a frozen dataclass again
    # costs more than the rest of the lease's bookkeeping for the call); one already sealed
    # (a backend handing out an object twice) is copied, so no seal is ever replaced. The
    # check is not atomic: it relies on a grant's token object going to that one grant, as
    # every backend here builds a new one per grant (two grants of one object at the same
    # time would be the same token granted twice).
    token = raw
    if raw._seal is not None or type(raw) is not Token:
        token = Token(raw.work_id, raw.holder_id, raw.fencing_token, raw.expires_at)
    object.__setattr__(token, "_seal", TokenSeal(issuer, token, call_start + ttl))
    return token


def unseal(token: object, issuer: object) -> TokenSeal:
    """The seal of a token issued through ``issuer``; InvalidTokenError otherwise."""
    if not isinstance(token, Token):
        raise TypeError(f"expected a Token from acquire, not {type(token).__name__}")
    seal = token._seal
    if not isinstance(seal, TokenSeal):
        raise InvalidTokenError(
            f"token for work ID {token.work_id!r} was not produced by acquire; "
            "tokens cannot be built or copied by hand"
        )
    if seal.issuer is not issuer:
        raise InvalidTokenError(
            f"token for work ID {token.work_id!r} was issued through another backend"
        )
    if seal.fields != (token.work_id, token.holder_id, token.fencing_token, token.expires_at):
        raise InvalidTokenError(f"token for work ID {token.work_id!r} was altered after acquire")
    return seal


class LeaseWindow:
    """The monotonic lease window and loss state of one renewal. Thread-safe.

    ``end`` is the monotonic instant up to which the lease is guaranteed held. The lease is
    lost when a renewal is fenced, finds the lease lapsed, or when the window closes while a
    renewal attempt (or its retries) that began inside the window has not succeeded. Loss by
    window is decided by the clock whenever anybody looks, so a stalled call cannot hide it.
    """

    __slots__ = ("_cause", "_clock", "_due", "_end", "_lock", "_stopped", "_trying_since", "token")

    def __init__(self, token: Token, end: float, clock: Callable[[], float] = monotonic) -> None:
        self.token = token
        self._clock = clock
        self._lock = ThreadLock()
        self._end = end
        self._trying_since: float | None = None
        self._due: float | None = None
        self._cause: LeaseLostError | None = None
        self._stopped = False

    @property
    def end(self) -> float:
        return self._end

    @property
    def stopped(self) -> bool:
        return self._stopped

    def cause(self, now: float | None = None) -> LeaseLostError | None:
        """The loss cause, latching window exhaustion if the window closed mid-renewal."""
        with self._lock:
            return self._check(self._clock() if now is None else now)

    def _check(self, now: float) -> LeaseLostError | None:
        if self._cause is None and not self._stopped and self._end <= now:
            since = self._trying_since
            due = self._due
            # Lost when a renewal that began (or was due to begin) inside the window has not
            # succeeded by its end: a stalled call, or a starved renewal that never got to run.
            # A renewal due only after the window closed (interval longer than the TTL) still
            # runs, to tell a lapsed lease from a stalled database.
            if (since is not None and since < self._end) or (due is not None and due < self._end):
                self._cause = self._exhausted()
        return self._cause

    def _exhausted(self) -> LeaseWindowExhaustedError:
        token = self.token
        return LeaseWindowExhaustedError(
            f"lease window for work ID {token.work_id!r} (holder {token.holder_id!r}, "
            f"token {token.fencing_token}) closed before a renewal succeeded",
            token=token,
        )

    def remaining(self, now: float | None = None) -> float | None:
        """Seconds of guaranteed lease left; ``None`` once lost or stopped."""
        with self._lock:
            now = self._clock() if now is None else now
            if self._stopped or self._check(now) is not None:
                return None
            return max(self._end - now, 0.0)

    def schedule(self, due: float) -> None:
        """The next renewal attempt is due at ``due`` (monotonic)."""
        with self._lock:
            self._due = due

    def begin_attempt(self, now: float) -> float:
        """Mark a renewal attempt as started; return the seconds left in the window.

        The result is not positive when the window closed while the renewal was idle (an
        interval longer than the TTL): the attempt must still run to learn whether the lease
        lapsed, and loss by window does not apply to an attempt that began after the window.
        """
        with self._lock:
            if self._trying_since is None:
                self._trying_since = now
            return self._end - now

    def renewed(self, call_start: float, ttl: float) -> bool:
        """Record a successful renewal; False if the lease was lost (or stopped) meanwhile."""
        with self._lock:
            if self._check(self._clock()) is not None or self._stopped:
                return False
            self._end = max(self._end, call_start + ttl)
            self._trying_since = None
            self._due = None
            return True

    def extend(self, call_start: float, ttl: float) -> None:
        """A write outside the renewal (checkpoint, renew) extended the lease."""
        with self._lock:
            if self._cause is None and not self._stopped:
                self._end = max(self._end, call_start + ttl)

    def lose(self, cause: LeaseLostError) -> LeaseLostError | None:
        """Record the loss unless one was already recorded or the renewal was stopped (a
        stopped renewal's late answers mean nothing); return the effective cause."""
        with self._lock:
            if self._cause is None and not self._stopped:
                self._cause = cause
            return self._cause

    def lose_by_window(self, error: BaseException | None = None) -> LeaseLostError | None:
        """Record window exhaustion (chained to the last transient error)."""
        cause = self._exhausted()
        if error is not None:
            cause.__cause__ = error
        return self.lose(cause)

    def window_closed(self, now: float) -> bool:
        return now >= self._end

    def stop(self, now: float | None = None) -> LeaseLostError | None:
        """Stop tracking; return the final cause, decided atomically with the stop."""
        with self._lock:
            cause = self._check(self._clock() if now is None else now)
            self._stopped = True
            return cause

    def start(self, end: float) -> None:
        """The renewal starts: take the latest known window end."""
        with self._lock:
            self._end = max(self._end, end)


def fresh(cause: LeaseLostError) -> LeaseLostError:
    """The recorded loss, ready to raise again: the same object (``renewal.cause`` is what
    gets raised), with the traceback of its previous raise dropped."""
    cause.__suppress_context__ = True
    return cause.with_traceback(None)


def chain_loss(error: BaseException, cause: LeaseLostError, *, cancelled: bool = False) -> None:
    """Attach a lease loss to the body's own exception without masking it.

    ``cancelled``: the body was cancelled because of the loss and raised ``error`` instead;
    the loss then replaces the cancellation as the error's context.
    """
    if error is cause:
        return
    if error.__context__ is None or cancelled:
        error.__context__ = cause
    error.add_note(f"worklease: the lease was lost meanwhile: {cause}")
