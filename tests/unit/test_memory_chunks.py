"""The memory store's batches and whole-store scans hold its lock a chunk at a time.

Nothing here measures time. The store's row dict is replaced by one that records, for every
hold of the lock, how many rows the hold touched (and fails any access without the lock);
that proves the bound at 100,000 leases. Outcomes are compared, on stores built by the same
random script, between chunks of 3 (every batch split many times), chunks larger than any
batch (one hold, as before), and the single operations run one after another.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worklease import ExitMode, LeaseExpiredError, LeaseHeldError, LeaseLostError, Token, _memory
from worklease._fairshare import member_prefix, member_work_id
from worklease._memory import MemoryStore, RowSnapshot
from worklease.testing import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = 3600.0
HUGE = 10**9


# -- instrumentation --------------------------------------------------------------------------


@dataclasses.dataclass
class Hold:
    rows: set[str] = dataclasses.field(default_factory=set)
    """The work IDs whose rows were looked up, stored or deleted during the hold."""
    scanned: int = 0
    """Work IDs read by iterating over the whole dict during the hold."""

    @property
    def touched(self) -> int:
        return len(self.rows)


class RecordingLock:
    """Stands in for the store's lock: counts outermost holds, and runs ``on_acquire(n)`` /
    ``on_release(n)`` at the start / end of the n-th one (n from 1)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.depth = 0
        self.holds: list[Hold] = []
        self.on_acquire: Callable[[int], object] | None = None
        self.on_release: Callable[[int], object] | None = None

    @property
    def waiting(self) -> int:
        return int(self._inner.waiting)

    def __enter__(self) -> None:
        self._inner.__enter__()
        self.depth += 1
        if self.depth == 1:
            self.holds.append(Hold())
            if self.on_acquire is not None:
                self.on_acquire(len(self.holds))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.depth -= 1
        outermost = self.depth == 0
        self._inner.__exit__(exc_type, exc, tb)
        if outermost and self.on_release is not None:
            self.on_release(len(self.holds))

    def touch(self, work_id: str) -> None:
        assert self.depth > 0, "a row was read or written without the store's lock"
        self.holds[-1].rows.add(work_id)


