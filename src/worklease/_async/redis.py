"""The Redis / Valkey backend (redis-py), written once for both flavours: the decisions live
in ``worklease._redis``; this module sends the scripts and waits."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any

from .._acompat import AEvent, AWorker, acancel_worker, ajoin_all, aspawn
from .._aredis import ClusterClient, RedisClient, Sentinel, redis_errors
from .._failures import closed, first_line
from .._fairshare import PoolSurvey
from .._models import Checkpoint, ExitMode, Token
from .._redis import (
    ACQUIRE,
    BATCH,
    CHECKPOINT,
    DEFAULT_PREFIX,
    EXPIRE,
    FORGET,
    HOLDER,
    READ,
    RELEASE,
    RELEASE_CHANNEL,
    RENEW,
    ROW_FIELDS,
    SWEEP,
    Grant,
    RedisTarget,
    Row,
    at,
    check_prefix,
    check_replicas,
    check_replicated,
    decode_grant,
    decode_guarded,
    decode_holder,
    decode_read,
    decode_row,
    key_of,
    milliseconds,
    outcome,
    parse_redis_url,
    request_id,
    scan_pattern,
    work_id_of,
)
from .._validation import (
    backend_ttl,
    check_exit_mode,
    check_flag,
    check_work_id,
    distinct_work_ids,
    non_negative_seconds,
    normalize_state,
    positive_seconds,
)
from .._window import Backoff
from ..errors import BackendError, ConfigError, LeaseHeldError, LeaseLostError
from .backend import StateLike
from .watch import AsyncReleaseHub, AsyncReleaseWatch

__all__ = ["AsyncRedisBackend"]

logger = logging.getLogger("worklease")

_WATCH_TICK = 0.25
"""How long the release watch waits for a message before it looks whether it should stop."""

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


CONNECT_TIMEOUT = 5.0
"""``from_url``'s default seconds for connecting and for each reply."""


def _client_for(target: RedisTarget, timeout: float) -> tuple[Any, Any]:
    """A client (and the ``Sentinel`` behind it, or ``None``) for ``target``."""
    options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if target.kind == "cluster":
        return ClusterClient.from_url(target.url, **options), None
    if target.kind == "standalone":
        return RedisClient.from_url(target.url, **options), None
    sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(target.sentinels), sentinel_kwargs=options, ssl=target.tls, **options
    )
    client = sentinel.master_for(  # type: ignore[no-untyped-call,unused-ignore]
        target.master, db=target.db, username=target.username, password=target.password
    )
    return client, sentinel


def _discard(client: Any) -> None:
    """Drop a client that never connected (its pool holds no connection yet)."""
    del client


def _no_script(answer: object) -> bool:
    return isinstance(answer, redis_errors.NoScriptError) or (
        isinstance(answer, redis_errors.ResponseError) and str(answer).startswith("NOSCRIPT")
    )


