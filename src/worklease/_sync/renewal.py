# Generated from src/worklease/_async/renewal.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Background renewal of one lease, with loss detection."""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING

from .._compat import (
    RENEWER_LINGER,
    Abandoned,
    Event,
    HostCanceller,
    ThreadLock,
    Worker,
    abandonable,
    loop_gone,
    loop_key,
    spawn_after,
    start_pending,
    start_within,
    worker_alive,
)
from .._context import _current
from .._models import Token
from .._options import RenewalOptions
from .._schedule import ScheduledRenewal, Settled, call_timeout, next_round, overdue, split_round
from .._types import RenewTogether
from .._window import LeaseWindow, TokenSeal, chain_loss, fresh, monotonic
from ..errors import LeaseLostError, LeaseShedError

if TYPE_CHECKING:
    from contextvars import Token as ContextToken

    from .._context import ActiveRenewal

__all__ = ["Renewal", "Renewals"]

logger = logging.getLogger("worklease")


class Renewal:
    """Keeps one lease renewed in the background while its ``with`` block runs.

    Renewal attempts run every ``interval`` seconds (up to half an interval early, to share a
    backend call with the lease object's other renewals); transient failures are retried with
    the backoff until the lease window closes. The window is tracked on the local monotonic clock
    and never exceeds the real expiry. The lease is lost when a renewal is fenced
    (``FencedError``), finds the lease lapsed (``LeaseLapsedError``), or the window closes
    before a renewal succeeded (``LeaseWindowExhaustedError``); ``cause`` then holds the
    error, ``remaining()`` returns ``None``, and every later write with the token through the
    same lease raises it without touching the backend.

    How the block learns of a loss depends on the flavour. With asyncio the task running the
    block is cancelled and the block raises the cause (an outside cancellation still raises
    ``CancelledError``). A thread cannot be cancelled: call ``raise_if_lost()`` between steps;
    leaving the block raises the cause. The block's own exception is never masked; the loss
    is chained to it.
    """

    __slots__ = (
        "__weakref__",
        "_canceller",
        "_context",
        "_entered",
        "_renewals",
        "_renewer",
        "_schedule",
        "_seal",
        "_shed",
        "_shed_reason",
        "_token",
        "_window",
    )

    __module__ = "worklease"

    def __init__(
        self,
        renewals: Renewals,
        token: Token,
        seal: TokenSeal,
        options: RenewalOptions,
    ) -> None:
        self._renewals = renewals
        self._token = token
        self._seal = seal
        self._schedule = ScheduledRenewal(token, seal, renewals.ttl, options)
        self._window: LeaseWindow = self._schedule.window
        self._canceller = HostCanceller()
        self._renewer: Renewer | None = None
        self._context: ContextToken[ActiveRenewal | None] | None = None
        self._entered = False
        self._shed = False
        self._shed_reason = ""

    @property
    def token(self) -> Token:
        """The token being renewed."""
        return self._token

    @property
    def interval(self) -> float:
        """Seconds between renewal attempts."""
        return self._schedule.interval

    @property
    def cause(self) -> LeaseLostError | None:
        """Why the lease was lost, or ``None`` while it is held (or after a normal stop)."""
        return self._window.cause()

    @property
    def lost(self) -> bool:
        """Whether the lease was lost."""
        return self._window.cause() is not None

    @property
    def shed(self) -> bool:
        """Whether a fair-share pool is handing the work ID to another member: the work
        should stop (``raise_if_lost()`` raises ``LeaseShedError``); the lease is still held
        until the pool releases it."""
        return self._shed

    def remaining(self) -> float | None:
        """Seconds of guaranteed lease left; ``None`` once lost or stopped."""
        return self._window.remaining()

    def raise_if_lost(self) -> None:
        """Raise the loss cause if the lease was lost (``LeaseShedError`` when a pool is
        handing the work ID over); otherwise do nothing."""
        cause = self._window.cause()
        if cause is not None:
            raise fresh(cause)
        if self._shed:
            raise self._shed_error()

    def _shed_error(self) -> LeaseShedError:
        token = self._token
        return LeaseShedError(
            f"work ID {token.work_id!r} (holder {token.holder_id!r}, token "
            f"{token.fencing_token}): {self._shed_reason}: stop working",
            token=token,
        )

    def _request_shed(self, reason: str, *, cancel: bool = True) -> None:
        """Tell the block to stop because its pool hands the work ID back (``reason``:
        another member takes it over, or the pool stops). asyncio: the block is cancelled
        (unless ``cancel`` is false: the block itself asks), as a loss would cancel it;
        threads: ``raise_if_lost()`` raises. The lease stays renewed until it is released."""
        if self._shed or self._schedule.stopped:
            return
        self._shed_reason = reason
        self._shed = True
        if cancel:
            self._canceller.cancel()

    def stop(self) -> None:
        """Stop renewing, without waiting for an attempt in flight. Idempotent."""
        if not self._schedule.stopped:
            self._window.stop()
            self._leave()

    def _leave(self) -> None:
        """Stop renewing once the window has stopped: no attempt is planned any more."""
        schedule = self._schedule
        if schedule.stopped:
            return
        schedule.stopped = True
        if self._renewer is not None:
            self._renewer.discard(self)

    def __repr__(self) -> str:
        state = "lost" if self.lost else "stopped" if self._schedule.stopped else "active"
        return f"<{type(self).__name__} {state} {self._token!r}>"

    def __enter__(self) -> Renewal:
        if self._entered:
            raise RuntimeError("a renewal runs once; ask the lease for a new one")
        self._entered = True
        self._schedule.begin()
        self._canceller.bind()
        self._context = _current.set(self)
        self._renewals.add(self)  # sets _renewer before stop() can be reached
        self._seal.attach(self._window, self.stop)
        if self._seal.given_up:  # released or forgotten meanwhile, from another thread
            self.stop()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cause = self._window.stop()  # the final verdict, decided atomically with the stop
        self._leave()
        if self._context is not None:
            _current.reset(self._context)
            self._context = None
        requested = self._canceller.requested
        ours = self._canceller.consume(exc)
        if cause is not None and ours:
            raise fresh(cause)  # replaces our own CancelledError
        if cause is None and self._shed and ours and exc is not None:
            raise self._shed_error()  # the block was cancelled to hand the work ID over
        if exc is not None:
            if cause is not None:
                chain_loss(exc, cause, cancelled=requested)
            return
        if cause is not None:
            raise fresh(cause)

    # -- driven by the lease's renewer ---------------------------------------------------------

    def _settle(self, start: float, outcome: Exception | None) -> None:
        """Take the outcome of an attempt that began at ``start`` (``None``: renewed)."""
        if self._schedule.settle(start, outcome) is Settled.LOST:
            self._lose(self._window.cause())

    def _lose(self, cause: LeaseLostError | None) -> None:
        if self._renewer is not None:
            self._renewer.discard(self)
        if cause is not None and not self._schedule.stopped:
            self._canceller.cancel()