class RecordingRows(dict[str, Any]):
    """The store's row dict, telling the lock about every access."""

    lock: RecordingLock

    def get(self, key: str, default: Any = None) -> Any:
        self.lock.touch(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.lock.touch(key)
        return super().__getitem__(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.lock.touch(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.lock.touch(key)
        super().__delitem__(key)

    def __contains__(self, key: object) -> bool:
        self.lock.touch(str(key))
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        assert self.lock.depth > 0, "the rows were scanned without the store's lock"
        self.lock.holds[-1].scanned += len(self)
        return super().__iter__()

    def items(self) -> Any:
        raise AssertionError("a whole-store pass over the items would be one long hold")

    def values(self) -> Any:
        raise AssertionError("a whole-store pass over the values would be one long hold")


def instrument(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> RecordingLock:
    lock = RecordingLock(store._lock)
    rows = RecordingRows(store._rows)
    rows.lock = lock
    monkeypatch.setattr(store, "_lock", lock)
    monkeypatch.setattr(store, "_rows", rows)
    return lock


# -- the bound at 100,000 leases --------------------------------------------------------------

LEASES = 100_000
HOLDERS = ("a", "b", "c", "d")
GROUP = "g"


@dataclasses.dataclass
class Full:
    store: MemoryStore
    clock: FakeClock
    work_ids: list[str]
    tokens: list[Token]


def full_store() -> Full:
    clock = FakeClock(T0)
    store = MemoryStore(clock.now)
    work_ids = [f"work-{index:06d}" for index in range(LEASES)]
    share = LEASES // len(HOLDERS)
    tokens: list[Token] = []
    for number, holder in enumerate(HOLDERS):
        batch = work_ids[number * share : (number + 1) * share]
        tokens += [token for token, _ in store.acquire_many(batch, holder, HOUR)]
    for holder in HOLDERS:
        store.acquire(member_work_id(GROUP, holder), holder, HOUR)
    return Full(store, clock, work_ids, tokens)


def _retire_all(full: Full) -> None:
    full.store.release_many(full.tokens, ExitMode.RETIRED)
    full.clock.advance(HOUR)


def _free_all(full: Full) -> None:
    full.store.release_many(full.tokens, ExitMode.FINISHED)


OPERATIONS: dict[str, tuple[Callable[[Full], None] | None, Callable[[Full], object]]] = {
    "survey": (None, lambda f: f.store.survey(f.work_ids, member_prefix(GROUP))),
    "survey, another prefix": (None, lambda f: f.store.survey(f.work_ids, "work-0")),
    "find_available": (None, lambda f: f.store.find_available(f.work_ids)),
    "renew_many": (None, lambda f: f.store.renew_many(f.tokens, HOUR)),
    "checkpoint_many": (
        None,
        lambda f: f.store.checkpoint_many([(token, b"state") for token in f.tokens], HOUR),
    ),
    "release_many": (None, lambda f: f.store.release_many(f.tokens, ExitMode.FINISHED)),
    "acquire_many": (_free_all, lambda f: f.store.acquire_many(f.work_ids, "taker", HOUR)),
    "sweep": (_retire_all, lambda f: f.store.sweep(0.0, False)),
    "rows": (None, lambda f: f.store.rows()),
}


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_no_hold_handles_more_than_a_chunk_at_100000_leases(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = full_store()
    setup, operation = OPERATIONS[name]
    if setup is not None:
        setup(full)
    lock = instrument(full.store, monkeypatch)

    operation(full)

    chunk = _memory.CHUNK_SIZE
    members = len(HOLDERS)
    assert len(lock.holds) >= LEASES // chunk  # it was split, not one hold
    for hold in lock.holds:
        if hold.scanned:
            # the one copy of the work IDs a scan starts with touches no row
            assert hold.touched == 0
        else:
            # a survey's last chunk also reads the group's members
            assert hold.touched <= chunk + (members if name.startswith("survey") else 0)
    assert sum(hold.scanned > 0 for hold in lock.holds) <= 1


def test_chunk_size_keeps_holds_small() -> None:
    """A few hundred items per hold: a grant costs a few microseconds, so about a
    millisecond per hold (benchmarks/bench_memory_lock.py measures it)."""
    assert 100 <= _memory.CHUNK_SIZE <= 1000


# -- chunked outcomes equal the single operations' --------------------------------------------

IDS = [*(f"w{index}" for index in range(8)), *(member_work_id(GROUP, h) for h in "AB")]
NAMES = ("A", "B", "C")
MODES = (ExitMode.FINISHED, ExitMode.RETIRED, ExitMode.ABANDONED)

# a script step: (kind, index of a work ID or a token, holder index, ttl or seconds)
steps = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "release", "renew", "checkpoint", "forget", "advance"]),
        st.integers(0, len(IDS) - 1),
        st.integers(0, len(NAMES) - 1),
        st.sampled_from([-1.0, 0.0, 1.0, 5.0, 30.0]),
    ),
    max_size=40,
)


@dataclasses.dataclass
class World:
    store: MemoryStore
    clock: FakeClock
    released: list[str]
    tokens: list[Token]


def build(script: list[tuple[str, int, int, float]]) -> World:
    """A store after ``script`` (errors of single operations are part of the script)."""
    clock = FakeClock(T0)
    released: list[str] = []
    store = MemoryStore(clock.now, on_release=released.append)
    tokens: list[Token] = []
    for kind, index, holder, value in script:
        try:
            if kind == "acquire":
                tokens.append(store.acquire(IDS[index], NAMES[holder], value))
            elif kind == "advance":
                clock.advance(abs(value))
            elif tokens:
                token = tokens[index % len(tokens)]
                if kind == "release":
                    store.release(token, MODES[holder])
                elif kind == "renew":
                    store.renew(token, value)
                elif kind == "checkpoint":
                    store.checkpoint(token, f"{index}".encode(), value)
                else:
                    store.forget(token)
        except (LeaseHeldError, LeaseLostError):
            pass
    # stale, foreign and never-granted tokens too
    tokens += [dataclasses.replace(t, fencing_token=t.fencing_token + 100) for t in tokens[:3]]
    tokens += [dataclasses.replace(t, holder_id="intruder") for t in tokens[:3]]
    tokens.append(Token("w7", "A", 999, T0))
    return World(store, clock, released, tokens)


def outcome(value: object) -> object:
    """Exceptions compared by type, message and attributes (they have no equality)."""
    if isinstance(value, BaseException):
        return (type(value), str(value), sorted(vars(value).items()))
    if isinstance(value, list):
        return [outcome(item) for item in value]
    return value


def state(world: World) -> tuple[list[RowSnapshot], int, list[str]]:
    return world.store.rows(), world.store._last_token, world.released


def one_by_one(world: World, operation: str, pick: list[int], number: int) -> object:
    """What the batch must equal: its single operations, in input order."""
    store = world.store
    if operation == "acquire_many":
        grants = []
        for work_id in [IDS[i] for i in pick]:
            try:
                grants.append(store.acquire_with_checkpoint(work_id, NAMES[number], 5.0))
            except LeaseHeldError:
                continue
        return grants
    results: list[object] = []
    for token in distinct_tokens(world, pick):
        try:
            if operation == "renew_many":
                store.renew(token, 5.0)
            elif operation == "checkpoint_many":
                store.checkpoint(token, f"s{token.fencing_token}".encode(), 5.0)
            else:
                store.release(token, MODES[number])
        except LeaseLostError as exc:
            results.append(exc)
        else:
            results.append(None)
    return results


def batch(world: World, operation: str, pick: list[int], number: int) -> object:
    store = world.store
    if operation == "acquire_many":
        return store.acquire_many([IDS[i] for i in pick], NAMES[number], 5.0)
    tokens = distinct_tokens(world, pick)
    if operation == "renew_many":
        return store.renew_many(tokens, 5.0)
    if operation == "checkpoint_many":
        return store.checkpoint_many(
            [(token, f"s{token.fencing_token}".encode()) for token in tokens], 5.0
        )
    return store.release_many(tokens, MODES[number])


def distinct_tokens(world: World, pick: list[int]) -> list[Token]:
    """Tokens of ``world`` chosen by ``pick``, at most one per work ID (a batch's rule)."""
    chosen: dict[str, Token] = {}
    for index in pick:
        if world.tokens:
            token = world.tokens[index % len(world.tokens)]
            chosen.setdefault(token.work_id, token)
    return list(chosen.values())


picks = st.lists(st.integers(0, len(IDS) - 1), unique=True, max_size=len(IDS))
fuzz = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fuzz
@given(
    script=steps,
    operation=st.sampled_from(["acquire_many", "renew_many", "checkpoint_many", "release_many"]),
    pick=picks,
    number=st.integers(0, 2),
)
def test_a_chunked_batch_equals_its_single_operations(
    script: list[tuple[str, int, int, float]], operation: str, pick: list[int], number: int
) -> None:
    expected_world = build(script)
    expected = one_by_one(expected_world, operation, pick, number)
    for size in (1, 3, HUGE):
        world = build(script)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_memory, "CHUNK_SIZE", size)
            result = batch(world, operation, pick, number)
        assert outcome(result) == outcome(expected), size
        assert state(world) == state(expected_world), size


