"""The exception hierarchy (SPEC §7) and the ``__module__`` of public classes."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import pytest

import worklease
from worklease import (
    AllSlotsDeadError,
    BackendError,
    BackendRequiredError,
    ConfigError,
    DuplicateWorkIDError,
    EmptyWorkIDError,
    EmptyWorkIDsError,
    FencedError,
    InvalidExitModeError,
    InvalidTokenError,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLapsedError,
    LeaseLostError,
    LeaseRequiredError,
    LeaseWindowExhaustedError,
    PermanentError,
    PoolConfigError,
    RetentionRequiredError,
    Retire,
    Token,
    WorkFnRequiredError,
    WorkleaseError,
    errors,
    permanent,
)

WHEN = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
TOKEN = Token("w1", "test-worker", 3, WHEN)

PARENTS: list[tuple[type[BaseException], tuple[type[BaseException], ...]]] = [
    (WorkleaseError, (Exception,)),
    (ConfigError, (WorkleaseError, ValueError)),
    (BackendRequiredError, (ConfigError,)),
    (RetentionRequiredError, (ConfigError,)),
    (LeaseRequiredError, (ConfigError,)),
    (WorkFnRequiredError, (ConfigError,)),
    (PoolConfigError, (ConfigError,)),
    (EmptyWorkIDsError, (PoolConfigError,)),
    (EmptyWorkIDError, (PoolConfigError,)),
    (DuplicateWorkIDError, (PoolConfigError,)),
    (InvalidTokenError, (WorkleaseError, ValueError)),
    (LeaseHeldError, (WorkleaseError,)),
    (LeaseLostError, (WorkleaseError,)),
    (FencedError, (LeaseLostError,)),
    (LeaseExpiredError, (LeaseLostError,)),
    (LeaseWindowExhaustedError, (LeaseLostError,)),
    (LeaseLapsedError, (LeaseWindowExhaustedError, LeaseExpiredError)),
    (InvalidExitModeError, (WorkleaseError, ValueError)),
    (AllSlotsDeadError, (WorkleaseError,)),
    (BackendError, (WorkleaseError,)),
    (Retire, (WorkleaseError,)),
    (PermanentError, (WorkleaseError,)),
]


@pytest.mark.parametrize(("cls", "parents"), PARENTS, ids=[c.__name__ for c, _ in PARENTS])
def test_hierarchy(cls: type[BaseException], parents: tuple[type[BaseException], ...]) -> None:
    for parent in parents:
        assert issubclass(cls, parent)


def test_lease_lapsed_is_both_exhausted_and_expired() -> None:
    error = LeaseLapsedError("lapsed", token=TOKEN)
    assert isinstance(error, LeaseWindowExhaustedError)
    assert isinstance(error, LeaseExpiredError)
    assert isinstance(error, LeaseLostError)
    assert not isinstance(error, FencedError)


@pytest.mark.parametrize(
    "cls", [FencedError, LeaseExpiredError, LeaseWindowExhaustedError, LeaseLapsedError]
)
def test_loss_kinds_are_distinct(cls: type[LeaseLostError]) -> None:
    kinds = {FencedError, LeaseExpiredError, LeaseWindowExhaustedError}
    matching = {kind for kind in kinds if issubclass(cls, kind)}
    expected = {LeaseWindowExhaustedError, LeaseExpiredError} if cls is LeaseLapsedError else {cls}
    assert matching == expected


def test_value_errors_and_not() -> None:
    for value_error in (ConfigError, InvalidExitModeError, InvalidTokenError):
        assert issubclass(value_error, ValueError)
    for other in (LeaseHeldError, LeaseLostError, BackendError, Retire, PermanentError):
        assert not issubclass(other, ValueError)


def test_lease_held_error_attributes() -> None:
    error = LeaseHeldError("held", work_id="w1", holder_id="other", expires_at=WHEN)
    assert (error.work_id, error.holder_id, error.expires_at) == ("w1", "other", WHEN)
    unknown = LeaseHeldError("held")
    assert (unknown.work_id, unknown.holder_id, unknown.expires_at) == (None, None, None)


def test_lease_lost_error_attributes() -> None:
    error = FencedError("fenced", token=TOKEN)
    assert (error.work_id, error.holder_id, error.fencing_token) == ("w1", "test-worker", 3)
    unknown = LeaseExpiredError("expired")
    assert (unknown.work_id, unknown.holder_id, unknown.fencing_token) == (None, None, None)


def test_backend_error_transient() -> None:
    assert BackendError("boom").transient is False
    assert BackendError("boom", transient=True).transient is True


def test_retire_state() -> None:
    assert Retire().state is None
    assert Retire(b"final").state == b"final"
    assert Retire(state=b"x").state == b"x"


def test_permanent_wraps_with_cause() -> None:
    original = RuntimeError("disk full")
    wrapped = permanent(original)
    assert isinstance(wrapped, PermanentError)
    assert wrapped.__cause__ is original
    assert "disk full" in str(wrapped)
    assert wrapped.permanent() is True


def test_permanent_of_an_anonymous_error_names_its_type() -> None:
    wrapped = permanent(KeyError())
    assert wrapped.__cause__ is not None
    assert "KeyError" in str(wrapped)


def test_permanent_is_idempotent() -> None:
    already = permanent(RuntimeError("x"))
    assert permanent(already) is already


def test_permanent_can_be_raised() -> None:
    original = ValueError("bad input")
    with pytest.raises(PermanentError) as info:
        raise permanent(original)
    assert info.value.__cause__ is original


# -- pickling -------------------------------------------------------------------------------


def _roundtrip(error: BaseException) -> BaseException:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert copy.args == error.args
    assert str(copy) == str(error)
    return copy


def test_pickle_lease_held_error() -> None:
    copy = _roundtrip(LeaseHeldError("held", work_id="w1", holder_id="other", expires_at=WHEN))
    assert isinstance(copy, LeaseHeldError)
    assert (copy.work_id, copy.holder_id, copy.expires_at) == ("w1", "other", WHEN)


@pytest.mark.parametrize(
    "cls",
    [LeaseLostError, FencedError, LeaseExpiredError, LeaseWindowExhaustedError, LeaseLapsedError],
)
def test_pickle_lease_lost_errors(cls: type[LeaseLostError]) -> None:
    copy = _roundtrip(cls("lost", token=TOKEN))
    assert isinstance(copy, cls)
    assert (copy.work_id, copy.holder_id, copy.fencing_token) == ("w1", "test-worker", 3)


def test_pickle_backend_error() -> None:
    copy = _roundtrip(BackendError("boom", transient=True))
    assert isinstance(copy, BackendError)
    assert copy.transient is True


def test_pickle_retire() -> None:
    copy = _roundtrip(Retire(b"final"))
    assert isinstance(copy, Retire)
    assert copy.state == b"final"
    empty = _roundtrip(Retire())
    assert isinstance(empty, Retire)
    assert empty.state is None


@pytest.mark.parametrize(
    "error",
    [
        WorkleaseError("x"),
        ConfigError("bad"),
        BackendRequiredError("no backend"),
        EmptyWorkIDsError("none"),
        InvalidTokenError("tok"),
        InvalidExitModeError("mode"),
        AllSlotsDeadError("dead"),
        PermanentError("perm"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_pickle_plain_errors(error: BaseException) -> None:
    _roundtrip(error)


# -- module names ---------------------------------------------------------------------------

PUBLIC_CLASSES = sorted(
    name for name in worklease.__all__ if isinstance(getattr(worklease, name), type)
)


@pytest.mark.parametrize("name", PUBLIC_CLASSES)
def test_public_class_module_is_worklease(name: str) -> None:
    assert getattr(worklease, name).__module__ == "worklease"


def test_every_error_is_exported() -> None:
    for name in errors.__all__:
        assert getattr(worklease, name) is getattr(errors, name)
        assert name in worklease.__all__