class Renewals:
    """The renewers of one lease object: one per event loop with asyncio, one per process
    with threads. ``renew`` renews a batch of tokens in one backend call (see
    ``AsyncRenewTogether``); ``ttl`` is the lease's."""

    def __init__(self, renew: RenewTogether, ttl: float) -> None:
        self.renew = renew
        self.ttl = ttl
        self._lock = ThreadLock()
        self._renewers: dict[object, Renewer] = {}

    def add(self, renewal: Renewal) -> None:
        """Hand ``renewal`` to the renewer of the running loop (or thread), starting one if
        needed."""
        key = loop_key()
        with self._lock:
            renewer = self._renewers.get(key)
            if renewer is None:
                # A renewer whose loop closed before its worker's start came would stay
                # (nothing on that loop runs again): drop it now, with its loop.
                for gone in [other for other in self._renewers if loop_gone(other)]:
                    del self._renewers[gone]
                renewer = self._renewers[key] = Renewer(self, key)
            renewer.add(renewal)

    def retire(self, key: object, renewer: Renewer) -> bool:
        """End an idle renewer's worker and forget it, unless a renewal arrived meanwhile;
        decided under the lock ``add`` takes, so no renewal is left with a renewer whose
        worker ended."""
        with self._lock:
            if not renewer.retire_if_idle():
                return False
            if self._renewers.get(key) is renewer:
                del self._renewers[key]
            return True

    def forget(self, key: object, renewer: Renewer) -> None:
        with self._lock:
            if self._renewers.get(key) is renewer:
                del self._renewers[key]