@fuzz
@given(
    script=steps,
    pick=picks,
    prefix=st.sampled_from([member_prefix(GROUP), "w", "w1", "", "worklease.", "nothing"]),
    retention=st.sampled_from([0.0, 1.0, 10.0]),
    include_expired=st.booleans(),
)
def test_chunked_reads_and_sweeps_equal_one_hold(
    script: list[tuple[str, int, int, float]],
    pick: list[int],
    prefix: str,
    retention: float,
    include_expired: bool,
) -> None:
    ids = [IDS[i] for i in pick]
    results = []
    for size in (1, 3, HUGE):
        world = build(script)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_memory, "CHUNK_SIZE", size)
            store = world.store
            results.append(
                (
                    store.survey(ids, prefix),
                    store.find_available(ids),
                    store.rows(),
                    store.sweep(retention, include_expired),
                    state(world),
                )
            )
    assert results[0] == results[2]
    assert results[1] == results[2]

    # and one hold agrees with the rows themselves (as the store before chunks computed it)
    world = build(script)
    now = world.clock.now()
    rows = {row.work_id: row for row in world.store.rows()}
    survey, available, snapshot, swept, _ = results[2]
    free = [w for w in ids if w not in rows or now > rows[w].expires_at]
    assert list(survey.free) == free == available
    held: dict[str, int] = {}
    for work_id in ids:
        if work_id not in free:
            held[rows[work_id].holder_id] = held.get(rows[work_id].holder_id, 0) + 1
    assert dict(survey.held) == held
    stored = [rows[work_id] for work_id in world.store._rows]  # a later row of a holder wins
    assert dict(survey.members) == {
        row.holder_id: row.checkpoint
        for row in stored
        if row.work_id.startswith(prefix) and now <= row.expires_at
    }
    assert snapshot == sorted(rows.values(), key=lambda row: row.work_id)
    keep_for = timedelta(seconds=retention)
    assert swept == sum(
        now > row.expires_at
        and now - row.updated_at > keep_for
        and (row.exit_mode is ExitMode.RETIRED or (include_expired and row.exit_mode is None))
        for row in rows.values()
    )


def test_members_index_follows_forget_and_sweep() -> None:
    clock = FakeClock(T0)
    store = MemoryStore(clock.now)
    prefix = member_prefix(GROUP)
    a = store.acquire(member_work_id(GROUP, "A"), "A", HOUR)
    b = store.acquire(member_work_id(GROUP, "B"), "B", HOUR)
    store.checkpoint(b, b"cap", HOUR)
    assert dict(store.survey([], prefix).members) == {"A": None, "B": b"cap"}
    store.forget(a)
    assert dict(store.survey([], prefix).members) == {"B": b"cap"}
    store.release(b, ExitMode.RETIRED)
    assert dict(store.survey([], prefix).members) == {}
    clock.advance(10)
    assert store.sweep(1.0, False) == 1
    assert store.rows() == []
    again = store.acquire(member_work_id(GROUP, "B"), "B2", HOUR)
    assert dict(store.survey([], prefix).members) == {"B2": None}
    assert again.fencing_token == 3


