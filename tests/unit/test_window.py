"""LeaseWindow bookkeeping and token sealing (the renewal arithmetic shared by both flavours)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from worklease import FencedError, InvalidTokenError, LeaseWindowExhaustedError, Token
from worklease._window import LeaseWindow, TokenSeal, monotonic, seal_token, unseal


def _token(expires_at: datetime | None = None) -> Token:
    when = expires_at if expires_at is not None else datetime.now(UTC) + timedelta(seconds=30)
    return Token("w1", "test-worker", 7, when)


def _fenced(token: Token) -> FencedError:
    return FencedError("fenced", token=token)


# -- LeaseWindow ----------------------------------------------------------------------------


def test_remaining_counts_down_to_zero_when_idle() -> None:
    window = LeaseWindow(_token(), end=100.0)
    assert window.end == 100.0
    assert window.remaining(now=90.0) == pytest.approx(10.0)
    assert window.remaining(now=100.0) == 0.0
    assert window.remaining(now=150.0) == 0.0


def test_idle_overrun_does_not_latch() -> None:
    window = LeaseWindow(_token(), end=100.0)
    assert window.cause(now=500.0) is None
    # an attempt that begins after the window closed is not loss by window
    assert window.begin_attempt(105.0) == pytest.approx(-5.0)
    assert window.cause(now=1000.0) is None
    assert window.remaining(now=1000.0) == 0.0


def test_window_exhaustion_latches_while_trying() -> None:
    token = _token()
    window = LeaseWindow(token, end=100.0)
    assert window.begin_attempt(95.0) == pytest.approx(5.0)
    assert window.cause(now=99.9) is None
    assert window.remaining(now=99.9) == pytest.approx(0.1)
    cause = window.cause(now=100.0)
    assert type(cause) is LeaseWindowExhaustedError
    assert cause.work_id == "w1"
    assert cause.holder_id == "test-worker"
    assert cause.fencing_token == 7
    # latched: looking again (even "earlier") gives the same cause
    assert window.cause(now=50.0) is cause
    assert window.remaining(now=50.0) is None


def test_remaining_reports_exhaustion_by_itself() -> None:
    window = LeaseWindow(_token(), end=100.0)
    window.begin_attempt(99.0)
    assert window.remaining(now=101.0) is None
    assert isinstance(window.cause(now=0.0), LeaseWindowExhaustedError)


def test_begin_attempt_keeps_the_first_start() -> None:
    window = LeaseWindow(_token(), end=100.0)
    window.begin_attempt(95.0)
    window.begin_attempt(101.0)  # a retry after the window closed: still the same cycle
    assert isinstance(window.cause(now=101.0), LeaseWindowExhaustedError)


def test_renewed_extends_and_clears_trying() -> None:
    now = monotonic()
    window = LeaseWindow(_token(), end=now + 10.0)
    window.begin_attempt(now)
    assert window.renewed(now, 60.0) is True
    assert window.end == pytest.approx(now + 60.0)
    # no longer trying: an idle overrun after the new end does not latch
    assert window.cause(now=now + 1000.0) is None


def test_renewed_never_shrinks_the_window() -> None:
    now = monotonic()
    window = LeaseWindow(_token(), end=now + 100.0)
    assert window.renewed(now, 1.0) is True
    assert window.end == pytest.approx(now + 100.0)


def test_renewed_after_window_exhaustion_is_refused() -> None:
    now = monotonic()
    window = LeaseWindow(_token(), end=now - 1.0)
    window.begin_attempt(now - 2.0)
    assert window.renewed(now, 60.0) is False
    assert isinstance(window.cause(), LeaseWindowExhaustedError)
    assert window.end == pytest.approx(now - 1.0)


def test_renewed_after_loss_or_stop_is_refused() -> None:
    now = monotonic()
    lost = LeaseWindow(_token(), end=now + 10.0)
    lost.lose(_fenced(lost.token))
    assert lost.renewed(now, 60.0) is False
    stopped = LeaseWindow(_token(), end=now + 10.0)
    stopped.stop()
    assert stopped.renewed(now, 60.0) is False


def test_lose_first_wins() -> None:
    window = LeaseWindow(_token(), end=100.0)
    first = _fenced(window.token)
    assert window.lose(first) is first
    assert window.lose(window._exhausted()) is first
    assert window.lose_by_window(RuntimeError("late")) is first
    assert window.cause(now=0.0) is first
    assert window.remaining(now=0.0) is None


def test_lose_by_window_chains_the_last_error() -> None:
    window = LeaseWindow(_token(), end=100.0)
    error = ConnectionError("database went away")
    cause = window.lose_by_window(error)
    assert type(cause) is LeaseWindowExhaustedError
    assert cause.__cause__ is error
    assert window.cause(now=0.0) is cause


def test_stop_makes_remaining_none_and_prevents_latching() -> None:
    window = LeaseWindow(_token(), end=100.0)
    window.begin_attempt(95.0)
    assert window.stop(now=96.0) is None
    assert window.stopped
    assert window.remaining(now=96.0) is None
    assert window.cause(now=500.0) is None


def test_stop_returns_a_loss_decided_before_it() -> None:
    window = LeaseWindow(_token(), end=100.0)
    window.begin_attempt(95.0)
    cause = window.stop(now=101.0)  # the window closed mid-attempt before the stop
    assert isinstance(cause, LeaseWindowExhaustedError)
    assert window.cause(now=500.0) is cause


def test_extend_only_while_held() -> None:
    window = LeaseWindow(_token(), end=100.0)
    window.extend(95.0, 10.0)
    assert window.end == 105.0
    window.extend(0.0, 10.0)  # never shrinks
    assert window.end == 105.0
    window.lose(_fenced(window.token))
    window.extend(200.0, 10.0)
    assert window.end == 105.0
    stopped = LeaseWindow(_token(), end=100.0)
    stopped.stop()
    stopped.extend(200.0, 10.0)
    assert stopped.end == 100.0


def test_window_closed() -> None:
    window = LeaseWindow(_token(), end=100.0)
    assert not window.window_closed(99.99)
    assert window.window_closed(100.0)
    assert window.window_closed(101.0)


# -- sealing --------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [10.0, 1.0, -5.0, 3600.0, -3600.0])
def test_seal_window_is_start_plus_ttl_whatever_the_expiry_looks_like(offset: float) -> None:
    """The window comes from the local monotonic clock only: an expiry that looks far ahead
    or behind (clock offset, a jumped wall clock) changes nothing."""
    issuer = object()
    raw = Token("w1", "h", 1, datetime.now(UTC) + timedelta(seconds=offset))
    start = monotonic()
    seal = unseal(seal_token(raw, issuer, start, 0.15), issuer)
    assert seal.window_end == start + 0.15


def test_sealed_token_keeps_its_fields_and_equals_the_raw_one() -> None:
    issuer = object()
    raw = _token()
    fields = (raw.work_id, raw.holder_id, raw.fencing_token, raw.expires_at)
    sealed = seal_token(raw, issuer, monotonic(), 1.0)
    assert sealed == Token(*fields)
    assert hash(sealed) == hash(Token(*fields))
    assert (sealed.work_id, sealed.holder_id, sealed.fencing_token, sealed.expires_at) == fields
    assert isinstance(sealed._seal, TokenSeal)
    assert unseal(sealed, issuer) is sealed._seal


def test_a_token_handed_out_twice_is_copied_and_its_first_seal_kept() -> None:
    """A fresh token from the backend is sealed as it is; one already sealed (a backend
    returning the same object again) is copied, so no seal is ever replaced."""
    first_issuer, second_issuer = object(), object()
    raw = _token()
    first = seal_token(raw, first_issuer, monotonic(), 1.0)
    first_seal = first._seal
    second = seal_token(raw, second_issuer, monotonic(), 1.0)
    assert second is not first
    assert first._seal is first_seal
    assert unseal(first, first_issuer) is first_seal
    assert unseal(second, second_issuer) is second._seal
    with pytest.raises(InvalidTokenError, match="another backend"):
        unseal(first, second_issuer)


def test_seal_token_refuses_bad_backend_output() -> None:
    with pytest.raises(TypeError):
        seal_token("not a token", object(), monotonic(), 1.0)  # type: ignore[arg-type]
    naive = Token("w1", "h", 1, datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="naive"):
        seal_token(naive, object(), monotonic(), 1.0)


def test_unseal_refuses_a_non_token() -> None:
    with pytest.raises(TypeError):
        unseal(("w1", "h", 1), object())


def test_unseal_refuses_an_unsealed_token() -> None:
    with pytest.raises(InvalidTokenError, match="not produced by acquire"):
        unseal(_token(), object())


def test_unseal_refuses_a_foreign_issuer() -> None:
    sealed = seal_token(_token(), object(), monotonic(), 1.0)
    with pytest.raises(InvalidTokenError, match="another backend"):
        unseal(sealed, object())


@pytest.mark.parametrize(
    "changes",
    [
        {"fencing_token": 8},
        {"work_id": "w2"},
        {"holder_id": "someone-else"},
        {"expires_at": datetime(2040, 1, 1, tzinfo=UTC)},
    ],
)
def test_unseal_refuses_an_altered_copy(changes: dict[str, object]) -> None:
    issuer = object()
    sealed = seal_token(_token(), issuer, monotonic(), 1.0)
    altered = dataclasses.replace(sealed, **changes)  # type: ignore[arg-type]
    with pytest.raises(InvalidTokenError, match="altered"):
        unseal(altered, issuer)


def test_invalid_token_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        unseal(_token(), object())


def test_seal_extend_moves_the_window_forward_only() -> None:
    issuer = object()
    start = monotonic()
    seal = unseal(seal_token(_token(), issuer, start, 1.0), issuer)
    seal.extend(start + 0.5, 1.0)
    assert seal.window_end == pytest.approx(start + 1.5, abs=1e-6)
    seal.extend(start, 0.1)
    assert seal.window_end == pytest.approx(start + 1.5, abs=1e-6)


def test_seal_finished_stops_an_attached_renewal() -> None:
    issuer = object()
    sealed = seal_token(_token(), issuer, monotonic(), 1.0)
    seal = unseal(sealed, issuer)
    seal.finished()  # nothing attached: no error
    window = LeaseWindow(sealed, seal.window_end)
    seal.attach(window, window.stop)
    seal.finished()
    assert window.stopped
    assert seal.lost_cause() is None
    lost = LeaseWindow(sealed, seal.window_end)
    seal.attach(lost, lost.stop)
    cause = lost.lose(_fenced(sealed))
    assert seal.lost_cause() is cause
