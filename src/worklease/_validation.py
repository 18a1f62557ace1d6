"""Argument validation shared by both flavours and every backend."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta
from typing import cast

from ._duration import MAX_DURATION
from ._models import ExitMode
from .errors import ConfigError, InvalidExitModeError

__all__ = [
    "Duration",
    "MAX_DURATION",
    "MAX_WORK_ID_BYTES",
    "MIN_TTL",
    "backend_ttl",
    "check_exit_mode",
    "check_flag",
    "check_holder_id",
    "check_ttl",
    "check_work_id",
    "distinct_work_ids",
    "non_negative_seconds",
    "normalize_state",
    "positive_seconds",
    "state_size",
    "to_seconds",
]

MAX_WORK_ID_BYTES = 1024
"""Longest work ID (and holder ID) accepted, in UTF-8 bytes."""

MIN_TTL = 0.001
"""Shortest lease TTL accepted, in seconds."""


StateLike = bytes | bytearray | memoryview


Duration = float | timedelta | str
"""A duration: seconds (``30``, ``2.5``), a ``timedelta``, or a string the command line accepts
too (``"30"``, ``"500ms"``, ``"90s"``, ``"1h30m"``)."""


def to_seconds(value: object, name: str) -> float:
    """Convert a duration (``float``/``int`` seconds, ``timedelta``, or a string such as
    ``"30s"``, ``"1h30m"`` or ``"30"``) to float seconds.

    Raises ``TypeError`` for anything else (including ``bool``), ``ValueError`` for a string
    that is not a duration. Range checks are the caller's.
    """
    if type(value) is float:  # the common case first: every backend call converts its TTL
        return value
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        from ._duration import parse_duration

        return parse_duration(value, allow_zero=True, name=name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"{name} must be a number of seconds, a timedelta or a string such as '30s', "
            f"not {value!r}"
        )
    try:
        return float(value)
    except OverflowError:  # an int too large for a float
        raise ValueError(f"{name} is out of range: {value!r}") from None


def positive_seconds(
    value: object, name: str, *, minimum: float = 0.0, maximum: float = MAX_DURATION
) -> float:
    """A finite duration greater than zero, at least ``minimum`` and at most ``maximum``
    seconds; ``TypeError`` for a non-duration, ``ValueError`` for one out of range."""
    seconds = to_seconds(value, name)
    if not math.isfinite(seconds) or seconds <= 0 or seconds < minimum:
        bound = f" of at least {minimum:g}s" if minimum else ""
        raise ValueError(f"{name} must be a finite positive duration{bound}, got {value!r}")
    if seconds > maximum:
        raise ValueError(f"{name} must be at most {maximum:g}s, got {value!r}")
    return seconds


def non_negative_seconds(value: object, name: str, *, maximum: float = MAX_DURATION) -> float:
    """A finite duration of zero or more, at most ``maximum`` seconds (a timeout)."""
    seconds = to_seconds(value, name)
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"{name} must be a finite non-negative duration, got {value!r}")
    if seconds > maximum:
        raise ValueError(f"{name} must be at most {maximum:g}s, got {value!r}")
    return seconds


def check_flag(value: object, name: str) -> bool:
    """A real ``bool`` (``TypeError`` otherwise: a truthy string must never pass for True)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


def check_ttl(value: object) -> float:
    """Validate a lease TTL: a finite number of seconds from 1 ms to ``MAX_DURATION``."""
    try:
        return positive_seconds(value, "ttl", minimum=MIN_TTL)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def backend_ttl(value: object) -> float:
    """A TTL as a backend receives it: any finite number of seconds up to ``MAX_DURATION``
    (a non-positive one yields an already-expired lease, a test affordance). Checked before
    any I/O, so no backend writes an expiry it could not read back."""
    if type(value) is float and -MAX_DURATION <= value <= MAX_DURATION:  # NaN fails too
        return value
    seconds = to_seconds(value, "ttl")
    if not math.isfinite(seconds) or seconds > MAX_DURATION:
        raise ValueError(
            f"ttl must be a finite duration of at most {MAX_DURATION:g}s, got {value!r}"
        )
    return seconds


