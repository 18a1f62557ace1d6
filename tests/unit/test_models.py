"""Value types: ExitMode, Operation, Token, Checkpoint."""

from __future__ import annotations

import dataclasses
import pickle
from datetime import UTC, datetime, timedelta, timezone

import pytest

from worklease import Checkpoint, ExitMode, Operation, Token
from worklease._window import monotonic, seal_token

WHEN = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        (ExitMode.NONE, "none"),
        (ExitMode.EXPIRED, "expired"),
        (ExitMode.FINISHED, "finished"),
        (ExitMode.ABANDONED, "abandoned"),
        (ExitMode.RETIRED, "retired"),
    ],
)
def test_exit_mode_values(mode: ExitMode, text: str) -> None:
    assert str(mode) == text
    assert mode == text
    assert ExitMode(text) is mode
    assert f"{mode}" == text


def test_exit_mode_members() -> None:
    assert [m.value for m in ExitMode] == ["none", "expired", "finished", "abandoned", "retired"]


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (None, ExitMode.NONE),
        ("none", ExitMode.NONE),
        ("expired", ExitMode.EXPIRED),
        ("finished", ExitMode.FINISHED),
        ("abandoned", ExitMode.ABANDONED),
        ("retired", ExitMode.RETIRED),
        (ExitMode.RETIRED, ExitMode.RETIRED),
        ("suspended", ExitMode.EXPIRED),
        ("", ExitMode.EXPIRED),
        ("FINISHED", ExitMode.EXPIRED),
        (3, ExitMode.EXPIRED),
    ],
)
def test_exit_mode_from_stored(stored: object, expected: ExitMode) -> None:
    assert ExitMode.from_stored(stored) is expected


def test_exit_mode_declarable() -> None:
    assert {m for m in ExitMode if m.declarable} == {
        ExitMode.FINISHED,
        ExitMode.ABANDONED,
        ExitMode.RETIRED,
    }


def test_operation_values() -> None:
    assert [str(op) for op in Operation] == ["checkpoint", "renew", "release", "forget"]
    assert Operation("renew") is Operation.RENEW
    assert Operation.FORGET.value == "forget"


def test_token_repr() -> None:
    token = Token("w1", "test-worker", 1, WHEN)
    assert repr(token) == (
        "Token(work_id='w1', holder_id='test-worker', fencing_token=1, "
        "expires_at=2026-01-01T12:00:00Z)"
    )


def test_token_repr_of_a_non_utc_expiry_keeps_its_offset() -> None:
    token = Token("w1", "h", 2, WHEN.astimezone(timezone(timedelta(hours=2))))
    assert "expires_at=2026-01-01T14:00:00+02:00)" in repr(token)


def test_token_repr_hides_the_seal() -> None:
    sealed = seal_token(Token("w1", "test-worker", 1, WHEN), object(), monotonic(), 1.0)
    assert repr(sealed) == repr(Token("w1", "test-worker", 1, WHEN))
    assert "seal" not in repr(sealed)


def test_token_is_frozen() -> None:
    token = Token("w1", "h", 1, WHEN)
    with pytest.raises(dataclasses.FrozenInstanceError):
        token.fencing_token = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        token.work_id = "w2"  # type: ignore[misc]


def test_token_is_hashable_and_compares_by_fields() -> None:
    one = Token("w1", "h", 1, WHEN)
    same = Token("w1", "h", 1, WHEN)
    other = Token("w1", "h", 2, WHEN)
    assert one == same
    assert hash(one) == hash(same)
    assert one != other
    assert len({one, same, other}) == 2


def test_token_equality_ignores_the_seal() -> None:
    raw = Token("w1", "h", 1, WHEN)
    sealed_a = seal_token(raw, object(), monotonic(), 1.0)
    sealed_b = seal_token(raw, object(), monotonic(), 1.0)
    assert sealed_a == raw == sealed_b
    assert hash(sealed_a) == hash(raw) == hash(sealed_b)
    assert {sealed_a: 1}[raw] == 1


def test_token_field_names() -> None:
    public = [f.name for f in dataclasses.fields(Token) if not f.name.startswith("_")]
    assert public == ["work_id", "holder_id", "fencing_token", "expires_at"]


def test_unsealed_token_pickles() -> None:
    token = Token("w1", "h", 1, WHEN)
    assert pickle.loads(pickle.dumps(token)) == token


def test_checkpoint_defaults() -> None:
    prior = Checkpoint()
    assert prior.state is None
    assert prior.prev_exit is ExitMode.NONE
    assert prior.prev_holder_id is None


def test_checkpoint_is_frozen_and_comparable() -> None:
    prior = Checkpoint(b"x", ExitMode.ABANDONED, "old")
    assert prior == Checkpoint(state=b"x", prev_exit=ExitMode.ABANDONED, prev_holder_id="old")
    assert hash(prior) == hash(Checkpoint(b"x", ExitMode.ABANDONED, "old"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        prior.state = b"y"  # type: ignore[misc]