class Renewer:
    """Renews every running renewal of one lease object (on one loop) together.

    One worker waits until the earliest renewal is due, then renews the round chosen by
    ``next_round`` in one backend call. Each renewal keeps its own interval, window, retries
    and loss: the outcome of the shared call is settled token by token.
    """

    def __init__(self, renewals: Renewals, key: object) -> None:
        self._renewals = renewals
        self._key = key
        self._lock = ThreadLock()
        self._members: dict[ScheduledRenewal, Renewal] = {}
        self._wake = Event()
        self._worker: Worker | None = None
        self._in_flight: set[Renewal] = set()
        self._abandon = Event()
        self._wakes_at = 0.0
        """When the waiting worker wakes next (monotonic); 0 while it is busy. Read and
        written under the lock together with the member snapshot, so no wake-up is lost."""

    def add(self, renewal: Renewal) -> None:
        """Renew ``renewal`` from now on (called under the registry's lock)."""
        due = renewal._schedule.due
        with self._lock:
            self._members[renewal._schedule] = renewal
            renewal._renewer = self
            worker = self._worker
            if worker is None or not worker_alive(worker):
                # The worker starts when the first attempt is due (a task; a thread starts
                # now): a renewal stopped before then never needed one.
                self._wake = Event()
                self._wakes_at = due
                self._worker = spawn_after(
                    due - monotonic(),
                    self._run,
                    name="worklease-renewals",
                    unstarted=self._cancelled_before_it_ran,
                    idle=self._retired_at_start,
                )
                return
            if due >= self._wakes_at > 0.0:
                return  # the worker wakes before this one is due anyway
            start_within(worker, due - monotonic())  # a worker not started yet: sooner
            wake = self._wake
        wake.set()

    def discard(self, renewal: Renewal) -> None:
        with self._lock:
            if self._members.pop(renewal._schedule, None) is None:
                return
            wake = self._wake
            if renewal in self._in_flight:
                self._in_flight.discard(renewal)
                if not self._in_flight:
                    self._abandon.set()  # nobody wants the answer: let the call go
            if self._members:
                return  # the worker finds out when it next wakes
            worker = self._worker
            if worker is not None and start_pending(worker):
                # Its start is still to come: left as it is, it serves the renewals that
                # follow (a runner's next cycles cost no timer and no renewer of their own);
                # due with nothing to renew, it never starts (_retired_at_start).
                return
            if RENEWER_LINGER:
                return  # the worker finds out when it next wakes
        wake.set()  # nothing left: a worker that ends at once should not wait for a due

    def retire_if_idle(self) -> bool:
        """End the worker if nothing is left to renew (under the registry's lock)."""
        with self._lock:
            if self._members:
                return False
            self._worker = None
            return True

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except Exception as exc:
            # A bug here must not leave a holder believing it holds a lease nobody renews.
            logger.exception("worklease renewals failed unexpectedly")
            self._abort(exc)
        except BaseException as exc:
            # Cancelled (the event loop shuts down, or somebody cancels every task): nobody
            # renews these leases any more, so report them lost rather than leave their
            # holders believing otherwise.
            self._abort(exc)
            raise

    def _retired_at_start(self) -> bool:
        """When the worker's start comes: with nothing left to renew, this renewer is
        retired instead (no task starts); otherwise the worker starts."""
        return self._renewals.retire(self._key, self)

    def _cancelled_before_it_ran(self) -> None:
        """The worker was cancelled before its first step (a sweep cancelling every task):
        nobody renews these leases, so report them lost, as a worker cancelled later does."""
        self._abort(RuntimeError("the renewal worker was cancelled before it ever ran"))

    def _abort(self, error: BaseException) -> None:
        self._renewals.forget(self._key, self)
        with self._lock:
            members, self._members = list(self._members.values()), {}
            self._worker = None
        for renewal in members:
            renewal._lose(renewal._window.lose_by_window(error))

    def _step(self) -> bool:
        """One wait or one round of renewals; False when the worker ends."""
        now = monotonic()
        with self._lock:
            wake = self._wake
            wake.clear()
            for schedule in [s for s in self._members if s.stopped]:
                del self._members[schedule]  # stopped before it was ever added (defensive)
            schedules = list(self._members)
            chosen, wakes_at = next_round(schedules, now)
            if not chosen:
                self._wakes_at = now + RENEWER_LINGER if wakes_at is None else wakes_at
            else:
                self._wakes_at = 0.0
            waits_until = self._wakes_at
            round_ = [self._members[schedule] for schedule in chosen]
        if not round_:
            woken = wake.wait(waits_until - now)
            with self._lock:
                self._wakes_at = 0.0  # awake: whatever is added gets looked at
            if not schedules and not woken:
                return not self._renewals.retire(self._key, self)
            return True
        self._round(round_)
        return True

    def _overdue(self, batch: list[Renewal], lost: dict[Renewal, bool]) -> float | None:
        """While a call is in flight: take out the renewals whose window closed meanwhile, so
        their holders learn it now rather than when the shared call ends; return the seconds
        until the next check. Their holders are told at once unless that leaves the call with
        nobody waiting for it: it is then abandoned first (see ``_round``), so an abandoned
        call is always cancelled before its holders hear."""
        schedules = {renewal._schedule: renewal for renewal in batch}
        told = {renewal._schedule: flag for renewal, flag in lost.items()}
        found, next_check = overdue(list(schedules), told, monotonic())
        for schedule in found:
            renewal = schedules[schedule]
            lost[renewal] = False  # not told yet
            self.discard(renewal)
        with self._lock:
            abandoning = not self._in_flight
        if not abandoning:
            self._tell(lost)
        return next_check

    @staticmethod
    def _tell(lost: dict[Renewal, bool]) -> None:
        for renewal, told in lost.items():
            if not told:
                lost[renewal] = True
                renewal._lose(renewal._window.cause())

    def _round(self, renewals: list[Renewal]) -> None:
        start = monotonic()
        by_schedule = {renewal._schedule: renewal for renewal in renewals}
        batch_s, later_s, exhausted_s = split_round(list(by_schedule), start)
        for schedule in exhausted_s:
            renewal = by_schedule[schedule]
            renewal._lose(renewal._window.lose_by_window(schedule.last_error))
        if not batch_s:
            return
        batch = [by_schedule[schedule] for schedule in batch_s]
        timeout = call_timeout(batch_s, start, self._renewals.ttl)
        with self._lock:
            self._in_flight = set(batch)
            self._abandon = abandon = Event()
        lost: dict[Renewal, bool] = {}  # lost by window during the call: told yet?
        try:
            outcomes = abandonable(
                abandon,
                lambda: self._overdue(batch, lost),
                self._renewals.renew,
                [schedule.token for schedule in batch_s],
                [schedule.attempt for schedule in batch_s],
                timeout,
            )
        except Abandoned:
            return  # every renewal of the call stopped (or lost its window) meanwhile
        finally:
            with self._lock:
                self._in_flight = set()
            self._tell(lost)
        for renewal, outcome in zip(batch, outcomes, strict=True):
            renewal._settle(start, outcome)
        if later_s:
            self._round([by_schedule[schedule] for schedule in later_s])
