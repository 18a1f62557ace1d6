"""Parsing and printing human durations for the command line (``90s``, ``1h30m``, ...)."""

from __future__ import annotations

import math
import re

from ._validation import MAX_DURATION

__all__ = ["format_duration", "glob_to_regex", "parse_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str) -> float:
    """Seconds in ``text``: numbers with units, combinable (``500ms``, ``7d``, ``1h30m``).

    Raises ``ValueError`` for anything else, including a bare number or a zero total.
    """
    cleaned = text.strip().lower()
    if not cleaned:
        raise ValueError("empty duration")
    position = 0
    total = 0.0
    seen: set[str] = set()
    for match in _PART.finditer(cleaned):
        if match.start() != position:
            break
        unit = match.group(2)
        if unit in seen:
            raise ValueError(f"bad duration {text!r}: unit {unit!r} given twice")
        seen.add(unit)
        total += float(match.group(1)) * _UNITS[unit]
        position = match.end()
    if position != len(cleaned):
        raise ValueError(
            f"bad duration {text!r}: use a number with a unit (ms, s, m, h, d), e.g. 90s, "
            "15m, 7d or 1h30m"
        )
    if not math.isfinite(total) or total <= 0:
        raise ValueError(f"bad duration {text!r}: must be greater than zero")
    if total > MAX_DURATION:
        raise ValueError(f"bad duration {text!r}: longer than 100 years")
    return total


def format_duration(seconds: float) -> str:
    """A short human form: ``850ms``, ``42s``, ``4m05s``, ``2h03m``, ``3d04h``."""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def glob_to_regex(pattern: str) -> str:
    """A shell glob (``*``, ``?``, ``[abc]``, ``[!abc]``) as an anchored POSIX regex.

    Raises ``ValueError`` for an unterminated ``[`` class or an empty class.
    """
    out = ["^"]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end == -1:
                raise ValueError(f"bad pattern {pattern!r}: unterminated [ class")
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            if negate:
                body = body[1:]
            if not body:
                raise ValueError(f"bad pattern {pattern!r}: empty [] class")
            escaped = "".join("\\" + c if c in "\\^[]" else c for c in body)
            out.append(f"[{'^' if negate else ''}{escaped}]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    out.append("$")
    return "".join(out)
