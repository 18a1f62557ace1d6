# Generated from tests/_async/test_options.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""One rule for argument errors, applied the same way by every entry point.

Constructors (lease, runner, leader, pool, vacuum, backends) and the context managers
``lease.hold()`` and ``lease.renewal()`` raise ``ConfigError`` (pool: ``PoolConfigError``)
for any bad option, before any I/O; operations raise ``TypeError``/``ValueError``. The
regression cases of issue 11 are named after the defect they pin.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from worklease import (
    Checkpoint,
    ConfigError,
    ExitMode,
    Leader,
    Lease,
    MemoryBackend,
    Pool,
    PoolConfigError,
    Runner,
    Token,
    Vacuum,
)
from worklease._validation import MAX_DURATION
from worklease.testing import FakeClock, RecordingObserver

from .helpers import ScriptedBackend

HOLDER = "test-worker"
TTL = 10.0


@pytest.fixture
def backend() -> ScriptedBackend:
    return ScriptedBackend(clock=FakeClock())


@pytest.fixture
def observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture
def lease(backend: ScriptedBackend, observer: RecordingObserver) -> Lease:
    return Lease(backend, holder_id=HOLDER, ttl=TTL, observer=observer)


def nothing(token: Token, prior: Checkpoint) -> None:
    return None


BAD_DURATIONS = [
    pytest.param(0, id="zero"),
    pytest.param(-1.0, id="negative"),
    pytest.param(math.nan, id="nan"),
    pytest.param(math.inf, id="inf"),
    pytest.param(1e12, id="1e12"),
    pytest.param(MAX_DURATION * 2, id="over-max"),
    pytest.param(timedelta(days=999_999), id="timedelta-over-max"),
    pytest.param("soon", id="str"),
    pytest.param("0s", id="str-zero"),
    pytest.param(True, id="bool"),
    pytest.param(10**400, id="int-overflow"),
]
"""Values no duration option accepts."""

BAD_BACKOFFS = [
    pytest.param("not a Backoff", id="str"),
    pytest.param((0.1, 5.0, 0.2), id="tuple"),
    pytest.param(1.0, id="float"),
]


# Each entry: the constructor, and how it spells the renewal interval and backoff.
RENEWING = {
    "runner": ("renewal_interval", "renewal_backoff"),
    "leader": ("renewal_interval", "renewal_backoff"),
    "pool": ("renewal_interval", "renewal_backoff"),
    "hold": ("interval", "backoff"),
    "renewal": ("interval", "backoff"),
}


def _build(lease: Lease, kind: str, **options: Any) -> object:
    if kind == "runner":
        return Runner(lease, nothing, **options)
    if kind == "leader":
        return Leader(lease, "job", **options)
    if kind == "pool":
        return Pool(lease, ["a"], nothing, **options)
    if kind == "hold":
        return lease.hold("job", **options)
    if kind == "renewal":
        token = lease.acquire("renewed")
        return lease.renewal(token, **options)
    raise AssertionError(kind)


def _expected(kind: str) -> type[ConfigError]:
    return PoolConfigError if kind == "pool" else ConfigError


@pytest.mark.parametrize("kind", list(RENEWING))
@pytest.mark.parametrize("backoff", BAD_BACKOFFS)
def test_defect1_renewal_backoff_checked_at_construction_everywhere(
    lease: Lease, kind: str, backoff: object
) -> None:
    """Defect 1: a backoff that is not a Backoff is refused when the object is built, by
    every constructor alike (the leader used to accept it and spin at run time)."""
    _, backoff_name = RENEWING[kind]
    with pytest.raises(_expected(kind)):
        _build(lease, kind, **{backoff_name: backoff})


@pytest.mark.parametrize("kind", list(RENEWING))
@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_renewal_interval_checked_the_same_way_everywhere(
    lease: Lease, kind: str, value: object
) -> None:
    interval_name, _ = RENEWING[kind]
    with pytest.raises(_expected(kind)):
        _build(lease, kind, **{interval_name: value})


CLEANING = ["runner", "leader", "pool", "hold"]


@pytest.mark.parametrize("kind", CLEANING)
@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_cleanup_timeout_checked_the_same_way_everywhere(
    lease: Lease, kind: str, value: object
) -> None:
    with pytest.raises(_expected(kind)):
        _build(lease, kind, cleanup_timeout=value)


