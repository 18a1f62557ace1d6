"""The leader (behaviour.md §7.2, v1.0 target): one election attempt, and standing forever.

Most cases run on both backends (memory and PostgreSQL) in real time with short intervals;
injected backend failures use the scripted memory backend. Fencing is produced for real: the
term's row is deleted behind the leader's back (``forget``) and a rival takes the work ID.
Outside cancellation exists only in the asyncio flavour (``tests/async_only``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from time import monotonic
from typing import Any

import pytest

from tests._acompat import asleep, aspawn_all
from worklease import (
    AsyncBackend,
    AsyncLeader,
    AsyncLease,
    AsyncMemoryBackend,
    Backoff,
    Checkpoint,
    ConfigError,
    ExitMode,
    FencedError,
    LeaseHeldError,
    LeaseRequiredError,
    LeaseWindowExhaustedError,
    Retire,
    Token,
    WorkFnRequiredError,
    current_renewal,
)
from worklease.observers import AcquireEvent, ReleaseEvent
from worklease.testing import RecordingObserver

from .helpers import ScriptedBackend, settle_listener, spin, transient

HOLDER = "leader-a"
JOB = "leader-job"
TTL = 5.0
EARLY = 0.02
"""Timers may fire a hair early; waits are asserted to last at least their length minus this."""
SLACK = 1.5
"""Extra time a loaded 2-core CI box may add on top of a wait."""
PROMPT = 3.0
"""Upper bound for anything that should happen 'at once'."""
LIMIT = 15.0
"""Watchdog: a run_forever still running after this long is stopped and the test fails."""
LONG = 30.0
"""An interval no test may sit out: seeing a return well before it proves it was skipped."""
FAST = Backoff(0.001, 0.005, 0.0)


@pytest.fixture
def observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture
def lease(backend: AsyncBackend, observer: RecordingObserver) -> AsyncLease:
    return AsyncLease(backend, holder_id=HOLDER, ttl=TTL, observer=observer)


@pytest.fixture
def rival(backend: AsyncBackend) -> AsyncLease:
    return AsyncLease(backend, holder_id="rival", ttl=TTL)


async def successor_reads(rival: AsyncLease) -> Checkpoint:
    """What the next leader reads: a fail-fast acquire (so the row must be free) and a read."""
    token = await rival.acquire(JOB)
    return await rival.read_checkpoint(token)


class Log:
    """Leader callbacks (plain functions: fine in both flavours) recording calls and times."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, Token, float]] = []

    def elected(self, token: Token) -> None:
        self.entries.append(("elected", token, monotonic()))

    def lost(self, token: Token) -> None:
        self.entries.append(("lost", token, monotonic()))

    def relinquished(self, token: Token) -> None:
        self.entries.append(("relinquished", token, monotonic()))

    def names(self) -> list[str]:
        return [name for name, _, _ in self.entries]

    def time_of(self, name: str) -> float:
        (moment,) = [t for n, _, t in self.entries if n == name]
        return moment

    def tokens(self) -> list[Token]:
        return [token for _, token, _ in self.entries]


def leader_for(lease: AsyncLease, log: Log, **options: Any) -> AsyncLeader:
    return AsyncLeader(
        lease,
        JOB,
        on_elected=log.elected,
        on_lost=log.lost,
        on_relinquished=log.relinquished,
        **options,
    )


def releases(observer: RecordingObserver) -> list[ExitMode]:
    return [event.mode for event in observer.of_type(ReleaseEvent)]


async def eventually(condition: Callable[[], bool], seconds: float = LIMIT) -> None:
    """Wait (polling) until ``condition()`` holds; fail after ``seconds``."""
    deadline = monotonic() + seconds
    while not condition():
        assert monotonic() < deadline, "condition not reached in time"
        await asleep(0.01)


def held_attempts(observer: RecordingObserver) -> int:
    return sum(isinstance(e.error, LeaseHeldError) for e in observer.of_type(AcquireEvent))


async def together(*steps: Callable[[], Any]) -> None:
    """Run the steps concurrently; re-raise the first exception any of them raised."""

    async def one(index: int) -> None:
        await steps[index]()

    for result in await aspawn_all(one, len(steps)):
        if isinstance(result, BaseException):
            raise result