def _identifier_problem(value: str, what: str) -> str | None:
    """Why ``value`` cannot be stored as a work or holder ID, or ``None``."""
    if not value:
        return f"{what} must not be empty"
    if "\x00" in value:
        return f"{what} must not contain a NUL character"
    if value.isascii():  # the usual ID: one byte a character, nothing to encode
        size = len(value)
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            return f"{what} must be encodable as UTF-8 (no lone surrogates)"
    if size > MAX_WORK_ID_BYTES:
        return f"{what} is {size} bytes in UTF-8; the limit is {MAX_WORK_ID_BYTES} bytes"
    return None


def check_holder_id(value: object) -> str:
    """Validate a holder ID like a work ID (a non-empty ``str`` of at most 1024 UTF-8 bytes,
    no NUL, encodable); ``ConfigError`` otherwise."""
    if not isinstance(value, str):
        raise ConfigError(f"holder_id must be a str, not {type(value).__name__}")
    problem = _identifier_problem(value, "holder_id")
    if problem is not None:
        if not value:
            problem += ": name this process (a pod name, say)"
        raise ConfigError(problem)
    return value


def check_work_id(value: object) -> str:
    """Validate a work ID: a non-empty ``str`` of at most 1024 UTF-8 bytes without NUL.

    Raises ``TypeError`` for a non-string and ``ValueError`` for a bad string.
    """
    if not isinstance(value, str):
        raise TypeError(f"work ID must be a str, not {type(value).__name__}")
    problem = _identifier_problem(value, "work ID")
    if problem is not None:
        raise ValueError(problem)
    return value


def normalize_state(state: object) -> bytes | None:
    """Copy checkpoint state into ``bytes``; ``None`` and empty input become ``None``.

    Accepts ``bytes``, ``bytearray`` and ``memoryview``; raises ``TypeError`` for anything else.
    """
    if state is None:
        return None
    if isinstance(state, bytes):
        return state or None
    if isinstance(state, bytearray | memoryview):
        data = bytes(state)
        return data or None
    raise TypeError(
        f"checkpoint state must be bytes, bytearray, memoryview or None, "
        f"not {type(state).__name__} (encode it first, e.g. with JSONCodec)"
    )


def state_size(state: StateLike | None) -> int:
    """The length in bytes of checkpoint state as passed in."""
    if state is None:
        return 0
    if isinstance(state, memoryview):
        return state.nbytes
    return len(state)


def check_exit_mode(mode: object) -> ExitMode:
    """Accept FINISHED, ABANDONED or RETIRED (or their text); InvalidExitModeError otherwise."""
    if mode is ExitMode.FINISHED or mode is ExitMode.ABANDONED or mode is ExitMode.RETIRED:
        return cast(ExitMode, mode)
    parsed: ExitMode | None = None
    if isinstance(mode, ExitMode):
        parsed = mode
    elif isinstance(mode, str):
        try:
            parsed = ExitMode(mode)
        except ValueError:
            parsed = None
    if parsed is None or not parsed.declarable:
        raise InvalidExitModeError(
            f"invalid exit mode {mode!r}: release accepts finished, abandoned or retired"
        )
    return parsed


def distinct_work_ids(work_ids: object) -> list[str]:
    """Validate a batch of work IDs (a sequence, not a string): each valid, none repeated."""
    if isinstance(work_ids, str | bytes) or not isinstance(work_ids, Sequence):
        raise TypeError("work IDs must be given as a sequence (a list or tuple) of str")
    seen: set[str] = set()
    for work_id in work_ids:
        check_work_id(work_id)
        if work_id in seen:
            raise ValueError(f"work ID {work_id!r} appears more than once in one batch")
        seen.add(work_id)
    return list(work_ids)
