"""Argument validation shared by both flavours and every backend."""

from __future__ import annotations

import array
import math
from datetime import timedelta

import pytest

from worklease import ConfigError, ExitMode, InvalidExitModeError
from worklease._validation import (
    MAX_WORK_ID_BYTES,
    MIN_TTL,
    check_exit_mode,
    check_holder_id,
    check_ttl,
    check_work_id,
    normalize_state,
    positive_seconds,
    state_size,
    to_seconds,
)

# -- work IDs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "work_id", ["w", "job:42", "ünïcödé", "x" * MAX_WORK_ID_BYTES, "é" * 512, "🙂" * 256]
)
def test_valid_work_ids(work_id: str) -> None:
    assert check_work_id(work_id) == work_id


@pytest.mark.parametrize("work_id", [None, 42, b"w1", ["w1"]])
def test_non_string_work_id_is_a_type_error(work_id: object) -> None:
    with pytest.raises(TypeError):
        check_work_id(work_id)


@pytest.mark.parametrize(
    "work_id",
    [
        "",
        "a\x00b",
        "\x00",
        "x" * (MAX_WORK_ID_BYTES + 1),
        "é" * 513,  # 1026 bytes in UTF-8 but only 513 characters
        "🙂" * 257,
        "\ud800",  # lone surrogate: not encodable
    ],
)
def test_invalid_work_ids(work_id: str) -> None:
    with pytest.raises(ValueError):
        check_work_id(work_id)


def test_work_id_errors_are_not_config_errors() -> None:
    with pytest.raises(ValueError) as info:
        check_work_id("")
    assert not isinstance(info.value, ConfigError)


# -- holder IDs -----------------------------------------------------------------------------


@pytest.mark.parametrize("holder_id", ["pod-1", "h", "ünï"])
def test_valid_holder_ids(holder_id: str) -> None:
    assert check_holder_id(holder_id) == holder_id


@pytest.mark.parametrize("holder_id", ["", None, 3, b"pod", "a\x00b"])
def test_invalid_holder_ids(holder_id: object) -> None:
    with pytest.raises(ConfigError):
        check_holder_id(holder_id)


# -- TTLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "seconds"),
    [
        (30, 30.0),
        (0.5, 0.5),
        (MIN_TTL, 0.001),
        (timedelta(seconds=2), 2.0),
        (timedelta(milliseconds=1), 0.001),
        ("30", 30.0),  # strings as the command line takes them
        ("30s", 30.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
    ],
)
def test_valid_ttls(ttl: object, seconds: float) -> None:
    result = check_ttl(ttl)
    assert result == pytest.approx(seconds)
    assert isinstance(result, float)


@pytest.mark.parametrize(
    "ttl",
    [
        0,
        -1,
        0.0009,
        timedelta(microseconds=999),
        timedelta(0),
        timedelta(seconds=-1),
        math.inf,
        -math.inf,
        math.nan,
        "0s",
        "thirty",
        "30 s",
        "-30s",
        None,
        True,
        False,
    ],
)
def test_invalid_ttls(ttl: object) -> None:
    with pytest.raises(ConfigError):
        check_ttl(ttl)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        check_ttl(0)


def test_positive_seconds() -> None:
    assert positive_seconds(2, "x") == 2.0
    assert positive_seconds(timedelta(seconds=1), "x") == 1.0
    with pytest.raises(ValueError, match="interval"):
        positive_seconds(0, "interval")
    with pytest.raises(ValueError):
        positive_seconds(0.5, "x", minimum=1.0)
    assert positive_seconds("1", "x") == 1.0
    assert positive_seconds("2h", "x") == 7200.0
    with pytest.raises(ValueError, match="interval"):
        positive_seconds("0s", "interval")
    with pytest.raises(ValueError, match="for interval"):
        positive_seconds("soon", "interval")
    with pytest.raises(TypeError):
        positive_seconds(b"1", "x")


# -- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (1, 1.0),
        (0, 0.0),
        (-2, -2.0),
        (0.25, 0.25),
        (timedelta(minutes=1, milliseconds=500), 60.5),
        (timedelta(microseconds=1), 1e-6),
        (timedelta(seconds=-3), -3.0),
        ("1", 1.0),
        ("0", 0.0),
        ("0.25", 0.25),
        ("1m0.5s", 60.5),
        ("250ms", 0.25),
    ],
)
def test_to_seconds(value: object, seconds: float) -> None:
    result = to_seconds(value, "d")
    assert result == pytest.approx(seconds)
    assert type(result) is float


@pytest.mark.parametrize("value", [True, False, None, b"1", [1]])
def test_to_seconds_rejects_non_durations(value: object) -> None:
    with pytest.raises(TypeError, match="poll_interval"):
        to_seconds(value, "poll_interval")


@pytest.mark.parametrize("value", ["", "soon", "1x", "-1s", "1 h"])
def test_to_seconds_rejects_strings_that_are_no_duration(value: str) -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        to_seconds(value, "poll_interval")


# -- state ----------------------------------------------------------------------------------


def test_state_bytes_like_is_copied_into_bytes() -> None:
    source = bytearray(b"abc")
    data = normalize_state(source)
    assert data == b"abc"
    assert type(data) is bytes
    source[0] = ord("z")
    assert data == b"abc"
    view = memoryview(b"hello")[1:4]
    assert normalize_state(view) == b"ell"
    assert normalize_state(b"xyz") == b"xyz"


@pytest.mark.parametrize("state", [None, b"", bytearray(), memoryview(b"")])
def test_empty_state_becomes_none(state: object) -> None:
    assert normalize_state(state) is None


def test_memoryview_of_non_byte_format() -> None:
    numbers = array.array("i", [1, 2, 3])
    view = memoryview(numbers)
    assert view.format == "i"
    assert len(view) == 3
    data = normalize_state(view)
    assert data == numbers.tobytes()
    assert len(data or b"") == 3 * numbers.itemsize
    assert state_size(view) == 3 * numbers.itemsize


def test_multidimensional_memoryview() -> None:
    view = memoryview(bytes(range(6))).cast("B", shape=[2, 3])
    assert normalize_state(view) == bytes(range(6))
    assert state_size(view) == 6


@pytest.mark.parametrize("state", ["text", 1, 1.5, ["a"], {"a": 1}, object(), array.array("b")])
def test_non_bytes_state_is_a_type_error(state: object) -> None:
    with pytest.raises(TypeError):
        normalize_state(state)


def test_state_size() -> None:
    assert state_size(None) == 0
    assert state_size(b"") == 0
    assert state_size(b"abc") == 3
    assert state_size(bytearray(b"ab")) == 2
    assert state_size(memoryview(b"abcd")[:2]) == 2


# -- exit modes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (ExitMode.FINISHED, ExitMode.FINISHED),
        (ExitMode.ABANDONED, ExitMode.ABANDONED),
        (ExitMode.RETIRED, ExitMode.RETIRED),
        ("finished", ExitMode.FINISHED),
        ("abandoned", ExitMode.ABANDONED),
        ("retired", ExitMode.RETIRED),
    ],
)
def test_declarable_exit_modes(mode: object, expected: ExitMode) -> None:
    assert check_exit_mode(mode) is expected


@pytest.mark.parametrize(
    "mode",
    [ExitMode.NONE, ExitMode.EXPIRED, "none", "expired", "Finished", "", "bogus", None, 2],
)
def test_undeclarable_exit_modes(mode: object) -> None:
    with pytest.raises(InvalidExitModeError):
        check_exit_mode(mode)


def test_invalid_exit_mode_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        check_exit_mode("expired")
