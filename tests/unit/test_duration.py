"""Durations and globs of the command line."""

from __future__ import annotations

import re

import pytest

from worklease._duration import format_duration, glob_to_regex, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("90s", 90.0),
        ("15m", 900.0),
        ("2h", 7200.0),
        ("7d", 604800.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s5ms", 93784.005),
        ("1.5h", 5400.0),
        (" 10S ", 10.0),
        ("10", 10.0),  # a bare number: seconds, as the API takes numbers
        ("2.5", 2.5),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "1x", "h", "0s", "0ms", "0", "5s5s", "1h 30m", "-5s", "-5", "99999999999d", "1e3"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.85, "850ms"),
        (42.9, "42s"),
        (245, "4m05s"),
        (7380, "2h03m"),
        (273600, "3d04h"),
        (-5, "5s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("tenant-*", ["tenant-", "tenant-42"], ["x-tenant-1", "tenant"]),
        ("part-0?", ["part-01", "part-0a"], ["part-1", "part-011"]),
        ("p[ab]c", ["pac", "pbc"], ["pcc", "pabc"]),
        ("p[!ab]c", ["pcc"], ["pac", "pbc"]),
        ("a.b+c", ["a.b+c"], ["axb+c", "a.bbc"]),
        ("[]]x", ["]x"], ["x"]),
    ],
)
def test_glob_to_regex(pattern: str, matches: list[str], misses: list[str]) -> None:
    regex = re.compile(glob_to_regex(pattern))
    for text in matches:
        assert regex.search(text), (pattern, text)
    for text in misses:
        assert not regex.search(text), (pattern, text)


@pytest.mark.parametrize("pattern", ["a[b", "[]", "[!]"])
def test_glob_to_regex_rejects(pattern: str) -> None:
    with pytest.raises(ValueError, match="bad pattern"):
        glob_to_regex(pattern)


def test_zero_is_a_duration_where_asked_for() -> None:
    assert parse_duration("0", allow_zero=True) == 0.0
    assert parse_duration("0s", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="for timeout"):
        parse_duration("soon", allow_zero=True, name="timeout")
