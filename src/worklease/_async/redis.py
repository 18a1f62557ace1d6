"""The Redis / Valkey backend (redis-py), written once for both flavours: the decisions live
in ``worklease._redis``; this module sends the scripts and waits."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from .._aredis import ClusterClient, RedisClient, redis_errors
from .._failures import closed, first_line
from .._models import Checkpoint, ExitMode, Token
from .._redis import (
    ACQUIRE,
    CHECKPOINT,
    DEFAULT_PREFIX,
    FORGET,
    READ,
    RELEASE,
    RELEASE_CHANNEL,
    RENEW,
    ROW_FIELDS,
    SWEEP,
    Grant,
    Row,
    at,
    check_prefix,
    decode_grant,
    decode_guarded,
    decode_read,
    decode_row,
    key_of,
    milliseconds,
    scan_pattern,
)
from .._validation import (
    backend_ttl,
    check_exit_mode,
    check_flag,
    check_work_id,
    non_negative_seconds,
    normalize_state,
)
from ..errors import BackendError, ConfigError, LeaseHeldError
from .backend import StateLike

__all__ = ["AsyncRedisBackend"]

_PERMANENT = (redis_errors.AuthenticationError, redis_errors.AuthorizationError)
"""Connection errors that no retry mends: wrong credentials, a missing permission."""
_TRANSIENT = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    redis_errors.ReadOnlyError,  # a replica answered (a failover in progress, a stale route)
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
)
_TRANSIENT_REPLIES = ("BUSY", "NOREPLICAS", "MASTERDOWN", "LOADING")


def backend_error(exc: BaseException, operation: str) -> BackendError:
    """A redis-py failure as ``BackendError``, transient when waiting may mend it."""
    detail = f"{type(exc).__name__}: {first_line(exc)}"
    if isinstance(exc, _PERMANENT):
        return BackendError(f"{operation}: Redis refused the client ({detail})")
    if isinstance(exc, _TRANSIENT) or str(exc).startswith(_TRANSIENT_REPLIES):
        return BackendError(f"{operation}: Redis did not answer ({detail})", transient=True)
    if isinstance(exc, redis_errors.RedisClusterException):  # slot not covered, and the like
        return BackendError(f"{operation}: Redis Cluster error ({detail})", transient=True)
    return BackendError(f"{operation}: Redis error: {detail}")


_FAILURES = (redis_errors.RedisError, redis_errors.RedisClusterException)


class AsyncRedisBackend:
    """Lease rows in Redis 7 (or Valkey), one hash per work ID (ADR-0020).

    ``client``: a redis-py client of this flavour (``Redis``, a ``RedisCluster``, or a
    Sentinel's ``master_for(...)``), created with ``decode_responses=False`` (checkpoints are
    bytes). The backend never closes it. ``prefix``: where the keys live (``worklease:`` by
    default; several applications can share one server, with prefixes none of which starts
    another: ``q:`` would also read ``q:tenant:``'s rows).

    A client that retries a command after sending it (redis-py's ``Retry``) may send a write
    twice: a repeated release or forget succeeds, a repeated checkpoint or renew writes the
    same again, but a repeated acquire finds the lease held, by this very holder, until its
    TTL: give the client no retries on ``TimeoutError`` if that matters (the lease layer
    retries renewals itself).

    Every operation is one server-side script on one key: the token, holder, exit and expiry
    are checked and written in one atomic step, with the server's ``TIME`` as the clock, so
    no client clock decides expiry. Fencing tokens are ``max(previous + 1, server ms *
    1024)``: strictly increasing per work ID, and greater than any token a failover's lost
    writes took along while the servers' clocks differ by less than the failover detection
    time (ADR-0020). ``transaction()`` is absent: Redis holds no rows of yours.
    """

    __module__ = "worklease"

    def __init__(
        self, client: RedisClient | ClusterClient, *, prefix: str = DEFAULT_PREFIX
    ) -> None:
        if not isinstance(client, RedisClient | ClusterClient):
            raise ConfigError(
                "expected a redis-py client of this flavour (Redis or RedisCluster), not "
                f"{type(client).__name__}"
            )
        if client.get_encoder().decode_responses:
            raise ConfigError("the client decodes responses: create it with decode_responses=False")
        self._client = client
        self._prefix = check_prefix(prefix)
        self._acquire = client.register_script(ACQUIRE)
        self._renew = client.register_script(RENEW)
        self._checkpoint = client.register_script(CHECKPOINT)
        self._release = client.register_script(RELEASE)
        self._forget = client.register_script(FORGET)
        self._read = client.register_script(READ)
        self._sweep = client.register_script(SWEEP)
        self._closed = False

    @property
    def prefix(self) -> str:
        return self._prefix

    def __repr__(self) -> str:
        return f"<{type(self).__name__} prefix={self._prefix!r}>"

    # -- transport -------------------------------------------------------------------------

    async def _call(
        self, operation: str, script: Any, key: str, args: list[Any], *, expect_list: bool = True
    ) -> Any:
        if self._closed:
            raise closed(operation)
        try:
            reply = await script(keys=[key], args=args)
        except _FAILURES as exc:
            raise backend_error(exc, operation) from exc
        if expect_list and not isinstance(reply, list):
            raise BackendError(f"{operation}: unexpected reply from the server: {reply!r}")
        return reply

    def _key(self, work_id: str) -> str:
        return key_of(self._prefix, work_id)

    @staticmethod
    def _guard(token: Token) -> list[Any]:
        return [str(token.fencing_token), token.holder_id]

    # -- the lease operations --------------------------------------------------------------

    async def acquire(self, work_id: str, holder_id: str, ttl: float) -> Token:
        token, _ = await self.acquire_with_checkpoint(work_id, holder_id, ttl)
        return token

    async def acquire_with_checkpoint(
        self, work_id: str, holder_id: str, ttl: float
    ) -> tuple[Token, Checkpoint]:
        """Acquire and return the new holder's checkpoint in one step (optional method)."""
        check_work_id(work_id)
        seconds = backend_ttl(ttl)
        reply = await self._call(
            "acquire", self._acquire, self._key(work_id), [holder_id, milliseconds(seconds)]
        )
        outcome = decode_grant(work_id, reply)
        if isinstance(outcome, LeaseHeldError):
            raise outcome
        return self._token(work_id, holder_id, outcome), outcome.prior

    @staticmethod
    def _token(work_id: str, holder_id: str, grant: Grant) -> Token:
        return Token(work_id, holder_id, grant.fencing_token, grant.expires_at)

    async def read_checkpoint(self, token: Token) -> Checkpoint:
        reply = await self._call(
            "read_checkpoint", self._read, self._key(token.work_id), [str(token.fencing_token)]
        )
        return decode_read(token, reply)

    async def checkpoint(self, token: Token, state: StateLike | None, ttl: float) -> None:
        data = normalize_state(state)
        seconds = backend_ttl(ttl)
        args = [*self._guard(token), milliseconds(seconds), data or b""]
        reply = await self._call("checkpoint", self._checkpoint, self._key(token.work_id), args)
        decode_guarded(token, "checkpoint", reply)

    async def renew(self, token: Token, ttl: float) -> None:
        seconds = backend_ttl(ttl)
        args = [*self._guard(token), milliseconds(seconds)]
        reply = await self._call("renew", self._renew, self._key(token.work_id), args)
        decode_guarded(token, "renew", reply)

    async def release(self, token: Token, mode: ExitMode) -> None:
        declared = check_exit_mode(mode)
        args = [*self._guard(token), declared.value, RELEASE_CHANNEL, token.work_id]
        reply = await self._call("release", self._release, self._key(token.work_id), args)
        decode_guarded(token, "release", reply)

    async def forget(self, token: Token) -> None:
        args = [*self._guard(token), RELEASE_CHANNEL, token.work_id]
        reply = await self._call("forget", self._forget, self._key(token.work_id), args)
        decode_guarded(token, "forget", [*reply, 0])

    # -- housekeeping ----------------------------------------------------------------------

    async def _server_ms(self, operation: str) -> int:
        try:
            seconds, micros = await self._client.time()
        except _FAILURES as exc:
            raise backend_error(exc, operation) from exc
        return int(seconds) * 1000 + int(micros) // 1000

    async def _rows(self, operation: str) -> list[Row]:
        """Every lease row under the prefix (``SCAN``, never ``KEYS``)."""
        if self._closed:
            raise closed(operation)
        found: list[Row] = []
        try:
            seen: dict[bytes, None] = {}  # SCAN may return a key more than once
            async for key in self._client.scan_iter(match=scan_pattern(self._prefix), count=500):
                seen[key] = None
            keys = list(seen)
            for start in range(0, len(keys), 500):
                part = keys[start : start + 500]
                pipe = self._client.pipeline(transaction=False)
                for key in part:
                    pipe.hmget(key, list(ROW_FIELDS[:-1]))
                    pipe.hstrlen(key, "c")
                replies = await pipe.execute(raise_on_error=False)
                for index, key in enumerate(part):
                    fields, size = replies[2 * index], replies[2 * index + 1]
                    failed = next((r for r in (fields, size) if isinstance(r, Exception)), None)
                    if failed is not None:
                        if str(failed).startswith("WRONGTYPE"):
                            continue  # not a hash: another application's key under the prefix
                        raise failed
                    row = decode_row(self._prefix, key, [*fields, size])
                    if row is not None:
                        found.append(row)
        except _FAILURES as exc:
            raise backend_error(exc, operation) from exc
        return found

    async def sweep(self, retention: float, include_expired: bool) -> int:
        keep_for = non_negative_seconds(retention, "retention")
        expired_too = check_flag(include_expired, "include_expired")
        rows = await self._rows("sweep")
        now = await self._server_ms("sweep")  # a first guess: each script reads its own clock
        retention_ms = milliseconds(keep_for) if keep_for > 0 else 0
        deleted = 0
        for row in rows:
            if not row.sweepable(now, now - retention_ms + 1, expired_too):
                continue
            reply = await self._call(
                "sweep",
                self._sweep,
                self._key(row.work_id),
                [str(row.token), str(retention_ms), "1" if expired_too else "0"],
                expect_list=False,
            )
            deleted += int(reply == 1)
        return deleted

    async def rows(self) -> list[dict[str, Any]]:
        """Every work ID under the prefix, as a plain dict per work ID (for tools and the
        CLI): holder, token, held, checkpoint size, exit fields, the TTL left in seconds
        (server time) and the last write's time."""
        rows = await self._rows("status")
        now = await self._server_ms("status")
        return [
            {
                "work_id": row.work_id,
                "holder_id": row.holder_id,
                "fencing_token": row.token,
                "held": row.held(now),
                "ttl_left": max((row.expires_ms - now) / 1000, 0.0) if row.held(now) else None,
                "checkpoint_bytes": row.checkpoint_bytes,
                "exit_mode": row.exit_mode,
                "prev_exit": row.prev_exit,
                "prev_holder_id": row.prev_holder_id,
                "updated_at": at(row.updated_ms) if row.updated_ms else None,
            }
            for row in sorted(rows, key=lambda row: row.work_id)
        ]

    # -- lifecycle -------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the backend (idempotent): later operations raise ``BackendError``. The
        client is the caller's and stays open; leases stay in Redis until they expire."""
        self._closed = True

    async def __aenter__(self) -> AsyncRedisBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
