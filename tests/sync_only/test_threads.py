"""Thread-only renewal behaviour: the renewal thread, loss flags, stuck calls, interpreter exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from tests._compat import spawn_all
from worklease import (
    ExitMode,
    FencedError,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    LeaseWindowExhaustedError,
    MemoryBackend,
    Token,
    current_renewal,
)
from worklease._sync import renewal as renewal_module
from worklease.testing import FakeClock

PROMPT = 5.0
"""Upper bound for 'promptly' on a loaded CI box."""


class GatedBackend(MemoryBackend):
    """Renewals pass through ``gate``: a test holds it to make a takeover atomic."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.gate = threading.Lock()
        self.renew_threads: list[threading.Thread] = []

    def renew(self, token: Token, ttl: float) -> None:
        self.renew_threads.append(threading.current_thread())
        with self.gate:
            super().renew(token, ttl)

    def renew_many(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        self.renew_threads.append(threading.current_thread())
        with self.gate:
            return super().renew_many(tokens, ttl)


class BlockingBackend(MemoryBackend):
    """Renewals block until ``unblock`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.blocked = threading.Event()
        self.unblock = threading.Event()
        self.returned = threading.Event()

    def renew(self, token: Token, ttl: float) -> None:
        self.blocked.set()
        self.unblock.wait()
        try:
            super().renew(token, ttl)
        finally:
            self.returned.set()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> GatedBackend:
    return GatedBackend(clock)


@pytest.fixture
def lease(backend: GatedBackend) -> Lease:
    return Lease(backend, holder_id="a", ttl=1.0)


@pytest.fixture
def rival(backend: GatedBackend) -> Lease:
    return Lease(backend, holder_id="b", ttl=1.0)


@pytest.fixture
def blocking() -> Iterator[BlockingBackend]:
    backend = BlockingBackend()
    yield backend
    backend.unblock.set()  # let any stuck renewal thread finish


def _wait_for(predicate: Callable[[], bool], timeout: float = PROMPT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


def _take_over(clock: FakeClock, backend: GatedBackend, rival: Lease, work_id: str) -> Token:
    """Let the lease lapse on the fake clock and acquire it for ``rival``, with no renewal
    slipping in between (that would report the lapse instead of the fencing)."""
    with backend.gate:
        clock.advance(5)
        return rival.acquire(work_id)


def test_renewals_share_one_named_daemon_thread(
    backend: GatedBackend, lease: Lease, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(renewal_module, "RENEWER_LINGER", 0.3)
    first = lease.acquire("w1")
    second = lease.acquire("w2")
    with lease.renewal(first, interval=0.02), lease.renewal(second, interval=0.02):
        assert _wait_for(lambda: len(backend.renew_threads) >= 4)
        assert len(set(backend.renew_threads)) == 1  # both renewals, one thread
    thread = backend.renew_threads[0]
    assert thread.name == "worklease-renewals"
    assert thread.daemon
    assert thread is not threading.current_thread()
    assert all(t is thread for t in backend.renew_threads)
    # A renewal started while the idle thread lingers reuses it: no thread per renewal.
    third = lease.acquire("w3")
    count = len(backend.renew_threads)
    with lease.renewal(third, interval=0.02):
        assert _wait_for(lambda: len(backend.renew_threads) > count)
    assert backend.renew_threads[-1] is thread
    thread.join(PROMPT)
    assert not thread.is_alive()  # with nothing left to renew, the thread ends


def test_raise_if_lost_after_a_takeover(
    clock: FakeClock, backend: GatedBackend, lease: Lease, rival: Lease
) -> None:
    token = lease.acquire("w1")
    renewal = lease.renewal(token, interval=0.02)

    def body() -> None:
        with renewal:
            renewal.raise_if_lost()  # held: nothing happens
            assert renewal.remaining() is not None
            _take_over(clock, backend, rival, "w1")
            assert _wait_for(lambda: renewal.lost)
            with pytest.raises(FencedError) as raised:
                renewal.raise_if_lost()
            assert raised.value is renewal.cause
            assert renewal.remaining() is None
            # the next write with the token raises the cause without touching the backend
            with pytest.raises(FencedError) as written:
                lease.checkpoint(token, b"late")
            assert written.value is renewal.cause

    with pytest.raises(FencedError) as left_with:
        body()
    # leaving the block raises the cause
    assert left_with.value is renewal.cause
    assert renewal.remaining() is None
    assert left_with.value.work_id == "w1"
    assert left_with.value.fencing_token == token.fencing_token


def test_body_exception_is_not_masked(
    clock: FakeClock, backend: GatedBackend, lease: Lease, rival: Lease
) -> None:
    token = lease.acquire("w1")
    renewal = lease.renewal(token, interval=0.02)

    def body() -> None:
        with renewal:
            _take_over(clock, backend, rival, "w1")
            assert _wait_for(lambda: renewal.lost)
            raise KeyError("own error")

    with pytest.raises(KeyError) as info:
        body()
    assert isinstance(renewal.cause, FencedError)
    assert info.value.__context__ is renewal.cause
    assert any("lost" in note for note in info.value.__notes__)


def test_remaining_none_after_stop(lease: Lease) -> None:
    token = lease.acquire("w1")
    with lease.renewal(token, interval=0.02) as renewal:
        left = renewal.remaining()
        assert left is not None
        assert 0 < left <= 1.0
        renewal.stop()
        assert renewal.remaining() is None
        assert renewal.cause is None
    assert renewal.remaining() is None
    assert not renewal.lost
    lease.release(token, ExitMode.FINISHED)


def test_stop_returns_at_once_while_a_renew_is_blocked(blocking: BlockingBackend) -> None:
    lease = Lease(blocking, holder_id="a", ttl=30.0)
    token = lease.acquire("w1")
    with lease.renewal(token, interval=0.02) as renewal:
        assert blocking.blocked.wait(PROMPT)
        started = time.monotonic()
        renewal.stop()
        renewal.stop()
        assert time.monotonic() - started < 0.5
        assert renewal.remaining() is None
    assert time.monotonic() - started < 0.5  # leaving the block does not wait either
    assert renewal.cause is None
    assert not blocking.returned.is_set()


def test_window_loss_is_reported_while_the_renew_call_is_stuck(
    blocking: BlockingBackend,
) -> None:
    ttl = 0.3
    lease = Lease(blocking, holder_id="a", ttl=ttl)
    started = time.monotonic()
    token = lease.acquire("w1")
    renewal = lease.renewal(token, interval=0.02)

    def body() -> None:
        with renewal:
            assert blocking.blocked.wait(PROMPT)
            assert _wait_for(lambda: renewal.lost, ttl + PROMPT)
            elapsed = time.monotonic() - started
            assert elapsed >= ttl * 0.9
            assert not blocking.returned.is_set()  # the call is still stuck
            assert type(renewal.cause) is LeaseWindowExhaustedError
            assert renewal.remaining() is None
            with pytest.raises(LeaseWindowExhaustedError):
                renewal.raise_if_lost()
            with pytest.raises(LeaseWindowExhaustedError):
                lease.renew(token)

    with pytest.raises(LeaseWindowExhaustedError) as info:
        body()
    assert info.value is renewal.cause
    # the stuck call returning late does not revive the renewal
    blocking.unblock.set()
    assert blocking.returned.wait(PROMPT)
    assert renewal.cause is info.value
    assert renewal.remaining() is None


def test_fifty_threads_one_winner() -> None:
    backend = MemoryBackend()
    leases = [Lease(backend, holder_id=f"h{i}", ttl=30.0) for i in range(50)]

    def attempt(index: int) -> Token:
        return leases[index].acquire("contested")

    results = spawn_all(attempt, 50)
    winners = [r for r in results if isinstance(r, Token)]
    losers = [r for r in results if isinstance(r, LeaseHeldError)]
    assert len(winners) == 1
    assert len(losers) == 49
    (winner,) = winners
    (row,) = backend.rows()
    assert (row.holder_id, row.fencing_token) == (winner.holder_id, winner.fencing_token)
    assert all(error.holder_id == winner.holder_id for error in losers)


def test_current_renewal_is_per_thread(lease: Lease) -> None:
    token = lease.acquire("w1")
    seen: list[object] = []
    with lease.renewal(token, interval=0.02) as renewal:
        assert current_renewal() is renewal
        thread = threading.Thread(target=lambda: seen.append(current_renewal()))
        thread.start()
        thread.join(PROMPT)
    assert seen == [None]
    assert current_renewal() is None


_EXIT_SCRIPT = textwrap.dedent(
    """
    import sys
    import threading

    from worklease import Lease, MemoryBackend

    blocked = threading.Event()

    class Stuck(MemoryBackend):
        def renew(self, token, ttl):
            blocked.set()
            threading.Event().wait()

    lease = Lease(Stuck(), holder_id="h", ttl=30.0)
    token = lease.acquire("w1")
    if sys.argv[1] == "inside":
        renewal = lease.renewal(token, interval=0.02)
        renewal.__enter__()
        assert blocked.wait(10)
        print("blocked", flush=True)
    else:
        with lease.renewal(token, interval=0.02):
            assert blocked.wait(10)
            print("blocked", flush=True)
            raise SystemExit(0)
    """
)


@pytest.mark.parametrize("how", ["inside", "system-exit"])
def test_interpreter_exit_does_not_hang(how: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, how],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "blocked" in result.stdout