@pytest.mark.parametrize("kind", ["leader", "pool"])
@pytest.mark.parametrize("name", ["idle_interval", "backoff_interval"])
@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_pacing_checked_the_same_way(lease: Lease, kind: str, name: str, value: object) -> None:
    with pytest.raises(_expected(kind)):
        _build(lease, kind, **{name: value})


@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_pool_rerun_interval(lease: Lease, value: object) -> None:
    with pytest.raises(PoolConfigError):
        Pool(lease, ["a"], nothing, rerun_interval=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["runner", "leader", "hold"])
@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_poll_interval_checked_the_same_way(lease: Lease, kind: str, value: object) -> None:
    wait = "wait" if kind == "hold" else "acquire_wait"
    with pytest.raises(ConfigError):
        _build(lease, kind, poll_interval=value, **{wait: True})


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(math.nan, id="nan"),
        pytest.param(-1, id="negative"),
        pytest.param("soon", id="str"),
        pytest.param(math.inf, id="inf"),
        pytest.param(MAX_DURATION * 2, id="over-max"),
    ],
)
@pytest.mark.parametrize("kind", ["runner", "hold"])
def test_defect5_acquire_timeout_checked_at_construction(
    lease: Lease, kind: str, value: object
) -> None:
    """Defect 5: Runner(acquire_timeout=nan | -1) was accepted (NaN waited forever); a string
    that is no duration is refused the same way."""
    names = ("acquire_wait", "acquire_timeout") if kind == "runner" else ("wait", "timeout")
    with pytest.raises(ConfigError):
        _build(lease, kind, **{names[0]: True, names[1]: value})


@pytest.mark.parametrize("flag", ["true", "false", 1, 0, None])
@pytest.mark.parametrize("kind", ["runner", "leader", "hold"])
def test_wait_flags_must_be_bools(lease: Lease, kind: str, flag: object) -> None:
    """A truthy string never passes for True: ``acquire_wait="false"`` would wait."""
    name = "wait" if kind == "hold" else "acquire_wait"
    with pytest.raises(ConfigError):
        _build(lease, kind, **{name: flag})


def test_good_options_are_normalised_once(lease: Lease) -> None:
    """timedelta and int options are accepted and handed down as float seconds."""
    runner = Runner(
        lease,
        nothing,
        acquire_wait=True,
        acquire_timeout=timedelta(seconds=3),
        poll_interval=1,
        renewal_interval=timedelta(milliseconds=500),
        cleanup_timeout=2,
    )
    options = runner._options
    assert options.acquire.wait is True
    assert options.acquire.timeout == 3.0
    assert options.acquire.poll_interval == 1.0
    assert options.renewal.interval == 0.5
    assert options.cleanup_timeout == 2.0
    assert all(
        isinstance(value, float)
        for value in (options.acquire.timeout, options.acquire.poll_interval)
    )


def test_durations_as_strings_are_the_command_lines(lease: Lease) -> None:
    """Every duration option takes the strings the command line takes ("30", "500ms",
    "1m30s"), and refuses others with the option's name, as it does numbers out of range."""
    runner = Runner(
        lease,
        nothing,
        acquire_wait=True,
        acquire_timeout="1m30s",
        poll_interval="500ms",
        renewal_interval="2",
        cleanup_timeout="5s",
    )
    options = runner._options
    assert options.acquire.timeout == 90.0
    assert options.acquire.poll_interval == 0.5
    assert options.renewal.interval == 2.0
    assert options.cleanup_timeout == 5.0
    backend = MemoryBackend()
    assert Lease(backend, holder_id="h", ttl="30s").ttl == 30.0
    assert Lease(backend, holder_id="h", ttl="45").ttl == 45.0
    with pytest.raises(ConfigError, match="cleanup_timeout"):
        Runner(lease, nothing, cleanup_timeout="soon")
    with pytest.raises(ConfigError, match="ttl"):
        Lease(backend, holder_id="h", ttl="0s")


def test_the_longest_duration_is_accepted(lease: Lease) -> None:
    """MAX_DURATION itself is inside the range."""
    Runner(lease, nothing, cleanup_timeout=MAX_DURATION, renewal_interval=MAX_DURATION)
    Lease(MemoryBackend(), holder_id=HOLDER, ttl=MAX_DURATION)


