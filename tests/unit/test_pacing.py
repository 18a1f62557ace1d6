"""Pacing helpers of the leader and the pool: idle jitter, intervals, permanence."""

from __future__ import annotations

import logging
import math
from datetime import timedelta

import pytest

from worklease import ConfigError, PermanentError, permanent
from worklease._pacing import IDLE_JITTER, interval, is_permanent, jittered


def test_jitter_of_zero_is_zero() -> None:
    assert jittered(0) == 0
    assert jittered(0.0) == 0.0
    assert jittered(-1.0) == 0.0


def test_jitter_range() -> None:
    """10 000 draws of jittered(1.0) all lie in [1.0, 1.2) and actually spread out."""
    assert IDLE_JITTER == 0.2
    draws = [jittered(1.0) for _ in range(10_000)]
    assert all(1.0 <= d < 1.2 for d in draws)
    assert min(draws) < 1.02
    assert max(draws) > 1.18
    assert len(set(draws)) > 9_000


def test_jitter_scales_with_base() -> None:
    draws = [jittered(0.05) for _ in range(1_000)]
    assert all(0.05 <= d < 0.05 * 1.2 for d in draws)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1.0), (0.25, 0.25), (timedelta(milliseconds=1500), 1.5), ("1", 1.0), ("1.5s", 1.5)],
)
def test_interval_accepts(value: object, expected: float) -> None:
    assert interval(value, "idle_interval") == pytest.approx(expected)


@pytest.mark.parametrize(
    "value", [0, -1, -0.5, math.nan, math.inf, timedelta(0), "0s", "soon", None, True]
)
def test_interval_rejects(value: object) -> None:
    with pytest.raises(ConfigError, match="idle_interval"):
        interval(value, "idle_interval")


class Says(Exception):
    def __init__(self, answer: bool) -> None:
        super().__init__("says " + str(answer))
        self.answer = answer

    def permanent(self) -> bool:
        return self.answer


class Broken(Exception):
    def permanent(self) -> bool:
        raise RuntimeError("permanent() bug")


class NotAMethod(Exception):
    permanent = True


def test_permanent_marks() -> None:
    cause = ValueError("bad")
    wrapped = permanent(cause)
    assert isinstance(wrapped, PermanentError)
    assert wrapped.__cause__ is cause
    assert str(wrapped) == "bad"
    assert permanent(wrapped) is wrapped
    assert is_permanent(wrapped)
    assert is_permanent(Says(True))
    assert not is_permanent(Says(False))
    assert not is_permanent(ValueError("plain"))
    assert not is_permanent(NotAMethod())


def test_permanent_through_cause_chain() -> None:
    """A permanent error anywhere down the __cause__ chain counts."""
    top = RuntimeError("top")
    middle = Says(False)
    top.__cause__ = middle
    middle.__cause__ = permanent(KeyError("root"))
    assert is_permanent(top)


def test_not_permanent_through_the_implicit_context() -> None:
    """An error merely raised while handling a permanent one is not permanent itself."""
    caught: BaseException | None = None
    try:
        try:
            raise permanent(OSError("disk"))
        except PermanentError:
            raise ValueError("while handling")  # noqa: B904 - the implicit context is the point
    except ValueError as exc:
        caught = exc
    assert caught is not None
    assert caught.__cause__ is None
    assert isinstance(caught.__context__, PermanentError)
    assert not is_permanent(caught)


def test_chain_without_permanent() -> None:
    top = RuntimeError("top")
    top.__cause__ = Says(False)
    top.__cause__.__context__ = ValueError("deeper")
    assert not is_permanent(top)


def test_cycles_end() -> None:
    """A cyclic chain is searched once and ends."""
    a, b, c = ValueError("a"), KeyError("b"), Says(False)
    a.__cause__ = b
    b.__cause__ = c
    c.__cause__ = a
    assert not is_permanent(a)
    self_loop = ValueError("self")
    self_loop.__cause__ = self_loop
    assert not is_permanent(self_loop)
    d, e = ValueError("d"), Says(True)
    d.__cause__ = d.__context__ = e
    e.__cause__ = d
    assert is_permanent(d)


def test_raising_permanent_is_not_permanent(caplog: pytest.LogCaptureFixture) -> None:
    """A permanent() that raises counts as not permanent (and is logged); the chain below is
    still searched."""
    with caplog.at_level(logging.ERROR, logger="worklease"):
        assert not is_permanent(Broken("x"))
    assert any(
        r.exc_info is not None and isinstance(r.exc_info[1], RuntimeError) for r in caplog.records
    )
    top = Broken("top")
    top.__cause__ = permanent(ValueError("root"))
    assert is_permanent(top)


def test_wait_pacing_wakes_at_the_expiry_then_polls() -> None:
    from datetime import UTC, datetime, timedelta

    from worklease._pacing import WaitPacing

    pacing = WaitPacing(2.0)
    soon = datetime.now(UTC) + timedelta(seconds=0.5)
    first = pacing.next_delay(soon)
    assert 0.4 < first <= 0.51
    # Woken early (a release notification somebody else won): wait for the expiry again.
    assert 0.3 < pacing.next_delay(soon) <= 0.51
    expired = datetime.now(UTC) - timedelta(milliseconds=1)
    assert pacing.next_delay(expired) == WaitPacing.MARGIN
    assert pacing.next_delay(expired) == 2.0  # same expiry still in force: poll, never spin
    later = datetime.now(UTC) + timedelta(seconds=10)
    assert pacing.next_delay(later) == 2.0  # the poll interval comes first
    assert pacing.next_delay(None) == 2.0  # holder unknown
    past = datetime.now(UTC) - timedelta(seconds=3)  # a skewed clock
    assert pacing.next_delay(past) == WaitPacing.MARGIN
    assert pacing.next_delay(past) == 2.0


def test_an_attempt_that_began_before_the_expiry_waits_for_it_again() -> None:
    """Woken early, the next attempt began before the expiry but ended after it (a slow
    round trip): that is no sign of a skewed clock, so no full poll interval."""
    from datetime import UTC, datetime, timedelta

    from worklease._pacing import WaitPacing

    pacing = WaitPacing(15.0)
    expiry = datetime.now(UTC) - timedelta(milliseconds=20)  # passed while the attempt ran
    began = expiry - timedelta(milliseconds=30)
    assert pacing.next_delay(expiry, began) == WaitPacing.MARGIN
    assert pacing.next_delay(expiry, began) == WaitPacing.MARGIN  # began before it again
    assert pacing.next_delay(expiry, expiry + timedelta(milliseconds=1)) == 15.0  # after it