async def run_forever_bounded(
    leader: AsyncLeader, fn: Callable[[Token], Any], *others: Callable[[], Any]
) -> None:
    """``leader.run_forever(fn)`` next to ``others``, with a watchdog that stops the leader
    after LIMIT seconds (and then fails the test)."""
    done: list[bool] = []
    fired: list[bool] = []

    async def forever() -> None:
        try:
            await leader.run_forever(fn)
        finally:
            done.append(True)

    async def watchdog() -> None:
        deadline = monotonic() + LIMIT
        while not done and monotonic() < deadline:
            await asleep(0.02)
        if not done:
            fired.append(True)
            leader.stop()

    await together(forever, watchdog, *others)
    assert not fired, "run_forever did not end by itself; the watchdog stopped it"


# -- one election: failing to get elected -----------------------------------------------------


async def test_held_waits_idle_then_raises(lease: AsyncLease, rival: AsyncLease) -> None:
    """Somebody else leads: wait idle_interval (+ ≤ 20 %), raise LeaseHeldError, no callback."""
    await rival.acquire(JOB)
    await settle_listener(lease.backend)
    log = Log()
    called: list[Token] = []
    leader = leader_for(lease, log, idle_interval=0.2, backoff_interval=LONG)
    start = monotonic()
    with pytest.raises(LeaseHeldError) as caught:
        await leader.run(called.append)
    elapsed = monotonic() - start
    assert 0.2 - EARLY <= elapsed <= 0.2 * 1.2 + SLACK
    assert caught.value.holder_id == "rival"
    assert called == []
    assert log.entries == []


async def test_acquire_wait_blocks_until_free(
    lease: AsyncLease, rival: AsyncLease, observer: RecordingObserver
) -> None:
    """acquire_wait: run polls every poll_interval until the rival steps down, then leads."""
    rival_token = await rival.acquire(JOB)
    log = Log()
    leader = leader_for(
        lease, log, acquire_wait=True, poll_interval=0.05, idle_interval=LONG, backoff_interval=0.01
    )
    priors: list[Checkpoint] = []

    async def fn(token: Token) -> None:
        priors.append(await lease.read_checkpoint(token))

    released: list[float] = []

    async def rival_steps_down() -> None:
        await eventually(lambda: held_attempts(observer) >= 2)
        # Taken before the release: with threads the leader can be elected (woken by the
        # release notification) before this thread returns from release().
        released.append(monotonic())
        await rival.release(rival_token, ExitMode.ABANDONED)

    async def lead() -> None:
        await leader.run(fn)

    await together(lead, rival_steps_down)
    assert priors == [Checkpoint(None, ExitMode.ABANDONED, "rival")]
    assert log.names() == ["elected", "relinquished"]
    assert 0 <= log.time_of("elected") - released[0] < PROMPT
    held = [e for e in observer.of_type(AcquireEvent) if e.error is not None]
    assert len(held) >= 2
    assert all(isinstance(e.error, LeaseHeldError) for e in held)


async def test_acquire_error_waits_backoff_then_raises() -> None:
    """Another acquire error: wait backoff_interval, then raise it unchanged; no callback."""
    backend = ScriptedBackend()
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=TTL)
    boom = transient("database unreachable (injected)")
    backend.fail("acquire", boom)
    log = Log()
    called: list[Token] = []
    leader = leader_for(lease, log, idle_interval=LONG, backoff_interval=0.2)
    start = monotonic()
    with pytest.raises(type(boom)) as caught:
        await leader.run(called.append)
    elapsed = monotonic() - start
    assert caught.value is boom
    assert 0.2 - EARLY <= elapsed <= 0.2 + SLACK
    assert called == []
    assert log.entries == []
    assert backend.names() == ["acquire"]


# -- one election: terms ----------------------------------------------------------------------


