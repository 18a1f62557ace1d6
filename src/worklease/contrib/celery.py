"""Celery integration: a task that runs at most once at a time per key and resumes from its
checkpoint.

Celery may deliver a task twice (``acks_late``, a worker lost mid-task, a retry racing a
slow first run), and many workers run tasks at once. A task built on ``LeasedTask`` holds a
lease on its key for the whole run: while one run holds the key, another run of the same key
does not start and is refused naming the holder (or retried later, or skipped: ``lease_on_held``).
The run reads how the previous run left (``current_hold().prior``) and checkpoints as it
goes; a run that fails releases the lease ABANDONED with its last checkpoint, so the next run
(Celery's retry, or a new delivery) resumes from there. A run that returns releases it
FINISHED; ``raise worklease.Retire`` retires the key.

    from celery import Celery
    from worklease.contrib.celery import LeasedTask, current_hold

    def build_lease() -> worklease.Lease:  # called once per worker process, after the fork
        pool = ConnectionPool(os.environ["WORKLEASE_DSN"], open=True)
        return worklease.Lease(worklease.PostgresBackend(pool), holder_id=..., ttl="30s")

    @app.task(base=LeasedTask, lease=build_lease, lease_key="export/{report_id}")
    def export_report(report_id: str) -> None:
        hold = current_hold()
        step = int(hold.prior.state or b"0")
        ...
        hold.checkpoint(str(step).encode())

Needs Celery (imported only by this module; ``import worklease.contrib`` never needs it).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any, Final

try:
    from celery import Task
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "worklease.contrib.celery needs Celery: pip install celery", name=exc.name
    ) from exc

from .. import ConfigError, Duration, Hold, Lease, LeaseHeldError
from .._compat import ThreadLock
from .._validation import non_negative_seconds

__all__ = ["ON_HELD", "LeasedTask", "current_hold"]

logger = logging.getLogger("worklease.contrib.celery")

ON_HELD: Final = ("raise", "retry", "skip")
"""What a run does when another run holds its key: fail with ``LeaseHeldError`` (naming
the holder), ``self.retry()`` after ``lease_retry_countdown`` seconds (Celery's
``max_retries`` applies; past it the ``LeaseHeldError`` is raised), or return ``None``
without running (logged)."""


class _Run:
    """The hold of a run in progress, and whether it was released early (by a retry)."""

    __slots__ = ("hold", "released")

    def __init__(self, hold: Hold) -> None:
        self.hold = hold
        self.released = False


class _Retrying(Exception):
    """How a retry leaves its hold: an exception, so the lease goes ABANDONED."""


_current: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
    "worklease_celery_run", default=None
)
_leases: dict[tuple[int, int], Lease] = {}
"""The leases lease functions built, by process and function."""
_building = ThreadLock()


def current_hold() -> Hold:
    """The hold of the ``LeasedTask`` run in progress (its ``token``, ``prior``,
    ``checkpoint()``, ``renewal``). ``RuntimeError`` outside one."""
    run = _current.get()
    if run is None:
        raise RuntimeError("current_hold() is only available inside a LeasedTask run")
    return run.hold


class LeasedTask(Task):
    """A Celery task base holding a lease on a key for each run (see the module docs).

    Options, given to ``@app.task(base=LeasedTask, ...)`` or set on a subclass:

    - ``lease``: a ``worklease.Lease``, or a function returning one; the function is called
      once per worker process (for all the tasks naming it), on the first run (after
      Celery's prefork workers forked: a connection pool must not cross a fork, so give a
      function, not a ``Lease`` whose pool is open, to a prefork worker).
    - ``lease_key``: the work ID of a run, a format string over the task's arguments
      (``"export/{report_id}"``, defaults applied) or a function taking the task's arguments.
    - ``lease_on_held``: ``"raise"`` (default), ``"retry"`` or ``"skip"`` (``ON_HELD``).
      A delivery after a worker was lost (``acks_late``) meets the dead worker's lease until
      its TTL runs out: ``"retry"`` with a countdown of at least the TTL resumes it then,
      where ``"raise"`` fails it and ``"skip"`` drops it.
    - ``lease_retry_countdown``: seconds before the retry of a refused run (default 5).
    """

    abstract = True
    lease: Lease | Callable[[], Lease] | None = None
    lease_key: str | Callable[..., str] | None = None
    lease_on_held: str = "raise"
    lease_retry_countdown: Duration = 5.0

    @property
    def hold(self) -> Hold:
        """The hold of the run in progress (``bind=True`` tasks: ``self.hold``)."""
        return current_hold()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        lease = self._lease()
        work_id = self._work_id(args, kwargs)
        on_held = self.lease_on_held
        if on_held not in ON_HELD:
            raise ConfigError(
                f"{self.name}: lease_on_held must be one of {', '.join(ON_HELD)}, got {on_held!r}"
            )
        try:
            held = lease.hold(work_id)
            held.__enter__()
        except LeaseHeldError as refused:
            return self._refused(refused, on_held)
        run = _Run(held)
        marker = _current.set(run)
        try:
            result = super().__call__(*args, **kwargs)
        except BaseException as exc:
            _current.reset(marker)
            if run.released or not held.__exit__(type(exc), exc, exc.__traceback__):
                raise
            return None  # Retire: the key is retired, the run succeeded
        _current.reset(marker)
        if not run.released:
            held.__exit__(None, None, None)
        return result

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's ``retry``, which first releases the run's lease ABANDONED (its last
        checkpoint stays): the retry is sent at once and must not find its own previous run
        still holding the key. After it (``throw=False``) the run holds nothing."""
        run = _current.get()
        if run is not None and not run.released:
            run.released = True
            run.hold.__exit__(_Retrying, _Retrying("retrying"), None)
        return super().retry(*args, **kwargs)

    # -- plumbing -----------------------------------------------------------------------------

    def _option(self, name: str) -> Any:
        """An option as given: a function set as a class attribute would come back bound."""
        option = inspect.getattr_static(self, name)
        return option.__func__ if isinstance(option, staticmethod) else option

    def _lease(self) -> Lease:
        option = self._option("lease")
        if isinstance(option, Lease):
            return option
        if not callable(option):
            raise ConfigError(
                f"{self.name}: LeasedTask needs the lease option: a worklease.Lease or a "
                f"function returning one, got {option!r}"
            )
        pid = os.getpid()
        with _building:
            lease = _leases.get((pid, id(option)))
            if lease is None:
                lease = option()
                if not isinstance(lease, Lease):
                    raise ConfigError(
                        f"{self.name}: the lease function returned {type(lease).__name__}, "
                        "not a worklease.Lease (this task runs in the sync flavour)"
                    )
                for key in [key for key in _leases if key[0] != pid]:
                    del _leases[key]  # a forked child drops its parent's
                _leases[(pid, id(option))] = lease
            return lease

    def _work_id(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        key = self._option("lease_key")
        if callable(key):
            work_id = key(*args, **kwargs)
        elif isinstance(key, str) and key:
            try:
                bound = inspect.signature(self.run).bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{self.name}(): {exc}") from None
            bound.apply_defaults()
            try:
                work_id = key.format(**bound.arguments)
            except (KeyError, IndexError, AttributeError) as exc:
                raise ConfigError(
                    f"{self.name}: lease_key {key!r} names {exc}, which is not an argument "
                    f"of the task ({', '.join(bound.arguments) or 'none'})"
                ) from None
        else:
            raise ConfigError(
                f"{self.name}: LeasedTask needs the lease_key option: a format string over "
                f"the task's arguments or a function, got {key!r}"
            )
        if not isinstance(work_id, str) or not work_id:
            raise ConfigError(f"{self.name}: lease_key gave {work_id!r}, not a work ID")
        return work_id

    def _refused(self, refused: LeaseHeldError, on_held: str) -> Any:
        if on_held == "skip":
            logger.info("%s: not run, %s", self.name, refused)
            return None
        if on_held == "retry":
            countdown = non_negative_seconds(self.lease_retry_countdown, "lease_retry_countdown")
            raise self.retry(exc=refused, countdown=countdown)
        raise refused
