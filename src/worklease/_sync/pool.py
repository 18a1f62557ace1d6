# Generated from src/worklease/_async/pool.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Pool: spread a fixed set of work IDs over every process running one."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from .._compat import (
    Event,
    ThreadLock,
    Worker,
    call,
    cancel_worker,
    cleanup,
    join_all,
    sleep,
    spawn,
)
from .._context import current_renewal
from .._fairshare import (
    Balancer,
    Plan,
    check_group,
    default_group,
    default_max_moves,
    encode_member,
    member_prefix,
    member_work_id,
    rescan_delay,
)
from .._models import Checkpoint, ExitMode, Token
from .._options import (
    DEFAULT_CLEANUP_TIMEOUT,
    RUNNER_NAMES,
    check_callable,
    check_count,
    check_instance,
    check_pool_work_ids,
    configuring,
    hold_options,
    pacing,
)
from .._pacing import is_permanent, jittered
from .._report import scan_report
from .._types import WorkFn
from .._validation import Duration, check_flag
from .._window import Backoff, monotonic
from ..errors import (
    AllSlotsDeadError,
    FencedError,
    LeaseHeldError,
    LeaseLostError,
    PoolConfigError,
    PoolLeaseRequiredError,
    PoolWorkFnRequiredError,
    Retire,
)
from ..observers import (
    BalanceEvent,
    PoolObserver,
    SlotAcquiredEvent,
    SlotBackoffEvent,
    SlotDeadEvent,
    SlotLostEvent,
    SlotRetiredEvent,
    SlotShedEvent,
    notify,
)
from .batch import ReleaseBatch
from .lease import Lease
from .renewal import Renewal
from .runner import Runner
from .watch import ReleaseHub, ReleaseWatch

__all__ = ["Pool"]

logger = logging.getLogger("worklease")

_START_WAVE = 256
"""Slots started between two yields to the event loop (see ``_start_slots``)."""

_FLUSH_EVERY = 0.05
"""While a pool stops, how often the final releases its slots left to it are sent."""