# -- operations: TypeError / ValueError, before any I/O ---------------------------------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"wait": "yes"}, TypeError),
        ({"wait": True, "timeout": math.nan}, ValueError),
        ({"wait": True, "timeout": -1}, ValueError),
        ({"wait": True, "timeout": "soon"}, ValueError),
        ({"wait": True, "timeout": b"1"}, TypeError),
        ({"wait": True, "timeout": math.inf}, ValueError),
        ({"wait": True, "timeout": 1e300}, ValueError),
        ({"wait": True, "poll_interval": 1e300}, ValueError),
        ({"wait": True, "poll_interval": 0}, ValueError),
        ({"timeout": 1.0}, ValueError),
    ],
)
def test_acquire_arguments_are_call_errors(
    lease: Lease,
    backend: ScriptedBackend,
    observer: RecordingObserver,
    options: dict[str, Any],
    error: type[Exception],
) -> None:
    with pytest.raises(error) as caught:
        lease.acquire("job", **options)
    assert not isinstance(caught.value, ConfigError)
    assert backend.calls == []
    assert observer.events == []


# -- defect 2: durations beyond the maximum ----------------------------------------------------


@pytest.mark.parametrize(
    "ttl",
    [1e12, 1e300, math.inf, MAX_DURATION * 1.5, timedelta(days=999_999_999), 10**400],
    ids=["1e12", "1e300", "inf", "over-max", "timedelta", "int-overflow"],
)
def test_defect2_ttl_beyond_the_maximum_is_a_config_error(ttl: object) -> None:
    """Defect 2: Lease(ttl=1e12) was accepted (and then committed a row nobody could read
    back); 1e300 and inf raised a raw OverflowError. Now each is a ConfigError."""
    with pytest.raises(ConfigError):
        Lease(MemoryBackend(), holder_id=HOLDER, ttl=ttl)  # type: ignore[arg-type]


# -- defect 6: holder IDs validated like work IDs ----------------------------------------------


@pytest.mark.parametrize(
    "holder_id",
    ["", "a\x00b", "\ud800", "lone \udfff surrogate", "x" * 1025, "\u00e9" * 513, 7, None],
    ids=["empty", "nul", "surrogate", "low-surrogate", "1025", "1026-utf8", "int", "none"],
)
def test_defect6_holder_ids_validated_like_work_ids(holder_id: object) -> None:
    """Defect 6: a holder ID with a lone surrogate was accepted and later failed inside the
    driver; holder IDs now follow the work-ID rules, at construction."""
    with pytest.raises(ConfigError):
        Lease(MemoryBackend(), holder_id=holder_id, ttl=TTL)  # type: ignore[arg-type]


def test_holder_id_of_1024_utf8_bytes_is_accepted() -> None:
    lease = Lease(MemoryBackend(), holder_id="\u00e9" * 512, ttl=TTL)
    token = lease.acquire("job")
    assert token.holder_id == "\u00e9" * 512


# -- defect 7: a destructive flag must be a real bool ------------------------------------------


@pytest.mark.parametrize("flag", ["false", "true", 0, 1, None])
def test_defect7_sweep_include_expired_must_be_a_bool(flag: object) -> None:
    """Defect 7: sweep(retention, include_expired="false") deleted lapsed rows (truthiness on
    a destructive flag). Now it raises TypeError before any I/O and nothing is deleted; the
    row was sweepable all along (a real True deletes it)."""
    clock = FakeClock()
    backend = ScriptedBackend(clock=clock)
    lease = Lease(backend, holder_id=HOLDER, ttl=TTL)
    lease.acquire("lapsed")
    clock.advance(TTL + 3600)
    backend.calls.clear()
    vacuum = Vacuum(backend)
    with pytest.raises(TypeError):
        vacuum.sweep(60, include_expired=flag)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        backend.inner.sweep(60, flag)  # type: ignore[arg-type]
    assert backend.calls == []
    assert [row.work_id for row in backend.inner.rows()] == ["lapsed"]
    assert vacuum.sweep(60, include_expired=True) == 1


def test_release_modes_still_invalid_exit_mode(lease: Lease) -> None:
    """The named operation errors keep their classes (InvalidExitModeError is a
    ValueError)."""
    token = lease.acquire("job")
    with pytest.raises(ValueError):
        lease.release(token, ExitMode.EXPIRED)


@pytest.mark.parametrize("clock", ["now", 42, object()])
def test_memory_backend_clock_is_checked_at_construction(clock: object) -> None:
    with pytest.raises(ConfigError):
        MemoryBackend(clock=clock)  # type: ignore[arg-type]
