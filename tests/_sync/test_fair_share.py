# Generated from tests/_async/test_fair_share.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Fair-share pools: members of one group spread its work IDs evenly, rebalance when a member
joins or is lost, and hand work over with its checkpoint (issue 12).

Every member here is a pool with its own lease (its own holder ID) over one backend, in one
process, so a shared trail sees every work function of every member: who is running which
work ID right now (two at once would be a double holder), what each acquisition read, and
the last checkpoint each holder had acknowledged. Work functions checkpoint
``"<holder>:<n>"`` every few milliseconds and call ``raise_if_lost()`` between steps, as a
thread must to be shed cleanly (with asyncio the pool cancels them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

import pytest

from tests._compat import sleep, spawn_all
from worklease import (
    Backend,
    BackendError,
    BalanceEvent,
    Checkpoint,
    ExitMode,
    Lease,
    Pool,
    PoolObserver,
    SlotShedEvent,
    Token,
    current_renewal,
)
from worklease._compat import Event, ThreadLock

_IS_SYNC = True

IDS = [f"fair-{i:02d}" for i in range(12)]
TTL = 3.0
"""Seconds: long enough that no renewal misses it on a loaded 2-core machine."""
STEP = 0.03
"""Seconds between two checkpoints of a work function."""
LIMIT = 20.0
"""Upper bound for any convergence (generous: a loaded CI box)."""


@dataclass
class Acquisition:
    work_id: str
    holder: str
    prior: Checkpoint
    at: float


@dataclass
class Trail:
    """What the work functions of every member did (thread-safe)."""

    lock: ThreadLock = field(default_factory=ThreadLock)
    running: dict[str, str] = field(default_factory=dict)
    overlaps: list[tuple[str, str, str]] = field(default_factory=list)
    acquisitions: list[Acquisition] = field(default_factory=list)
    acked: dict[tuple[str, str], int] = field(default_factory=dict)
    """(work ID, holder) -> the last checkpoint number the holder saw acknowledged."""

    def work(self, holder: str, lease: Lease) -> Callable[[Token, Checkpoint], Any]:
        def work(token: Token, prior: Checkpoint) -> bytes | None:
            work_id = token.work_id
            with self.lock:
                other = self.running.get(work_id)
                if other is not None:
                    self.overlaps.append((work_id, other, holder))
                self.running[work_id] = holder
                self.acquisitions.append(Acquisition(work_id, holder, prior, monotonic()))
            try:
                renewal = current_renewal()
                assert renewal is not None
                n = 0
                while True:
                    renewal.raise_if_lost()
                    n += 1
                    lease.checkpoint(token, f"{holder}:{n}".encode())
                    with self.lock:
                        self.acked[(work_id, holder)] = n
                    sleep(STEP)
            finally:
                with self.lock:
                    if self.running.get(work_id) == holder:
                        del self.running[work_id]

        return work

    def moves(self, since: float) -> list[Acquisition]:
        """Acquisitions after ``since`` that took a work ID over from another member."""
        with self.lock:
            return [
                a
                for a in self.acquisitions
                if a.at >= since and a.prior.prev_holder_id not in (None, a.holder)
            ]

    def checkpointed(self, members: list[Member]) -> Callable[[], bool]:
        """Whether every work ID the members' pools are running has a checkpoint acknowledged
        to its current holder (so a successor has one to read, whatever the machine's load)."""

        def check() -> bool:
            held = [(w, member.holder) for member in members for w in member.pool.active_slots()]
            with self.lock:
                return all(self.acked.get(pair, 0) >= 1 for pair in held)

        return check

    def check_carried_over(self, moves: list[Acquisition]) -> None:
        """Each move read the previous holder's last acknowledged checkpoint, or a later one
        (a write in flight when it stopped), never an older one."""
        for move in moves:
            previous = move.prior.prev_holder_id
            assert previous is not None
            with self.lock:
                acked = self.acked.get((move.work_id, previous), 0)
            state = move.prior.state
            assert state is not None, (move, acked)
            holder, _, number = state.decode().partition(":")
            assert holder == previous, (move, acked)
            assert int(number) >= acked, (move, acked)


class Counting(PoolObserver):
    def __init__(self) -> None:
        self.balances: list[BalanceEvent] = []
        self.shed: list[str] = []

    def on_balance(self, event: BalanceEvent) -> None:
        self.balances.append(event)

    def on_slot_shed(self, event: SlotShedEvent) -> None:
        self.shed.append(event.work_id)


class Partitionable:
    """A backend cut off from the store on demand (a crashed or partitioned member): every
    call then fails as a lost connection would, and nothing it holds is released."""

    def __init__(self, inner: Backend) -> None:
        self._inner = inner
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if name == "watch_releases" or not callable(target):
            return target

        def call(*args: Any) -> Any:
            if self.cut:
                raise BackendError("connection lost (injected)", transient=True)
            return target(*args)

        return call


@dataclass
class Member:
    holder: str
    lease: Lease
    pool: Pool
    observer: Counting
    gate: Event = field(default_factory=Event)
    backend: Partitionable | None = None

    def held(self) -> int:
        return len(self.pool.active_slots())


class Group:
    """Several members of one pool group; each starts when its gate opens."""

    def __init__(self, backend: Backend, trail: Trail, count: int, **options: Any) -> None:
        self.members: list[Member] = []
        for index in range(count):
            holder = f"member-{index}"
            wrapped = Partitionable(backend)
            lease = Lease(wrapped, holder_id=holder, ttl=TTL)
            observer = Counting()
            pool = Pool(
                lease,
                IDS,
                trail.work(holder, lease),
                observer=observer,
                idle_interval=0.05,
                rerun_interval=0.05,
                backoff_interval=0.1,
                **options.get(holder, {}),
            )
            self.members.append(Member(holder, lease, pool, observer, backend=wrapped))

    def counts(self, members: list[Member] | None = None) -> list[int]:
        return sorted(member.held() for member in (members or self.members))

    def until(self, what: str, check: Callable[[], bool]) -> None:
        deadline = monotonic() + LIMIT
        while not check():
            if monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {self.counts()}")
            sleep(0.02)

    def run(self, script: Callable[[Group], Any]) -> None:
        """Run every member (each once its gate opens) and ``script``; stop them all when the
        script ends."""
        members = self.members

        def one(index: int) -> None:
            if index == len(members):
                try:
                    script(self)
                finally:
                    for member in members:
                        member.gate.set()
                        member.pool.stop()
                return
            member = members[index]
            member.gate.wait()
            if not member.pool.stopping:
                member.pool.run()

        for result in spawn_all(one, len(members) + 1):
            if isinstance(result, BaseException):
                raise result


def balanced(group: Group, members: list[Member], shares: list[int]) -> Callable[[], bool]:
    return lambda: group.counts(members) == shares


def test_members_converge_to_their_fair_share(backend: Backend) -> None:
    """Three members started together over 12 work IDs end up with 4 each, every work ID
    held once, no double holder; their balance events agree on 3 members."""
    trail = Trail()
    group = Group(backend, trail, 3)

    def script(group: Group) -> None:
        for member in group.members:
            member.gate.set()
        group.until("4 / 4 / 4", balanced(group, group.members, [4, 4, 4]))
        with trail.lock:
            assert sorted(trail.running) == IDS

        def agreed() -> bool:  # a member may hold its 4 a scan before it recounts the group
            last = {(e.members, e.target) for m in group.members for e in m.observer.balances[-1:]}
            return last == {(3, 4)} and all(m.observer.balances for m in group.members)

        group.until("balance events agreeing on 3 members", agreed)
        assert group.counts() == [4, 4, 4]

    group.run(script)
    assert trail.overlaps == []


def test_a_joining_member_gets_its_share_by_handover(backend: Backend) -> None:
    """Two members hold 6 / 6; a third joins: 4 / 4 / 4. Every move is a handover: the
    previous holder stopped its work and released ABANDONED, and the newcomer read its last
    acknowledged checkpoint (never an older one). No work ID ever ran on two members at once,
    and the newcomer never took more than its share."""
    trail = Trail()
    group = Group(backend, trail, 3)
    first, second, newcomer = group.members

    def script(group: Group) -> None:
        first.gate.set()
        second.gate.set()
        group.until("6 / 6", balanced(group, [first, second], [6, 6]))
        group.until("a checkpoint on each", trail.checkpointed([first, second]))
        shed_before = len(first.observer.shed) + len(second.observer.shed)
        joined = monotonic()
        newcomer.gate.set()
        group.until("4 / 4 / 4", balanced(group, group.members, [4, 4, 4]))
        moves = trail.moves(joined)
        assert {move.holder for move in moves} == {newcomer.holder}
        assert all(move.prior.prev_exit is ExitMode.ABANDONED for move in moves)
        trail.check_carried_over(moves)
        shed = len(first.observer.shed) + len(second.observer.shed) - shed_before
        assert shed == len(moves) == 4  # exactly the newcomer's share moved, by handover
        assert max(event.held for event in newcomer.observer.balances) <= 4

    group.run(script)
    assert trail.overlaps == []


def test_a_lost_member_is_replaced_after_its_ttl(backend: Backend) -> None:
    """Three members hold 4 / 4 / 4; one is cut off from the store (a crash: it releases
    nothing): once its leases lapse the two others hold 6 / 6, each successor reading
    EXPIRED and the lost member's last checkpoint (or a later one)."""
    trail = Trail()
    group = Group(backend, trail, 3)
    lost = group.members[2]
    survivors = group.members[:2]

    def script(group: Group) -> None:
        for member in group.members:
            member.gate.set()
        group.until("4 / 4 / 4", balanced(group, group.members, [4, 4, 4]))
        group.until("a checkpoint on each", trail.checkpointed([lost]))
        assert lost.backend is not None
        lost.backend.cut = True
        cut_at = monotonic()
        group.until("6 / 6", balanced(group, survivors, [6, 6]))
        moves = [m for m in trail.moves(cut_at) if m.prior.prev_holder_id == lost.holder]
        assert len(moves) == 4
        assert all(move.prior.prev_exit is ExitMode.EXPIRED for move in moves)
        assert all(move.at - cut_at >= TTL * 0.5 for move in moves)  # not before it lapsed
        trail.check_carried_over(moves)

    group.run(script)
    assert trail.overlaps == []


def test_max_work_ids_caps_a_member_and_reports_uncovered(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """One member capped at 2 leaves the rest to the other; both capped at 3 leave 6 of the
    12 uncovered, which both report (balance event and a warning)."""
    caplog.set_level(logging.WARNING, logger="worklease")
    trail = Trail()
    group = Group(
        backend,
        trail,
        2,
        **{"member-0": {"max_work_ids": 3}, "member-1": {"max_work_ids": 3}},
    )

    def script(group: Group) -> None:
        for member in group.members:
            member.gate.set()
        group.until("3 / 3", balanced(group, group.members, [3, 3]))
        sleep(0.3)  # a few more scans: nobody takes more
        assert group.counts() == [3, 3]
        # each reports it once a scan of its own has seen the other's 3
        group.until(
            "6 uncovered in every report",
            lambda: all(m.observer.balances[-1].uncovered == 6 for m in group.members),
        )
        assert group.counts() == [3, 3]

    group.run(script)
    assert any("6 work ID(s) uncovered" in r.getMessage() for r in caplog.records)


def test_one_capped_member_leaves_the_rest_to_the_other(backend: Backend) -> None:
    trail = Trail()
    group = Group(backend, trail, 2, **{"member-0": {"max_work_ids": 2}})

    def script(group: Group) -> None:
        for member in group.members:
            member.gate.set()
        capped, other = group.members
        group.until("2 / 10", lambda: (capped.held(), other.held()) == (2, 10))
        group.until("none uncovered", lambda: other.observer.balances[-1].uncovered == 0)
        assert (capped.held(), other.held()) == (2, 10)

    group.run(script)


def test_pools_of_different_groups_do_not_count_each_other(backend: Backend) -> None:
    """Two pools over the same work IDs but in different groups each see one member (and
    share by racing, like pools without fair share)."""
    trail = Trail()
    group = Group(backend, trail, 2, **{"member-1": {"group": "another"}})

    def script(group: Group) -> None:
        for member in group.members:
            member.gate.set()
        group.until("all held", lambda: sum(group.counts()) == len(IDS))
        sleep(0.2)
        for member in group.members:
            assert member.observer.balances[-1].members == 1

    group.run(script)
    assert trail.overlaps == []


def test_a_stopping_pool_releases_everything_in_a_few_statements(
    backend: Backend,
) -> None:
    """A pool holding every work ID stops: its holds release through one batch (a few
    statements for all 12, not one each), every work ID ABANDONED with its checkpoint."""
    calls: list[str] = []

    class Counted(Partitionable):
        def __getattr__(self, name: str) -> Any:
            if name in ("release", "release_many"):
                calls.append(name)
            return super().__getattr__(name)

    trail = Trail()
    group = Group(backend, trail, 1)
    member = group.members[0]
    counted = Counted(backend)
    member.lease = Lease(counted, holder_id="stopper", ttl=TTL)
    member.pool = Pool(member.lease, IDS, trail.work("stopper", member.lease))

    def script(group: Group) -> None:
        member.gate.set()
        group.until("all held", lambda: member.held() == len(IDS))
        # Each work ID's first checkpoint acknowledged: the release must keep it.
        group.until("all checkpointed", lambda: all(trail.acked.get((w, "stopper")) for w in IDS))
        calls.clear()

    group.run(script)
    assert calls.count("release_many") >= 1
    # Cancelled tasks all get there in the same turn of the loop; threads notice the stop at
    # their own pace (between two checkpoints), so their releases come in a few bursts.
    assert len(calls) <= (len(IDS) // 2 if _IS_SYNC else 3), calls
    reader = Lease(backend, holder_id="reader", ttl=TTL)
    for work_id in IDS:
        token = reader.acquire(work_id)
        prior = reader.read_checkpoint(token)
        assert prior.prev_exit is ExitMode.ABANDONED
        assert prior.state is not None
        assert prior.state.startswith(b"stopper:")


class Recording(Partitionable):
    """Records how many work IDs each survey asked about (0: a look at the members only)."""

    def __init__(self, inner: Backend, surveys: list[int]) -> None:
        super().__init__(inner)
        self._surveys = surveys

    def __getattr__(self, name: str) -> Any:
        call = super().__getattr__(name)
        if name != "survey":
            return call

        def survey(work_ids: Any, prefix: str) -> Any:
            self._surveys.append(len(work_ids))
            return call(work_ids, prefix)

        return survey


def test_a_settled_group_looks_only_at_its_members(backend: Backend) -> None:
    """Once two members hold 6 / 6, their scans read only the members (no survey of the
    work IDs: the background cost no longer grows with them); a third member joining makes
    them survey again, rebalance to 4 / 4 / 4, and settle again (issue 24)."""
    trail = Trail()
    group = Group(backend, trail, 3)
    surveys: dict[str, list[int]] = {member.holder: [] for member in group.members}
    for member in group.members:
        member.backend = Recording(backend, surveys[member.holder])
        member.lease = Lease(member.backend, holder_id=member.holder, ttl=TTL)
        member.pool = Pool(
            member.lease,
            IDS,
            trail.work(member.holder, member.lease),
            observer=member.observer,
            idle_interval=0.05,
            rerun_interval=0.05,
            backoff_interval=0.1,
        )
    first, second, newcomer = group.members

    def quiet_scans(members: list[Member]) -> None:
        """Wait until each of ``members`` made 5 scans in a row that read only the members."""

        def settled() -> bool:
            return all(surveys[m.holder][-5:] == [0] * 5 for m in members)

        group.until("quiet scans", settled)

    def script(group: Group) -> None:
        first.gate.set()
        second.gate.set()
        group.until("6 / 6", balanced(group, [first, second], [6, 6]))
        quiet_scans([first, second])
        mark = {m.holder: len(surveys[m.holder]) for m in (first, second)}
        sleep(0.5)  # about ten scans each: none of them a full survey
        for member in (first, second):
            assert set(surveys[member.holder][mark[member.holder] :]) == {0}
        newcomer.gate.set()
        group.until("4 / 4 / 4", balanced(group, group.members, [4, 4, 4]))
        for member in (first, second):  # the join made them survey the work IDs again
            assert len(IDS) in surveys[member.holder][mark[member.holder] :]
        quiet_scans(group.members)

    group.run(script)
    assert trail.overlaps == []


def test_a_stopping_pool_hands_back_everything_however_slow_the_releases(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Releasing what a stopping pool holds takes longer than its cleanup_timeout (each
    release costs 50 ms per work ID here): it goes on chunk by chunk, each committed, until
    everything is released (bounded by the TTL, not by cleanup_timeout), instead of giving
    up on the whole batch at the timeout (issue 24)."""
    monkeypatch.setattr("worklease._batching.BATCH_CHUNK", 2)
    slow = {"on": False}

    class SlowReleases(Partitionable):
        def __getattr__(self, name: str) -> Any:
            call = super().__getattr__(name)
            if name not in ("release", "release_many"):
                return call

            def release(tokens: Any, mode: Any) -> Any:
                if slow["on"]:
                    count = len(tokens) if isinstance(tokens, list | tuple) else 1
                    sleep(0.05 * count)
                return call(tokens, mode)

            return release

    trail = Trail()
    wrapped = SlowReleases(backend)
    lease = Lease(wrapped, holder_id="stopper", ttl=10.0)
    pool = Pool(lease, IDS, trail.work("stopper", lease), idle_interval=0.05, cleanup_timeout=0.2)
    group = Group(backend, trail, 1)
    member = group.members[0]
    member.lease, member.pool = lease, pool

    def script(group: Group) -> None:
        member.gate.set()
        group.until("all held", lambda: member.held() == len(IDS))
        group.until(
            "a checkpoint on each", lambda: all(trail.acked.get((w, "stopper")) for w in IDS)
        )
        slow["on"] = True

    group.run(script)
    reader = Lease(backend, holder_id="reader", ttl=TTL)
    for work_id in IDS:
        token = reader.acquire(work_id)  # held by nobody: released, not lapsing
        prior = reader.read_checkpoint(token)
        assert prior.prev_exit is ExitMode.ABANDONED, work_id
        assert prior.state is not None
        assert prior.state.startswith(b"stopper:")
