"""The exception hierarchy shared by both flavours, and the rule for argument errors.

::

    WorkleaseError
    ├── ConfigError (also ValueError)
    │   ├── BackendRequiredError        backend missing
    │   ├── RetentionRequiredError      sweep retention not positive
    │   ├── LeaseRequiredError          runner / leader / pool built without a lease
    │   ├── WorkFnRequiredError         runner / leader / pool built without a work function
    │   └── PoolConfigError             every pool construction error
    │       ├── EmptyWorkIDsError
    │       ├── EmptyWorkIDError
    │       ├── DuplicateWorkIDError
    │       ├── PoolLeaseRequiredError  (also LeaseRequiredError)
    │       └── PoolWorkFnRequiredError (also WorkFnRequiredError)
    ├── InvalidTokenError (also ValueError)  token not issued through this backend, or altered
    ├── LeaseHeldError                  acquire: somebody holds the lease
    ├── LeaseLostError                  the holder no longer owns the lease
    │   ├── FencedError                 a newer token exists, or the row is gone
    │   ├── LeaseExpiredError           the lease lapsed or its exit was already declared
    │   ├── LeaseWindowExhaustedError   renewal could not succeed before the window closed
    │   ├── LeaseLapsedError            (both of the two above) renewal found the lease lapsed
    │   └── LeaseShedError              a pool hands the work ID back (fair share, or stop)
    ├── InvalidExitModeError (also ValueError)
    ├── AllSlotsDeadError               every pool slot failed permanently
    ├── BackendError                    a storage/driver failure (chained with ``raise ... from``)
    ├── Retire                          raised by a work function to retire its work ID
    └── PermanentError                  marks a pool slot failure as permanent

Argument errors follow one rule, in both flavours and every backend:

- **Building something raises** ``ConfigError`` (a subclass of it) for any option it cannot
  use, when it is built and before any I/O: the constructors of ``Lease``, ``Runner``,
  ``Leader``, ``Pool``, ``Vacuum``, the backends, ``Backoff`` and ``JSONCodec``, and the context
  managers ``lease.hold()`` and ``lease.renewal()`` (their work ID included). Every pool
  construction error is a ``PoolConfigError``. A value of the wrong type is a ``ConfigError``
  too (not a ``TypeError``), so one ``except ConfigError`` catches every bad setting.
- **Calling an operation raises** ``TypeError`` for an argument of the wrong type and
  ``ValueError`` for an unusable value, before any I/O (``acquire``, ``checkpoint``,
  ``release``, ``sweep``, ... and the backend methods). Named errors of operations are
  ``ValueError`` subclasses: ``InvalidExitModeError``, ``InvalidTokenError``, and two
  ``ConfigError`` subclasses the Go library names: ``RetentionRequiredError`` (a sweep's
  retention) and ``WorkFnRequiredError`` (the function given to ``leader.run()``).
- **Durations** are ``float``/``int`` seconds or a ``timedelta``: finite, within the range
  each parameter documents, and never longer than ``MAX_DURATION`` (100 years), so no
  deadline, timer or stored expiry can overflow. Flags (``wait``, ``include_expired``, ...)
  must be real ``bool`` values: a truthy string is refused, never guessed.

Match errors by type; message texts are not part of the compatibility promise.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._models import Token

__all__ = [
    "AllSlotsDeadError",
    "BackendError",
    "BackendRequiredError",
    "ConfigError",
    "DuplicateWorkIDError",
    "EmptyWorkIDError",
    "EmptyWorkIDsError",
    "FencedError",
    "InvalidExitModeError",
    "InvalidTokenError",
    "LeaseExpiredError",
    "LeaseHeldError",
    "LeaseLapsedError",
    "LeaseLostError",
    "LeaseRequiredError",
    "LeaseShedError",
    "LeaseWindowExhaustedError",
    "PermanentError",
    "PoolConfigError",
    "PoolLeaseRequiredError",
    "PoolWorkFnRequiredError",
    "RetentionRequiredError",
    "Retire",
    "WorkFnRequiredError",
    "WorkleaseError",
    "permanent",
]


class WorkleaseError(Exception):
    """Base class of every error raised by worklease."""

    __module__ = "worklease"


class ConfigError(WorkleaseError, ValueError):
    """A constructor or method received a configuration value it cannot use."""

    __module__ = "worklease"


class BackendRequiredError(ConfigError):
    """No backend was given where one is required."""

    __module__ = "worklease"


class RetentionRequiredError(ConfigError):
    """A sweep was asked for with a retention that is not a positive duration."""

    __module__ = "worklease"


class LeaseRequiredError(ConfigError):
    """A runner, leader or pool was built without a lease."""

    __module__ = "worklease"


class WorkFnRequiredError(ConfigError):
    """A runner, leader or pool was built without a work function."""

    __module__ = "worklease"


class PoolConfigError(ConfigError):
    """Base class of every pool construction error."""

    __module__ = "worklease"


class EmptyWorkIDsError(PoolConfigError):
    """A pool was given no work IDs."""

    __module__ = "worklease"


class EmptyWorkIDError(PoolConfigError):
    """A pool was given an empty work ID."""

    __module__ = "worklease"


class DuplicateWorkIDError(PoolConfigError):
    """A pool was given the same work ID twice."""

    __module__ = "worklease"


class PoolLeaseRequiredError(LeaseRequiredError, PoolConfigError):
    """A pool was built without a lease (both a ``LeaseRequiredError`` and a
    ``PoolConfigError``)."""

    __module__ = "worklease"


class PoolWorkFnRequiredError(WorkFnRequiredError, PoolConfigError):
    """A pool was built without a work function (both a ``WorkFnRequiredError`` and a
    ``PoolConfigError``)."""

    __module__ = "worklease"


class InvalidTokenError(WorkleaseError, ValueError):
    """The token was not issued by ``acquire`` on a lease over this backend, or was altered.

    Tokens are produced only by ``acquire``; building one by hand, copying one with changed
    fields, or passing one to a lease over a different backend is a programming error.
    """

    __module__ = "worklease"


class InvalidExitModeError(WorkleaseError, ValueError):
    """``release`` was given a mode other than FINISHED, ABANDONED or RETIRED."""

    __module__ = "worklease"


class LeaseHeldError(WorkleaseError):
    """The lease is held by a holder (possibly this one: leases are not re-entrant).

    ``holder_id`` and ``expires_at`` describe the current holder when the backend knows them,
    and are ``None`` otherwise.
    """

    __module__ = "worklease"

    def __init__(
        self,
        message: str,
        *,
        work_id: str | None = None,
        holder_id: str | None = None,
        expires_at: datetime | None = None,
    ) -> None:
        super().__init__(message)
        self.work_id = work_id
        self.holder_id = holder_id
        self.expires_at = expires_at

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class LeaseLostError(WorkleaseError):
    """The holder of a token no longer owns the lease.

    ``work_id``, ``holder_id`` and ``fencing_token`` describe the token that lost it, when known.
    """

    __module__ = "worklease"

    def __init__(self, message: str, *, token: Token | None = None) -> None:
        super().__init__(message)
        self.work_id: str | None = token.work_id if token is not None else None
        self.holder_id: str | None = token.holder_id if token is not None else None
        self.fencing_token: int | None = token.fencing_token if token is not None else None

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class FencedError(LeaseLostError):
    """A newer token exists for the work ID, or its row is gone: the caller is a zombie.

    Stop working at once; every further write with this token is rejected.
    """

    __module__ = "worklease"


class LeaseExpiredError(LeaseLostError):
    """The lease lapsed, or its holder already declared an exit with ``release``."""

    __module__ = "worklease"


class LeaseWindowExhaustedError(LeaseLostError):
    """Renewal did not succeed before the tracked lease window closed."""

    __module__ = "worklease"


class LeaseLapsedError(LeaseWindowExhaustedError, LeaseExpiredError):
    """A renewal found the lease already lapsed (it is both window-exhausted and expired)."""

    __module__ = "worklease"


class LeaseShedError(LeaseLostError):
    """A pool is handing this work ID back: another member takes it over (fair share), or
    the pool stops. Stop working on it.

    ``raise_if_lost()`` raises it (with asyncio the block is cancelled and raises it) once
    the pool decided. Unlike a real loss the lease is still held while the work stops: the
    pool writes the state the work function returns (or keeps the last checkpoint it wrote)
    and releases ABANDONED, so the next holder resumes from it at once.
    """

    __module__ = "worklease"


class AllSlotsDeadError(WorkleaseError):
    """Every slot of a pool ended with a permanent failure."""

    __module__ = "worklease"


class BackendError(WorkleaseError):
    """The storage backend failed; the driver's exception is the ``__cause__``.

    ``transient`` is true for failures worth retrying (connection loss, server restart,
    statement timeout, serialization failure, pool exhaustion).
    """

    __module__ = "worklease"

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class Retire(WorkleaseError):
    """Raised by a work function to retire its work ID for good.

    The lease is released with ``ExitMode.RETIRED``; ``state``, when not ``None``, is written as
    the final checkpoint first. Runners, holds and pools treat it as success.
    """

    __module__ = "worklease"

    def __init__(self, state: bytes | bytearray | memoryview | None = None) -> None:
        super().__init__("retire work ID")
        self.state = state

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.state,))


class PermanentError(WorkleaseError):
    """Marks a pool slot failure as permanent: the slot stops instead of retrying.

    Build one with :func:`permanent`; the original exception is the ``__cause__``. A subclass
    may override :meth:`permanent` to decide dynamically.
    """

    __module__ = "worklease"

    def permanent(self) -> bool:
        """Whether the failure is permanent (always true for this class)."""
        return True


def permanent(exc: BaseException) -> PermanentError:
    """Wrap ``exc`` in a :class:`PermanentError` whose ``__cause__`` is ``exc``.

    Raise the result from a pool work function to drop the slot without re-acquisition.
    """
    if isinstance(exc, PermanentError):
        return exc
    error = PermanentError(str(exc) or type(exc).__name__)
    error.__cause__ = exc
    return error


def _rebuild(cls: type[Exception], args: tuple[object, ...], state: dict[str, object]) -> Exception:
    error = Exception.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error
