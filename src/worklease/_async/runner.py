"""Runner: the whole acquire → read → work → checkpoint → release lifecycle for one call."""

from __future__ import annotations

from datetime import timedelta

from .._acompat import acall
from .._models import Checkpoint, Token
from .._types import AsyncWorkFn
from .._validation import positive_seconds
from .._window import Backoff
from ..errors import ConfigError, LeaseRequiredError, WorkFnRequiredError
from .hold import AsyncHold
from .lease import DEFAULT_CLEANUP_TIMEOUT, DEFAULT_POLL_INTERVAL, AsyncLease

__all__ = ["AsyncRunner"]


class AsyncRunner:
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
        lease: AsyncLease,
        work: AsyncWorkFn,
        *,
        cleanup_timeout: float | timedelta = DEFAULT_CLEANUP_TIMEOUT,
        acquire_wait: bool = False,
        acquire_timeout: float | timedelta | None = None,
        poll_interval: float | timedelta = DEFAULT_POLL_INTERVAL,
        renewal_interval: float | timedelta | None = None,
        renewal_backoff: Backoff | None = None,
    ) -> None:
        if lease is None:
            raise LeaseRequiredError("a lease is required")
        if work is None or not callable(work):
            raise WorkFnRequiredError("a work function is required")
        try:
            self._cleanup_timeout = positive_seconds(cleanup_timeout, "cleanup_timeout")
            self._poll_interval = positive_seconds(poll_interval, "poll_interval")
            self._renewal_interval = (
                None
                if renewal_interval is None
                else positive_seconds(renewal_interval, "renewal_interval")
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        if renewal_backoff is not None and not isinstance(renewal_backoff, Backoff):
            raise ConfigError(
                f"renewal_backoff must be a Backoff, not {type(renewal_backoff).__name__}"
            )
        if acquire_timeout is not None and not acquire_wait:
            raise ConfigError("acquire_timeout applies only with acquire_wait=True")
        self._lease = lease
        self._work = work
        self._acquire_wait = acquire_wait
        self._acquire_timeout = acquire_timeout
        self._renewal_backoff = renewal_backoff

    @property
    def lease(self) -> AsyncLease:
        return self._lease

    async def run(self, work_id: str) -> None:
        """Run the work function once under the lease on ``work_id`` (see the class doc)."""
        await self._run(work_id, None)

    async def _run(self, work_id: str, granted: tuple[Token, Checkpoint | None] | None) -> None:
        """``run``, or with ``granted`` the same cycle on a lease acquired beforehand."""
        async with AsyncHold(
            self._lease,
            work_id,
            wait=self._acquire_wait,
            timeout=self._acquire_timeout,
            poll_interval=self._poll_interval,
            interval=self._renewal_interval,
            backoff=self._renewal_backoff,
            cleanup_timeout=self._cleanup_timeout,
            granted=granted,
        ) as held:
            held.finish_with(await acall(self._work, held.token, held.prior))
