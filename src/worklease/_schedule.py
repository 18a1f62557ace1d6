"""When background renewals run, which run together, and what each outcome means.

Shared by both flavours and free of waits and I/O: the renewer of each flavour asks these
functions what to do and then does it (waits, calls the backend, cancels a body). The clock
is injected (``clock``, monotonic seconds), so the decisions are tested without sleeping.

One lease object renews all its renewals through one worker. The worker wakes when the
earliest renewal is due; every renewal past half its interval joins that round, so renewals
fall into step and a process sends one renewal call per interval however many leases it
holds. Each renewal keeps its own window, retries and loss.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TypeVar

from ._models import Token
from ._options import RenewalOptions
from ._window import LeaseWindow, TokenSeal, monotonic
from .errors import LeaseExpiredError, LeaseLapsedError, LeaseLostError

__all__ = [
    "OVERDUE_GRACE",
    "ScheduledRenewal",
    "Settled",
    "call_timeout",
    "next_round",
    "overdue",
    "split_round",
]

OVERDUE_GRACE = 0.01
"""How long after a window's end a shared call in flight is checked for it: a single
renewal's own call bound (the same end) then gives up first."""


class Settled(enum.Enum):
    """What the outcome of one renewal attempt means for its renewal."""

    RENEWED = "renewed"
    """The lease was extended; the next attempt is planned one interval on."""
    RETRY = "retry"
    """A transient failure inside the window; a retry is planned with the backoff."""
    LOST = "lost"
    """The lease is lost (``window.cause()`` says why): tell the holder."""
    IGNORED = "ignored"
    """The renewal was stopped meanwhile: the answer means nothing now."""


class ScheduledRenewal:
    """The schedule, retry and loss state of one background renewal (no waits, no I/O)."""

    __slots__ = (
        "_backoff",
        "_base",
        "_clock",
        "_interval",
        "_seal",
        "_token",
        "_ttl",
        "_window",
        "attempt",
        "due",
        "last_error",
        "retrying",
        "stopped",
    )

    def __init__(
        self,
        token: Token,
        seal: TokenSeal,
        ttl: float,
        options: RenewalOptions,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self._token = token
        self._seal = seal
        self._ttl = ttl
        self._interval = options.interval_for(ttl)
        self._backoff = options.backoff
        self._clock = clock
        self._window = LeaseWindow(token, seal.window_end, clock)
        self.due = 0.0
        """When the next attempt is due (monotonic)."""
        self.retrying = False
        """Whether the next attempt retries a failed one (retries never join other rounds)."""
        self.attempt = 1
        """The number of the next attempt within the current renewal cycle."""
        self.last_error: Exception | None = None
        self.stopped = False
        self._base = options.backoff.initial

    @property
    def token(self) -> Token:
        """The token being renewed."""
        return self._token

    @property
    def interval(self) -> float:
        """Seconds between renewal attempts."""
        return self._interval

    @property
    def window(self) -> LeaseWindow:
        return self._window

    def begin(self) -> None:
        """The renewal starts: take the latest window end and plan the first attempt (at once
        when the window already closed, to learn whether the lease is still held)."""
        window = self._window
        window.start(self._seal.window_end)
        now = self._clock()
        self.plan(now if window.end <= now else now + self._interval)

    def plan(self, due: float) -> None:
        self.due = due
        self._window.schedule(due)

    def settle(self, start: float, outcome: Exception | None) -> Settled:
        """Take the outcome of an attempt that began at ``start`` (``None``: renewed)."""
        window = self._window
        if self.stopped or window.stopped:
            return Settled.IGNORED
        ttl = self._ttl
        if outcome is None:
            if not window.renewed(start, ttl):
                return Settled.LOST
            self._seal.extend(start, ttl)
            self.retrying = False
            self.attempt = 1
            self._base = self._backoff.initial
            self.plan(self._clock() + self._interval)
            return Settled.RENEWED
        if isinstance(outcome, LeaseLostError):
            window.lose(self._lapsed(outcome))
            return Settled.LOST
        self.last_error = outcome
        now = self._clock()
        if window.window_closed(now):
            window.lose_by_window(outcome)
            return Settled.LOST
        delay = min(self._backoff.delay(self._base), window.end - now)
        self._base = self._backoff.next_base(self._base)
        self.attempt += 1
        self.retrying = True
        self.plan(now + delay)
        return Settled.RETRY

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


_R = TypeVar("_R", bound=ScheduledRenewal)


def next_round(members: Sequence[_R], now: float) -> tuple[list[_R], float | None]:
    """The renewals to renew now, or (none and) the instant the earliest is due.

    A round holds the due renewals and every renewal more than half way to its next attempt:
    renewing a little early costs nothing and brings every renewal into the same round.
    Retries do not join (their pacing is the backoff's). The instant is ``None`` when there
    is nothing to renew at all.
    """
    due = [renewal for renewal in members if renewal.due <= now]
    if not due:
        return [], (min(renewal.due for renewal in members) if members else None)
    joining = [
        renewal
        for renewal in members
        if renewal.due > now and not renewal.retrying and renewal.due - renewal.interval / 2 <= now
    ]
    return due + joining, now


def split_round(renewals: Sequence[_R], start: float) -> tuple[list[_R], list[_R], list[_R]]:
    """Split a round starting at ``start`` into (the batch to send now, renewals of a work ID
    already in the batch, to send in a round of their own right after, retries whose window
    closed before they could run: lost by window)."""
    batch: list[_R] = []
    later: list[_R] = []
    exhausted: list[_R] = []
    seen: set[str] = set()
    for renewal in renewals:
        if renewal.retrying and renewal.window.window_closed(start):
            exhausted.append(renewal)
        elif renewal.token.work_id in seen:
            later.append(renewal)  # one token per work ID per call
        else:
            seen.add(renewal.token.work_id)
            batch.append(renewal)
    return batch, later, exhausted


def call_timeout(batch: Sequence[ScheduledRenewal], start: float, ttl: float) -> float:
    """Mark the batch's attempts as begun; return the bound of the shared call: the latest
    window end among them (a window already closed counts a whole TTL: its attempt runs to
    learn whether the lease lapsed)."""
    lefts = [renewal.window.begin_attempt(start) for renewal in batch]
    return max(left if left > 0 else ttl for left in lefts)


def overdue(batch: Sequence[_R], told: dict[_R, bool], now: float) -> tuple[list[_R], float | None]:
    """While a shared call is in flight: the renewals of ``batch`` whose window closed (newly
    lost by window; ``told`` holds those found before), and the seconds until the next open
    window closes, plus a small grace (``None``: no open window left)."""
    found: list[_R] = []
    soonest: float | None = None
    for renewal in batch:
        window = renewal.window
        if renewal.stopped or window.stopped or renewal in told:
            continue
        if window.end <= now:
            if window.cause(now) is not None:  # latched: lost by window
                found.append(renewal)
        elif soonest is None or window.end < soonest:
            soonest = window.end
    return found, (None if soonest is None else soonest - now + OVERDUE_GRACE)
