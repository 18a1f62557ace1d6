"""The thread flavour of the pool and the leader: one thread per slot, stop() from another
thread, and running work that finishes before the pool returns."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

import worklease
from worklease import (
    Checkpoint,
    ExitMode,
    Leader,
    Lease,
    MemoryBackend,
    Pool,
    Token,
)
from worklease.observers import PoolObserver, ScanEvent, SlotBackoffEvent
from worklease.testing import RecordingObserver

TTL = 30.0
BOUND = 10.0
PROMPT = 3.0
LONG = 60.0


@pytest.fixture
def backend() -> Iterator[MemoryBackend]:
    with MemoryBackend() as backend:
        yield backend


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Background:
    """``pool.run()`` (or any call) in a thread, with its outcome."""

    def __init__(self, call: Callable[[], None]) -> None:
        self.error: BaseException | None = None
        self.returned = False
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:
            self.error = exc
        else:
            self.returned = True

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "still running"
        if self.error is not None:
            raise self.error


class Backoffs(PoolObserver):
    def __init__(self) -> None:
        self.work_ids: list[str] = []

        self.scans: list[ScanEvent] = []

    def on_slot_backoff(self, event: SlotBackoffEvent) -> None:
        self.work_ids.append(event.work_id)

    def on_scan(self, event: ScanEvent) -> None:
        self.scans.append(event)


def test_one_thread_per_slot(backend: MemoryBackend) -> None:
    """Each slot runs its work in its own thread named "worklease-pool:<id>"."""
    lease = Lease(backend, holder_id="pool-a", ttl=TTL)
    ids = ["alpha", "beta", "gamma"]
    threads: dict[str, tuple[str, int]] = {}
    barrier = threading.Barrier(len(ids), timeout=BOUND)

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        current = threading.current_thread()
        threads[token.work_id] = (current.name, current.ident or 0)
        barrier.wait()  # all slots run at the same time
        while not pool.stopping:
            time.sleep(0.01)
        return b"done"

    pool = Pool(lease, ids, work, rerun_interval=LONG)
    runner = Background(pool.run)
    until(lambda: pool.active_slots() == frozenset(ids), "every slot to run")
    pool.stop()
    runner.join(BOUND)
    assert runner.returned
    assert {work_id: name for work_id, (name, _) in threads.items()} == {
        work_id: "worklease-pool:" + work_id for work_id in ids
    }
    idents = {ident for _, ident in threads.values()}
    assert len(idents) == len(ids)
    assert threading.get_ident() not in idents
    assert runner.thread.ident not in idents


def test_stop_from_another_thread_wakes_waiting_slots(backend: MemoryBackend) -> None:
    """stop() from another thread ends slots waiting idle, rerun and backoff at once."""
    rival = Lease(backend, holder_id="rival", ttl=TTL)
    rival.acquire("held")
    recorder = RecordingObserver()
    lease = Lease(backend, holder_id="pool-a", ttl=TTL, observer=recorder)
    runs: dict[str, int] = {"held": 0, "reruns": 0, "fails": 0}

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        runs[token.work_id] += 1
        if token.work_id == "fails":
            raise ValueError("backing off")
        return None

    backoffs = Backoffs()
    pool = Pool(
        lease,
        ["held", "reruns", "fails"],
        work,
        observer=backoffs,
        idle_interval=LONG,
        rerun_interval=LONG,
        backoff_interval=LONG,
    )
    runner = Background(pool.run)
    until(
        lambda: (
            runs["reruns"] == 1
            and backoffs.work_ids == ["fails"]
            and any(e.candidates and "held" not in e.acquired for e in backoffs.scans)
            and not pool.active_slots()
        ),
        "every slot to wait",
    )
    time.sleep(0.1)
    stopper = threading.Thread(target=pool.stop, name="stopper")
    start = time.monotonic()
    stopper.start()
    runner.join(PROMPT + 1.0)
    assert time.monotonic() - start < PROMPT
    stopper.join(PROMPT)
    assert runner.returned
    assert runs == {"held": 0, "reruns": 1, "fails": 1}


def test_running_work_finishes_before_run_returns(backend: MemoryBackend) -> None:
    """stop(): a running work function is not interrupted (a thread cannot be); it may poll
    ``stopping`` (or ``raise_if_lost()``, which raises LeaseShedError); what it returns is
    written and the lease released ABANDONED before run() returns, as with asyncio."""
    lease = Lease(backend, holder_id="pool-a", ttl=TTL)
    finished: list[bool] = []

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        while not pool.stopping:
            time.sleep(0.01)
        time.sleep(0.2)  # still busy after stop()
        finished.append(True)
        return b"final"

    pool = Pool(lease, ["job"], work, rerun_interval=LONG)
    runner = Background(pool.run)
    until(lambda: pool.active_slots() == frozenset({"job"}), "the slot to run")
    pool.stop()
    assert pool.stopping
    runner.join(BOUND)
    assert finished == [True]
    assert pool.active_slots() == frozenset()
    ((work_id, exit_mode, state),) = [
        (r.work_id, r.exit_mode, r.checkpoint) for r in backend.rows()
    ]
    assert (work_id, exit_mode, state) == ("job", ExitMode.ABANDONED, b"final")


def test_leader_stop_from_another_thread(backend: MemoryBackend) -> None:
    """Leader.stop() from another thread: the term in progress finishes, run_forever returns
    without sitting out the backoff pause."""
    lease = Lease(backend, holder_id="leader-a", ttl=TTL)
    terms: list[str] = []
    leader = Leader(lease, "job", backoff_interval=LONG, idle_interval=LONG)

    def fn(token: Token) -> None:
        terms.append(threading.current_thread().name)
        while not leader.stopping:
            time.sleep(0.01)

    runner = Background(lambda: leader.run_forever(fn))
    until(lambda: bool(terms), "the term to start")
    start = time.monotonic()
    threading.Thread(target=leader.stop).start()
    runner.join(PROMPT + 1.0)
    assert time.monotonic() - start < PROMPT
    assert terms == [runner.thread.name]  # callbacks and fn run in the electing thread
    ((exit_mode,),) = [(r.exit_mode,) for r in backend.rows()]
    assert exit_mode is ExitMode.FINISHED


def test_a_slow_thread_does_not_hold_back_the_others_releases(backend: MemoryBackend) -> None:
    """stop(): two work functions stop at once (they look at raise_if_lost()), one keeps
    running for a while; the two are released ABANDONED right away, not when the slow one
    ends (their renewals stopped with their slots: waiting would let them lapse)."""
    lease = Lease(backend, holder_id="pool-a", ttl=TTL)
    release_slow = threading.Event()

    def work(token: Token, prior: Checkpoint) -> bytes | None:
        renewal = worklease.current_renewal()
        assert renewal is not None
        if token.work_id == "slow":
            release_slow.wait(BOUND)  # does not look at raise_if_lost()
            return b"slow done"
        while True:
            renewal.raise_if_lost()  # LeaseShedError once the pool stops
            time.sleep(0.01)

    pool = Pool(lease, ["quick-1", "quick-2", "slow"], work, rerun_interval=LONG)
    runner = Background(pool.run)
    until(lambda: len(pool.active_slots()) == 3, "all three running")
    pool.stop()

    def released(work_id: str) -> bool:
        rows = {r.work_id: r for r in backend.rows()}
        return rows[work_id].exit_mode is ExitMode.ABANDONED

    until(lambda: released("quick-1") and released("quick-2"), "the quick ones released")
    assert not released("slow")
    assert not runner.returned
    release_slow.set()
    runner.join(BOUND)
    assert runner.returned
    rows = {r.work_id: r for r in backend.rows()}
    assert (rows["slow"].exit_mode, rows["slow"].checkpoint) == (ExitMode.ABANDONED, b"slow done")