class Pool:
    """Runs ``work(token, prior)`` for each of a fixed set of work IDs this process can lease.

    Start one pool per process over the same work IDs: together they cover the whole set, and
    work moves to the survivors when a process dies (after its leases expire) or releases.

    **Fair share** (the default, on backends with ``survey``, such as memory and PostgreSQL):
    pools over the same work IDs form a *group* (``group``, by default a digest of the set)
    and find each other through a membership lease each holds in the backend (renewed with
    its other leases; a crashed member drops out when it lapses). Every scan reads, in one
    statement, the free work IDs, how many each member holds and who the members are; each
    member aims at ``⌊N/P⌋`` or ``⌈N/P⌉`` of the ``N`` work IDs over ``P`` members (never
    more than its ``max_work_ids``). A member under its target takes free work IDs (at most
    ``max_moves`` per scan); a member over it, seeing the surplus on two scans in a row and
    somebody lacking, *sheds* it (at most ``max_moves`` per scan): the work function is told
    to stop (asyncio: cancelled; threads: ``raise_if_lost()`` raises ``LeaseShedError``), the
    state it returns, or its last checkpoint, stays, and the lease is released ABANDONED, so
    the next member resumes from it at once (``on_slot_shed``). Each scan is reported to
    ``on_balance``. A member at its target with nothing to move then looks only at the
    members on its scans (a read of a few rows), and surveys the work IDs again when the
    members change, when one of its own slots ends, and at least every five minutes: a
    settled group's background work does not grow with the number of work IDs. A member
    takes at most 1,000 work IDs per scan, or as many as it already holds if that is more
    (a cold start or a big takeover grows in steps it can renew), scanning again soon while
    under its target (after a tenth of ``idle_interval``, or three times what its last scan
    took if that is more). ``fair_share=False``, or a backend without ``survey``, takes whatever
    is free instead.

    The pool scans: once per ``idle_interval`` (plus up to 20 %) it asks the backend which of
    its work IDs that it does not hold are free, in one statement, and acquires those in one
    more (``find_available`` / ``acquire_many``; a backend without them gets one acquire per
    work ID); a release of one of its work IDs, when the backend reports releases, starts
    the next scan at once. Each work ID acquired gets a slot that runs the work function like
    a runner, then

    - it returned → wait ``rerun_interval`` (plus up to 20 %) and run it again;
    - it raised ``Retire`` → the work ID is released RETIRED and the slot stops
      (``on_slot_retired``);
    - the lease was fenced → the slot ends and the next scan, at once, takes the work ID
      back if it is free (``on_slot_lost``);
    - another holder has it (on a re-acquire) → the slot ends and the scan looks for it again;
    - a permanent failure (``worklease.permanent(exc)``, or any exception in the chain with a
      ``permanent()`` method returning true) → the slot stops for good (``on_slot_dead``);
    - any other failure → wait ``backoff_interval`` (``on_slot_backoff``), then the slot ends
      and the scan takes the work ID back.

    After a failure the work ID always goes back through the scan, so thousands of slots
    failing together (a stalled process losing its leases) come back in batched acquires,
    never in one acquire each.

    Each scan is reported to ``on_scan``; a failed scan is logged and retried after
    ``backoff_interval``. Only work IDs held here have a running slot (with threads, one
    thread each). ``run()`` returns when stopped or when every work ID retired or died,
    raising ``AllSlotsDeadError`` if all of them failed permanently.

    ``stop()`` (with asyncio, also cancelling ``run()``) ends the pool gracefully, the same
    way in both flavours: the pool leaves its group, and every running work function is told
    to stop (asyncio: cancelled; threads: ``raise_if_lost()`` raises ``LeaseShedError`` and
    ``stopping`` turns true; a thread cannot be interrupted, so one that does not look
    finishes first); each slot then releases ABANDONED, keeping the state its work function
    returned or its last checkpoint, before ``run`` returns; the releases go out together
    (``release_many``, in chunks of 1,000 each committed on its own) and go on until all are
    released or one TTL (at least ``cleanup_timeout``) after ``stop()``, when the leases it
    held have lapsed anyway: a slow server slows the hand-over down but never turns it into
    "nothing released". On ``KeyboardInterrupt`` the sync ``run()``
    stops the pool, waits up to ``cleanup_timeout`` + 1 s for the slots, and re-raises; a
    work function still running then is left in its daemon thread and its lease lapses
    (EXPIRED). ``active_slots()`` lists the
    work IDs whose work function is running. A stopped pool cannot run again.
    """

    __module__ = "worklease"

    def __init__(
        self,
        lease: Lease,
        work_ids: Iterable[str],
        work: WorkFn,
        *,
        idle_interval: Duration = 1.0,
        rerun_interval: Duration = 1.0,
        backoff_interval: Duration = 1.0,
        cleanup_timeout: Duration = DEFAULT_CLEANUP_TIMEOUT,
        observer: PoolObserver | None = None,
        renewal_interval: Duration | None = None,
        renewal_backoff: Backoff | None = None,
        fair_share: bool = True,
        group: str | None = None,
        max_work_ids: int | None = None,
        max_moves: int | None = None,
    ) -> None:
        self._lease = check_instance(lease, Lease, "lease", PoolLeaseRequiredError)
        self._work = check_callable(work, "work function", PoolWorkFnRequiredError)
        self._work_ids = check_pool_work_ids(work_ids)
        with configuring(PoolConfigError):
            if observer is not None:
                check_instance(observer, PoolObserver, "observer (subclass it)", PoolConfigError)
            self._options = hold_options(
                interval=renewal_interval,
                backoff=renewal_backoff,
                cleanup_timeout=cleanup_timeout,
                names=RUNNER_NAMES,
            )
            self._pacing = pacing(
                idle_interval=idle_interval,
                backoff_interval=backoff_interval,
                rerun_interval=rerun_interval,
            )
            self._fair = check_flag(fair_share, "fair_share")
            self._group = default_group(self._work_ids) if group is None else check_group(group)
            self._cap = None if max_work_ids is None else check_count(max_work_ids, "max_work_ids")
            moves = default_max_moves(len(self._work_ids)) if max_moves is None else max_moves
            self._max_moves = check_count(moves, "max_moves", minimum=1)
        self._observer = observer if observer is not None else PoolObserver()
        self._releases = ReleaseBatch(self._lease)
        self._shedding: set[str] = set()
        """Work IDs being handed to another member (their slots end when their run does)."""
        self._renewals: dict[str, Renewal] = {}
        """The renewal of each work function running here (a shed tells it to stop)."""
        self._uncovered = 0
        self._deferred: list[tuple[Token, ExitMode]] = []
        """Final releases of slots that ended while the pool stops: sent together by run()."""
        self._deferring = False
        """Whether run() still sends deferred releases (false once it sent the last ones)."""
        self._leaving = Event()
        """Set when the pool stops or its run ends: the membership lease is given up."""
        self._joined = Event()
        """Set once the membership worker tried to join (the first scan waits for it)."""
        self._lock = ThreadLock()
        self._active: set[str] = set()
        self._dead = 0
        self._running = False
        self._stop = Event()
        self._workers: dict[str, Worker] = {}
        self._claimed: set[str] = set()
        """Work IDs with a slot running here (holding it, or about to try it again)."""
        self._done: set[str] = set()
        """Work IDs retired or dead: never taken again by this run."""
        self._retiring: set[str] = set()
        self._unstarted: dict[str, Token] = {}
        """Grants whose slot has not started (it may never: stopped first)."""
        self._watch: ReleaseWatch | None = None
        self._stopped_at: float | None = None
        """When stop() was first called (monotonic seconds): hand-backs end a TTL later."""

    @property
    def work_ids(self) -> tuple[str, ...]:
        return self._work_ids

    @property
    def group(self) -> str:
        """The fair-share group: pools with the same group share its work IDs fairly."""
        return self._group

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called."""
        return self._stop.is_set()

    def active_slots(self) -> frozenset[str]:
        """A snapshot of the work IDs whose work function is running right now."""
        with self._lock:
            return frozenset(self._active)

    def stop(self) -> None:
        """End the pool gracefully (see the class documentation). Idempotent."""
        with self._lock:
            if self._stopped_at is None:
                self._stopped_at = monotonic()
        self._stop.set()
        self._leaving.set()  # leave the group first: the others recount without us at once
        watch = self._watch
        if watch is not None:
            watch.close()  # ends the scan's wait at once
        with self._lock:
            renewals = dict(self._renewals)
            workers = dict(self._workers)
        for work_id, worker in workers.items():
            cancel_worker(worker)
            renewal = renewals.get(work_id)
            if renewal is not None:
                # A thread cannot be cancelled: it learns it from raise_if_lost(), as a shed.
                # So does a task whose cancellation some await lost on the way.
                renewal._request_shed("the pool is stopping", cancel=False)

    def run(self) -> None:
        """Run the pool until it is stopped or every work ID retired or died (see the class
        documentation)."""
        with self._lock:
            if self._running:
                raise RuntimeError("this pool is already running")
            if self._stop.is_set():
                raise RuntimeError("this pool was stopped; build a new one to run again")
            self._running = True
            self._dead = 0
            self._done = set()
            self._claimed = set()
            self._unstarted = {}
            self._deferred = []
            self._deferring = True
            self._shedding = set()
        runner = Runner._with_options(
            self._lease, self._adapter, self._options, self._releases.release, self._defer
        )
        balancing = self._fair and self._lease._capabilities.survey is not None
        if self._fair and not balancing:
            logger.info(
                "worklease pool: the backend has no survey, so this pool takes whatever is "
                "free instead of its fair share"
            )
        self._leaving = Event()
        self._joined = Event()
        membership: Worker | None = None
        try:
            try:
                if balancing:  # joined before the first scan: the others count us at once
                    membership = spawn(self._membership, name="worklease-pool-member")
                    self._joined.wait(self._pacing.idle_interval)
                self._scan_loop(runner, balancing)
                self._join_slots(None)
            except BaseException:
                self.stop()  # graceful: running slots release before we leave
                self._join_slots(self._options.cleanup_timeout + 1.0)
                raise
            finally:
                self._release_unstarted()
        finally:
            self._leaving.set()  # the membership worker forgets the lease and ends
            if membership is not None:
                join_all([membership], self._options.cleanup_timeout + 1.0)
            with self._lock:
                self._workers = {}
                self._running = False
        if self._dead == len(self._work_ids):
            raise AllSlotsDeadError(
                f"every slot of the pool failed permanently ({len(self._work_ids)} work IDs)"
            )

    def _live_workers(self) -> list[Worker]:
        with self._lock:
            return list(self._workers.values())

    def _join_slots(self, timeout: float | None) -> None:
        """Wait for the slots to end (at most ``timeout`` seconds), sending the final
        releases they leave to the pool every few milliseconds meanwhile: one slow work
        function (a thread that does not look at ``raise_if_lost()``) never holds back the
        releases of the others."""
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            step = _FLUSH_EVERY if deadline is None else min(_FLUSH_EVERY, deadline - monotonic())
            done = join_all(self._live_workers(), max(step, 0.0))
            self._release_deferred()
            if done or (deadline is not None and monotonic() >= deadline):
                return

    # -- the scan -----------------------------------------------------------------------------

    def _scan_loop(self, runner: Runner, balancing: bool) -> None:
        """Find and take free work IDs (and, ``balancing``, shed the surplus) until stopped or
        every work ID is done."""
        # Without release reports from the backend, a watch on nothing still lets slots and
        # stop() end the wait.
        watch = self._lease._watch_releases(self._work_ids)
        if watch is None:
            watch = ReleaseHub().watch(())
        self._watch = watch
        balancer = Balancer(self._work_ids, self._lease.holder_id, self._cap, self._max_moves)
        try:
            while not self._stop.is_set():
                with self._lock:
                    if len(self._done) == len(self._work_ids):
                        return
                    # (A balancing scan asks about every work ID anyway: no list to build.)
                    candidates = (
                        []
                        if balancing
                        else [
                            work_id
                            for work_id in self._work_ids
                            if work_id not in self._claimed and work_id not in self._done
                        ]
                    )
                delay = jittered(self._pacing.idle_interval)
                not_before = 0.0
                if balancing or candidates:
                    try:
                        if balancing:
                            started = monotonic()
                            if self._balance(runner, balancer):  # more to take now
                                took = monotonic() - started
                                delay = rescan_delay(self._pacing.idle_interval, took)
                                not_before = started + took + delay
                        else:
                            self._start_slots(runner, self._scan(candidates))
                    except Exception as exc:
                        logger.warning(
                            "worklease pool scan failed; retrying in %gs: %s",
                            self._pacing.backoff_interval,
                            exc,
                        )
                        delay = self._pacing.backoff_interval
                if self._stop.is_set():
                    return
                watch.wait(delay)  # a release of one of ours ends it early
                if not_before > monotonic():
                    # Under target after a costly scan: a wake (a release, a slot that
                    # ended) does not make the next one come sooner than its pace.
                    self._stop.wait(not_before - monotonic())
        finally:
            self._watch = None
            watch.close()

    def _scan(self, candidates: list[str]) -> list[tuple[Token, Checkpoint | None]]:
        with scan_report(self._observer, len(candidates)) as call:
            grants = call.result = self._lease._acquire_available(candidates)
        return grants

    def _balance(self, runner: Runner, balancer: Balancer) -> bool:
        """One fair-share scan: survey the group, take free work IDs up to the target, shed
        the surplus. True when it took something, is still under its target (it lost some
        races, or may take at most ``max_moves`` a scan) and has peers: the next scan should
        come soon (taking free work moves nothing, so it is not paced like shedding)."""
        prefix = member_prefix(self._group)
        with self._lock:
            candidates = len(self._work_ids) - len(self._claimed | self._done)
        with scan_report(self._observer, candidates) as call:
            plan: Plan | None = None
            if balancer.settled():  # a look at the members first (see _fairshare: quiet)
                look = self._lease._survey([], prefix)
                assert look is not None  # balancing only with a backend that surveys
                with self._lock:
                    held = len(self._claimed - self._shedding)
                plan = balancer.quiet(look.members, held, monotonic())
            if plan is None:
                survey = self._lease._survey(list(self._work_ids), prefix)
                assert survey is not None
                with self._lock:
                    mine, shedding = set(self._claimed), set(self._shedding)
                    done = set(self._done)
                plan = balancer.plan(survey, mine, shedding, done, now=monotonic())
            grants: list[tuple[Token, Checkpoint | None]] = []
            if plan.take:
                grants = self._lease._acquire_available(list(plan.take), known_free=True)
            call.result = grants
        self._start_slots(runner, grants)
        for work_id in plan.shed:
            self._shed(work_id)
        self._report_balance(plan, grants)
        return (
            bool(grants)
            and len(grants) == len(plan.take)
            and (plan.held + len(grants) < plan.target)
        )

    def _report_balance(self, plan: Plan, grants: list[tuple[Token, Checkpoint | None]]) -> None:
        if plan.uncovered != self._uncovered:
            if plan.uncovered:
                logger.warning(
                    "worklease pool %s: %d work ID(s) uncovered: every member of the group "
                    "is at its max_work_ids",
                    self._group,
                    plan.uncovered,
                )
            else:
                logger.info("worklease pool %s: every work ID can be held again", self._group)
            self._uncovered = plan.uncovered
        event = BalanceEvent(
            self._group,
            plan.members,
            plan.target,
            plan.held,
            tuple(token.work_id for token, _ in grants),
            plan.shed,
            plan.uncovered,
        )
        notify(self._observer.on_balance, event)

    def _shed(self, work_id: str) -> None:
        """Hand ``work_id`` to another member: tell its work to stop; its slot then writes the
        final checkpoint, releases ABANDONED and ends."""
        with self._lock:
            if work_id not in self._claimed or work_id in self._shedding:
                return
            self._shedding.add(work_id)
            renewal = self._renewals.get(work_id)
        notify(self._observer.on_slot_shed, SlotShedEvent(work_id))
        if renewal is not None:
            renewal._request_shed("handed to another pool member")

    def _join(self) -> Token | None:
        """Acquire this pool's membership lease of its group and publish its cap; ``None``
        when that failed (a previous run of this holder still holds it, or the backend
        failed: the membership worker tries again)."""
        lease = self._lease
        try:
            token = lease.acquire(member_work_id(self._group, lease.holder_id))
        except LeaseHeldError:
            return None
        except Exception as exc:
            logger.warning("worklease pool %s: joining failed: %s", self._group, exc)
            return None
        try:
            lease.checkpoint(token, encode_member(self._cap))
        except BaseException as exc:
            if isinstance(exc, Exception):
                logger.warning("worklease pool %s: joining failed: %s", self._group, exc)
            self._leave(token)
            if not isinstance(exc, Exception):
                raise
            return None
        return token

    def _membership(self) -> None:
        """Hold this pool's membership lease while the pool runs (re-joining after a loss), so
        the other members count it; forget it when the pool stops or its run ends."""
        pause = self._pacing.idle_interval
        leaving = self._leaving
        while not leaving.is_set():
            token = self._join()
            self._joined.set()  # the first scan waits for the first attempt
            if token is None:
                leaving.wait(pause)
                continue
            try:
                with self._lease._renewal(token, self._options.renewal) as renewal:
                    while not leaving.wait(pause):
                        renewal.raise_if_lost()
            except LeaseLostError:
                pass  # lost the membership: join again
            except Exception as exc:
                logger.warning("worklease pool %s: membership failed: %s", self._group, exc)
                leaving.wait(self._pacing.backoff_interval)
            finally:
                if leaving.is_set():
                    self._leave(token)

    def _leave(self, token: Token) -> None:
        try:
            cleanup(self._options.cleanup_timeout, self._lease.forget, token)
        except Exception as exc:  # it lapses after the TTL instead
            logger.info("worklease pool %s: leaving failed: %s", self._group, exc)

    def _start_slots(self, runner: Runner, grants: list[tuple[Token, Checkpoint | None]]) -> None:
        with self._lock:  # every grant is ours first: one not started yet is released at the end
            for token, _ in grants:
                self._claimed.add(token.work_id)
                self._unstarted[token.work_id] = token
        spawned = 0
        try:
            for token, prior in grants:
                if spawned and spawned % _START_WAVE == 0:
                    # Let the slots started so far take their first steps, and the
                    # renewals run, before starting more: thousands of new slots at once
                    # must not keep the leases already held waiting for seconds.
                    sleep(0)
                work_id = token.work_id
                with self._lock:
                    if self._stop.is_set():
                        return  # released with the other unstarted grants when run ends
                    self._workers[work_id] = spawn(
                        self._slot,
                        runner,
                        work_id,
                        (token, prior),
                        name="worklease-pool:" + work_id,
                    )
                spawned += 1
        except Exception:
            # No slot for the rest (a thread could not start): hand them back now rather
            # than leave them claimed, unrenewed and never taken again.
            with self._lock:
                left = [token for token, _ in grants[spawned:]]
                for token in left:
                    self._unstarted.pop(token.work_id, None)
                    self._claimed.discard(token.work_id)
            self._hand_back([(token, ExitMode.ABANDONED) for token in left])
            raise

    # -- one held work ID ---------------------------------------------------------------------

    def _adapter(self, token: Token, prior: Checkpoint) -> bytes | None:
        work_id = token.work_id
        renewal = current_renewal()  # the hold's: a shed tells it to stop
        notify(self._observer.on_slot_acquired, SlotAcquiredEvent(work_id, token))
        with self._lock:
            self._retiring.discard(work_id)
            self._active.add(work_id)
            shed = work_id in self._shedding or self._stop.is_set()
            if isinstance(renewal, Renewal):
                self._renewals[work_id] = renewal
        try:
            if shed and isinstance(renewal, Renewal):
                reason = "the pool is stopping" if self._stop.is_set() else "handed over"
                # No cancellation of our own task: raising here is enough (and a pending
                # cancel request would outlive uncancel() before Python 3.13).
                renewal._request_shed(reason, cancel=False)
                renewal.raise_if_lost()  # handed back before the work started
            result: bytes | None = call(self._work, token, prior)
            return result
        except Retire:
            with self._lock:
                self._retiring.add(work_id)
            raise
        finally:
            with self._lock:
                self._active.discard(work_id)
                self._renewals.pop(work_id, None)

    def _handed_over(self, work_id: str) -> bool:
        with self._lock:
            return work_id in self._shedding

    def _retired_now(self, work_id: str) -> bool:
        """Whether the run that just ended retired the work ID (it is then done for good)."""
        with self._lock:
            if work_id not in self._retiring:
                return False
            self._retiring.discard(work_id)
            self._done.add(work_id)
            return True

    def _slot(
        self, runner: Runner, work_id: str, granted: tuple[Token, Checkpoint | None] | None
    ) -> None:
        """Run the work while this process keeps the work ID; give it back to the scan (by
        ending) when somebody else holds it or after a failure. (One coroutine per slot:
        each frame more costs every held lease a few hundred bytes.)"""
        try:
            with self._lock:
                if self._stop.is_set() or self._unstarted.pop(work_id, None) is None:
                    return  # unstarted: the grant is (or was) released when run ends
            observer = self._observer
            while granted is not None or not self._stop.is_set():  # a grant is always run
                if granted is None and self._handed_over(work_id):
                    return
                error: Exception | None = None
                try:
                    runner._run(work_id, granted)
                except Exception as exc:
                    error = exc
                granted = None
                if self._handed_over(work_id):
                    return  # shed: released ABANDONED by the hold; the new holder carries on
                if error is None and self._retired_now(work_id):
                    notify(observer.on_slot_retired, SlotRetiredEvent(work_id))
                    return
                if self._stop.is_set():
                    return
                if error is None:
                    self._pause(jittered(self._pacing.rerun_interval))
                    continue  # the work returned: this slot runs it again (its own acquire)
                # After a failure the scan takes the work ID back, with any others that failed
                # meanwhile, in one batch: thousands of slots losing their leases together (a
                # stalled machine) must not turn into thousands of acquires racing each other.
                if isinstance(error, FencedError):
                    notify(observer.on_slot_lost, SlotLostEvent(work_id, error))
                elif is_permanent(error):
                    notify(observer.on_slot_dead, SlotDeadEvent(work_id, error))
                    with self._lock:
                        self._dead += 1
                        self._done.add(work_id)
                elif not isinstance(error, LeaseHeldError):  # held: somebody else has it
                    delay = self._pacing.backoff_interval
                    notify(observer.on_slot_backoff, SlotBackoffEvent(work_id, error, delay))
                    self._pause(delay)
                return
        except Exception:  # a bug must not take the other slots down silently
            logger.exception("worklease pool slot %r failed unexpectedly", work_id)
        finally:
            with self._lock:
                self._claimed.discard(work_id)
                self._shedding.discard(work_id)
                self._workers.pop(work_id, None)
                watch = self._watch
            if watch is not None:
                watch.wake()  # the scan takes the work ID back (or sees everything done)

    def _defer(self, token: Token, mode: ExitMode) -> bool:
        """A slot's plain final release while the pool stops: kept for one release of many
        together (cheaper than a batch per slot for thousands of work IDs)."""
        with self._lock:
            if not (self._stop.is_set() and self._deferring):
                return False
            self._deferred.append((token, mode))
            return True

    def _release_deferred(self) -> None:
        with self._lock:
            pending, self._deferred = self._deferred, []
        self._hand_back(pending)

    def _release_unstarted(self) -> None:
        """Hand back the grants no slot started (the pool stopped first: ABANDONED like any
        work the pool stops) and the last final releases slots left to the pool; slots that
        end later release by themselves."""
        with self._lock:
            tokens, self._unstarted = list(self._unstarted.values()), {}
            pending, self._deferred = self._deferred, []
            self._deferring = False
        self._hand_back(pending + [(token, ExitMode.ABANDONED) for token in tokens])

    def _hand_back_deadline(self) -> float:
        """Until when releasing what the pool holds is worth it: one TTL (at least
        ``cleanup_timeout``) after the pool was stopped. The slots stop renewing as they end,
        so by then every lease it held has lapsed anyway."""
        with self._lock:
            since = self._stopped_at
        if since is None:  # the run ended by itself (everything retired or died)
            since = monotonic()
        return since + max(self._lease.ttl, self._options.cleanup_timeout)

    def _hand_back(self, pending: list[tuple[Token, ExitMode]]) -> None:
        """Release ``pending`` together, in chunks each committed on its own (a lease taken
        over or lapsed meanwhile has nothing to hand back), until done or until the leases
        would have lapsed anyway (``_hand_back_deadline``): a slow server slows the hand-back
        down but keeps what each chunk released. What is left lapses after its TTL."""
        if not pending:
            return
        try:
            left = self._hand_back_deadline() - monotonic()
            cleanup(left, self._release_all, pending)
        except Exception as exc:
            logger.warning(
                "worklease pool could not hand back %d work ID(s) as it stopped (they lapse "
                "after the TTL): %s",
                len(pending),
                exc,
            )

    def _release_all(self, pending: list[tuple[Token, ExitMode]]) -> None:
        failure: Exception | None = None
        for mode in dict.fromkeys(mode for _, mode in pending):
            tokens = [token for token, item_mode in pending if item_mode is mode]
            try:
                outcomes = self._lease._release_together(tokens, mode)
            except Exception as exc:
                failure = failure or exc
                continue
            for outcome in outcomes:
                if outcome is not None and not isinstance(outcome, LeaseLostError):
                    failure = failure or outcome
        if failure is not None:
            raise failure

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)
