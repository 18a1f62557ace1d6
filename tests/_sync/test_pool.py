# Generated from tests/_async/test_pool.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""The pool (behaviour.md §7.3, §8.3): construction, slots, and how every run outcome paces.

Cases run on both backends (memory and PostgreSQL) in real time with short intervals; each
pool run has a watchdog that stops it (and fails the test) if it does not end by itself.
Fencing is produced for real by deleting the slot's row behind its back (``forget``).
Outside cancellation of ``run`` exists only in the asyncio flavour (``tests/async_only``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from time import monotonic
from typing import Any

import pytest

from tests._compat import sleep, spawn_all
from worklease import (
    AllSlotsDeadError,
    Backend,
    Checkpoint,
    ConfigError,
    DuplicateWorkIDError,
    EmptyWorkIDError,
    EmptyWorkIDsError,
    ExitMode,
    Lease,
    LeaseHeldError,
    LeaseRequiredError,
    MemoryBackend,
    PermanentError,
    Pool,
    PoolConfigError,
    PoolLeaseRequiredError,
    PoolSurvey,
    PoolWorkFnRequiredError,
    Retire,
    Token,
    WorkFnRequiredError,
    current_renewal,
    permanent,
)
from worklease._compat import Event
from worklease.observers import (
    AcquireEvent,
    PoolObserver,
    ScanEvent,
    SlotAcquiredEvent,
    SlotBackoffEvent,
    SlotDeadEvent,
    SlotLostEvent,
    SlotRetiredEvent,
)
from worklease.testing import RecordingObserver

from .helpers import settle_listener, spin

HOLDER = "pool-a"
TTL = 5.0
EARLY = 0.02
"""Timers may fire a hair early; waits are asserted to last at least their length minus this."""
PROMPT = 3.0
"""Upper bound for anything that should happen 'at once' on a loaded CI box."""
LIMIT = 15.0
"""Watchdog: a pool still running after this long is stopped and the test fails."""
LONG = 30.0
"""An interval no test may sit out."""

SlotEvent = SlotAcquiredEvent | SlotLostEvent | SlotBackoffEvent | SlotDeadEvent | SlotRetiredEvent


class Slots(PoolObserver):
    """Records every pool event with the time it arrived."""

    def __init__(self) -> None:
        self.timed: list[tuple[SlotEvent, float]] = []

    def _record(self, event: SlotEvent) -> None:
        self.timed.append((event, monotonic()))

    def on_slot_acquired(self, event: SlotAcquiredEvent) -> None:
        self._record(event)

    def on_slot_lost(self, event: SlotLostEvent) -> None:
        self._record(event)

    def on_slot_backoff(self, event: SlotBackoffEvent) -> None:
        self._record(event)

    def on_slot_dead(self, event: SlotDeadEvent) -> None:
        self._record(event)

    def on_slot_retired(self, event: SlotRetiredEvent) -> None:
        self._record(event)

    @property
    def events(self) -> list[SlotEvent]:
        return [event for event, _ in list(self.timed)]

    def kinds(self, work_id: str | None = None) -> list[str]:
        """Event kinds in order ("acquired", "lost", ...), of one work ID or all."""
        return [
            type(e).__name__.removeprefix("Slot").removesuffix("Event").lower()
            for e in self.events
            if work_id is None or e.work_id == work_id
        ]


@pytest.fixture
def observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture
def lease(backend: Backend, observer: RecordingObserver) -> Lease:
    return Lease(backend, holder_id=HOLDER, ttl=TTL, observer=observer)


@pytest.fixture
def rival(backend: Backend) -> Lease:
    return Lease(backend, holder_id="rival", ttl=TTL)


@pytest.fixture
def slots() -> Slots:
    return Slots()


def successor_reads(rival: Lease, work_id: str) -> Checkpoint:
    """What the next holder reads: a fail-fast acquire (so the row must be free) and a read."""
    token = rival.acquire(work_id)
    return rival.read_checkpoint(token)


def drive(
    pool: Pool,
    *,
    stop_when: Callable[[], bool] | None = None,
    side: Callable[[], Any] | None = None,
) -> BaseException | None:
    """Run ``pool.run()`` to its end and return what it raised (``None`` if it returned).

    ``stop_when`` is polled and the pool stopped once it is true; ``side`` runs alongside. A
    watchdog stops the pool after LIMIT seconds, which fails the test.
    """
    outcome: list[BaseException | None] = []
    fired: list[bool] = []

    def runner() -> None:
        try:
            pool.run()
        except Exception as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    def stopper() -> None:
        deadline = monotonic() + LIMIT
        while not outcome and monotonic() < deadline:
            if stop_when is not None and stop_when():
                pool.stop()
                return
            sleep(0.01)
        if not outcome:
            fired.append(True)
            pool.stop()

    def aside() -> None:
        if side is not None:
            side()

    steps = [runner, stopper, aside]

    def one(index: int) -> None:
        steps[index]()

    for result in spawn_all(one, len(steps)):
        if isinstance(result, BaseException):
            raise result
    assert not fired, "the pool did not end by itself; the watchdog stopped it"
    assert pool.active_slots() == frozenset()
    return outcome[0]


def held_attempts(observer: RecordingObserver) -> int:
    return sum(isinstance(e.error, LeaseHeldError) for e in observer.of_type(AcquireEvent))


class Scans(Slots):
    """Also records every scan (with the time it ended)."""

    def __init__(self) -> None:
        super().__init__()
        self.scans: list[tuple[ScanEvent, float]] = []

    def on_scan(self, event: ScanEvent) -> None:
        self.scans.append((event, monotonic()))

    def fruitless(self) -> int:
        """Scans that had candidates but acquired nothing (they were held elsewhere)."""
        return sum(1 for event, _ in list(self.scans) if event.candidates and not event.acquired)


class NotPermanent(Exception):
    """Has a permanent() method that says no."""

    def permanent(self) -> bool:
        return False


class BrokenPermanent(Exception):
    """Has a permanent() method that raises (counts as not permanent)."""

    def permanent(self) -> bool:
        raise RuntimeError("permanent() bug")


# -- construction -------------------------------------------------------------------------------


@pytest.fixture
def memory_lease() -> Lease:
    """Construction checks need no real backend."""
    return Lease(MemoryBackend(), holder_id=HOLDER, ttl=TTL)


def nothing(token: Token, prior: Checkpoint) -> None:
    return None


@pytest.mark.parametrize(
    ("lease_given", "work", "work_ids", "expected"),
    [
        (False, None, [], PoolLeaseRequiredError),
        (True, None, [], PoolWorkFnRequiredError),
        (True, "not callable", ["a"], PoolWorkFnRequiredError),
        (True, nothing, [], EmptyWorkIDsError),
        (True, nothing, ["a", "", "a"], EmptyWorkIDError),
        (True, nothing, ["a", "b", "a"], DuplicateWorkIDError),
        (True, nothing, "abc", PoolConfigError),
        (True, nothing, b"abc", PoolConfigError),
        (True, nothing, 42, PoolConfigError),
        (True, nothing, ["a", "x\x00y"], PoolConfigError),
        (True, nothing, ["a", 7], PoolConfigError),
    ],
    ids=[
        "no-lease-first",
        "no-work-before-ids",
        "work-not-callable",
        "empty-list",
        "empty-id-before-duplicate",
        "duplicate",
        "str-not-list",
        "bytes-not-list",
        "not-iterable",
        "nul-in-id",
        "not-a-str-id",
    ],
)
def test_construction_errors(
    memory_lease: Lease,
    lease_given: bool,
    work: Any,
    work_ids: Any,
    expected: type[ConfigError],
) -> None:
    """Construction errors, checked in the order lease, work, empty list, empty ID,
    duplicate; every one is a PoolConfigError (the Go contract), a ConfigError and a
    ValueError; the missing lease and work function are LeaseRequiredError and
    WorkFnRequiredError too."""
    with pytest.raises(expected) as caught:
        Pool(memory_lease if lease_given else None, work_ids, work)  # type: ignore[arg-type]
    assert type(caught.value) is expected
    assert isinstance(caught.value, PoolConfigError)
    assert isinstance(caught.value, ConfigError)
    assert isinstance(caught.value, ValueError)
    if expected is PoolLeaseRequiredError:
        assert isinstance(caught.value, LeaseRequiredError)
    if expected is PoolWorkFnRequiredError:
        assert isinstance(caught.value, WorkFnRequiredError)


@pytest.mark.parametrize(
    "options",
    [
        {"idle_interval": 0},
        {"rerun_interval": -1.0},
        {"backoff_interval": math.nan},
        {"cleanup_timeout": 0},
        {"renewal_interval": 0},
        {"observer": object()},
    ],
)
def test_bad_options(memory_lease: Lease, options: dict[str, Any]) -> None:
    """Unusable intervals and a non-PoolObserver observer raise ConfigError."""
    with pytest.raises(ConfigError):
        Pool(memory_lease, ["a"], nothing, **options)


def test_work_ids_any_iterable(memory_lease: Lease) -> None:
    """Any iterable of IDs works (a generator too); order is kept."""
    pool = Pool(memory_lease, (w for w in ["b", "a"]), nothing)
    assert pool.work_ids == ("b", "a")
    assert pool.active_slots() == frozenset()
    assert not pool.stopping


# -- running slots ------------------------------------------------------------------------------


def test_all_slots_run_until_stopped(lease: Lease, rival: Lease, slots: Slots) -> None:
    """Every slot acquires and shows in active_slots() while its work runs; stop() ends run;
    every running slot releases ABANDONED keeping its checkpoint (asyncio: cancelled;
    threads: told through raise_if_lost(), or here by polling ``stopping``)."""
    ids = ["w1", "w2", "w3"]
    seen: list[frozenset[str]] = []
    tokens: dict[str, Token] = {}

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        lease.checkpoint(token, b"progress " + token.work_id.encode())
        tokens[token.work_id] = token  # checkpointed: stopping now keeps the progress
        for _ in range(1000):
            if pool.stopping:
                break
            sleep(0.01)
        return None

    pool = Pool(lease, ids, work, observer=slots, rerun_interval=LONG)

    def all_running() -> bool:
        active = pool.active_slots()
        if active == frozenset(ids) and len(tokens) == len(ids):
            seen.append(active)
            return True
        return False

    assert drive(pool, stop_when=all_running) is None
    assert seen == [frozenset(ids)]
    assert sorted(slots.kinds()) == ["acquired"] * 3
    assert {e.work_id: e.token for e in slots.events if isinstance(e, SlotAcquiredEvent)} == tokens
    for work_id in ids:
        expected = Checkpoint(b"progress " + work_id.encode(), ExitMode.ABANDONED, HOLDER)
        assert successor_reads(rival, work_id) == expected


def test_rerun_after_rerun_interval(lease: Lease, slots: Slots) -> None:
    """Work that returns runs again after rerun_interval (+ ≤ 20 %); each run sees the last."""
    starts: list[float] = []
    priors: list[Checkpoint] = []

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        starts.append(monotonic())
        priors.append(prior)
        return b"run " + str(len(starts)).encode()

    pool = Pool(lease, ["job"], work, observer=slots, rerun_interval=0.1)
    begin = monotonic()
    assert drive(pool, stop_when=lambda: len(starts) >= 5) is None
    elapsed = monotonic() - begin
    runs = len(starts)
    assert 5 <= runs <= elapsed / 0.1 + 1
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.1 - EARLY
    assert priors[0] == Checkpoint(None, ExitMode.NONE, None)
    for index, prior in enumerate(priors[1:], start=1):
        assert prior == Checkpoint(b"run " + str(index).encode(), ExitMode.FINISHED, HOLDER)
    assert slots.kinds() == ["acquired"] * runs  # no callback after a clean run


def test_retire_stops_only_that_slot(lease: Lease, rival: Lease, slots: Slots) -> None:
    """Retire: on_slot_retired, the slot stops; the other slots go on."""
    runs: dict[str, int] = {"retiring": 0, "busy": 0}

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        runs[token.work_id] += 1
        if token.work_id == "retiring":
            raise Retire(b"all done")
        return None

    pool = Pool(lease, ["retiring", "busy"], work, observer=slots, rerun_interval=0.05)
    assert drive(pool, stop_when=lambda: runs["busy"] >= 4) is None
    assert runs["retiring"] == 1
    assert slots.kinds("retiring") == ["acquired", "retired"]
    assert "retired" not in slots.kinds("busy")
    assert successor_reads(rival, "retiring") == Checkpoint(b"all done", ExitMode.RETIRED, HOLDER)


def test_every_slot_retired_ends_run(lease: Lease, slots: Slots) -> None:
    """When every slot retired, run returns None by itself."""

    def work(token: Token, prior: Checkpoint) -> bytes | None:  # a plain function works too
        raise Retire

    pool = Pool(lease, ["a", "b"], work, observer=slots, rerun_interval=LONG)
    assert drive(pool) is None
    assert sorted(slots.kinds()) == ["acquired", "acquired", "retired", "retired"]


class PermanentRetire(Retire):
    """Both a Retire and permanent: Retire wins."""

    def permanent(self) -> bool:
        return True


def test_retire_wins_over_permanent(lease: Lease, slots: Slots) -> None:
    """An error that is both a Retire and permanent retires the slot (not dead)."""

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        raise PermanentRetire(b"bye")

    pool = Pool(lease, ["job"], work, observer=slots)
    assert drive(pool) is None
    assert slots.kinds() == ["acquired", "retired"]


def test_permanent_failure_kills_the_slot(lease: Lease, rival: Lease, slots: Slots) -> None:
    """permanent(exc): on_slot_dead, released ABANDONED keeping the last checkpoint; with one
    slot, every slot is dead: AllSlotsDeadError."""
    cause = ValueError("corrupt input")
    raised: list[PermanentError] = []

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        lease.checkpoint(token, b"last good")
        error = permanent(cause)
        raised.append(error)
        raise error

    pool = Pool(lease, ["job"], work, observer=slots, backoff_interval=LONG, rerun_interval=LONG)
    outcome = drive(pool)
    assert isinstance(outcome, AllSlotsDeadError)
    assert slots.kinds() == ["acquired", "dead"]
    dead = slots.events[-1]
    assert isinstance(dead, SlotDeadEvent)
    assert dead.work_id == "job"
    assert dead.error is raised[0]
    assert dead.error.__cause__ is cause
    assert successor_reads(rival, "job") == Checkpoint(b"last good", ExitMode.ABANDONED, HOLDER)


def test_all_slots_dead(lease: Lease, slots: Slots) -> None:
    """Every slot failing permanently (also through a wrapping chain): AllSlotsDeadError."""

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        if token.work_id == "direct":
            raise permanent(KeyError("gone"))
        try:
            raise permanent(OSError("disk gone"))
        except PermanentError as inner:
            raise RuntimeError("wrapped by the application") from inner

    pool = Pool(lease, ["direct", "wrapped"], work, observer=slots, backoff_interval=LONG)
    assert isinstance(drive(pool), AllSlotsDeadError)
    assert sorted(slots.kinds()) == ["acquired", "acquired", "dead", "dead"]
    wrapped = [e for e in slots.events if isinstance(e, SlotDeadEvent) and e.work_id == "wrapped"]
    assert isinstance(wrapped[0].error, RuntimeError)


def test_a_retirement_means_no_all_dead_error(lease: Lease, slots: Slots) -> None:
    """One slot retired, the others died: run returns None."""

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        if token.work_id == "retires":
            raise Retire
        raise permanent(ValueError("bad"))

    pool = Pool(lease, ["retires", "dies-1", "dies-2"], work, observer=slots)
    assert drive(pool) is None
    assert slots.kinds("retires") == ["acquired", "retired"]
    assert slots.kinds("dies-1") == slots.kinds("dies-2") == ["acquired", "dead"]


@pytest.mark.parametrize(
    "idle",
    [0.1, pytest.param(LONG, marks=pytest.mark.needs_release_reports)],
    ids=["polling", "woken-by-release"],
)
def test_held_elsewhere_waits_then_picks_it_up(
    lease: Lease, rival: Lease, observer: RecordingObserver, idle: float
) -> None:
    """Held by another holder: scan every idle_interval (+ ≤ 20 %) without trying to acquire
    it, no callback, and pick the work ID up once it is released; a backend that reports
    releases wakes the scan at once, whatever the idle interval."""
    rival_token = rival.acquire("job")
    released: list[float] = []
    priors: list[Checkpoint] = []
    scans = Scans()

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        priors.append(prior)
        raise Retire

    def rival_steps_down() -> None:
        deadline = monotonic() + LIMIT
        while scans.fruitless() < 2 and monotonic() < deadline:
            sleep(0.01)
        rival.checkpoint(rival_token, b"from rival")
        rival.release(rival_token, ExitMode.FINISHED)
        released.append(monotonic())

    if idle == LONG and getattr(lease.backend, "watch_releases", None) is None:
        pytest.skip("the backend does not report releases")
    settle_listener(lease.backend)
    pool = Pool(lease, ["job"], work, observer=scans, idle_interval=idle, backoff_interval=LONG)
    if idle == LONG:  # two fruitless scans take two idle intervals: wait for one only
        scans.scans.append((ScanEvent(1, (), 0.0, None), monotonic()))
    begin = monotonic()
    assert drive(pool, side=rival_steps_down) is None
    elapsed = monotonic() - begin
    assert priors == [Checkpoint(b"from rival", ExitMode.FINISHED, "rival")]
    assert scans.kinds() == ["acquired", "retired"]
    acquired_at = scans.timed[0][1]
    assert acquired_at >= released[0]
    assert acquired_at - released[0] < 0.12 + PROMPT
    assert held_attempts(observer) == 0  # the scan never tries a held work ID
    if idle != LONG:
        assert 2 <= scans.fruitless() <= elapsed / 0.1 + 1


def test_fenced_slot_reacquires_at_once(lease: Lease, backend: Backend, slots: Slots) -> None:
    """Fenced: on_slot_lost and an immediate re-acquire attempt (no wait of any kind)."""
    tokens: list[Token] = []

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        tokens.append(token)
        if len(tokens) == 1:
            backend.forget(token)  # the row disappears: the next renewal is fenced
            renewal = current_renewal()
            assert renewal is not None
            spin(renewal, seconds=10.0)
            return b"never written"
        raise Retire

    pool = Pool(
        lease,
        ["job"],
        work,
        observer=slots,
        renewal_interval=0.05,
        idle_interval=LONG,
        rerun_interval=LONG,
        backoff_interval=LONG,
    )
    assert drive(pool) is None
    assert slots.kinds() == ["acquired", "lost", "acquired", "retired"]
    lost, lost_at = slots.timed[1]
    assert isinstance(lost, SlotLostEvent)
    assert lost.work_id == "job"
    assert slots.timed[2][1] - lost_at < PROMPT
    assert tokens[1].fencing_token > tokens[0].fencing_token


@pytest.mark.parametrize(
    "error",
    [ValueError("transient trouble"), NotPermanent("says no"), BrokenPermanent("raises")],
    ids=["plain", "permanent-false", "permanent-raises"],
)
def test_other_error_backs_off(
    lease: Lease, slots: Slots, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """Any other failure: on_slot_backoff with delay == backoff_interval, then a wait of that
    long (no jitter needed), then a new attempt that sees ABANDONED."""
    priors: list[Checkpoint] = []
    starts: list[float] = []

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        priors.append(prior)
        starts.append(monotonic())
        if len(priors) == 1:
            raise error
        raise Retire

    pool = Pool(lease, ["job"], work, observer=slots, backoff_interval=0.25, rerun_interval=LONG)
    assert drive(pool) is None
    assert slots.kinds() == ["acquired", "backoff", "acquired", "retired"]
    backoff, backoff_at = slots.timed[1]
    assert isinstance(backoff, SlotBackoffEvent)
    assert (backoff.work_id, backoff.error, backoff.delay) == ("job", error, 0.25)
    assert starts[1] - backoff_at >= 0.25 - EARLY
    assert priors[1] == Checkpoint(None, ExitMode.ABANDONED, HOLDER)


def test_stop_with_slots_waiting(lease: Lease, rival: Lease) -> None:
    """stop() ends slots sitting in any wait (idle scan, rerun, backoff) at once."""
    slots = Scans()
    rival.acquire("held")
    runs: dict[str, int] = {"held": 0, "reruns": 0, "fails": 0}

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        runs[token.work_id] += 1
        if token.work_id == "fails":
            raise ValueError("backing off")
        return None

    pool = Pool(
        lease,
        ["held", "reruns", "fails"],
        work,
        observer=slots,
        idle_interval=LONG,
        rerun_interval=LONG,
        backoff_interval=LONG,
    )
    stopped: list[float] = []

    def all_waiting() -> bool:
        held = [e for e, _ in list(slots.scans) if "held" not in e.acquired]
        waiting = bool(held) and runs["reruns"] == 1 and "backoff" in slots.kinds("fails")
        if waiting and not pool.active_slots():
            stopped.append(monotonic())
            return True
        return False

    assert drive(pool, stop_when=all_waiting) is None
    assert monotonic() - stopped[0] < PROMPT
    assert pool.stopping
    assert runs == {"held": 0, "reruns": 1, "fails": 1}


def test_observer_errors_are_logged(lease: Lease, caplog: pytest.LogCaptureFixture) -> None:
    """An observer that raises is logged; the pool goes on."""

    class Broken(PoolObserver):
        def on_slot_acquired(self, event: SlotAcquiredEvent) -> None:
            raise RuntimeError("observer bug")

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        raise Retire

    pool = Pool(lease, ["job"], work, observer=Broken())
    assert drive(pool) is None
    assert any(
        r.exc_info is not None and isinstance(r.exc_info[1], RuntimeError) for r in caplog.records
    )


def test_run_again_after_it_ended(lease: Lease, slots: Slots) -> None:
    """A pool whose run ended (all retired) can run again; the dead count starts afresh."""
    runs: list[int] = []

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        runs.append(1)
        if len(runs) == 1:
            raise permanent(ValueError("first run dies"))
        raise Retire

    pool = Pool(lease, ["job"], work, observer=slots)
    assert isinstance(drive(pool), AllSlotsDeadError)
    assert drive(pool) is None
    assert slots.kinds() == ["acquired", "dead", "acquired", "retired"]


def test_run_is_not_reentrant(lease: Lease, slots: Slots) -> None:
    """A second run() while the pool runs raises RuntimeError; the first goes on."""
    errors: list[BaseException] = []

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        try:
            pool.run()
        except RuntimeError as exc:
            errors.append(exc)
        raise Retire

    pool = Pool(lease, ["job"], work, observer=slots)
    assert drive(pool) is None
    assert len(errors) == 1
    assert slots.kinds() == ["acquired", "retired"]


# -- the scan -----------------------------------------------------------------------------------


class CountingMemory(MemoryBackend):
    """Counts the calls a pool makes: scans, batched acquires and single acquires."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def find_available(self, work_ids: Sequence[str]) -> list[str]:
        self.calls.append(("find_available", len(work_ids)))
        return super().find_available(work_ids)

    def acquire_many(
        self, work_ids: Sequence[str], holder_id: str, ttl: float
    ) -> list[tuple[Token, Checkpoint]]:
        self.calls.append(("acquire_many", len(work_ids)))
        return super().acquire_many(work_ids, holder_id, ttl)

    def acquire(self, work_id: str, holder_id: str, ttl: float) -> Token:
        self.calls.append(("acquire", 1))
        return super().acquire(work_id, holder_id, ttl)

    def acquire_with_checkpoint(
        self, work_id: str, holder_id: str, ttl: float
    ) -> tuple[Token, Checkpoint]:
        self.calls.append(("acquire", 1))
        return super().acquire_with_checkpoint(work_id, holder_id, ttl)


class WithoutBatches(CountingMemory):
    """A backend without the optional scan and batch methods (as a third-party one may be)."""

    find_available = None  # type: ignore[assignment]
    acquire_many = None  # type: ignore[assignment]
    watch_releases = None  # type: ignore[assignment]


def test_scan_takes_every_free_work_id_in_one_batch() -> None:
    """One scan statement for the unheld work IDs, one batched acquire of the free ones; held
    work IDs are never tried; a release elsewhere is picked up by a later scan."""
    backend = CountingMemory()
    rival = Lease(backend, holder_id="rival", ttl=TTL)
    held = [rival.acquire(f"w{i}") for i in range(5)]
    backend.calls.clear()
    ids = [f"w{i}" for i in range(50)]
    lease = Lease(backend, holder_id=HOLDER, ttl=TTL)
    scans = Scans()

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        spin_until_stopped(pool)
        return None

    pool = Pool(
        lease,
        ids,
        work,
        observer=scans,
        idle_interval=0.05,
        rerun_interval=LONG,
        fair_share=False,  # the plain scan: every free work ID, whoever else runs a pool
    )

    def all_mine() -> bool:
        return pool.active_slots() == frozenset(ids)

    def rival_steps_down() -> None:
        deadline = monotonic() + LIMIT
        while len(pool.active_slots()) < 45 and monotonic() < deadline:
            sleep(0.01)
        for token in held:
            rival.release(token, ExitMode.FINISHED)

    assert drive(pool, stop_when=all_mine, side=rival_steps_down) is None
    first = scans.scans[0][0]
    assert (first.candidates, len(first.acquired)) == (50, 45)
    assert backend.calls[:2] == [("find_available", 50), ("acquire_many", 45)]
    assert ("acquire", 1) not in backend.calls  # never one acquire per work ID
    # Later scans ask only about the work IDs not held here.
    assert all(n <= 5 for kind, n in backend.calls[2:] if kind == "find_available")
    assert sorted(w for event, _ in scans.scans for w in event.acquired) == sorted(ids)


@pytest.mark.parametrize("fair_share", [False, True], ids=["plain", "fair"])
def test_slots_that_failed_together_are_taken_back_in_batches(fair_share: bool) -> None:
    """Every work function fails at once (as when a stalled process loses all its leases):
    each slot backs off and hands its work ID back to the scan, which takes them again in
    batched acquires; no slot acquires on its own (thousands of slots doing so at once made
    a storm of single acquires, issue 24)."""
    backend = CountingMemory()
    lease = Lease(backend, holder_id=HOLDER, ttl=TTL)
    ids = [f"w{i:02d}" for i in range(30)]
    runs: dict[str, int] = {}
    slots = Slots()

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        runs[token.work_id] = runs.get(token.work_id, 0) + 1
        if runs[token.work_id] == 1:
            raise ValueError("the first run fails everywhere")
        raise Retire

    pool = Pool(
        lease,
        ids,
        work,
        observer=slots,
        idle_interval=0.05,
        backoff_interval=0.2,
        rerun_interval=LONG,
        fair_share=fair_share,
    )
    assert drive(pool) is None
    assert runs == dict.fromkeys(ids, 2)
    assert slots.kinds().count("backoff") == len(ids)
    # The one single acquire of a fair-share pool is its membership lease.
    assert backend.calls.count(("acquire", 1)) == (1 if fair_share else 0)
    granted = sum(n for kind, n in backend.calls if kind == "acquire_many")
    assert granted >= 2 * len(ids)
    assert sum(1 for kind, _ in backend.calls if kind == "acquire_many") < len(ids)


def test_grants_whose_slot_could_not_start_are_handed_back_and_taken_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Starting the fifth slot of a scan fails (as a thread that cannot start would): the
    grants after it are released at once instead of staying claimed without a slot, and a
    later scan takes them again, so the pool ends up holding every work ID."""
    from worklease._compat import spawn as real
    from worklease._sync import pool as pool_module

    calls = itertools.count(1)

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("name", "").startswith("worklease-pool:") and next(calls) == 5:
            raise RuntimeError("can't start new thread")
        return real(*args, **kwargs)

    monkeypatch.setattr(pool_module, real.__name__, flaky)
    backend = CountingMemory()
    lease = Lease(backend, holder_id=HOLDER, ttl=TTL)
    ids = [f"w{i}" for i in range(10)]

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        spin_until_stopped(pool)
        return None

    pool = Pool(lease, ids, work, idle_interval=0.05, backoff_interval=0.05, fair_share=False)

    def all_mine() -> bool:
        return pool.active_slots() == frozenset(ids)

    assert drive(pool, stop_when=all_mine) is None
    assert next(calls) > 11  # the failed start, then the others started again


def test_backend_without_batches_is_scanned_one_acquire_at_a_time() -> None:
    backend = WithoutBatches()
    rival = Lease(backend, holder_id="rival", ttl=TTL)
    rival.acquire("taken")
    backend.calls.clear()
    lease = Lease(backend, holder_id=HOLDER, ttl=TTL)
    scans = Scans()
    ids = ["a", "b", "taken"]

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        spin_until_stopped(pool)
        return None

    pool = Pool(lease, ids, work, observer=scans, idle_interval=0.05, rerun_interval=LONG)

    def enough() -> bool:
        return pool.active_slots() == {"a", "b"} and len(scans.scans) >= 3

    assert drive(pool, stop_when=enough) is None
    first = scans.scans[0][0]
    assert (first.candidates, sorted(first.acquired)) == (3, ["a", "b"])
    assert {kind for kind, _ in backend.calls} == {"acquire"}
    assert all(event.acquired == () for event, _ in scans.scans[1:])


@pytest.mark.parametrize("fair_share", [False, True], ids=["scan", "fair-share"])
def test_a_failed_scan_is_reported_and_retried_after_the_backoff(fair_share: bool) -> None:
    class FailingOnce(CountingMemory):
        failed = False

        def find_available(self, work_ids: Sequence[str]) -> list[str]:
            if not self.failed:
                self.failed = True
                raise ValueError("scan trouble")
            return super().find_available(work_ids)

        def survey(self, work_ids: Sequence[str], prefix: str) -> PoolSurvey:
            if not self.failed:
                self.failed = True
                raise ValueError("scan trouble")
            return super().survey(work_ids, prefix)

    backend = FailingOnce()
    lease = Lease(backend, holder_id=HOLDER, ttl=TTL)
    scans = Scans()

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        raise Retire

    pool = Pool(
        lease,
        ["job"],
        work,
        observer=scans,
        idle_interval=LONG,
        backoff_interval=0.2,
        fair_share=fair_share,
    )
    assert drive(pool) is None
    (failed, failed_at), (ok, ok_at) = scans.scans[:2]
    assert isinstance(failed.error, ValueError)
    assert ok.error is None
    assert ok.acquired == ("job",)
    assert ok_at - failed_at >= 0.2 - EARLY
    assert scans.kinds() == ["acquired", "retired"]


def spin_until_stopped(pool: Pool) -> None:
    for _ in range(round(LIMIT / 0.01)):
        if pool.stopping:
            return
        sleep(0.01)


def test_work_ids_acquired_by_a_scan_that_ends_after_stop_are_handed_back() -> None:
    """stop() while a scan is acquiring: its grants are released ABANDONED when run ends, not
    left to lapse."""

    class SlowGrant(CountingMemory):
        def __init__(self) -> None:
            super().__init__()
            self.entered = Event()
            self.gate = Event()

        def acquire_many(
            self, work_ids: Sequence[str], holder_id: str, ttl: float
        ) -> list[tuple[Token, Checkpoint]]:
            self.entered.set()
            assert self.gate.wait(LIMIT)
            return super().acquire_many(work_ids, holder_id, ttl)

    backend = SlowGrant()
    lease = Lease(backend, holder_id=HOLDER, ttl=TTL)
    slots = Slots()
    pool = Pool(lease, ["a", "b"], nothing, observer=slots, idle_interval=LONG)

    def open_gate_after_stop() -> None:
        while not pool.stopping:
            sleep(0.01)
        backend.gate.set()

    assert drive(pool, stop_when=backend.entered.is_set, side=open_gate_after_stop) is None
    assert slots.kinds() == []  # no work ran
    rows = {row.work_id: row for row in backend.rows()}
    assert sorted(rows) == ["a", "b"]
    assert all(row.exit_mode is ExitMode.ABANDONED for row in rows.values())
