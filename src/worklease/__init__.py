"""worklease: lease-based work coordination with checkpointed handoff.

A worker acquires a time-limited lease on a work ID and gets a fencing token; it renews the
lease in the background and writes progress checkpoints, each stored atomically with a lease
extension and rejected once a newer token exists. The successor reads the last checkpoint
and how the previous holder left.

Two flavours with the same API: ``AsyncLease`` & co. for asyncio, ``Lease`` & co. for
threads and scripts. Backends: PostgreSQL for production, in-memory for tests.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ._context import current_renewal as current_renewal
from ._fairshare import PoolSurvey as PoolSurvey
from ._models import Checkpoint as Checkpoint
from ._models import DeclaredExit as DeclaredExit
from ._models import ExitMode as ExitMode
from ._models import Operation as Operation
from ._models import Token as Token
from ._sync.backend import AcquireMany as AcquireMany
from ._sync.backend import AcquireWithCheckpoint as AcquireWithCheckpoint
from ._sync.backend import Backend as Backend
from ._sync.backend import BackendTransaction as BackendTransaction
from ._sync.backend import CheckpointMany as CheckpointMany
from ._sync.backend import FindAvailable as FindAvailable
from ._sync.backend import ReleaseMany as ReleaseMany
from ._sync.backend import RenewMany as RenewMany
from ._sync.backend import Survey as Survey
from ._sync.backend import Transactional as Transactional
from ._sync.hold import Hold as Hold
from ._sync.leader import Leader as Leader
from ._sync.lease import Lease as Lease
from ._sync.memory import MemoryBackend as MemoryBackend
from ._sync.pool import Pool as Pool
from ._sync.renewal import Renewal as Renewal
from ._sync.runner import Runner as Runner
from ._sync.transaction import LeaseTransaction as LeaseTransaction
from ._sync.vacuum import Vacuum as Vacuum
from ._sync.watch import ReleaseWatching as ReleaseWatching
from ._types import AsyncTokenCallback as AsyncTokenCallback
from ._types import AsyncWorkFn as AsyncWorkFn
from ._types import TokenCallback as TokenCallback
from ._types import WorkFn as WorkFn
from ._validation import MAX_DURATION as MAX_DURATION
from ._validation import Duration as Duration
from ._window import Backoff as Backoff
from .codec import Codec as Codec
from .codec import JSONCodec as JSONCodec
from .errors import AllSlotsDeadError as AllSlotsDeadError
from .errors import BackendError as BackendError
from .errors import BackendRequiredError as BackendRequiredError
from .errors import ConfigError as ConfigError
from .errors import DuplicateWorkIDError as DuplicateWorkIDError
from .errors import EmptyWorkIDError as EmptyWorkIDError
from .errors import EmptyWorkIDsError as EmptyWorkIDsError
from .errors import FencedError as FencedError
from .errors import InvalidExitModeError as InvalidExitModeError
from .errors import InvalidTokenError as InvalidTokenError
from .errors import LeaseExpiredError as LeaseExpiredError
from .errors import LeaseHeldError as LeaseHeldError
from .errors import LeaseLapsedError as LeaseLapsedError
from .errors import LeaseLostError as LeaseLostError
from .errors import LeaseRequiredError as LeaseRequiredError
from .errors import LeaseShedError as LeaseShedError
from .errors import LeaseWindowExhaustedError as LeaseWindowExhaustedError
from .errors import PermanentError as PermanentError
from .errors import PoolConfigError as PoolConfigError
from .errors import PoolLeaseRequiredError as PoolLeaseRequiredError
from .errors import PoolWorkFnRequiredError as PoolWorkFnRequiredError
from .errors import RetentionRequiredError as RetentionRequiredError
from .errors import Retire as Retire
from .errors import WorkFnRequiredError as WorkFnRequiredError
from .errors import WorkleaseError as WorkleaseError
from .errors import permanent as permanent
from .observers import AcquireEvent as AcquireEvent
from .observers import BalanceEvent as BalanceEvent
from .observers import CheckpointEvent as CheckpointEvent
from .observers import FencedEvent as FencedEvent
from .observers import ForgetEvent as ForgetEvent
from .observers import LeaseObserver as LeaseObserver
from .observers import PoolObserver as PoolObserver
from .observers import ReadCheckpointEvent as ReadCheckpointEvent
from .observers import ReleaseEvent as ReleaseEvent
from .observers import RenewEvent as RenewEvent
from .observers import ScanEvent as ScanEvent
from .observers import SlotAcquiredEvent as SlotAcquiredEvent
from .observers import SlotBackoffEvent as SlotBackoffEvent
from .observers import SlotDeadEvent as SlotDeadEvent
from .observers import SlotLostEvent as SlotLostEvent
from .observers import SlotRetiredEvent as SlotRetiredEvent
from .observers import SlotShedEvent as SlotShedEvent
from .observers import SweepEvent as SweepEvent
from .observers import VacuumObserver as VacuumObserver

# Imported on first use (PEP 562): the PostgreSQL and etcd names, which load psycopg or httpx
# (so the memory backend, FakeClock and the quick start work where psycopg or libpq is
# missing), and the asyncio flavour, which loads asyncio (so `import worklease` in a threaded
# program does not).
if TYPE_CHECKING:
    from ._async.backend import AsyncAcquireMany as AsyncAcquireMany
    from ._async.backend import AsyncAcquireWithCheckpoint as AsyncAcquireWithCheckpoint
    from ._async.backend import AsyncBackend as AsyncBackend
    from ._async.backend import AsyncBackendTransaction as AsyncBackendTransaction
    from ._async.backend import AsyncCheckpointMany as AsyncCheckpointMany
    from ._async.backend import AsyncFindAvailable as AsyncFindAvailable
    from ._async.backend import AsyncReleaseMany as AsyncReleaseMany
    from ._async.backend import AsyncRenewMany as AsyncRenewMany
    from ._async.backend import AsyncSurvey as AsyncSurvey
    from ._async.backend import AsyncTransactional as AsyncTransactional
    from ._async.check import acheck_postgres as acheck_postgres
    from ._async.etcd import AsyncEtcdBackend as AsyncEtcdBackend
    from ._async.hold import AsyncHold as AsyncHold
    from ._async.leader import AsyncLeader as AsyncLeader
    from ._async.lease import AsyncLease as AsyncLease
    from ._async.memory import AsyncMemoryBackend as AsyncMemoryBackend
    from ._async.pool import AsyncPool as AsyncPool
    from ._async.postgres import AsyncPostgresBackend as AsyncPostgresBackend
    from ._async.redis import AsyncRedisBackend as AsyncRedisBackend
    from ._async.redis_check import acheck_redis as acheck_redis
    from ._async.renewal import AsyncRenewal as AsyncRenewal
    from ._async.runner import AsyncRunner as AsyncRunner
    from ._async.transaction import AsyncLeaseTransaction as AsyncLeaseTransaction
    from ._async.vacuum import AsyncVacuum as AsyncVacuum
    from ._async.watch import AsyncReleaseWatching as AsyncReleaseWatching
    from ._check import CheckFinding as CheckFinding
    from ._check import CheckReport as CheckReport
    from ._pg import schema_sql as schema_sql
    from ._sync.check import check_postgres as check_postgres
    from ._sync.etcd import EtcdBackend as EtcdBackend
    from ._sync.postgres import PostgresBackend as PostgresBackend
    from ._sync.redis import RedisBackend as RedisBackend
    from ._sync.redis_check import check_redis as check_redis

_LAZY = {
    # the asyncio flavour loads asyncio: a program using threads never imports it
    "AsyncAcquireMany": "._async.backend",
    "AsyncAcquireWithCheckpoint": "._async.backend",
    "AsyncBackend": "._async.backend",
    "AsyncBackendTransaction": "._async.backend",
    "AsyncCheckpointMany": "._async.backend",
    "AsyncFindAvailable": "._async.backend",
    "AsyncReleaseMany": "._async.backend",
    "AsyncRenewMany": "._async.backend",
    "AsyncSurvey": "._async.backend",
    "AsyncTransactional": "._async.backend",
    "AsyncHold": "._async.hold",
    "AsyncLeader": "._async.leader",
    "AsyncLease": "._async.lease",
    "AsyncMemoryBackend": "._async.memory",
    "AsyncPool": "._async.pool",
    "AsyncRenewal": "._async.renewal",
    "AsyncRunner": "._async.runner",
    "AsyncLeaseTransaction": "._async.transaction",
    "AsyncVacuum": "._async.vacuum",
    "AsyncReleaseWatching": "._async.watch",
    # the etcd backend loads httpx (the ``etcd`` extra)
    "AsyncEtcdBackend": "._async.etcd",
    "EtcdBackend": "._sync.etcd",
    # the Redis backend loads redis-py (the ``redis`` extra)
    "AsyncRedisBackend": "._async.redis",
    "RedisBackend": "._sync.redis",
    "AsyncPostgresBackend": "._async.postgres",
    "PostgresBackend": "._sync.postgres",
    "acheck_postgres": "._async.check",
    "check_postgres": "._sync.check",
    "acheck_redis": "._async.redis_check",
    "check_redis": "._sync.redis_check",
    "CheckFinding": "._check",
    "CheckReport": "._check",
    "schema_sql": "._pg",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'worklease' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0.dev0"

__all__ = [
    "MAX_DURATION",
    "AcquireEvent",
    "AcquireMany",
    "AcquireWithCheckpoint",
    "AllSlotsDeadError",
    "AsyncAcquireMany",
    "AsyncAcquireWithCheckpoint",
    "AsyncBackend",
    "AsyncBackendTransaction",
    "AsyncFindAvailable",
    "AsyncHold",
    "AsyncLeader",
    "AsyncLease",
    "AsyncLeaseTransaction",
    "AsyncMemoryBackend",
    "AsyncPool",
    "AsyncEtcdBackend",
    "AsyncRedisBackend",
    "AsyncPostgresBackend",
    "AsyncCheckpointMany",
    "AsyncReleaseMany",
    "AsyncReleaseWatching",
    "AsyncRenewMany",
    "AsyncRenewal",
    "AsyncRunner",
    "AsyncSurvey",
    "AsyncTokenCallback",
    "AsyncTransactional",
    "AsyncVacuum",
    "AsyncWorkFn",
    "Backend",
    "BackendError",
    "BackendRequiredError",
    "BackendTransaction",
    "Backoff",
    "BalanceEvent",
    "CheckFinding",
    "CheckReport",
    "Checkpoint",
    "CheckpointEvent",
    "Codec",
    "ConfigError",
    "DeclaredExit",
    "Duration",
    "DuplicateWorkIDError",
    "EmptyWorkIDError",
    "EmptyWorkIDsError",
    "ExitMode",
    "FencedError",
    "FencedEvent",
    "FindAvailable",
    "ForgetEvent",
    "Hold",
    "InvalidExitModeError",
    "InvalidTokenError",
    "JSONCodec",
    "Leader",
    "Lease",
    "LeaseExpiredError",
    "LeaseHeldError",
    "LeaseLapsedError",
    "LeaseLostError",
    "LeaseObserver",
    "LeaseRequiredError",
    "LeaseShedError",
    "LeaseTransaction",
    "LeaseWindowExhaustedError",
    "MemoryBackend",
    "Operation",
    "PermanentError",
    "Pool",
    "PoolConfigError",
    "PoolLeaseRequiredError",
    "PoolObserver",
    "PoolSurvey",
    "PoolWorkFnRequiredError",
    "EtcdBackend",
    "RedisBackend",
    "PostgresBackend",
    "ReadCheckpointEvent",
    "ReleaseEvent",
    "CheckpointMany",
    "ReleaseMany",
    "ReleaseWatching",
    "RenewEvent",
    "RenewMany",
    "Renewal",
    "RetentionRequiredError",
    "Retire",
    "Runner",
    "ScanEvent",
    "SlotAcquiredEvent",
    "SlotBackoffEvent",
    "SlotDeadEvent",
    "SlotLostEvent",
    "SlotRetiredEvent",
    "SlotShedEvent",
    "Survey",
    "SweepEvent",
    "Token",
    "TokenCallback",
    "Transactional",
    "Vacuum",
    "VacuumObserver",
    "WorkFn",
    "WorkFnRequiredError",
    "WorkleaseError",
    "__version__",
    "acheck_postgres",
    "acheck_redis",
    "check_postgres",
    "check_redis",
    "current_renewal",
    "permanent",
    "schema_sql",
]
