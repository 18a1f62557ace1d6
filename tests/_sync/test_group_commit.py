# Generated from tests/_async/test_group_commit.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Group commit: concurrent writes through one lease object share one statement per round.

A gate holds the first (lone) write in flight until every other caller has queued behind it;
the next round must then be one batch call carrying all of them, each caller getting its own
outcome. Runs on every backend kind (memory, PostgreSQL, PgBouncer, etcd).

The lease lets two rounds be in flight, and as many lone checkpoints as the backend has lanes
(``write_lanes``: the PostgreSQL pool's size); most tests here pin one of each (``one_round``,
``Gated.write_lanes``) so that a single gate decides who queues.
``test_the_lease_keeps_two_rounds_in_flight`` checks the default rounds,
``test_checkpoints_go_alone_while_the_backend_has_free_lanes`` the lanes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests._compat import sleep, spawn_all
from worklease import (
    Backend,
    BackendError,
    ExitMode,
    FencedError,
    Lease,
    LeaseExpiredError,
    LeaseLostError,
    Token,
)
from worklease._compat import Event
from worklease._sync import group as group_module
from worklease._sync.group import GroupCommit

PROMPT = 10.0
"""Upper bound for 'promptly' on a loaded CI box."""
CALLERS = 8
DEFAULT_ROUNDS = group_module._ROUNDS