# -- other threads get in between chunks ------------------------------------------------------


def test_an_operation_from_another_thread_runs_between_two_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A release done from another thread after the first chunk is what the later chunks
    see: the renewal of that token fails as a single renew after the release would."""
    monkeypatch.setattr(_memory, "CHUNK_SIZE", 3)
    clock = FakeClock(T0)
    store = MemoryStore(clock.now)
    tokens = [store.acquire(f"w{index}", "A", HOUR) for index in range(9)]
    lock = instrument(store, monkeypatch)
    finished = threading.Event()

    def after_first(hold: int) -> None:
        if hold != 1:
            return
        helper = threading.Thread(target=store.release, args=(tokens[5], ExitMode.FINISHED))
        helper.start()
        helper.join(timeout=30)  # generous: only a lock still held would make it wait
        if not helper.is_alive():
            finished.set()

    lock.on_release = after_first
    outcomes = store.renew_many(tokens, HOUR)

    assert finished.is_set(), "the other thread could not get the lock between chunks"
    assert [type(item) for item in outcomes] == [type(None)] * 5 + [LeaseExpiredError] + [
        type(None)
    ] * 3
    assert len(lock.holds) == 4  # chunk 1, the helper's release, chunks 2 and 3


def test_a_thread_blocked_on_the_lock_goes_before_the_next_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPython's locks are not fair: a batch would retake the lock before a woken waiter runs.
    A thread blocked on the lock while a chunk runs gets it before the next chunk."""
    monkeypatch.setattr(_memory, "CHUNK_SIZE", 3)
    monkeypatch.setattr(_memory, "STEP_ASIDE", 60.0)  # so the order cannot depend on timing
    clock = FakeClock(T0)
    store = MemoryStore(clock.now)
    tokens = [store.acquire(f"w{index}", "A", HOUR) for index in range(9)]
    lock = instrument(store, monkeypatch)
    helper = threading.Thread(target=store.release, args=(tokens[4], ExitMode.FINISHED))
    blocked = threading.Event()

    def during_first(hold: int) -> None:
        if hold != 1:
            return
        helper.start()  # it blocks on the lock this thread holds
        for _ in range(60_000):
            if lock.waiting:
                blocked.set()
                return
            time.sleep(0.001)

    lock.on_acquire = during_first
    outcomes = store.renew_many(tokens, HOUR)
    helper.join(timeout=30)

    assert blocked.is_set()
    assert not helper.is_alive()
    assert isinstance(outcomes[4], LeaseExpiredError)
    assert outcomes[:4] == [None] * 4
    assert outcomes[5:] == [None] * 4
    assert lock.waiting == 0


def test_between_chunks_a_batch_gives_way_while_threads_wait_for_the_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step aside itself, with the waiting threads and the sleeps stood in for."""
    monkeypatch.setattr(_memory, "CHUNK_SIZE", 3)
    store = MemoryStore(FakeClock(T0).now)
    tokens = [store.acquire(f"w{index}", "A", HOUR) for index in range(7)]
    lock = instrument(store, monkeypatch)
    events: list[str] = []
    lock.on_acquire = lambda hold: events.append("hold")

    def sleep(seconds: float) -> None:
        events.append("sleep")
        store._lock._inner.waiting -= 1  # type: ignore[attr-defined]  # one waiter got in

    monkeypatch.setattr(_memory, "sleep", sleep)
    store._lock._inner.waiting = 2  # type: ignore[attr-defined]  # two threads blocked on it

    assert store.renew_many(tokens, HOUR) == [None] * 7

    assert events == ["hold", "sleep", "sleep", "hold", "hold"]


def test_a_batch_gives_way_for_step_aside_seconds_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_memory, "CHUNK_SIZE", 3)
    store = MemoryStore(FakeClock(T0).now)
    tokens = [store.acquire(f"w{index}", "A", HOUR) for index in range(7)]
    lock = instrument(store, monkeypatch)
    events: list[str] = []
    lock.on_acquire = lambda hold: events.append("hold")
    ticks = iter(range(1_000_000))
    monkeypatch.setattr(_memory, "monotonic", lambda: next(ticks) * 0.001)  # 1 ms per look
    monkeypatch.setattr(_memory, "sleep", lambda seconds: events.append("sleep"))
    store._lock._inner.waiting = 1  # type: ignore[attr-defined]  # a waiter that never comes

    assert store.renew_many(tokens, HOUR) == [None] * 7

    # 1 ms per look at the clock: the deadline is two looks on, so one sleep per gap
    assert events == ["hold", "sleep", "hold", "sleep", "hold"]
