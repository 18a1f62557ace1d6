# Generated from src/worklease/_async/runner.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Runner: the whole acquire → read → work → checkpoint → release lifecycle for one call."""

from __future__ import annotations

from collections.abc import Callable

from .._compat import call
from .._models import Checkpoint, ExitMode, Token
from .._options import (
    DEFAULT_CLEANUP_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    RUNNER_NAMES,
    HoldOptions,
    check_callable,
    check_instance,
    configuring,
    hold_options,
)
from .._types import Releaser, WorkFn
from .._validation import Duration
from .._window import Backoff
from ..errors import ConfigError, LeaseRequiredError, WorkFnRequiredError
from .hold import Hold
from .lease import Lease

__all__ = ["Runner"]


class Runner:
    """Runs a work function under a lease on a work ID.

    ``run(work_id)`` acquires the lease, reads the checkpoint, keeps the lease renewed while
    ``work(token, prior)`` runs, and then:

    - the work returns ``None`` → the checkpoint stays as it is; released FINISHED;
    - it returns bytes (even empty) → written as the final checkpoint; released FINISHED
      (empty bytes clear the checkpoint);
    - it raises ``Retire(state)`` → ``state`` is written if not ``None``; released RETIRED;
      ``run`` returns normally;
    - it raises anything else (or the caller cancels) → released ABANDONED keeping the last
      checkpoint written, and the exception propagates;
    - the lease was lost (fenced, lapsed, window exhausted) → nothing is written; the loss
      propagates.

    The final writes survive cancellation but are bounded by ``cleanup_timeout`` seconds.
    ``acquire_wait``, ``acquire_timeout`` and ``poll_interval`` control acquisition;
    ``renewal_interval`` and ``renewal_backoff`` the renewal. A runner may run many work IDs,
    also concurrently.
    """

    __module__ = "worklease"

    def __init__(
        self,
        lease: Lease,
        work: WorkFn,
        *,
        cleanup_timeout: Duration = DEFAULT_CLEANUP_TIMEOUT,
        acquire_wait: bool = False,
        acquire_timeout: Duration | None = None,
        poll_interval: Duration = DEFAULT_POLL_INTERVAL,
        renewal_interval: Duration | None = None,
        renewal_backoff: Backoff | None = None,
    ) -> None:
        self._lease = check_instance(lease, Lease, "lease", LeaseRequiredError)
        self._work = check_callable(work, "work function", WorkFnRequiredError)
        with configuring(ConfigError):
            self._options = hold_options(
                wait=acquire_wait,
                timeout=acquire_timeout,
                poll_interval=poll_interval,
                interval=renewal_interval,
                backoff=renewal_backoff,
                cleanup_timeout=cleanup_timeout,
                names=RUNNER_NAMES,
            )
        self._release: Releaser | None = None
        self._defer: Callable[[Token, ExitMode], bool] | None = None

    @classmethod
    def _with_options(
        cls,
        lease: Lease,
        work: WorkFn,
        options: HoldOptions,
        release: Releaser | None = None,
        defer: Callable[[Token, ExitMode], bool] | None = None,
    ) -> Runner:
        """A runner with options checked already, releasing through ``release`` and offering
        plain final releases to ``defer`` (a pool's, see ``AsyncHold``)."""
        runner = cls.__new__(cls)
        runner._lease = lease
        runner._work = work
        runner._options = options
        runner._release = release
        runner._defer = defer
        return runner

    @property
    def lease(self) -> Lease:
        return self._lease

    def run(self, work_id: str) -> None:
        """Run the work function once under the lease on ``work_id`` (see the class doc)."""
        self._run(work_id, None)

    def _run(self, work_id: str, granted: tuple[Token, Checkpoint | None] | None) -> None:
        """``run``, or with ``granted`` the same cycle on a lease acquired beforehand."""
        with Hold(self._lease, work_id, self._options, granted, self._release, self._defer) as held:
            held.finish_with(call(self._work, held.token, held.prior))
