"""Backoff clamping and pacing (behaviour.md §3.1)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worklease import Backoff, ConfigError
from worklease._validation import MAX_DURATION


@pytest.mark.parametrize(
    ("given_values", "expected"),
    [
        ((0, 5, 0.2), (0.001, 5.0, 0.2)),
        ((0.1, 0, 0.2), (0.001, 0.001, 0.2)),
        ((0.1, 5, -1), (0.1, 5.0, 0.0)),
        ((0.1, 5, 2), (0.1, 5.0, 1.0)),
        ((10, 5, 0.2), (5.0, 5.0, 0.2)),
        ((0.2, 2, 0.5), (0.2, 2.0, 0.5)),
        ((-3, -1, 0.2), (0.001, 0.001, 0.2)),
        ((timedelta(milliseconds=250), timedelta(seconds=3), 0.1), (0.25, 3.0, 0.1)),
    ],
)
def test_clamping_table(
    given_values: tuple[float | timedelta, float | timedelta, float],
    expected: tuple[float, float, float],
) -> None:
    backoff = Backoff(*given_values)
    assert (backoff.initial, backoff.maximum, backoff.jitter) == pytest.approx(expected)


def test_defaults() -> None:
    backoff = Backoff()
    assert (backoff.initial, backoff.maximum, backoff.jitter) == (0.1, 5.0, 0.2)


def test_keywords_and_types() -> None:
    backoff = Backoff(initial=1, maximum=2, jitter=0)
    assert isinstance(backoff.initial, float)
    assert isinstance(backoff.maximum, float)
    assert backoff.jitter == 0.0


def test_frozen_and_comparable() -> None:
    backoff = Backoff(0.2, 2, 0.5)
    with pytest.raises(AttributeError):
        backoff.initial = 1.0  # type: ignore[misc]
    assert backoff == Backoff(0.2, 2, 0.5)
    assert hash(backoff) == hash(Backoff(0.2, 2, 0.5))


@pytest.mark.parametrize(
    "values", [(math.nan, 1.0, 0.2), (0.1, math.nan, 0.2), (0.1, 1.0, math.nan)]
)
def test_nan_is_refused(values: tuple[float, float, float]) -> None:
    """Backoff is built like every other option holder: a bad value is a ConfigError."""
    with pytest.raises(ConfigError):
        Backoff(*values)


@pytest.mark.parametrize("bad", ["soon", None, True, 10**400])
def test_non_durations_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError):
        Backoff(initial=bad)
    with pytest.raises(ConfigError):
        Backoff(maximum=bad)


@pytest.mark.parametrize("bad", ["0.2", None, True, timedelta(seconds=1)])
def test_non_number_jitter_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError):
        Backoff(jitter=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("huge", [math.inf, 1e300, timedelta(days=999_999_999)])
def test_durations_clamp_to_the_maximum(huge: object) -> None:
    """Beyond MAX_DURATION (infinity included) clamps like the other out-of-range values, so
    no retry wait can overflow a timer."""
    backoff = Backoff(initial=huge, maximum=huge)
    assert backoff.initial == backoff.maximum == MAX_DURATION
    assert math.isfinite(backoff.delay(backoff.maximum))


def test_delay_without_jitter_is_the_base() -> None:
    backoff = Backoff(0.1, 5, 0)
    assert all(backoff.delay(0.4) == 0.4 for _ in range(100))


def test_delay_within_jitter_range() -> None:
    backoff = Backoff(1.0, 5.0, 0.5)
    delays = [backoff.delay(1.0) for _ in range(2000)]
    assert min(delays) >= 1.0
    assert max(delays) < 1.5
    # jitter is really applied, spread over the range
    assert min(delays) < 1.1
    assert max(delays) > 1.4


def test_next_base_doubles_up_to_the_cap() -> None:
    backoff = Backoff(0.1, 1.0, 0.2)
    bases = [backoff.initial]
    for _ in range(6):
        bases.append(backoff.next_base(bases[-1]))
    assert bases == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


_durations = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


@given(initial=_durations, maximum=_durations, jitter=_durations)
def test_clamping_properties(initial: float, maximum: float, jitter: float) -> None:
    backoff = Backoff(initial, maximum, jitter)
    assert 0 < backoff.initial <= backoff.maximum
    assert 0.0 <= backoff.jitter <= 1.0
    expected_max = maximum if maximum > 0 else 0.001
    assert backoff.maximum == expected_max
    expected_initial = min(initial if initial > 0 else 0.001, expected_max)
    assert backoff.initial == expected_initial
    assert backoff.jitter == min(max(jitter, 0.0), 1.0)


@given(
    initial=st.floats(min_value=1e-3, max_value=100),
    maximum=st.floats(min_value=1e-3, max_value=1000),
    jitter=st.floats(min_value=0, max_value=1),
    steps=st.integers(min_value=0, max_value=30),
)
def test_delay_and_next_base_properties(
    initial: float, maximum: float, jitter: float, steps: int
) -> None:
    backoff = Backoff(initial, maximum, jitter)
    base = backoff.initial
    for _ in range(steps):
        following = backoff.next_base(base)
        assert following == min(base * 2, backoff.maximum)
        assert base <= following <= backoff.maximum
        base = following
    delay = backoff.delay(base)
    assert base <= delay <= base * (1 + backoff.jitter) * (1 + 1e-12)
    if backoff.jitter == 0:
        assert delay == base
