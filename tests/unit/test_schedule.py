"""The pure renewal schedule shared by both flavours, driven by an injected clock.

No sleeping: every decision (when a renewal is due, which renewals share a call, what an
outcome means, which windows close while a call is in flight) is checked at chosen instants.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from worklease import (
    BackendError,
    Backoff,
    FencedError,
    LeaseExpiredError,
    LeaseLapsedError,
    LeaseWindowExhaustedError,
    Token,
)
from worklease._options import RenewalOptions
from worklease._schedule import (
    OVERDUE_GRACE,
    ScheduledRenewal,
    Settled,
    call_timeout,
    next_round,
    overdue,
    split_round,
)
from worklease._window import TokenSeal, seal_token

TTL = 30.0
INTERVAL = 10.0
NO_JITTER = Backoff(initial=1.0, maximum=8.0, jitter=0.0)


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _sealed(work_id: str, clock: Clock) -> tuple[Token, TokenSeal]:
    raw = Token(work_id, "holder", 1, datetime.now(UTC) + timedelta(seconds=TTL))
    token = seal_token(raw, object(), clock(), TTL)
    seal = token._seal
    assert isinstance(seal, TokenSeal)
    return token, seal


def _renewal(
    clock: Clock, work_id: str = "w1", interval: float = INTERVAL, backoff: Backoff = NO_JITTER
) -> ScheduledRenewal:
    token, seal = _sealed(work_id, clock)
    renewal = ScheduledRenewal(token, seal, TTL, RenewalOptions(interval, backoff), clock)
    renewal.begin()
    return renewal


def _transient() -> BackendError:
    return BackendError("connection reset", transient=True)


# -- one renewal ------------------------------------------------------------------------------


def test_first_attempt_is_one_interval_after_the_start() -> None:
    clock = Clock()
    renewal = _renewal(clock)
    assert renewal.due == clock.now + INTERVAL
    assert renewal.window.end == clock.now + TTL
    assert RenewalOptions().interval_for(TTL) == TTL / 3


def test_a_window_already_closed_at_the_start_renews_at_once() -> None:
    """A slow step between acquire and renewal: the first attempt is due right away."""
    clock = Clock()
    token, seal = _sealed("w1", clock)
    clock.advance(TTL + 1)
    renewal = ScheduledRenewal(token, seal, TTL, RenewalOptions(INTERVAL, NO_JITTER), clock)
    renewal.begin()
    assert renewal.due == clock.now


def test_a_success_extends_from_the_start_of_the_call_and_plans_the_next() -> None:
    clock = Clock()
    renewal = _renewal(clock)
    clock.advance(INTERVAL)
    start = clock.now
    clock.advance(0.2)  # the call took 200 ms
    assert renewal.settle(start, None) is Settled.RENEWED
    assert renewal.window.end == start + TTL  # from the call's start, never its end
    assert renewal.due == clock.now + INTERVAL
    assert (renewal.attempt, renewal.retrying) == (1, False)


def test_transient_failures_retry_with_the_backoff_inside_the_window() -> None:
    clock = Clock()
    renewal = _renewal(clock)
    clock.advance(INTERVAL)
    assert renewal.settle(clock.now, _transient()) is Settled.RETRY
    assert (renewal.attempt, renewal.retrying) == (2, True)
    assert renewal.due == clock.now + 1.0  # the backoff's initial wait
    clock.advance(1.0)
    assert renewal.settle(clock.now, _transient()) is Settled.RETRY
    assert renewal.due == clock.now + 2.0  # doubled
    assert renewal.attempt == 3


def test_a_retry_never_waits_past_the_window() -> None:
    clock = Clock()
    renewal = _renewal(clock, backoff=Backoff(initial=100.0, maximum=100.0, jitter=0.0))
    clock.advance(INTERVAL)
    assert renewal.settle(clock.now, _transient()) is Settled.RETRY
    assert renewal.due == renewal.window.end


def test_a_transient_failure_after_the_window_closed_is_a_loss_by_window() -> None:
    clock = Clock()
    renewal = _renewal(clock)
    clock.advance(INTERVAL)
    start = clock.now
    renewal.window.begin_attempt(start)
    clock.advance(TTL)  # the call hung past the window
    error = _transient()
    assert renewal.settle(start, error) is Settled.LOST
    cause = renewal.window.cause()
    assert isinstance(cause, LeaseWindowExhaustedError)
    assert cause.__cause__ is error


def test_fenced_is_reported_as_is_and_expired_as_lapsed() -> None:
    clock = Clock()
    fenced = _renewal(clock, "w1")
    error = FencedError("fenced", token=fenced.token)
    assert fenced.settle(clock.now, error) is Settled.LOST
    assert fenced.window.cause() is error
    lapsed = _renewal(clock, "w2")
    expired = LeaseExpiredError("expired", token=lapsed.token)
    assert lapsed.settle(clock.now, expired) is Settled.LOST
    cause = lapsed.window.cause()
    assert isinstance(cause, LeaseLapsedError)
    assert cause.__cause__ is expired


def test_a_stopped_renewal_ignores_late_answers() -> None:
    clock = Clock()
    renewal = _renewal(clock)
    renewal.stopped = True
    assert renewal.settle(clock.now, FencedError("late", token=renewal.token)) is Settled.IGNORED
    assert renewal.window.cause() is None


# -- rounds -----------------------------------------------------------------------------------


def test_nothing_to_renew_and_the_earliest_due() -> None:
    clock = Clock()
    assert next_round([], clock.now) == ([], None)
    a = _renewal(clock, "a")
    clock.advance(1.0)
    b = _renewal(clock, "b")
    assert next_round([a, b], clock.now) == ([], a.due)


def test_renewals_past_half_their_interval_join_the_due_one() -> None:
    """a is due; b is past half its interval (joins); c is not (waits); a retry never joins."""
    clock = Clock()
    a = _renewal(clock, "a")
    clock.advance(4.0)
    b = _renewal(clock, "b")  # due at +14, half way at +9
    clock.advance(2.0)
    c = _renewal(clock, "c")  # due at +16, half way at +11
    clock.advance(2.0)
    retry = _renewal(clock, "r", backoff=Backoff(initial=5.0, maximum=5.0, jitter=0.0))
    retry.settle(clock.now, _transient())  # retrying, due at +13: it would join otherwise
    clock.now = a.due
    chosen, _ = next_round([a, b, c, retry], clock.now)
    assert chosen == [a, b]


def test_split_sends_one_token_per_work_id_and_drops_exhausted_retries() -> None:
    clock = Clock()
    first = _renewal(clock, "same")
    second = _renewal(clock, "same")
    other = _renewal(clock, "other")
    stale = _renewal(clock, "stale")
    stale.settle(clock.now, _transient())
    clock.advance(TTL + 1)  # stale's window closed before its retry could run
    batch, later, exhausted = split_round([first, second, other, stale], clock.now)
    assert batch == [first, other]
    assert later == [second]
    assert exhausted == [stale]


def test_the_shared_call_is_bounded_by_the_latest_window() -> None:
    clock = Clock()
    early = _renewal(clock, "early")
    clock.advance(5.0)
    late = _renewal(clock, "late")
    assert call_timeout([early, late], clock.now, TTL) == pytest.approx(TTL)
    clock.advance(TTL + 1)  # both windows closed: each attempt still gets a TTL
    assert call_timeout([early, late], clock.now, TTL) == TTL


def test_windows_closing_during_a_call_are_found_one_by_one() -> None:
    clock = Clock()
    early = _renewal(clock, "early")
    clock.advance(5.0)
    late = _renewal(clock, "late")
    start = clock.now
    call_timeout([early, late], start, TTL)
    found, next_check = overdue([early, late], {}, start)
    assert found == []
    assert next_check == pytest.approx(early.window.end - start + OVERDUE_GRACE)
    clock.now = early.window.end + OVERDUE_GRACE
    found, next_check = overdue([early, late], {}, clock.now)
    assert found == [early]
    assert isinstance(early.window.cause(), LeaseWindowExhaustedError)
    assert next_check == pytest.approx(late.window.end - clock.now + OVERDUE_GRACE)
    found, _ = overdue([early, late], {early: True}, clock.now)
    assert found == []  # already told
    clock.now = late.window.end + 1
    found, next_check = overdue([early, late], {early: True}, clock.now)
    assert found == [late]
    assert next_check is None