@pytest.fixture(autouse=True)
def one_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leases made in these tests let one round be in flight (see the module docstring)."""
    monkeypatch.setattr(group_module, "_ROUNDS", 1)


class Gated:
    """Delegates to a backend, records the write calls, and can hold the next lone write
    (``gate``) until the test opens it. It says it runs one write at a time
    (``write_lanes``), so that a gate decides who queues whatever the backend's pool size."""

    write_lanes: int | None = 1

    def __init__(self, inner: Backend) -> None:
        self._inner = inner
        self.calls: list[tuple[str, Any]] = []
        self.gate: Event | None = None
        self.entered = Event()
        self.fail_many: BackendError | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _hold(self) -> None:
        gate, self.gate = self.gate, None
        if gate is not None:
            self.entered.set()
            assert gate.wait(PROMPT), "the test never opened the gate"

    def checkpoint(self, token: Token, state: Any, ttl: float) -> None:
        self.calls.append(("checkpoint", token.work_id))
        self._hold()
        self._inner.checkpoint(token, state, ttl)

    def checkpoint_many(
        self, items: Sequence[tuple[Token, Any]], ttl: float
    ) -> list[LeaseLostError | None]:
        self.calls.append(("checkpoint_many", [token.work_id for token, _ in items]))
        if self.fail_many is not None:
            raise self.fail_many
        inner: Any = self._inner
        result: list[LeaseLostError | None] = inner.checkpoint_many(items, ttl)
        return result

    def renew(self, token: Token, ttl: float) -> None:
        self.calls.append(("renew", token.work_id))
        self._hold()
        self._inner.renew(token, ttl)

    def renew_many(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        self.calls.append(("renew_many", [token.work_id for token in tokens]))
        inner: Any = self._inner
        result: list[LeaseLostError | None] = inner.renew_many(tokens, ttl)
        return result

    def release(self, token: Token, mode: ExitMode) -> None:
        self.calls.append(("release", token.work_id))
        self._hold()
        self._inner.release(token, mode)

    def release_many(self, tokens: Sequence[Token], mode: ExitMode) -> list[LeaseLostError | None]:
        self.calls.append(("release_many", [token.work_id for token in tokens]))
        inner: Any = self._inner
        result: list[LeaseLostError | None] = inner.release_many(tokens, mode)
        return result


def queued(lease: Lease, kind: str) -> list[str]:
    """The work IDs of the callers waiting behind the round in flight (private state, read
    only)."""
    group: Any = getattr(lease, f"_{kind}")
    return [entry.key for entry in list(group._queue)]


def rounds(gated: Gated) -> list[tuple[str, Any]]:
    """The recorded calls, a batch's work IDs sorted (threads queue in any order)."""
    return [(name, sorted(ids) if isinstance(ids, list) else ids) for name, ids in gated.calls]


def _until(predicate: Any) -> None:
    for _ in range(round(PROMPT / 0.005)):
        if predicate():
            return
        sleep(0.005)
    raise AssertionError("timed out waiting for the callers to queue")


def _behind_a_gate(gated: Gated, lease: Lease, kind: str, calls: list[Any]) -> list[object]:
    """Run ``calls[0]`` first (held at the gate), the rest once it is in flight, and open
    the gate when all of them queue behind it; each call's result or exception."""
    gate = Event()
    gated.entered = Event()
    gated.gate = gate

    def run(index: int) -> object:
        if index == len(calls):  # the opener
            assert gated.entered.wait(PROMPT)
            _until(lambda: len(queued(lease, kind)) == len(calls) - 1)
            gate.set()
            return None
        if index > 0:
            assert gated.entered.wait(PROMPT)
        return calls[index]()

    return (spawn_all(run, len(calls) + 1))[: len(calls)]


def test_the_lease_keeps_two_rounds_in_flight(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default two callers write alone at once (one round on the wire while the next
    gathers); the callers arriving while both are out share the next rounds."""
    monkeypatch.setattr(group_module, "_ROUNDS", DEFAULT_ROUNDS)
    assert DEFAULT_ROUNDS == 2
    held: list[str] = []
    both_held = Event()
    gate = Event()

    class TwoGates(Gated):
        def checkpoint(self, token: Token, state: Any, ttl: float) -> None:
            held.append(token.work_id)
            if len(held) == 2:
                both_held.set()
            if len(held) <= 2:
                assert gate.wait(PROMPT), "the test never opened the gate"
            super().checkpoint(token, state, ttl)

    gated = TwoGates(backend)
    lease = Lease(gated, holder_id="h", ttl=30.0)
    tokens = [lease.acquire(f"g{i}") for i in range(CALLERS)]

    def run(index: int) -> object:
        if index < 2:
            lease.checkpoint(tokens[index], f"state {index}".encode())
        elif index < CALLERS:
            assert both_held.wait(PROMPT)
            lease.checkpoint(tokens[index], f"state {index}".encode())
        else:  # the opener
            assert both_held.wait(PROMPT)
            _until(lambda: len(queued(lease, "checkpoints")) == CALLERS - 2)
            gate.set()
        return None

    results = spawn_all(run, CALLERS + 1)
    assert results == [None] * (CALLERS + 1)
    assert sorted(held[:2]) == ["g0", "g1"]  # both out at once, neither queued
    # The six queued behind them go in the next rounds: at most two (one per round ending),
    # one of them a batch, each work ID written once.
    later = [call for call in rounds(gated) if call[1] not in ("g0", "g1")]
    assert 1 <= len(later) <= 2
    assert any(name == "checkpoint_many" for name, _ in later)
    written = [w for _, ids in later for w in (ids if isinstance(ids, list) else [ids])]
    assert sorted(written) == [f"g{i}" for i in range(2, CALLERS)]
    for i, token in enumerate(tokens):
        assert (lease.read_checkpoint(token)).state == f"state {i}".encode()


def test_checkpoints_go_alone_while_the_backend_has_free_lanes(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With four lanes, four callers write alone at once (as four hand-written statements on
    four free connections would); the callers arriving while all four are out queue, and the
    queue goes in batch rounds, at most two of them in flight."""
    monkeypatch.setattr(group_module, "_ROUNDS", DEFAULT_ROUNDS)
    lanes = 4
    callers = 12
    held: list[str] = []
    all_held = Event()
    gate = Event()

    class FourLanes(Gated):
        write_lanes = lanes

        def checkpoint(self, token: Token, state: Any, ttl: float) -> None:
            held.append(token.work_id)
            if len(held) == lanes:
                all_held.set()
            if len(held) <= lanes:
                assert gate.wait(PROMPT), "the test never opened the gate"
            super().checkpoint(token, state, ttl)

    gated = FourLanes(backend)
    lease = Lease(gated, holder_id="h", ttl=30.0)
    tokens = [lease.acquire(f"g{i}") for i in range(callers)]

    def run(index: int) -> object:
        if index < lanes:
            lease.checkpoint(tokens[index], f"state {index}".encode())
        elif index < callers:
            assert all_held.wait(PROMPT)
            lease.checkpoint(tokens[index], f"state {index}".encode())
        else:  # the opener
            assert all_held.wait(PROMPT)
            _until(lambda: len(queued(lease, "checkpoints")) == callers - lanes)
            gate.set()
        return None

    results = spawn_all(run, callers + 1)
    assert results == [None] * (callers + 1)
    alone = [f"g{i}" for i in range(lanes)]
    assert sorted(held[:lanes]) == alone  # all four out at once, none queued
    later = [call for call in rounds(gated) if call[1] not in alone]
    # The eight queued go in the rounds led by the first two callers woken as lanes free (at
    # most two in flight): one or two calls, one of them a batch, each work ID written once.
    assert 1 <= len(later) <= 2
    assert any(name == "checkpoint_many" for name, _ in later)
    written = [w for _, ids in later for w in (ids if isinstance(ids, list) else [ids])]
    assert sorted(written) == sorted(f"g{i}" for i in range(lanes, callers))
    for i, token in enumerate(tokens):
        assert (lease.read_checkpoint(token)).state == f"state {i}".encode()


def test_a_lone_caller_writes_alone(backend: Backend) -> None:
    gated = Gated(backend)
    lease = Lease(gated, holder_id="h", ttl=30.0)
    token = lease.acquire("g0")
    for i in range(3):
        lease.checkpoint(token, f"state {i}".encode())
    lease.renew(token)
    lease.release(token, ExitMode.FINISHED)
    assert gated.calls == [
        ("checkpoint", "g0"),
        ("checkpoint", "g0"),
        ("checkpoint", "g0"),
        ("renew", "g0"),
        ("release", "g0"),
    ]


def test_concurrent_checkpoints_share_one_statement(backend: Backend) -> None:
    gated = Gated(backend)
    lease = Lease(gated, holder_id="h", ttl=30.0)
    tokens = [lease.acquire(f"g{i}") for i in range(CALLERS)]

    def write(i: int) -> Any:
        def call() -> None:
            lease.checkpoint(tokens[i], f"state {i}".encode())

        return call

    results = _behind_a_gate(gated, lease, "checkpoints", [write(i) for i in range(CALLERS)])
    assert results == [None] * CALLERS
    assert rounds(gated) == [
        ("checkpoint", "g0"),
        ("checkpoint_many", [f"g{i}" for i in range(1, CALLERS)]),
    ]
    for i, token in enumerate(tokens):
        assert (lease.read_checkpoint(token)).state == f"state {i}".encode()
        lease.release(token, ExitMode.FINISHED)


def test_each_caller_gets_its_own_outcome(backend: Backend) -> None:
    gated = Gated(backend)
    lease = Lease(gated, holder_id="h", ttl=30.0)
    tokens = [lease.acquire(f"g{i}") for i in range(CALLERS)]
    # Behind the lease's back: g2 released, g4 released and taken by another holder.
    backend.release(tokens[2], ExitMode.FINISHED)
    backend.release(tokens[4], ExitMode.FINISHED)
    successor = backend.acquire("g4", "other", 30.0)
    backend.checkpoint(successor, b"successor", 30.0)

    def write(i: int) -> Any:
        def call() -> None:
            lease.checkpoint(tokens[i], f"state {i}".encode())

        return call

    results = _behind_a_gate(gated, lease, "checkpoints", [write(i) for i in range(CALLERS)])
    assert isinstance(results[2], LeaseExpiredError)
    assert isinstance(results[4], FencedError)
    assert [r for i, r in enumerate(results) if i not in (2, 4)] == [None] * (CALLERS - 2)
    assert rounds(gated)[1] == ("checkpoint_many", [f"g{i}" for i in range(1, CALLERS)])
    assert (backend.read_checkpoint(successor)).state == b"successor"
    for i in (1, 3, 5, 6, 7):
        assert (lease.read_checkpoint(tokens[i])).state == f"state {i}".encode()


def test_writes_to_one_lease_never_share_a_round(backend: Backend) -> None:
    """Two queued checkpoints of one token go in successive rounds, in order."""
    gated = Gated(backend)
    lease = Lease(gated, holder_id="h", ttl=30.0)
    tokens = [lease.acquire(f"g{i}") for i in range(3)]

    def write(token: Token, state: bytes, step: int) -> Any:
        def call() -> None:
            if step == 2:  # queue behind the first write to the same lease
                _until(lambda: "g1" in queued(lease, "checkpoints"))
            lease.checkpoint(token, state)

        return call

    calls = [
        write(tokens[0], b"zero", 0),
        write(tokens[1], b"first", 1),
        write(tokens[1], b"second", 2),
        write(tokens[2], b"two", 3),
    ]
    assert _behind_a_gate(gated, lease, "checkpoints", calls) == [None] * 4
    assert gated.calls[0] == ("checkpoint", "g0")
    assert gated.calls[1][0] == "checkpoint_many"
    assert sorted(gated.calls[1][1]) == ["g1", "g2"]
    assert gated.calls[2] == ("checkpoint", "g1")
    assert (lease.read_checkpoint(tokens[1])).state == b"second"


def test_a_failed_round_fails_each_caller(backend: Backend) -> None:
    gated = Gated(backend)
    gated.fail_many = BackendError("boom", transient=True)
    lease = Lease(gated, holder_id="h", ttl=30.0)
    tokens = [lease.acquire(f"g{i}") for i in range(4)]

    def write(i: int) -> Any:
        def call() -> None:
            lease.checkpoint(tokens[i], b"state")

        return call

    results = _behind_a_gate(gated, lease, "checkpoints", [write(i) for i in range(4)])
    assert results[0] is None
    errors = results[1:]
    for error in errors:
        assert isinstance(error, BackendError)
        assert error.transient
        assert error.__cause__ is gated.fail_many
    assert len({id(error) for error in errors}) == len(errors)  # one exception per caller
    for token in tokens[1:]:
        assert (lease.read_checkpoint(token)).state is None


@pytest.mark.parametrize("kind", ["renews", "releases"])
def test_concurrent_renewals_and_releases_share_one_statement(backend: Backend, kind: str) -> None:
    gated = Gated(backend)
    lease = Lease(gated, holder_id="h", ttl=30.0)
    tokens = [lease.acquire(f"g{i}") for i in range(CALLERS)]
    backend.release(tokens[3], ExitMode.FINISHED)  # behind the lease's back

    def call_for(i: int) -> Any:
        def call() -> None:
            if kind == "renews":
                lease.renew(tokens[i])
            else:
                lease.release(tokens[i], ExitMode.FINISHED)

        return call

    results = _behind_a_gate(gated, lease, kind, [call_for(i) for i in range(CALLERS)])
    assert isinstance(results[3], LeaseExpiredError)
    assert [r for i, r in enumerate(results) if i != 3] == [None] * (CALLERS - 1)
    single = "renew" if kind == "renews" else "release"
    assert rounds(gated) == [
        (single, "g0"),
        (f"{single}_many", [f"g{i}" for i in range(1, CALLERS)]),
    ]
    if kind == "releases":
        for i in range(CALLERS):
            if i != 3:  # released FINISHED: a successor sees it
                successor = backend.acquire(f"g{i}", "next", 30.0)
                assert (backend.read_checkpoint(successor)).prev_exit is ExitMode.FINISHED


def test_more_rounds_in_flight_keep_work_ids_apart() -> None:
    """With two rounds allowed in flight, two lone callers write at once; a third caller
    to a work ID already in flight waits for that round, then writes alone."""
    in_one: list[str] = []
    entered = Event()
    gate = Event()
    rounds: list[list[str]] = []

    def one(key: str) -> None:
        in_one.append(key)
        if len(in_one) == 2:
            entered.set()
        assert gate.wait(PROMPT)

    def many(keys: list[str]) -> list[BaseException | None]:
        rounds.append(keys)
        return [None] * len(keys)

    group: GroupCommit[str] = GroupCommit(one, many, operation="test", rounds=2)

    def run(index: int) -> object:
        if index < 2:
            group.submit(f"k{index}", f"k{index}", None)
        elif index == 2:  # the same work ID as a round in flight: queued
            assert entered.wait(PROMPT)
            group.submit("k0-again", "k0", None)
        else:
            assert entered.wait(PROMPT)
            _until(lambda: [e.key for e in group._queue] == ["k0"])
            gate.set()
        return sorted(in_one)

    results = spawn_all(run, 4)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sorted(in_one) == ["k0", "k0-again", "k1"]
    assert in_one[2] == "k0-again"  # after both rounds began, alone
    assert rounds == []


def test_a_round_is_bounded_by_the_latest_deadline_among_its_callers() -> None:
    """A caller near the end of its window does not cut the others' round short, and a
    caller without a deadline does not lift theirs."""
    from worklease._deadline import seconds_left
    from worklease._window import monotonic

    entered = Event()
    gate = Event()
    seen: list[float | None] = []

    def one(key: str) -> None:
        entered.set()
        assert gate.wait(PROMPT)

    def many(keys: list[str]) -> list[BaseException | None]:
        seen.append(seconds_left())
        return [None] * len(keys)

    group: GroupCommit[str] = GroupCommit(one, many, operation="test", rounds=1)
    now = monotonic()
    deadlines = {"soon": now + 5.0, "later": now + 50.0, "none": None}

    def run(index: int) -> None:
        if index == 0:
            group.submit("lone", "lone", None)
        elif index <= 3:
            assert entered.wait(PROMPT)
            key = list(deadlines)[index - 1]
            group.submit(key, key, deadlines[key])
        else:
            assert entered.wait(PROMPT)
            _until(lambda: len(group._queue) == 3)
            gate.set()

    results = spawn_all(run, 5)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len(seen) == 1
    left = seen[0]
    assert left is not None
    assert 40.0 < left <= 50.0  # the latest deadline, not the soonest, and not none


def test_a_queued_caller_stops_waiting_at_its_deadline() -> None:
    """A caller queued behind a round that outlasts its deadline gets a transient error at
    the deadline (a thread cannot be cancelled); taken out of the queue, it is never
    written, and the callers queued after it still are."""
    from worklease._window import monotonic

    entered = Event()
    gate = Event()
    written: list[str] = []

    def one(key: str) -> None:
        if key == "lone":
            entered.set()
            assert gate.wait(PROMPT)
        written.append(key)

    def many(keys: list[str]) -> list[BaseException | None]:
        written.extend(keys)
        return [None] * len(keys)

    group: GroupCommit[str] = GroupCommit(one, many, operation="test", rounds=1)

    def run(index: int) -> float | None:
        if index == 0:
            group.submit("lone", "lone", None)
            return None
        assert entered.wait(PROMPT)
        if index == 1:
            start = monotonic()
            with pytest.raises(BackendError, match=r"deadline passed.*never sent") as caught:
                group.submit("late", "late", start + 0.2)
            assert caught.value.transient
            waited = monotonic() - start
            gate.set()  # only now: the round it queued behind is still out
            return waited
        _until(lambda: "late" in [entry.key for entry in group._queue])
        group.submit("patient", "patient", None)
        return None

    results = spawn_all(run, 3)
    assert not [r for r in results if isinstance(r, BaseException)], results
    waited = results[1]
    assert isinstance(waited, float)
    assert 0.2 <= waited < PROMPT
    assert "late" not in written
    assert sorted(written) == ["lone", "patient"]
    assert group._queue == []


def test_a_caller_with_a_cut_off_leads_alone() -> None:
    """A caller that must hand control back by a moment (a thread's final writes) never
    carries others' writes in its round: woken to lead, it writes its own alone and passes
    the lead on, and the others go together in the next round."""
    from worklease._deadline import cutting_off_at
    from worklease._window import monotonic

    entered = Event()
    gate = Event()
    calls: list[list[str]] = []

    def one(key: str) -> None:
        if key == "lone":
            entered.set()
            assert gate.wait(PROMPT)
        calls.append([key])

    def many(keys: list[str]) -> list[BaseException | None]:
        calls.append(sorted(keys))
        return [None] * len(keys)

    group: GroupCommit[str] = GroupCommit(one, many, operation="test", rounds=1)

    def run(index: int) -> None:
        if index == 0:
            group.submit("lone", "lone", None)
        elif index == 1:  # queues first, so it is woken to lead
            assert entered.wait(PROMPT)
            with cutting_off_at(monotonic() + PROMPT):
                group.submit("final", "final", None)
        elif index <= 3:
            assert entered.wait(PROMPT)
            _until(lambda: [entry.key for entry in group._queue][:1] == ["final"])
            group.submit(f"other{index}", f"other{index}", None)
        else:
            assert entered.wait(PROMPT)
            _until(lambda: len(group._queue) == 3)
            gate.set()

    results = spawn_all(run, 5)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert calls == [["lone"], ["final"], ["other2", "other3"]]
