# Generated from tests/_async/test_renewal_batch.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Batched renewal: every renewal of one lease object is renewed in one backend call."""

from __future__ import annotations

from collections.abc import Sequence

from tests._compat import sleep, spawn_all
from worklease import (
    ExitMode,
    FencedError,
    Lease,
    LeaseLapsedError,
    LeaseLostError,
    MemoryBackend,
    Token,
)
from worklease._compat import Event
from worklease.observers import FencedEvent, RenewEvent
from worklease.testing import RecordingObserver

from .helpers import spin

PROMPT = 10.0
"""Upper bound for 'promptly' on a loaded CI box."""


class CountingBackend(MemoryBackend):
    """Records every renewal call: ``renew`` one token, ``renew_many`` a batch."""

    def __init__(self) -> None:
        super().__init__()
        self.single: list[str] = []
        self.batches: list[list[str]] = []

    def renew(self, token: Token, ttl: float) -> None:
        self.single.append(token.work_id)
        super().renew(token, ttl)

    def renew_many(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        self.batches.append([token.work_id for token in tokens])
        return super().renew_many(tokens, ttl)


class SingleOnlyBackend(CountingBackend):
    """A backend without the optional batch renewal (as a third-party backend may be)."""

    renew_many = None  # type: ignore[assignment]


def _wait_until(predicate: object, timeout: float = PROMPT) -> bool:
    assert callable(predicate)
    for _ in range(round(timeout / 0.01)):
        if predicate():
            return True
        sleep(0.01)
    return bool(predicate())


def test_many_renewals_share_one_call_per_interval() -> None:
    backend = CountingBackend()
    lease = Lease(backend, holder_id="a", ttl=30.0)
    ids = [f"w{i}" for i in range(50)]
    tokens = [lease.acquire(work_id) for work_id in ids]
    done = Event()
    entered: list[int] = []

    def hold(index: int) -> None:
        with lease.renewal(tokens[index], interval=0.05) as renewal:
            entered.append(index)
            while not done.is_set():
                renewal.raise_if_lost()
                sleep(0.01)

    def watch(index: int) -> None:
        if index < len(ids):
            hold(index)
            return
        try:
            assert _wait_until(lambda: len(entered) == len(ids))
            backend.batches.clear()  # count from when every renewal runs
            assert _wait_until(lambda: len(backend.batches) >= 6)
        finally:
            done.set()

    results = spawn_all(watch, len(ids) + 1)
    assert [r for r in results if r is not None] == []
    assert backend.single == []  # never one statement per token
    # Renewals started at different times fall into step within two rounds of the last
    # one starting; from then on every call renews all fifty.
    assert all(sorted(batch) == sorted(ids) for batch in backend.batches[2:])
    before = [row.expires_at for row in backend.rows()]
    assert min(before) > tokens[0].expires_at  # every lease was extended


def test_each_token_of_a_batch_keeps_its_own_outcome() -> None:
    backend = CountingBackend()
    observer = RecordingObserver()
    lease = Lease(backend, holder_id="a", ttl=30.0, observer=observer)
    kept, fenced, lapsed = [lease.acquire(w) for w in ("kept", "fenced", "lapsed")]
    entered = Event()
    done = Event()
    outcome: dict[str, object] = {}

    def hold(index: int) -> None:
        token = (kept, fenced, lapsed, None)[index]
        if token is None:  # the saboteur: works on the rows behind the lease's back
            try:
                assert _wait_until(lambda: any(len(b) == 3 for b in backend.batches))
                backend.forget(fenced)  # row gone: the renewal is fenced
                backend.release(lapsed, ExitMode.ABANDONED)  # no longer renewable
                assert _wait_until(lambda: {"fenced", "lapsed"} <= set(outcome))
                sleep(0.2)  # a few more rounds for the survivor
            finally:
                done.set()
            return
        try:
            with lease.renewal(token, interval=0.05) as renewal:
                entered.set()
                while not done.is_set():
                    spin(renewal, seconds=0.05)
            outcome[token.work_id] = "held"
        except LeaseLostError as exc:
            outcome[token.work_id] = exc

    results = spawn_all(hold, 4)
    assert [r for r in results if r is not None] == []
    assert entered.is_set()
    assert outcome["kept"] == "held"
    assert isinstance(outcome["fenced"], FencedError)
    assert isinstance(outcome["lapsed"], LeaseLapsedError)
    assert any(len(batch) == 3 for batch in backend.batches)
    # Events stay per token: the fencing is reported for the fenced token only.
    fenced_events = [event.token.work_id for event in observer.of_type(FencedEvent)]
    assert fenced_events == ["fenced"]
    renewed = {e.token.work_id for e in observer.of_type(RenewEvent) if e.error is None}
    assert renewed == {"kept", "fenced", "lapsed"}  # the first round renewed all three
    # The survivor went on being renewed after the other two were lost.
    last = [batch for batch in backend.batches if batch][-1]
    assert last == ["kept"] or backend.single[-1:] == ["kept"]


def test_backend_without_renew_many_renews_token_by_token() -> None:
    backend = SingleOnlyBackend()
    lease = Lease(backend, holder_id="a", ttl=30.0)
    tokens = [lease.acquire(w) for w in ("w1", "w2", "w3")]
    done = Event()

    def hold(index: int) -> None:
        if index == len(tokens):
            try:
                assert _wait_until(lambda: len(backend.single) >= 9)
            finally:
                done.set()
            return
        with lease.renewal(tokens[index], interval=0.05) as renewal:
            while not done.is_set():
                spin(renewal, seconds=0.05)

    results = spawn_all(hold, len(tokens) + 1)
    assert [r for r in results if r is not None] == []
    assert backend.batches == []
    assert set(backend.single) == {"w1", "w2", "w3"}


def test_two_renewals_of_one_token_are_not_sent_in_one_call() -> None:
    backend = CountingBackend()
    lease = Lease(backend, holder_id="a", ttl=30.0)
    token = lease.acquire("w1")
    other = lease.acquire("w2")
    with (
        lease.renewal(token, interval=0.05) as first,
        lease.renewal(token, interval=0.05) as second,
        lease.renewal(other, interval=0.05) as third,
    ):
        assert _wait_until(lambda: len(backend.batches) + len(backend.single) >= 6)
        for renewal in (first, second, third):
            renewal.raise_if_lost()
    assert all(len(batch) == len(set(batch)) for batch in backend.batches)
    assert "w1" in backend.single or any(batch.count("w1") for batch in backend.batches)


def test_renewals_one_after_another_are_each_renewed() -> None:
    """Sequential renewals on one lease object (a runner's cycles): whether the renewal worker
    is reused or replaced between them, each renewal gets renewed."""
    backend = CountingBackend()
    lease = Lease(backend, holder_id="a", ttl=30.0)
    for index in range(3):
        token = lease.acquire(f"w{index}")
        with lease.renewal(token, interval=0.02):
            assert _wait_until(lambda w=token.work_id: w in backend.single)
        lease.release(token, ExitMode.FINISHED)
    assert backend.single[-1] == "w2"
    assert all(row.exit_mode is ExitMode.FINISHED for row in backend.rows())


def test_a_renewal_entered_after_its_release_never_renews() -> None:
    """Released between ``lease.renewal(token)`` and entering it (another thread or task):
    the renewal stops at once instead of renewing, or reporting the loss of, a lease the
    holder gave up."""
    backend = CountingBackend()
    lease = Lease(backend, holder_id="a", ttl=30.0)
    token = lease.acquire("w1")
    renewal = lease.renewal(token, interval=0.01)
    lease.release(token, ExitMode.FINISHED)
    with renewal:
        sleep(0.1)
        assert renewal.remaining() is None
    assert renewal.cause is None
    assert backend.single == []
    assert backend.batches == []
