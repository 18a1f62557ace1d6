"""Validated options of every entry point that acquires, renews, cleans up or paces.

The lease's ``hold()`` and ``renewal()``, the runner, the leader and the pool take the same
acquire, renewal, cleanup and pacing parameters (under slightly different names). They are
checked here, once, when the object is built, and handed down normalised: float seconds, a
real ``bool``, a ``Backoff``. The flavoured code never looks at a raw option again.

Checks raise ``TypeError``/``ValueError`` (what an operation such as ``acquire`` raises);
constructors wrap them with :func:`configuring`, which turns them into the ``ConfigError``
subclass of the object being built (see the rule in ``worklease.errors``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, TypeVar, cast

from ._validation import (
    check_flag,
    check_work_id,
    non_negative_seconds,
    positive_seconds,
)
from ._window import Backoff
from .errors import (
    ConfigError,
    DuplicateWorkIDError,
    EmptyWorkIDError,
    EmptyWorkIDsError,
    PoolConfigError,
)

__all__ = [
    "DEFAULT_ACQUIRE",
    "DEFAULT_CLEANUP_TIMEOUT",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_RENEWAL",
    "HOLD_NAMES",
    "RUNNER_NAMES",
    "AcquireOptions",
    "HoldOptions",
    "Names",
    "Pacing",
    "RenewalOptions",
    "acquire_options",
    "check_callable",
    "check_callbacks",
    "check_count",
    "check_instance",
    "check_pool_work_ids",
    "configuring",
    "hold_options",
    "pacing",
    "renewal_options",
]

DEFAULT_POLL_INTERVAL = 2.0
"""Seconds between attempts of a waiting acquire (at most; a holder's expiry can be sooner)."""

DEFAULT_CLEANUP_TIMEOUT = 5.0
"""Seconds the final writes of a hold, runner, leader or pool may take."""

DEFAULT_PACING_INTERVAL = 1.0
"""Default idle, backoff and rerun interval of leaders and pools, in seconds."""

_DEFAULT_BACKOFF = Backoff()

_E = TypeVar("_E", bound=ConfigError)
_T = TypeVar("_T")


@contextmanager
def configuring(error: type[ConfigError] = ConfigError) -> Iterator[None]:
    """Turn the ``TypeError``/``ValueError`` of an option check into ``error``.

    A ``ConfigError`` raised inside stays as it is when it already is an ``error``; another
    ``ConfigError`` (say the pool's, built by a shared check) becomes an ``error`` too, so a
    pool raises nothing but ``PoolConfigError``.
    """
    try:
        yield
    except error:
        raise
    except (TypeError, ValueError) as exc:
        raise error(str(exc)) from None


class Names(NamedTuple):
    """How one entry point spells the acquire, renewal and cleanup parameters (for errors)."""

    wait: str
    timeout: str
    poll_interval: str
    interval: str
    backoff: str
    cleanup_timeout: str


HOLD_NAMES = Names("wait", "timeout", "poll_interval", "interval", "backoff", "cleanup_timeout")
"""The names of ``lease.acquire()``, ``lease.renewal()`` and ``lease.hold()``."""

RUNNER_NAMES = Names(
    "acquire_wait",
    "acquire_timeout",
    "poll_interval",
    "renewal_interval",
    "renewal_backoff",
    "cleanup_timeout",
)
"""The names of the runner, leader and pool."""


@dataclass(frozen=True, slots=True)
class AcquireOptions:
    """How to acquire: wait for a held lease or not, for how long at most, polling how often."""

    wait: bool = False
    timeout: float | None = None
    """Seconds a waiting acquire may take in all (``None``: no bound)."""
    poll_interval: float = DEFAULT_POLL_INTERVAL


@dataclass(frozen=True, slots=True)
class RenewalOptions:
    """How a background renewal runs: its interval and the backoff of its retries."""

    interval: float | None = None
    """Seconds between renewals; ``None``: a third of the lease's TTL."""
    backoff: Backoff = _DEFAULT_BACKOFF

    def interval_for(self, ttl: float) -> float:
        """The interval for a lease of ``ttl`` seconds."""
        return ttl / 3 if self.interval is None else self.interval


@dataclass(frozen=True, slots=True)
class HoldOptions:
    """Everything one held work ID needs: how to acquire, renew, and how long final writes
    may take."""

    acquire: AcquireOptions = AcquireOptions()
    renewal: RenewalOptions = RenewalOptions()
    cleanup_timeout: float = DEFAULT_CLEANUP_TIMEOUT


@dataclass(frozen=True, slots=True)
class Pacing:
    """The waits of leaders and pools between attempts (seconds)."""

    idle_interval: float = DEFAULT_PACING_INTERVAL
    """After finding the lease held by somebody else (leader), between scans (pool)."""
    backoff_interval: float = DEFAULT_PACING_INTERVAL
    """After a failure."""
    rerun_interval: float = DEFAULT_PACING_INTERVAL
    """Between two runs of a pool slot's work function."""


DEFAULT_ACQUIRE = AcquireOptions()
DEFAULT_RENEWAL = RenewalOptions()


def acquire_options(
    wait: object = False,
    timeout: object = None,
    poll_interval: object = DEFAULT_POLL_INTERVAL,
    *,
    names: Names = HOLD_NAMES,
) -> AcquireOptions:
    """Check the acquire parameters (``TypeError``/``ValueError``)."""
    if wait is False and timeout is None and poll_interval is DEFAULT_POLL_INTERVAL:
        return DEFAULT_ACQUIRE  # a plain acquire: nothing to check
    waiting = check_flag(wait, names.wait)
    poll = positive_seconds(poll_interval, names.poll_interval)
    limit: float | None = None
    if timeout is not None:
        if not waiting:
            raise ValueError(
                f"{names.timeout} applies to a waiting acquire: pass {names.wait}=True"
            )
        limit = non_negative_seconds(timeout, names.timeout)
    if not waiting and limit is None and poll == DEFAULT_POLL_INTERVAL:
        return DEFAULT_ACQUIRE
    return AcquireOptions(waiting, limit, poll)


def renewal_options(
    interval: object = None, backoff: object = None, *, names: Names = HOLD_NAMES
) -> RenewalOptions:
    """Check the renewal parameters (``TypeError``/``ValueError``)."""
    every = None if interval is None else positive_seconds(interval, names.interval)
    if backoff is not None and not isinstance(backoff, Backoff):
        raise TypeError(f"{names.backoff} must be a Backoff, not {type(backoff).__name__}")
    if every is None and backoff is None:
        return DEFAULT_RENEWAL
    return RenewalOptions(every, backoff if backoff is not None else Backoff())


def hold_options(
    *,
    wait: object = False,
    timeout: object = None,
    poll_interval: object = DEFAULT_POLL_INTERVAL,
    interval: object = None,
    backoff: object = None,
    cleanup_timeout: object = DEFAULT_CLEANUP_TIMEOUT,
    names: Names = HOLD_NAMES,
) -> HoldOptions:
    """Check every parameter of a held work ID (``TypeError``/``ValueError``)."""
    return HoldOptions(
        acquire_options(wait, timeout, poll_interval, names=names),
        renewal_options(interval, backoff, names=names),
        positive_seconds(cleanup_timeout, names.cleanup_timeout),
    )


def pacing(
    *,
    idle_interval: object = DEFAULT_PACING_INTERVAL,
    backoff_interval: object = DEFAULT_PACING_INTERVAL,
    rerun_interval: object = DEFAULT_PACING_INTERVAL,
) -> Pacing:
    """Check the waits of a leader or pool (``TypeError``/``ValueError``)."""
    return Pacing(
        positive_seconds(idle_interval, "idle_interval"),
        positive_seconds(backoff_interval, "backoff_interval"),
        positive_seconds(rerun_interval, "rerun_interval"),
    )


def check_instance(value: object, cls: type[_T], name: str, error: type[_E]) -> _T:
    """``value`` when it is a ``cls``; ``error`` otherwise (``None`` included)."""
    if not isinstance(value, cls):
        raise error(f"{name}: expected {cls.__name__}, got {type(value).__name__}")
    return value


def check_callable(value: _T | None, name: str, error: type[_E]) -> _T:
    """``value`` when it is callable; ``error`` otherwise (``None`` included)."""
    if value is None or not callable(value):
        raise error(f"{name} is required and must be callable, not {value!r}")
    return value


def check_count(value: object, name: str, *, minimum: int = 0) -> int:
    """A whole number of at least ``minimum`` (``TypeError``/``ValueError`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def check_callbacks(**callbacks: Callable[..., object] | None) -> None:
    """Optional callbacks: ``None`` or callable (``TypeError`` otherwise)."""
    for name, callback in callbacks.items():
        if callback is not None and not callable(callback):
            raise TypeError(f"{name} must be callable, not {callback!r}")


def check_pool_work_ids(work_ids: object) -> tuple[str, ...]:
    """A pool's work IDs: an iterable (not one string) of valid, distinct work IDs, at least
    one; ``PoolConfigError`` (one of its subclasses) otherwise."""
    if isinstance(work_ids, str | bytes):
        raise PoolConfigError("work_ids must be a collection of work IDs, not a single string")
    try:
        ids = tuple(cast(Iterable[str], work_ids))
    except TypeError:
        raise PoolConfigError("work_ids must be an iterable of work IDs") from None
    if not ids:
        raise EmptyWorkIDsError("a pool needs at least one work ID")
    seen: set[str] = set()
    for work_id in ids:
        if work_id == "":
            raise EmptyWorkIDError("a pool work ID must not be empty")
        try:
            check_work_id(work_id)
        except (TypeError, ValueError) as exc:
            raise PoolConfigError(f"invalid pool work ID {work_id!r}: {exc}") from None
        if work_id in seen:
            raise DuplicateWorkIDError(f"work ID {work_id!r} appears more than once")
        seen.add(work_id)
    return ids
