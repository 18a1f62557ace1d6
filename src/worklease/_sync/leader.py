# Generated from src/worklease/_async/leader.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Leader election on top of a lease."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from .._compat import Event, call, cleanup
from .._models import ExitMode, Token
from .._options import (
    DEFAULT_CLEANUP_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    RUNNER_NAMES,
    check_callable,
    check_callbacks,
    check_instance,
    configuring,
    hold_options,
    pacing,
)
from .._pacing import WaitPacing, jittered
from .._types import TokenCallback
from .._validation import Duration, check_work_id
from .._window import Backoff
from ..errors import (
    ConfigError,
    FencedError,
    LeaseHeldError,
    LeaseRequiredError,
    Retire,
    WorkFnRequiredError,
)
from .hold import finish
from .lease import Lease
from .watch import ReleaseWatch

__all__ = ["Leader"]

logger = logging.getLogger("worklease")


class Leader:
    """Elects one leader for ``work_id`` among every process running this code.

    ``run(fn)`` makes one election attempt: when this process wins, ``on_elected(token)`` is
    called, the lease is renewed while ``fn(token)`` runs (pass ``token.fencing_token`` to the
    systems ``fn`` writes to), and the lease is released afterwards: FINISHED when ``fn``
    returns, RETIRED on ``Retire`` (its ``state``, if any, written first), ABANDONED on
    another exception (which ``run`` re-raises).
    ``on_relinquished(token)`` follows a FINISHED or RETIRED release; ``on_lost(token)`` is
    called when the lease was lost during the term (fenced or window exhausted; never for an
    outside cancellation), and nothing is released then.

    Pacing: when somebody else leads, ``run`` waits ``idle_interval`` (plus up to 20 %) and
    raises ``LeaseHeldError`` (with ``acquire_wait=True`` it waits for the lease instead); after
    another acquire error, and after every term that did not end fenced, it waits
    ``backoff_interval``. Cancellation ends any wait at once; so does ``stop()``. When the
    backend can tell (see ``watch_releases``), a release of the work ID ends the waits for
    somebody else's lease early, so leadership passes on at once.
    ``run_forever(fn)`` stands for election again after each term or attempt until cancelled
    or stopped; an exception from ``fn`` is logged and ends only that term. A stopped leader
    cannot run again (``RuntimeError``): build a new one.

    Callbacks run in the electing task or thread; exceptions they raise are logged.
    """

    __module__ = "worklease"

    def __init__(
        self,
        lease: Lease,
        work_id: str,
        *,
        idle_interval: Duration = 1.0,
        backoff_interval: Duration = 1.0,
        cleanup_timeout: Duration = DEFAULT_CLEANUP_TIMEOUT,
        on_elected: TokenCallback | None = None,
        on_lost: TokenCallback | None = None,
        on_relinquished: TokenCallback | None = None,
        acquire_wait: bool = False,
        poll_interval: Duration = DEFAULT_POLL_INTERVAL,
        renewal_interval: Duration | None = None,
        renewal_backoff: Backoff | None = None,
    ) -> None:
        self._lease = check_instance(lease, Lease, "lease", LeaseRequiredError)
        with configuring(ConfigError):
            self._work_id = check_work_id(work_id)
            check_callbacks(on_elected=on_elected, on_lost=on_lost, on_relinquished=on_relinquished)
            self._options = hold_options(
                wait=acquire_wait,
                poll_interval=poll_interval,
                interval=renewal_interval,
                backoff=renewal_backoff,
                cleanup_timeout=cleanup_timeout,
                names=RUNNER_NAMES,
            )
            self._pacing = pacing(idle_interval=idle_interval, backoff_interval=backoff_interval)
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._on_relinquished = on_relinquished
        self._stop = Event()
        self._watch: ReleaseWatch | None = None

    @property
    def work_id(self) -> str:
        return self._work_id

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called (a long-running term may poll it to end early)."""
        return self._stop.is_set()

    def stop(self) -> None:
        """Stop standing for election: waits end at once; a term in progress finishes first."""
        self._stop.set()
        watch = self._watch  # read after setting the flag: see _pause
        if watch is not None:
            watch.close()  # ends a wait on it at once

    def run_forever(self, fn: TokenCallback) -> None:
        """Stand for election, term after term, until cancelled or ``stop()``."""
        _check_fn(fn)
        self._refuse_if_stopped()
        while not self._stop.is_set():
            try:
                self._term(fn)
            except (LeaseHeldError, FencedError):
                pass  # somebody else leads, or we were fenced: stand again (paced already)
            except Exception:
                logger.exception("worklease leader term for %r failed", self._work_id)

    def run(self, fn: TokenCallback) -> None:
        """One election attempt; see the class documentation."""
        _check_fn(fn)
        self._refuse_if_stopped()
        self._term(fn)

    def _refuse_if_stopped(self) -> None:
        if self._stop.is_set():
            raise RuntimeError("this leader was stopped; build a new one to stand again")

    def _acquire(self, watch: ReleaseWatch | None) -> Token:
        """Acquire, waiting (stop-aware) when ``acquire_wait`` is set."""
        lease = self._lease
        options = self._options.acquire
        if not options.wait:
            return lease.acquire(self._work_id)
        pacing = WaitPacing(options.poll_interval)
        while True:
            started = datetime.now(UTC)
            try:
                return lease.acquire(self._work_id)
            except LeaseHeldError as held:
                if self._stop.is_set():
                    raise
                self._pause(pacing.next_delay(held.expires_at, started), watch)

    def _term(self, fn: TokenCallback) -> None:
        lease = self._lease
        # Opened before the attempt, so a release right after it still ends the wait.
        watch = self._watch = lease._watch_releases((self._work_id,))
        try:
            token = self._acquire(watch)
        except LeaseHeldError:
            self._pause(jittered(self._pacing.idle_interval), watch)
            raise
        except Exception:
            self._pause(self._pacing.backoff_interval)
            raise
        finally:
            self._watch = None
            if watch is not None:
                watch.close()
        try:
            self._callback(self._on_elected, token)
            renewal = lease._renewal(token, self._options.renewal)
        except BaseException as exc:  # cancelled before the term began: hand the lease back
            try:
                cleanup(
                    self._options.cleanup_timeout,
                    lease.release,
                    token,
                    ExitMode.ABANDONED,
                    self_bounded=lease._self_bounded,
                )
            except Exception as release_error:
                exc.add_note(f"worklease: releasing leadership failed: {release_error!r}")
            raise
        error: BaseException | None = None
        try:
            with renewal:
                call(fn, token)
        except BaseException as exc:
            error = exc
        cause = renewal.cause
        if error is cause:
            error = None  # the block raised the loss itself
        if cause is not None and (error is None or isinstance(error, Exception)):
            self._callback(self._on_lost, token)
        if isinstance(error, FencedError):
            raise error
        if isinstance(cause, FencedError):
            if error is not None and isinstance(error, Exception):
                raise _loss(cause) from error  # the term's own outcome, recorded nowhere
            raise _loss(cause)
        if cause is not None:  # lapsed or window exhausted: record nothing
            if error is not None and not isinstance(error, Exception):
                raise error
            self._pause(self._pacing.backoff_interval)
            if error is None:
                raise _loss(cause)
            if isinstance(error, Retire):  # nothing was recorded: not a success
                raise _loss(cause) from error
            raise error
        self._relinquish(token, error)

    def _relinquish(self, token: Token, error: BaseException | None) -> None:
        if error is None:
            mode = ExitMode.FINISHED
        elif isinstance(error, Retire):
            mode = ExitMode.RETIRED
        else:
            mode = ExitMode.ABANDONED
        state = error.state if isinstance(error, Retire) else None
        try:
            cleanup(
                self._options.cleanup_timeout,
                finish,
                self._lease,
                token,
                state,
                mode,
                self_bounded=self._lease._self_bounded,
            )
        except FencedError:
            if error is not None and not isinstance(error, Exception):
                raise error from None  # a cancellation or interrupt must not be swallowed
            raise
        except Exception as release_error:
            if error is not None and not isinstance(error, Exception):
                raise error  # noqa: B904 - a cancellation or interrupt: no pause
            self._pause(self._pacing.backoff_interval)
            if error is not None and not isinstance(error, Retire):
                error.add_note(f"worklease: releasing leadership failed: {release_error!r}")
                raise error  # noqa: B904 - the term's own error wins, its chain kept
            raise
        if mode is not ExitMode.ABANDONED:
            self._callback(self._on_relinquished, token)
        if error is not None and not isinstance(error, Exception):
            raise error  # cancellation or interrupt: no pause
        self._pause(self._pacing.backoff_interval)
        if error is not None and not isinstance(error, Retire):
            raise error

    def _pause(self, seconds: float, watch: ReleaseWatch | None = None) -> None:
        if watch is None:
            self._stop.wait(seconds)
        elif not self._stop.is_set():
            # stop() sets the flag before closing the watch it finds: either it closes this
            # one (ending the wait) or the flag is seen here.
            watch.wait(seconds)

    def _callback(self, callback: TokenCallback | None, token: Token) -> None:
        if callback is None:
            return
        try:
            call(callback, token)
        except Exception:
            logger.exception("worklease leader callback %r raised", callback)


def _check_fn(fn: TokenCallback | None) -> None:
    check_callable(fn, "leader function", WorkFnRequiredError)


def _loss(cause: BaseException) -> BaseException:
    return cause.with_traceback(None)