class AsyncRedisBackend:
    """Lease rows in Redis 7 (or Valkey), one hash per work ID (ADR-0020).

    ``client``: a redis-py client of this flavour (``Redis``, a ``RedisCluster``, or a
    Sentinel's ``master_for(...)``), created with ``decode_responses=False`` (checkpoints are
    bytes). The backend never closes it. ``prefix``: where the keys live (``worklease:`` by
    default; several applications can share one server, with prefixes none of which starts
    another: ``q:`` would also read ``q:tenant:``'s rows).

    ``replicas``: how many replicas must confirm each renew, checkpoint, release and forget
    (``WAIT``, sent on the write's connection, at most ``replica_timeout``) before it returns;
    fewer in time raise a transient ``BackendError``, the write then being on the primary
    only (a failover now could lose it). Acquire does not wait: a grant a failover loses
    leaves its holder fenced at its next write, and its token is never issued again
    (ADR-0020). Not on a Cluster client (its pipelines cannot send ``WAIT`` to the master
    that took each write).

    A client that retries a command after sending it (redis-py's ``Retry``) may send a write
    twice: a repeated release or forget succeeds (each call carries its own request ID), a
    repeated checkpoint or renew writes the same again, but a repeated acquire finds the
    lease held, by this very holder, until its TTL: give the client no retries on
    ``TimeoutError`` if that matters (the lease layer retries renewals itself).

    Every operation is one server-side script on one key: the token, holder, exit and expiry
    are checked and written in one atomic step, with the server's ``TIME`` as the clock, so
    no client clock decides expiry. Fencing tokens are ``max(previous + 1, server ms *
    1024)``: strictly increasing per work ID, and greater than any token a failover's lost
    writes took along while the servers' clocks differ by less than the failover detection
    time (ADR-0020). ``transaction()`` is absent: Redis holds no rows of yours.
    """

    __module__ = "worklease"

    def __init__(
        self,
        client: RedisClient | ClusterClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 0,
        replica_timeout: float | timedelta | str = 1.0,
    ) -> None:
        if not isinstance(client, RedisClient | ClusterClient):
            raise ConfigError(
                "expected a redis-py client of this flavour (Redis or RedisCluster), not "
                f"{type(client).__name__}"
            )
        if client.get_encoder().decode_responses:
            raise ConfigError("the client decodes responses: create it with decode_responses=False")
        self._replicas, self._replica_timeout_ms = check_replicas(
            replicas, replica_timeout, cluster=isinstance(client, ClusterClient)
        )
        self._client = client
        self._prefix = check_prefix(prefix)
        self._acquire = client.register_script(ACQUIRE)
        self._renew = client.register_script(RENEW)
        self._checkpoint = client.register_script(CHECKPOINT)
        self._release = client.register_script(RELEASE)
        self._forget = client.register_script(FORGET)
        self._read = client.register_script(READ)
        self._sweep = client.register_script(SWEEP)
        self._holder = client.register_script(HOLDER)
        self._expire = client.register_script(EXPIRE)
        self._closed = False
        self._owned: tuple[Any, Any] | None = None  # a client (and sentinel) from_url made
        self._hub = AsyncReleaseHub()
        self._watch_stop = AEvent()
        self._watcher: AWorker | None = None
        self._watch_up = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 0,
        replica_timeout: float | timedelta | str = 1.0,
        timeout: float = CONNECT_TIMEOUT,
    ) -> AsyncRedisBackend:
        """A backend with a client of its own for ``url`` (closed with the backend):
        ``redis://host:6379/0`` (``rediss://`` for TLS), ``redis+cluster://host:7000`` for a
        Cluster, ``redis+sentinel://host:26379[,host:26379...]/mymaster[/db]`` for the
        primary that Sentinel names. ``timeout``: seconds for connecting and for each
        reply (a URL's own ``socket_timeout`` wins)."""
        target = parse_redis_url(url)
        seconds = positive_seconds(timeout, "timeout", maximum=300.0)
        client, sentinel = _client_for(target, seconds)
        try:
            backend = cls(client, prefix=prefix, replicas=replicas, replica_timeout=replica_timeout)
        except BaseException:
            _discard(client)
            raise
        backend._owned = (client, sentinel)
        return backend

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def client(self) -> RedisClient | ClusterClient:
        """The redis-py client the backend sends through."""
        return self._client

    @property
    def replicas(self) -> int:
        """How many replicas must confirm each renew, checkpoint, release and forget."""
        return self._replicas

    @property
    def watching(self) -> bool:
        """Whether the release watch has subscribed (releases then wake waiters at once)."""
        return self._watch_up

    def __repr__(self) -> str:
        return f"<{type(self).__name__} prefix={self._prefix!r}>"

    # -- transport -------------------------------------------------------------------------

    async def _call(
        self,
        operation: str,
        script: Any,
        key: str,
        args: list[Any],
        *,
        expect_list: bool = False,
        replicate: bool = False,
    ) -> Any:
        if self._closed:
            raise closed(operation)
        if replicate and self._replicas:
            # WAIT counts the writes of its own connection: script and WAIT in one pipeline
            (reply,) = await self._call_many(operation, script, [(key, args)], replicate=True)
            return reply
        try:
            reply = await script(keys=[key], args=args)
        except _FAILURES as exc:
            raise backend_error(exc, operation) from exc
        if expect_list and not isinstance(reply, list):
            raise BackendError(f"{operation}: unexpected reply from the server: {reply!r}")
        return reply

    async def _call_many(
        self,
        operation: str,
        script: Any,
        calls: Sequence[tuple[str | bytes, list[Any]]],
        *,
        replicate: bool = False,
    ) -> list[Any]:
        """One script per ``(key, args)``, pipelined ``BATCH`` at a time (on a Cluster the
        pipeline sends each node its own keys; every script still touches one key): the
        replies in order. A script the server lost (``NOSCRIPT``, after a restart or
        ``SCRIPT FLUSH``) is loaded again and only the calls it refused are sent again.
        ``replicate``: each pipeline ends with ``WAIT`` for the backend's ``replicas``."""
        if self._closed:
            raise closed(operation)
        wait = replicate and self._replicas > 0
        replies: list[Any] = []
        try:
            for start in range(0, len(calls), BATCH):
                part = calls[start : start + BATCH]
                answers = await self._pipeline(operation, script, part, wait)
                missing = [i for i, a in enumerate(answers) if _no_script(a)]
                if missing:
                    await self._client.script_load(script.script)
                    again = await self._pipeline(
                        operation, script, [part[i] for i in missing], wait
                    )
                    for i, answer in zip(missing, again, strict=True):
                        answers[i] = answer
                for answer in answers:
                    if isinstance(answer, Exception):
                        raise answer
                replies.extend(answers)
        except _FAILURES as exc:
            raise backend_error(exc, operation) from exc
        return replies

    async def _pipeline(
        self,
        operation: str,
        script: Any,
        calls: Sequence[tuple[str | bytes, list[Any]]],
        wait: bool,
    ) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for key, args in calls:
            # EVALSHA by name: a Cluster pipeline blocks the evalsha method (scripts may miss
            # on a node), not the command; each call names its one key, so it is routed to
            # its slot's master, and NOSCRIPT is answered above.
            pipe.execute_command("EVALSHA", script.sha, 1, key, *args)
        if wait:
            pipe.execute_command("WAIT", self._replicas, self._replica_timeout_ms)
        answers = list(await pipe.execute(raise_on_error=False))
        if wait:
            confirmed = answers.pop()
            if not all(_no_script(answer) for answer in answers):  # else nothing was written
                check_replicated(operation, confirmed, self._replicas, self._replica_timeout_ms)
        return answers

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
            "acquire",
            self._acquire,
            self._key(work_id),
            [holder_id, milliseconds(seconds)],
            expect_list=True,
        )
        outcome = decode_grant(work_id, reply)
        if isinstance(outcome, LeaseHeldError):
            raise outcome
        return self._token(work_id, holder_id, outcome), outcome.prior

    async def acquire_many(
        self, work_ids: Sequence[str], holder_id: str, ttl: float
    ) -> list[tuple[Token, Checkpoint]]:
        """Acquire every free work ID of ``work_ids``, pipelined (optional method): work IDs
        somebody holds are left out, grants come in input order, each with the checkpoint
        its previous holder left."""
        ids = distinct_work_ids(work_ids)
        seconds = backend_ttl(ttl)
        if self._closed:
            raise closed("acquire_many")
        calls = [(self._key(work_id), [holder_id, milliseconds(seconds)]) for work_id in ids]
        replies = await self._call_many("acquire_many", self._acquire, calls)
        grants: list[tuple[Token, Checkpoint]] = []
        for work_id, reply in zip(ids, replies, strict=True):
            granted = decode_grant(work_id, reply)
            if not isinstance(granted, LeaseHeldError):
                grants.append((self._token(work_id, holder_id, granted), granted.prior))
        return grants

    async def find_available(self, work_ids: Sequence[str]) -> list[str]:
        """The work IDs ``acquire`` would grant now by the server's clock, in input order
        (optional method); writes nothing."""
        ids = distinct_work_ids(work_ids)
        holders = await self._holders(ids, "find_available", with_checkpoint=False)
        return [work_id for work_id, found in zip(ids, holders, strict=True) if found is None]

    async def _holders(
        self, ids: Sequence[str], operation: str, *, with_checkpoint: bool
    ) -> list[tuple[str, bytes | None] | None]:
        flag = "1" if with_checkpoint else "0"
        calls = [(self._key(work_id), [flag]) for work_id in ids]
        return [
            decode_holder(reply) for reply in await self._call_many(operation, self._holder, calls)
        ]

    async def survey(self, work_ids: Sequence[str], prefix: str) -> PoolSurvey:
        """Who holds which of ``work_ids``, and the held leases whose work IDs start with
        ``prefix`` with their checkpoints (optional method); writes nothing. Each work ID is
        read at its own instant (a pool surveys again at its next scan)."""
        ids = distinct_work_ids(work_ids)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        holders = await self._holders(ids, "survey", with_checkpoint=False)
        counts: dict[str, int] = {}
        for found in holders:
            if found is not None:
                counts[found[0]] = counts.get(found[0], 0) + 1
        group = await self._keys_under(self._prefix + prefix, "survey")
        members: dict[str, bytes | None] = {}
        calls = [(key, ["1"]) for key in group]
        for reply in await self._call_many("survey", self._holder, calls):
            found = decode_holder(reply)
            if found is not None:
                members[found[0]] = found[1]
        free = tuple(work_id for work_id, found in zip(ids, holders, strict=True) if found is None)
        return PoolSurvey(free, counts, members)

    @staticmethod
    def _token(work_id: str, holder_id: str, grant: Grant) -> Token:
        return Token(work_id, holder_id, grant.fencing_token, grant.expires_at)

    async def read_checkpoint(self, token: Token) -> Checkpoint:
        reply = await self._call(
            "read_checkpoint",
            self._read,
            self._key(token.work_id),
            [str(token.fencing_token)],
            expect_list=True,
        )
        return decode_read(token, reply)

    async def checkpoint(self, token: Token, state: StateLike | None, ttl: float) -> None:
        data = normalize_state(state)
        seconds = backend_ttl(ttl)
        args = [*self._guard(token), milliseconds(seconds), data or b""]
        reply = await self._call(
            "checkpoint", self._checkpoint, self._key(token.work_id), args, replicate=True
        )
        decode_guarded(token, "checkpoint", reply)

    async def checkpoint_many(
        self, items: Sequence[tuple[Token, StateLike | None]], ttl: float
    ) -> list[LeaseLostError | None]:
        """Checkpoint every ``(token, state)``, pipelined (optional method): one outcome per
        item, ``None`` when written, else what ``checkpoint`` would raise."""
        distinct_work_ids([token.work_id for token, _ in items])
        states = [normalize_state(state) for _, state in items]
        seconds = milliseconds(backend_ttl(ttl))
        calls = [
            (self._key(token.work_id), [*self._guard(token), seconds, data or b""])
            for (token, _), data in zip(items, states, strict=True)
        ]
        replies = await self._call_many("checkpoint", self._checkpoint, calls, replicate=True)
        return [
            outcome(token, "checkpoint", reply)
            for (token, _), reply in zip(items, replies, strict=True)
        ]

    async def renew_many(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        """Renew every token, pipelined (optional method): one outcome per token."""
        distinct_work_ids([token.work_id for token in tokens])
        seconds = milliseconds(backend_ttl(ttl))
        calls = [(self._key(token.work_id), [*self._guard(token), seconds]) for token in tokens]
        replies = await self._call_many("renew", self._renew, calls, replicate=True)
        return [
            outcome(token, "renew", reply) for token, reply in zip(tokens, replies, strict=True)
        ]

    async def renew(self, token: Token, ttl: float) -> None:
        seconds = backend_ttl(ttl)
        args = [*self._guard(token), milliseconds(seconds)]
        reply = await self._call(
            "renew", self._renew, self._key(token.work_id), args, replicate=True
        )
        decode_guarded(token, "renew", reply)

    async def release(self, token: Token, mode: ExitMode) -> None:
        declared = check_exit_mode(mode)
        key = self._key(token.work_id)
        args = [*self._guard(token), declared.value, RELEASE_CHANNEL, key, request_id()]
        reply = await self._call("release", self._release, key, args, replicate=True)
        decode_guarded(token, "release", reply)

    async def release_many(
        self, tokens: Sequence[Token], mode: ExitMode
    ) -> list[LeaseLostError | None]:
        """Release every token with ``mode``, pipelined (optional method): one outcome per
        token."""
        declared = check_exit_mode(mode)
        distinct_work_ids([token.work_id for token in tokens])
        calls = []
        for token in tokens:
            key = self._key(token.work_id)
            calls.append(
                (key, [*self._guard(token), declared.value, RELEASE_CHANNEL, key, request_id()])
            )
        replies = await self._call_many("release", self._release, calls, replicate=True)
        return [
            outcome(token, "release", reply) for token, reply in zip(tokens, replies, strict=True)
        ]

    async def forget(self, token: Token) -> None:
        key = self._key(token.work_id)
        args = [*self._guard(token), RELEASE_CHANNEL, key, request_id()]
        reply = await self._call("forget", self._forget, key, args, replicate=True)
        lost = outcome(token, "forget", reply)
        if lost is not None:
            raise lost

    async def expire(self, work_id: str) -> bool:
        """End the current grant of ``work_id`` now (an operator's action, optional method):
        its token is replaced by a greater one nobody holds, so the holder's next write is
        fenced, and the next acquire reads the previous exit ``expired``. ``False`` when the
        work ID is not held (nothing changes)."""
        check_work_id(work_id)
        key = self._key(work_id)
        reply = await self._call("expire", self._expire, key, [RELEASE_CHANNEL, key])
        return bool(reply == 1)

    # -- housekeeping ----------------------------------------------------------------------

    async def _server_ms(self, operation: str) -> int:
        try:
            seconds, micros = await self._client.time()
        except _FAILURES as exc:
            raise backend_error(exc, operation) from exc
        return int(seconds) * 1000 + int(micros) // 1000

    async def _keys_under(self, prefix: str, operation: str) -> list[bytes]:
        """Every key starting with ``prefix``, each once (``SCAN``, never ``KEYS``; on a
        Cluster every master is scanned)."""
        if self._closed:
            raise closed(operation)
        seen: dict[bytes, None] = {}  # SCAN may return a key more than once
        try:
            async for key in self._client.scan_iter(match=scan_pattern(prefix), count=500):
                seen[key] = None
        except _FAILURES as exc:
            raise backend_error(exc, operation) from exc
        return list(seen)

    async def _rows(self, operation: str) -> list[Row]:
        """Every lease row under the prefix."""
        keys = await self._keys_under(self._prefix, operation)
        found: list[Row] = []
        try:
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

    # -- release watch ---------------------------------------------------------------------

    def watch_releases(self, work_ids: Iterable[str]) -> AsyncReleaseWatch | None:
        """A watch woken when one of ``work_ids`` is released or forgotten, by any client of
        the server (the scripts announce it on pub/sub; optional method); ``None`` once
        closed. A lapse is not announced: a waiter finds it when its wait runs out."""
        if self._closed:
            return None
        watch = self._hub.watch(work_ids)
        if self._watcher is None:
            self._watcher = aspawn(self._watch_loop, name="worklease-redis-watch")
        return watch

    async def _watch_loop(self) -> None:
        backoff = Backoff(initial=0.2, maximum=5.0)
        base = backoff.initial
        while not self._watch_stop.is_set():
            pubsub: Any = None
            try:
                await self._client.ping()  # a Cluster client learns its slots first
                pubsub = self._client.pubsub()  # type: ignore[no-untyped-call,unused-ignore]
                await pubsub.subscribe(RELEASE_CHANNEL)
                while not self._watch_stop.is_set():
                    message = await pubsub.get_message(timeout=_WATCH_TICK)
                    if message is None:
                        continue
                    if message.get("type") == "subscribe":
                        # (Re)subscribed: a release before this moment went unseen, so every
                        # waiter looks again.
                        self._watch_up = True
                        self._hub.wake_all()
                        base = backoff.initial
                    elif message.get("type") == "message":
                        work_id = work_id_of(self._prefix, message.get("data"))
                        if work_id is not None:
                            self._hub.publish(work_id)
            except Exception as exc:
                if self._watch_stop.is_set():
                    return
                logger.info(
                    "worklease: Redis release watch interrupted (%s); resuming", first_line(exc)
                )
                self._watch_up = False
                self._hub.wake_all()
                await self._watch_stop.wait_timeout(backoff.delay(base))
                base = backoff.next_base(base)
            finally:
                if pubsub is not None:
                    try:
                        await pubsub.aclose()
                    except Exception:  # a connection already lost: nothing to close
                        pass

    # -- lifecycle -------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the backend (idempotent): later operations raise ``BackendError`` and
        ``watch_releases`` returns ``None``. A client the caller passed stays open (one
        ``from_url`` made is closed); leases stay in Redis until they expire."""
        if self._closed:
            return
        self._closed = True
        self._watch_stop.set()
        watcher = self._watcher
        if watcher is not None:
            acancel_worker(watcher)
            await ajoin_all([watcher], timeout=_WATCH_TICK + 1.0)
        self._hub.wake_all()
        if self._owned is not None:
            client, sentinel = self._owned
            await client.aclose()
            for connection in sentinel.sentinels if sentinel is not None else ():
                await connection.aclose()

    async def __aenter__(self) -> AsyncRedisBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
