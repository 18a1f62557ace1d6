"""The in-memory lease store behind both flavours of the memory backend.

All logic lives here, guarded by one lock; the flavour classes only adapt the call style.
Comparisons mirror PostgreSQL: a row is acquirable when ``now > expires_at``; renew and
release need ``now < expires_at``; sweep needs ``now > expires_at`` and
``now - updated_at > retention``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ._acompat import ThreadRLock
from ._failures import closed, fenced, held, lease_expired, lease_lapsed
from ._fairshare import PoolSurvey
from ._models import Checkpoint, ExitMode, Token
from ._validation import check_exit_mode, check_work_id, distinct_work_ids, normalize_state
from .errors import LeaseHeldError, LeaseLostError

__all__ = ["MemoryStore", "RowSnapshot", "system_clock"]

RELEASE_OFFSET = timedelta(milliseconds=1)
"""Release sets expiry this far before now, so the row is acquirable at once."""

_TINY = timedelta(microseconds=1)


def system_clock() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class _Row:
    holder_id: str
    fencing_token: int
    expires_at: datetime
    checkpoint: bytes | None
    exit_mode: ExitMode | None
    prev_exit: ExitMode
    prev_holder_id: str | None
    acquired_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class RowSnapshot:
    """A copy of one stored row (for inspection in tests and tools)."""

    work_id: str
    holder_id: str
    fencing_token: int
    expires_at: datetime
    checkpoint: bytes | None
    exit_mode: ExitMode | None
    prev_exit: ExitMode
    prev_holder_id: str | None
    acquired_at: datetime
    updated_at: datetime


class MemoryStore:
    """Lease rows in a dict, one lock, an injectable clock and a per-instance token counter.

    ``on_release(work_id)`` is called after a successful release or forget, once the lock is
    released (the memory backend wakes its release watches with it).
    """

    def __init__(
        self,
        clock: Callable[[], datetime] | None = None,
        on_release: Callable[[str], object] | None = None,
    ) -> None:
        self._now = clock or system_clock
        # Called with the work ID after a release or forget, outside the lock.
        self._on_release = on_release
        self._lock = ThreadRLock()
        self._rows: dict[str, _Row] = {}
        self._last_token = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Refuse every later operation (``BackendError``), like a closed PostgreSQL backend;
        the rows stay readable through ``rows()``."""
        self._closed = True

    def _open(self, operation: str) -> None:
        if self._closed:
            raise closed(operation)

    def check_open(self, operation: str) -> None:
        """``BackendError`` once closed."""
        self._open(operation)

    def now(self) -> datetime:
        value = self._now()
        if value.tzinfo is None:
            raise ValueError("the memory backend's clock must return timezone-aware datetimes")
        return value

    def acquire(self, work_id: str, holder_id: str, ttl: float) -> Token:
        check_work_id(work_id)
        self._open("acquire")
        with self._lock:
            now = self.now()
            expires_at = now + timedelta(seconds=ttl)
            if ttl <= 0:
                expires_at = min(expires_at, now - _TINY)
            row = self._rows.get(work_id)
            if row is not None and not now > row.expires_at:
                raise held(work_id, row.holder_id, row.expires_at)
            self._last_token += 1
            if row is None:
                self._rows[work_id] = _Row(
                    holder_id=holder_id,
                    fencing_token=self._last_token,
                    expires_at=expires_at,
                    checkpoint=None,
                    exit_mode=None,
                    prev_exit=ExitMode.NONE,
                    prev_holder_id=None,
                    acquired_at=now,
                    updated_at=now,
                )
            else:
                row.prev_exit = row.exit_mode or ExitMode.EXPIRED
                row.prev_holder_id = row.holder_id
                row.holder_id = holder_id
                row.fencing_token = self._last_token
                row.expires_at = expires_at
                row.exit_mode = None
                row.updated_at = now
            return Token(work_id, holder_id, self._last_token, expires_at)

    def acquire_with_checkpoint(
        self, work_id: str, holder_id: str, ttl: float
    ) -> tuple[Token, Checkpoint]:
        """Acquire and read the new holder's checkpoint in one step."""
        with self._lock:
            token = self.acquire(work_id, holder_id, ttl)
            return token, self.read_checkpoint(token)

    def acquire_many(
        self, work_ids: Sequence[str], holder_id: str, ttl: float
    ) -> list[tuple[Token, Checkpoint]]:
        """Acquire every free work ID of ``work_ids`` in one step (held ones are left out)."""
        ids = distinct_work_ids(work_ids)
        self._open("acquire_many")
        grants: list[tuple[Token, Checkpoint]] = []
        with self._lock:
            for work_id in ids:
                try:
                    grants.append(self.acquire_with_checkpoint(work_id, holder_id, ttl))
                except LeaseHeldError:
                    continue
        return grants

    def find_available(self, work_ids: Sequence[str]) -> list[str]:
        """The work IDs of ``work_ids`` that ``acquire`` would grant now, in input order."""
        ids = distinct_work_ids(work_ids)
        self._open("find_available")
        with self._lock:
            now = self.now()
            return [
                work_id
                for work_id in ids
                if (row := self._rows.get(work_id)) is None or now > row.expires_at
            ]

    def renew_many(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        """Renew every token in one step; per token ``None`` or the error ``renew`` raises."""
        distinct_work_ids([token.work_id for token in tokens])
        self._open("renew_many")
        outcomes: list[LeaseLostError | None] = []
        with self._lock:
            for token in tokens:
                try:
                    self.renew(token, ttl)
                except LeaseLostError as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
        return outcomes

    def checkpoint_many(
        self, items: Sequence[tuple[Token, bytes | None]], ttl: float
    ) -> list[LeaseLostError | None]:
        """Checkpoint every ``(token, state)`` in one step; per item ``None`` or the error
        ``checkpoint`` raises (states already normalized)."""
        distinct_work_ids([token.work_id for token, _ in items])
        self._open("checkpoint_many")
        outcomes: list[LeaseLostError | None] = []
        with self._lock:
            for token, state in items:
                try:
                    self.checkpoint(token, state, ttl)
                except LeaseLostError as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
        return outcomes

    def _owned(self, token: Token, operation: str) -> _Row:
        row = self._rows.get(token.work_id)
        if (
            row is None
            or row.fencing_token != token.fencing_token
            or row.holder_id != token.holder_id
        ):
            raise fenced(token, operation)
        return row

    def checkpoint(self, token: Token, state: object, ttl: float) -> None:
        data = normalize_state(state)
        self._open("checkpoint")
        with self._lock:
            row = self._owned(token, "checkpoint")
            if row.exit_mode is not None:
                raise lease_expired(
                    token, "checkpoint", f"the holder already released it ({row.exit_mode})"
                )
            now = self.now()
            row.checkpoint = data
            row.expires_at = now + timedelta(seconds=ttl)
            row.updated_at = now

    def commit_step(self, token: Token, state: bytes | None, write: bool, ttl: float) -> None:
        """A transactional step's commit: like ``checkpoint`` (``write``: set the state), but
        only while the lease has not lapsed (a step must never revive a lease)."""
        self._open("transaction")
        with self._lock:
            row = self._owned(token, "transaction")
            if row.exit_mode is not None:
                raise lease_expired(
                    token, "transaction", f"the holder already released it ({row.exit_mode})"
                )
            now = self.now()
            if not now < row.expires_at:
                raise lease_lapsed(token, "transaction")
            if write:
                row.checkpoint = state
            row.expires_at = now + timedelta(seconds=ttl)
            row.updated_at = now

    def renew(self, token: Token, ttl: float) -> None:
        self._open("renew")
        with self._lock:
            row = self._owned(token, "renew")
            now = self.now()
            if not now < row.expires_at:
                raise lease_expired(token, "renew", "the lease expired or was released")
            row.expires_at = now + timedelta(seconds=ttl)
            row.updated_at = now

    def release(self, token: Token, mode: ExitMode) -> None:
        declared = check_exit_mode(mode)
        self._open("release")
        with self._lock:
            self._release(token, declared, "release")
        if self._on_release is not None:
            self._on_release(token.work_id)

    def _release(self, token: Token, mode: ExitMode, operation: str) -> None:
        row = self._owned(token, operation)
        now = self.now()
        if not now < row.expires_at:
            raise lease_expired(token, operation, "the lease expired or was released")
        row.exit_mode = mode
        row.expires_at = now - RELEASE_OFFSET
        row.updated_at = now

    def release_many(self, tokens: Sequence[Token], mode: ExitMode) -> list[LeaseLostError | None]:
        """Release every token with ``mode`` in one step; per token ``None`` or the error
        ``release`` raises. Waiters are woken afterwards, outside the lock."""
        declared = check_exit_mode(mode)
        distinct_work_ids([token.work_id for token in tokens])
        self._open("release_many")
        outcomes: list[LeaseLostError | None] = []
        with self._lock:
            for token in tokens:
                try:
                    self._release(token, declared, "release")
                except LeaseLostError as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
        if self._on_release is not None:
            for token, outcome in zip(tokens, outcomes, strict=True):
                if outcome is None:
                    self._on_release(token.work_id)
        return outcomes

    def survey(self, work_ids: Sequence[str], prefix: str) -> PoolSurvey:
        """Who holds which of ``work_ids``, and the held leases whose work ID starts with
        ``prefix`` (with their checkpoints), in one step; writes nothing."""
        ids = distinct_work_ids(work_ids)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        self._open("survey")
        with self._lock:
            now = self.now()
            free: list[str] = []
            held: dict[str, int] = {}
            for work_id in ids:
                row = self._rows.get(work_id)
                if row is None or now > row.expires_at:
                    free.append(work_id)
                else:
                    held[row.holder_id] = held.get(row.holder_id, 0) + 1
            members = {
                row.holder_id: row.checkpoint
                for work_id, row in self._rows.items()
                if work_id.startswith(prefix) and now <= row.expires_at
            }
        return PoolSurvey(tuple(free), held, members)

    def read_checkpoint(self, token: Token) -> Checkpoint:
        self._open("read_checkpoint")
        with self._lock:
            row = self._rows.get(token.work_id)
            if row is None or row.fencing_token != token.fencing_token:
                raise fenced(token, "read_checkpoint")
            return Checkpoint(row.checkpoint, row.prev_exit, row.prev_holder_id)

    def forget(self, token: Token) -> None:
        self._open("forget")
        with self._lock:
            self._owned(token, "forget")
            del self._rows[token.work_id]
        if self._on_release is not None:
            self._on_release(token.work_id)

    def sweep(self, retention: float, include_expired: bool) -> int:
        keep_for = timedelta(seconds=retention)
        self._open("sweep")
        with self._lock:
            now = self.now()
            doomed = [
                work_id
                for work_id, row in self._rows.items()
                if now > row.expires_at
                and now - row.updated_at > keep_for
                and (
                    row.exit_mode is ExitMode.RETIRED or (include_expired and row.exit_mode is None)
                )
            ]
            for work_id in doomed:
                del self._rows[work_id]
            return len(doomed)

    def rows(self) -> list[RowSnapshot]:
        """A snapshot of every row, sorted by work ID."""
        with self._lock:
            return [
                RowSnapshot(
                    work_id,
                    row.holder_id,
                    row.fencing_token,
                    row.expires_at,
                    row.checkpoint,
                    row.exit_mode,
                    row.prev_exit,
                    row.prev_holder_id,
                    row.acquired_at,
                    row.updated_at,
                )
                for work_id, row in sorted(self._rows.items())
            ]