async def test_clean_term(
    lease: AsyncLease, rival: AsyncLease, observer: RecordingObserver
) -> None:
    """on_elected before fn; fn gets the token; FINISHED, on_relinquished, then the backoff
    pause; run returns None."""
    log = Log()
    seen: list[tuple[Token, list[str]]] = []

    async def fn(token: Token) -> None:
        seen.append((token, log.names()))
        renewal = current_renewal()
        assert renewal is not None
        assert renewal.token == token

    leader = leader_for(lease, log, backoff_interval=0.3, idle_interval=LONG)
    assert leader.work_id == JOB
    await leader.run(fn)
    returned = monotonic()
    ((token, names_at_entry),) = seen
    assert names_at_entry == ["elected"]
    assert (token.work_id, token.holder_id) == (JOB, HOLDER)
    assert log.names() == ["elected", "relinquished"]
    assert log.tokens() == [token, token]
    assert returned - log.time_of("relinquished") >= 0.3 - EARLY
    assert releases(observer) == [ExitMode.FINISHED]
    assert await successor_reads(rival) == Checkpoint(None, ExitMode.FINISHED, HOLDER)


@pytest.mark.parametrize(
    ("midway", "retire", "expected"),
    [(b"mid", Retire(b"final"), b"final"), (b"mid", Retire(), b"mid"), (None, Retire(), None)],
    ids=["with-state", "keeps-checkpoint", "no-state"],
)
async def test_retire(
    lease: AsyncLease,
    rival: AsyncLease,
    observer: RecordingObserver,
    midway: bytes | None,
    retire: Retire,
    expected: bytes | None,
) -> None:
    """Retire: its state (if any) is written, RETIRED, on_relinquished; run returns None."""
    log = Log()

    async def fn(token: Token) -> None:
        if midway is not None:
            await lease.checkpoint(token, midway)
        raise retire

    await leader_for(lease, log, backoff_interval=0.05).run(fn)
    assert log.names() == ["elected", "relinquished"]
    assert releases(observer) == [ExitMode.RETIRED]
    assert await successor_reads(rival) == Checkpoint(expected, ExitMode.RETIRED, HOLDER)


async def test_exception_abandons(
    lease: AsyncLease, rival: AsyncLease, observer: RecordingObserver
) -> None:
    """fn raises: ABANDONED keeping the last checkpoint, re-raised after the backoff pause,
    no on_relinquished."""
    log = Log()
    boom = ValueError("leader work failed")

    async def fn(token: Token) -> None:
        await lease.checkpoint(token, b"half")
        raise boom

    leader = leader_for(lease, log, backoff_interval=0.3, idle_interval=LONG)
    with pytest.raises(ValueError) as caught:
        await leader.run(fn)
    returned = monotonic()
    assert caught.value is boom
    assert log.names() == ["elected"]
    assert returned - log.time_of("elected") >= 0.3 - EARLY
    assert releases(observer) == [ExitMode.ABANDONED]
    assert await successor_reads(rival) == Checkpoint(b"half", ExitMode.ABANDONED, HOLDER)


async def test_fenced_during_term(
    lease: AsyncLease, rival: AsyncLease, backend: AsyncBackend, observer: RecordingObserver
) -> None:
    """A takeover during the term: on_lost, FencedError, nothing released, no backoff pause."""
    log = Log()
    taken: list[float] = []
    rival_tokens: list[Token] = []

    async def fn(token: Token) -> None:
        await backend.forget(token)  # the row disappears behind the leader's back ...
        rival_tokens.append(await rival.acquire(JOB))  # ... and a rival takes the work ID
        taken.append(monotonic())
        renewal = current_renewal()
        assert renewal is not None
        await spin(renewal, seconds=10.0)  # async: cancelled; sync: raise_if_lost raises

    leader = leader_for(
        lease, log, renewal_interval=0.05, backoff_interval=LONG, idle_interval=LONG
    )
    with pytest.raises(FencedError):
        await leader.run(fn)
    assert monotonic() - taken[0] < PROMPT
    assert log.names() == ["elected", "lost"]
    assert releases(observer) == []
    (rival_token,) = rival_tokens
    assert rival_token.fencing_token > log.tokens()[0].fencing_token
    await rival.renew(rival_token)  # the rival still holds the work ID
    assert (await rival.read_checkpoint(rival_token)).prev_exit is ExitMode.NONE


