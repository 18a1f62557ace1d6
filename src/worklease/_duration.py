"""Parsing and printing human durations (``30``, ``90s``, ``1h30m``, ...): the command line's, and
the API's for durations given as strings."""

from __future__ import annotations

import math
import re

__all__ = ["MAX_DURATION", "format_duration", "glob_to_regex", "parse_duration"]

MAX_DURATION = 100 * 365 * 86400.0
"""Longest duration any parameter accepts, in seconds (100 years).

It keeps every deadline, timer and stored expiry representable: a lease row expiring in 100
years is still a ``datetime`` Python can read back, and a wait that long is within what
threads and event loops accept.
"""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = r"\d+(?:\.\d+)?"
_SECONDS = re.compile(_NUMBER)
_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d)")


def parse_duration(text: str, *, allow_zero: bool = False, name: str = "duration") -> float:
    """Seconds in ``text``: a number of seconds (``30``, ``2.5``), or numbers with units,
    combinable (``500ms``, ``90s``, ``7d``, ``1h30m``). The same forms are accepted by the
    command line and, as strings, by every duration argument of the API.

    Raises ``ValueError`` for anything else, and for a zero total unless ``allow_zero``;
    ``name`` says what the duration is for in the message.
    """
    what = "" if name == "duration" else f" for {name}"
    cleaned = text.strip().lower()
    if not cleaned:
        raise ValueError(f"empty duration{what}")
    if _SECONDS.fullmatch(cleaned):
        total = float(cleaned)
        position = len(cleaned)
    else:
        position = 0
        total = 0.0
        seen: set[str] = set()
        for match in _PART.finditer(cleaned):
            if match.start() != position:
                break
            unit = match.group(2)
            if unit in seen:
                raise ValueError(f"bad duration {text!r}{what}: unit {unit!r} given twice")
            seen.add(unit)
            total += float(match.group(1)) * _UNITS[unit]
            position = match.end()
    if position != len(cleaned):
        raise ValueError(
            f"bad duration {text!r}{what}: use seconds (30, 2.5) or a number with a unit "
            "(ms, s, m, h, d), e.g. 90s, 15m, 7d or 1h30m"
        )
    if not math.isfinite(total) or total < 0 or (total == 0 and not allow_zero):
        raise ValueError(f"bad duration {text!r}{what}: must be greater than zero")
    if total > MAX_DURATION:
        raise ValueError(f"bad duration {text!r}{what}: longer than 100 years")
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
