"""Argument validation shared by both flavours and every backend."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta

from ._models import ExitMode
from .errors import ConfigError, InvalidExitModeError

__all__ = [
    "MAX_WORK_ID_BYTES",
    "MIN_TTL",
    "check_exit_mode",
    "check_holder_id",
    "check_ttl",
    "check_work_id",
    "normalize_state",
    "state_size",
    "to_seconds",
]

MAX_WORK_ID_BYTES = 1024
"""Longest work ID accepted, in UTF-8 bytes."""

MIN_TTL = 0.001
"""Shortest lease TTL accepted, in seconds."""

StateLike = bytes | bytearray | memoryview


def to_seconds(value: object, name: str) -> float:
    """Convert a duration (``float``/``int`` seconds or ``timedelta``) to float seconds.

    Raises ``TypeError`` for anything else (including ``bool``). Range checks are the caller's.
    """
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds or a timedelta, not {value!r}")
    return float(value)


def positive_seconds(value: object, name: str, *, minimum: float = 0.0) -> float:
    """A finite duration greater than zero (and at least ``minimum``); ValueError otherwise."""
    seconds = to_seconds(value, name)
    if not math.isfinite(seconds) or seconds <= 0 or seconds < minimum:
        bound = f" of at least {minimum}s" if minimum else ""
        raise ValueError(f"{name} must be a finite positive duration{bound}, got {value!r}")
    return seconds


def check_ttl(value: object) -> float:
    """Validate a lease TTL: a finite number of seconds of at least 1 ms."""
    try:
        return positive_seconds(value, "ttl", minimum=MIN_TTL)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def check_holder_id(value: object) -> str:
    """Validate a holder ID: a non-empty string."""
    if not isinstance(value, str):
        raise ConfigError(f"holder_id must be a str, not {type(value).__name__}")
    if not value:
        raise ConfigError("holder_id must not be empty: name this process (a pod name, say)")
    if "\x00" in value:
        raise ConfigError("holder_id must not contain a NUL character")
    return value


def check_work_id(value: object) -> str:
    """Validate a work ID: a non-empty ``str`` of at most 1024 UTF-8 bytes without NUL.

    Raises ``TypeError`` for a non-string and ``ValueError`` for a bad string.
    """
    if not isinstance(value, str):
        raise TypeError(f"work ID must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError("work ID must not be empty")
    if "\x00" in value:
        raise ValueError("work ID must not contain a NUL character")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("work ID must be encodable as UTF-8 (no lone surrogates)") from None
    if size > MAX_WORK_ID_BYTES:
        raise ValueError(
            f"work ID is {size} bytes in UTF-8; the limit is {MAX_WORK_ID_BYTES} bytes"
        )
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