async def test_fenced_while_fn_ignores_the_loss(
    lease: AsyncLease, backend: AsyncBackend, observer: RecordingObserver
) -> None:
    """fn never looks at the renewal and returns normally after the loss (asyncio: it is
    cancelled): still on_lost and FencedError, nothing released."""
    log = Log()

    async def fn(token: Token) -> None:
        await backend.forget(token)
        renewal = current_renewal()
        assert renewal is not None
        for _ in range(1000):
            if renewal.lost:
                break
            await asleep(0.01)

    leader = leader_for(lease, log, renewal_interval=0.05, backoff_interval=LONG)
    start = monotonic()
    with pytest.raises(FencedError):
        await leader.run(fn)
    assert monotonic() - start < PROMPT
    assert log.names() == ["elected", "lost"]
    assert releases(observer) == []


async def test_window_exhausted() -> None:
    """Renewals keep failing: on_lost, nothing released, backoff pause, then
    LeaseWindowExhaustedError."""
    backend = ScriptedBackend()
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=0.3)
    backend.fail_always("renew")
    log = Log()

    async def fn(token: Token) -> None:
        renewal = current_renewal()
        assert renewal is not None
        await spin(renewal, seconds=10.0)

    leader = leader_for(
        lease,
        log,
        renewal_interval=0.02,
        renewal_backoff=FAST,
        backoff_interval=0.3,
        idle_interval=LONG,
    )
    start = monotonic()
    with pytest.raises(LeaseWindowExhaustedError):
        await leader.run(fn)
    returned = monotonic()
    assert log.names() == ["elected", "lost"]
    assert returned - log.time_of("lost") >= 0.3 - EARLY
    assert returned - start < 0.3 + 0.3 + SLACK + PROMPT
    assert "release" not in backend.names()
    assert backend.count("renew") >= 1


async def test_release_failure_after_clean_term() -> None:
    """The release of a clean term fails: no on_relinquished; the release error is raised
    after the backoff pause."""
    backend = ScriptedBackend()
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=TTL)
    boom = transient("release failed (injected)")
    backend.fail("release", boom)
    log = Log()
    leader = leader_for(lease, log, backoff_interval=0.3, idle_interval=LONG)
    start = monotonic()
    with pytest.raises(type(boom)) as caught:
        await leader.run(lambda token: None)
    assert caught.value is boom
    assert monotonic() - start >= 0.3 - EARLY
    assert log.names() == ["elected"]


async def test_release_failure_after_retire() -> None:
    """The RETIRED release fails: no on_relinquished; the release error after the pause."""
    backend = ScriptedBackend()
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=TTL)
    boom = transient("release failed (injected)")
    backend.fail("release", boom)
    log = Log()

    def fn(token: Token) -> None:
        raise Retire

    leader = leader_for(lease, log, backoff_interval=0.3, idle_interval=LONG)
    start = monotonic()
    with pytest.raises(type(boom)) as caught:
        await leader.run(fn)
    assert caught.value is boom
    assert monotonic() - start >= 0.3 - EARLY
    assert log.names() == ["elected"]


def failing_fn(raised: list[ValueError], inner: BaseException) -> Callable[[Token], None]:
    """A leader fn raising ValueError from ``inner`` (recorded in ``raised``)."""

    def fn(token: Token) -> None:
        try:
            raise inner
        except KeyError as exc:
            error = ValueError("fn failed")
            raised.append(error)
            raise error from exc

    return fn


async def test_release_failure_after_fn_error_pauses() -> None:
    """fn raised and the ABANDONED release fails too: fn's error (with a note about the
    release) is raised after the backoff pause."""
    backend = ScriptedBackend()
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=TTL)
    backend.fail("release", transient("release failed (injected)"))
    log = Log()
    raised: list[ValueError] = []
    leader = leader_for(lease, log, backoff_interval=0.3, idle_interval=LONG)
    start = monotonic()
    with pytest.raises(ValueError) as caught:
        await leader.run(failing_fn(raised, KeyError("root cause")))
    elapsed = monotonic() - start
    assert caught.value is raised[0]
    assert any("release" in note for note in getattr(caught.value, "__notes__", []))
    assert log.names() == ["elected"]
    assert elapsed >= 0.3 - EARLY


