"""Flavour-neutral helpers for the leader and the pool: jitter, permanence, callbacks."""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime

from ._validation import positive_seconds
from .errors import ConfigError

__all__ = ["IDLE_JITTER", "WaitPacing", "interval", "is_permanent", "jittered"]

logger = logging.getLogger("worklease")

IDLE_JITTER = 0.2
"""Idle and rerun waits are drawn uniformly from [base, base * (1 + IDLE_JITTER))."""


def jittered(base: float) -> float:
    """A wait of ``base`` seconds stretched by up to 20 % (0 stays 0)."""
    if base <= 0:
        return 0.0
    return base * random.uniform(1.0, 1.0 + IDLE_JITTER)


def interval(value: object, name: str) -> float:
    """A positive, finite duration in seconds, or ConfigError."""
    try:
        return positive_seconds(value, name)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def is_permanent(error: BaseException) -> bool:
    """Whether ``error``, or an exception it was raised from, says it is permanent.

    Any exception with a ``permanent()`` method returning true qualifies (``PermanentError``
    and ``worklease.permanent(exc)`` among them). The chain is followed through explicit
    wrapping only (``__cause__``, as ``raise ... from exc`` sets it), not through exceptions
    that were merely being handled when it was raised.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        check = getattr(current, "permanent", None)
        if callable(check):
            try:
                if check():
                    return True
            except Exception:
                logger.exception("permanent() of %r raised; treated as not permanent", current)
        current = current.__cause__
    return False


class WaitPacing:
    """How long a waiting acquire sleeps after ``LeaseHeldError``.

    The earlier of the poll interval and the holder's expiry (plus a few milliseconds), so a
    crashed holder's work is picked up right after it expires. The expiry is the backend's
    clock read through ours: if a wait that lasted until it finds the same expiry still in
    force (clock offset, or a holder that renewed exactly then), the next wait is the full
    poll interval, so a skewed clock can never turn the wait into a busy loop. A wait cut
    short before the expiry (a release notification for the work ID, which somebody else
    then took first) waits for the expiry again.
    """

    MARGIN = 0.005

    def __init__(self, poll: float) -> None:
        self._poll = poll
        self._last: datetime | None = None

    def next_delay(self, expires_at: datetime | None, started: datetime | None = None) -> float:
        """The wait after an attempt that found the work ID held until ``expires_at``;
        ``started`` is when that attempt began (now when not given). The same expiry counts
        as "still in force" only for an attempt that began after it: one that began before
        and merely ended after it (a slow round trip, a loaded machine) waits for the expiry
        again, a few milliseconds."""
        if expires_at is None:
            self._last = None
            return self._poll
        now = datetime.now(UTC)
        began = now if started is None else started
        if expires_at == self._last and began >= expires_at:
            return self._poll
        self._last = expires_at
        until = (expires_at - now).total_seconds() + self.MARGIN
        return min(self._poll, max(until, self.MARGIN))