async def test_release_failure_after_fn_error_keeps_the_chain() -> None:
    """fn raised (from another exception) and the release fails: fn's chain is intact."""
    backend = ScriptedBackend()
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=TTL)
    backend.fail("release", transient("release failed (injected)"))
    inner = KeyError("root cause")
    raised: list[ValueError] = []
    leader = AsyncLeader(lease, JOB, backoff_interval=0.01)
    with pytest.raises(ValueError) as caught:
        await leader.run(failing_fn(raised, inner))
    assert caught.value is raised[0]
    assert caught.value.__cause__ is inner


async def test_async_callbacks(lease: AsyncLease, rival: AsyncLease) -> None:
    """Callbacks and fn may be coroutine functions in the asyncio flavour (plain in sync)."""
    calls: list[tuple[str, int]] = []

    async def elected(token: Token) -> None:
        await asleep(0)
        calls.append(("elected", token.fencing_token))

    async def relinquished(token: Token) -> None:
        await asleep(0)
        calls.append(("relinquished", token.fencing_token))

    async def fn(token: Token) -> str:
        await asleep(0)
        calls.append(("fn", token.fencing_token))
        return "ignored"

    leader = AsyncLeader(
        lease, JOB, on_elected=elected, on_relinquished=relinquished, backoff_interval=0.01
    )
    await leader.run(fn)
    (number,) = {n for _, n in calls}
    assert calls == [("elected", number), ("fn", number), ("relinquished", number)]
    assert (await successor_reads(rival)).prev_exit is ExitMode.FINISHED


async def test_plain_callables(lease: AsyncLease, rival: AsyncLease) -> None:
    """A plain function works as fn (and as callbacks) in both flavours."""
    log = Log()
    called: list[Token] = []
    await leader_for(lease, log, backoff_interval=0.01).run(called.append)
    assert len(called) == 1
    assert log.names() == ["elected", "relinquished"]
    assert log.tokens() == [called[0], called[0]]
    assert (await successor_reads(rival)).prev_exit is ExitMode.FINISHED


async def test_raising_callbacks_are_logged(
    lease: AsyncLease, rival: AsyncLease, caplog: pytest.LogCaptureFixture
) -> None:
    """A callback that raises is logged and ignored: the term runs and finishes normally."""

    def broken(token: Token) -> None:
        raise RuntimeError("callback bug for " + token.work_id)

    called: list[Token] = []
    leader = AsyncLeader(
        lease, JOB, on_elected=broken, on_relinquished=broken, backoff_interval=0.01
    )
    with caplog.at_level(logging.ERROR, logger="worklease"):
        await leader.run(called.append)
    assert len(called) == 1
    failures = [
        r
        for r in caplog.records
        if r.exc_info is not None and isinstance(r.exc_info[1], RuntimeError)
    ]
    assert len(failures) == 2
    assert all(r.name == "worklease" for r in failures)
    assert (await successor_reads(rival)).prev_exit is ExitMode.FINISHED


async def test_raising_on_lost_is_logged(
    backend: AsyncBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """An on_lost that raises is logged; the loss is still reported as FencedError."""
    # The loss must be the fencing: a TTL (the lease window) no stall of a loaded machine
    # outlasts, so the window cannot close before a renewal reports the row gone; the body
    # waits on past it, so it cannot end first either.
    lease = AsyncLease(backend, holder_id=HOLDER, ttl=LONG)
    lost: list[Token] = []

    def broken(token: Token) -> None:
        lost.append(token)
        raise RuntimeError("on_lost bug")

    async def fn(token: Token) -> None:
        await backend.forget(token)
        renewal = current_renewal()
        assert renewal is not None
        await spin(renewal, seconds=2 * LONG)  # async: cancelled; sync: raise_if_lost raises

    leader = AsyncLeader(lease, JOB, on_lost=broken, renewal_interval=0.05, backoff_interval=LONG)
    with caplog.at_level(logging.ERROR, logger="worklease"), pytest.raises(FencedError):
        await leader.run(fn)
    assert len(lost) == 1
    assert any(
        r.exc_info is not None and isinstance(r.exc_info[1], RuntimeError) for r in caplog.records
    )


# -- run_forever --------------------------------------------------------------------------------


async def test_run_forever_stands_again_after_held(
    lease: AsyncLease, rival: AsyncLease, observer: RecordingObserver
) -> None:
    """LeaseHeldError does not end run_forever: it stands again every idle_interval and wins
    once the rival releases; fn stopping the leader ends it."""
    rival_token = await rival.acquire(JOB)
    log = Log()
    leader = leader_for(lease, log, idle_interval=0.05, backoff_interval=0.05)
    priors: list[Checkpoint] = []

    async def fn(token: Token) -> None:
        priors.append(await lease.read_checkpoint(token))
        leader.stop()

    async def rival_steps_down() -> None:
        await eventually(lambda: held_attempts(observer) >= 2)
        await rival.release(rival_token, ExitMode.FINISHED)

    await run_forever_bounded(leader, fn, rival_steps_down)
    assert priors == [Checkpoint(None, ExitMode.FINISHED, "rival")]
    assert log.names() == ["elected", "relinquished"]
    assert held_attempts(observer) >= 2
    assert leader.stopping


async def test_run_forever_keeps_standing_and_logs_errors(
    lease: AsyncLease, rival: AsyncLease, caplog: pytest.LogCaptureFixture
) -> None:
    """Term after term: an exception from fn is logged and ends only its term."""
    log = Log()
    leader = leader_for(lease, log, idle_interval=0.05, backoff_interval=0.05)
    terms: list[Token] = []

    async def fn(token: Token) -> None:
        terms.append(token)
        if len(terms) == 1:
            raise ValueError("term one failed")
        if len(terms) == 3:
            leader.stop()

    with caplog.at_level(logging.ERROR, logger="worklease"):
        await run_forever_bounded(leader, fn)
    assert len(terms) == 3
    numbers = [t.fencing_token for t in terms]
    assert numbers == sorted(set(numbers))
    assert log.names() == ["elected", "elected", "relinquished", "elected", "relinquished"]
    logged = [
        r
        for r in caplog.records
        if r.exc_info is not None and isinstance(r.exc_info[1], ValueError)
    ]
    assert len(logged) == 1
    assert (await successor_reads(rival)).prev_exit is ExitMode.FINISHED


async def test_run_forever_stands_again_after_fencing(
    lease: AsyncLease, backend: AsyncBackend
) -> None:
    """A fenced term does not end run_forever: it stands again at once."""
    log = Log()
    leader = leader_for(lease, log, renewal_interval=0.05, backoff_interval=0.05)
    terms: list[Token] = []

    async def fn(token: Token) -> None:
        terms.append(token)
        if len(terms) == 1:
            await backend.forget(token)
            renewal = current_renewal()
            assert renewal is not None
            await spin(renewal, seconds=10.0)
        leader.stop()

    await run_forever_bounded(leader, fn)
    assert len(terms) == 2
    assert log.names() == ["elected", "lost", "elected", "relinquished"]


async def test_stop_from_elsewhere_cuts_the_backoff_short(lease: AsyncLease) -> None:
    """stop() from another task or thread ends the backoff wait at once."""
    log = Log()
    leader = leader_for(lease, log, backoff_interval=LONG, idle_interval=LONG)
    stopped: list[float] = []

    async def stopper() -> None:
        for _ in range(500):
            if "relinquished" in log.names():
                break
            await asleep(0.01)
        await asleep(0.1)  # well into the backoff pause
        stopped.append(monotonic())
        leader.stop()

    await run_forever_bounded(leader, lambda token: None, stopper)
    assert monotonic() - stopped[0] < PROMPT
    assert log.names() == ["elected", "relinquished"]


async def test_stop_from_elsewhere_cuts_the_idle_wait_short(
    lease: AsyncLease, rival: AsyncLease, observer: RecordingObserver
) -> None:
    """stop() while waiting out somebody else's term ends run_forever at once."""
    await rival.acquire(JOB)
    await settle_listener(lease.backend)
    log = Log()
    leader = leader_for(lease, log, backoff_interval=LONG, idle_interval=LONG)
    stopped: list[float] = []

    async def stopper() -> None:
        for _ in range(500):
            if observer.of_type(AcquireEvent):
                break
            await asleep(0.01)
        await asleep(0.1)
        stopped.append(monotonic())
        leader.stop()

    called: list[Token] = []
    await run_forever_bounded(leader, called.append, stopper)
    assert monotonic() - stopped[0] < PROMPT
    assert called == []
    assert log.entries == []
    assert len(observer.of_type(AcquireEvent)) == 1


async def test_stop_during_a_term_lets_it_finish(lease: AsyncLease, rival: AsyncLease) -> None:
    """stop() during a term: the term goes on (fn may poll ``stopping``), then ends cleanly."""
    log = Log()
    leader = leader_for(lease, log, backoff_interval=LONG, idle_interval=LONG)
    saw_stopping: list[bool] = []

    async def fn(token: Token) -> None:
        for _ in range(500):
            if leader.stopping:
                break
            await asleep(0.01)
        saw_stopping.append(leader.stopping)

    async def stopper() -> None:
        for _ in range(500):
            if log.entries:
                break
            await asleep(0.01)
        await asleep(0.05)
        leader.stop()

    await run_forever_bounded(leader, fn, stopper)
    assert saw_stopping == [True]
    assert log.names() == ["elected", "relinquished"]
    assert (await successor_reads(rival)).prev_exit is ExitMode.FINISHED


async def test_stopped_leader_cannot_run_again(
    lease: AsyncLease, observer: RecordingObserver
) -> None:
    """A stopped leader is done: run and run_forever refuse to start (no silent spinning)."""
    log = Log()
    leader = leader_for(lease, log, backoff_interval=LONG, idle_interval=LONG)
    leader.stop()
    assert leader.stopping
    with pytest.raises(RuntimeError, match="stopped"):
        await leader.run_forever(lambda token: None)
    with pytest.raises(RuntimeError, match="stopped"):
        await leader.run(lambda token: None)
    assert observer.events == []
    assert log.names() == []


# -- configuration ------------------------------------------------------------------------------


@pytest.fixture
def memory_lease(observer: RecordingObserver) -> AsyncLease:
    """Configuration checks need no real backend."""
    return AsyncLease(AsyncMemoryBackend(), holder_id=HOLDER, ttl=TTL, observer=observer)


async def test_config_lease_required() -> None:
    """No lease: LeaseRequiredError (a ConfigError and a ValueError)."""
    with pytest.raises(LeaseRequiredError) as caught:
        AsyncLeader(None, JOB)  # type: ignore[arg-type]
    assert isinstance(caught.value, ConfigError)
    assert isinstance(caught.value, ValueError)


async def test_config_fn_required(memory_lease: AsyncLease, observer: RecordingObserver) -> None:
    """No (callable) fn: WorkFnRequiredError from run and run_forever, before any I/O."""
    leader = AsyncLeader(memory_lease, JOB, backoff_interval=0.01)
    for bad in (None, "not callable"):
        with pytest.raises(WorkFnRequiredError) as caught:
            await leader.run(bad)  # type: ignore[arg-type]
        assert isinstance(caught.value, ConfigError)
        with pytest.raises(WorkFnRequiredError):
            await leader.run_forever(bad)  # type: ignore[arg-type]
    assert observer.events == []


@pytest.mark.parametrize(
    "options",
    [
        {"idle_interval": 0},
        {"idle_interval": -1.0},
        {"idle_interval": math.nan},
        {"backoff_interval": 0},
        {"backoff_interval": math.inf},
        {"cleanup_timeout": 0},
        {"poll_interval": -0.5},
        {"renewal_interval": 0},
        {"on_elected": "not callable"},
        {"on_lost": 42},
        {"on_relinquished": object()},
    ],
)
async def test_config_errors(memory_lease: AsyncLease, options: dict[str, Any]) -> None:
    """Unusable intervals and non-callable callbacks raise ConfigError at construction."""
    with pytest.raises(ConfigError):
        AsyncLeader(memory_lease, JOB, **options)


@pytest.mark.parametrize("work_id", ["", "a\x00b", "x" * 1025])
async def test_config_bad_work_id(memory_lease: AsyncLease, work_id: str) -> None:
    """An unusable work ID raises ConfigError (a ValueError) at construction."""
    with pytest.raises(ConfigError):
        AsyncLeader(memory_lease, work_id)
