"""The etcd backend: lease rows in an etcd cluster, through its v3 JSON gateway.

Key layout, request bodies and the meaning of answers live in ``worklease._etcd``; this
module sends them (httpx), fails over between members and keeps the release watch.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the etcd backend needs httpx: pip install httpx (worklease's etcd extra: "
        "pip install '.[etcd]' from a checkout)"
    ) from exc

from .._acompat import AEvent, AWorker, ThreadLock, acancel_worker, ajoin_all, aspawn
from .._deadline import seconds_left
from .._etcd import (
    ACQUIRE_COMPARES,
    ACQUIRE_OPS,
    CONNECTIONS,
    MAIN_CONNECTIONS,
    RACES,
    RENEWAL_CONNECTIONS,
    Keepalives,
    Plan,
    Record,
    WorkKeys,
    acquire_compares,
    acquire_writes,
    b64,
    check_endpoints,
    check_prefix,
    checkpoint_from,
    checkpoint_held,
    chunks,
    closed_in_flight,
    contended,
    cut,
    delete,
    expire_txn,
    expiry,
    judge_error,
    lane_wait,
    lease_seconds,
    pool_timeout,
    prefix_end,
    queue_timeout,
    queue_wait,
    range_kvs,
    record_of,
    records,
    release_plan,
    renew_held,
    renew_moved,
    same_token,
    still_held_by,
    sweep_txn,
    tls_cause,
    tls_context,
    tls_failed,
    token_of,
    txn,
    unb64,
    wall_clock,
)
from .._failures import closed, fenced, first_line, held, lease_expired
from .._fairshare import PoolSurvey
from .._models import Checkpoint, ExitMode, Token
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
from ..errors import BackendError, ConfigError, LeaseLostError
from .backend import StateLike
from .watch import AsyncReleaseHub, AsyncReleaseWatch

__all__ = ["AsyncEtcdBackend"]

_IS_SYNC = False

logger = logging.getLogger("worklease")

_WATCH_TICK = 5.0
"""How long the release watch waits for news before it reconnects (a thread notices a stop
at that pace; the watch resumes from the last revision it saw, so nothing is missed)."""


class _Lane:
    """Connections for one kind of call: at most ``size`` requests in flight, the callers
    beyond waiting their turn, first come first served (``_etcd``'s connections note)."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self._lock = ThreadLock()
        self._free = size
        self._queue: deque[AEvent] = deque()

    async def enter(self, wait: float) -> bool:
        """Take a connection, waiting up to ``wait`` seconds for one; False if none came."""
        with self._lock:
            if self._free > 0:
                self._free -= 1
                return True
            turn = AEvent()
            self._queue.append(turn)
        try:
            if await turn.wait_timeout(wait):
                return True
        except BaseException:
            if self._give_up(turn):
                self.leave()  # it came just now: hand it on
            raise
        return self._give_up(turn)

    def _give_up(self, turn: AEvent) -> bool:
        """Leave the queue; True when the connection was handed over meanwhile."""
        with self._lock:
            if turn.is_set():
                return True
            self._queue.remove(turn)
            return False

    def leave(self) -> None:
        """Give the connection back: to the first caller waiting, else to the lane."""
        with self._lock:
            if self._queue:
                self._queue.popleft().set_threadsafe()
            else:
                self._free += 1


class AsyncEtcdBackend:
    """Lease rows in etcd (v3 API, 3.4 or newer), reached through its JSON gateway.

    ``endpoints``: the members' client URLs (``http://host:2379``; a comma-separated string or
    a sequence). Calls go to the member that answered last; a member that refuses the
    connection or does not answer is left for the next one. A write whose outcome is unknown
    (no answer after sending, leader changed) is never sent again: it raises a transient
    ``BackendError`` and the lease layer decides, as with a lost PostgreSQL connection.

    ``prefix``: where the keys live (several applications can share one cluster).
    ``timeout``: seconds per step of a request once sent (connecting, sending, each read of
    the answer); waiting for one of the backend's connections is not counted (it ends at the
    caller's deadline, or after 30 s or ``timeout``, the longer). ``username``/``password``:
    etcd authentication (the token is fetched once and again when etcd says it expired).
    ``ca_file``, ``cert_file``, ``key_file`` or a ready ``ssl_context``: TLS for ``https://``
    endpoints.

    Expiry is etcd's: each grant attaches its work ID's hold key to an etcd lease whose TTL
    is the lease TTL rounded up to whole seconds (etcd counts whole seconds and may raise a
    TTL to its minimum); when it runs out, etcd deletes the key and the work ID is free. No
    client clock decides expiry. Fencing tokens come from etcd's revision (revision * 1000 +
    the grant's place in its transaction): strictly increasing across the whole cluster.
    The checkpoint is stored as one etcd value, so it is bounded by
    the cluster's ``--max-request-bytes`` (1.5 MiB by default).
    """

    __module__ = "worklease"

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        prefix: str = "worklease/",
        timeout: float = 5.0,
        username: str | None = None,
        password: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._endpoints = check_endpoints(endpoints)
        self._prefix_text = prefix
        # The prefix, then NUL: another application under "prefix/sub/" is never read as
        # work IDs of this one (a work ID and a prefix never contain NUL).
        self._prefix = check_prefix(prefix) + b"\x00"
        try:
            self._timeout = positive_seconds(timeout, "timeout")
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        if (username is None) != (password is None):
            raise ConfigError("give both username and password, or neither")
        self._credentials = None if username is None else (username, password)
        if ssl_context is not None and (ca_file or cert_file or key_file):
            raise ConfigError("give ssl_context or ca_file/cert_file/key_file, not both")
        if (cert_file is None) != (key_file is None):
            raise ConfigError("give both cert_file and key_file, or neither")
        tls_given = ssl_context is not None or bool(ca_file or cert_file)
        if tls_given and not any(url.startswith("https://") for url in self._endpoints):
            raise ConfigError("TLS options were given but no endpoint is https://")
        verify: ssl.SSLContext | bool = True
        if ssl_context is not None:
            verify = ssl_context
        elif ca_file or cert_file:
            verify = tls_context(ca_file, cert_file, key_file)
        # Every request a lane lets through finds a connection: httpx's pool never queues.
        self._client = httpx.AsyncClient(
            verify=verify,
            timeout=self._timeout,
            limits=httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS),
        )
        self._calls = _Lane("calls", MAIN_CONNECTIONS)
        self._renewals = _Lane("renewals", RENEWAL_CONNECTIONS)
        self._queue_wait = queue_wait(self._timeout)
        self._preferred = 0
        self._auth_token: str | None = None
        # work ID -> (fencing token, holder, etcd lease, its TTL): the lease of each grant
        # made here, so a renewal needs no lookup.
        self._leases: dict[str, tuple[int, str, int, int]] = {}
        self._hub = AsyncReleaseHub()
        self._watch_stop = AEvent()
        self._watcher: AWorker | None = None
        self._watch_up = False
        self._closed = False

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._endpoints

    @property
    def prefix(self) -> str:
        return self._prefix_text

    @property
    def watching(self) -> bool:
        """Whether the release watch has been set up in etcd (releases are reported from
        then on; it wakes every waiter once when it starts)."""
        return self._watch_up

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {','.join(self._endpoints)} prefix={self._prefix_text!r}>"

    # -- transport -------------------------------------------------------------------------

    def _open(self, operation: str) -> None:
        if self._closed:
            raise closed(operation)

    async def _headers(self, operation: str, lane: _Lane | None = None) -> dict[str, str]:
        if self._credentials is None:
            return {}
        if self._auth_token is None:
            name, password = self._credentials
            answer = await self._post(
                "/v3/auth/authenticate",
                operation,
                idempotent=True,
                body={"name": name, "password": password},
                authenticate=False,
                lane=lane,
            )
            self._auth_token = str(answer.json()["token"])
        return {"Authorization": self._auth_token}

    async def _post(
        self,
        path: str,
        operation: str,
        *,
        idempotent: bool,
        body: dict[str, Any] | None = None,
        content: str | None = None,
        authenticate: bool = True,
        lane: _Lane | None = None,
    ) -> httpx.Response:
        """One request, to the preferred member and then the others while that is safe.

        It waits for a connection of its ``lane`` (ordinary calls by default) first: that
        wait is this backend's, so it never counts against a member. It ends at the caller's
        deadline (``seconds_left()``), if that comes first: the request is not sent then
        (``lane_wait``), nor once the deadline has passed."""
        self._open(operation)
        lane = lane or self._calls
        count = len(self._endpoints)
        first: int | None = None
        last: BaseException | None = None
        failed_at: str | None = None  # the member whose error ``last`` is
        reauthenticated = False
        attempt = 0
        while attempt < count:
            headers = await self._headers(operation, lane) if authenticate else {}
            wait, deadline = lane_wait(self._queue_wait, seconds_left())
            if (deadline and wait <= 0) or not await lane.enter(wait):
                raise queue_timeout(
                    operation,
                    lane.name,
                    lane.size,
                    wait,
                    deadline=deadline,
                    last=last,
                    member=failed_at,
                )
            if first is None:  # the member preferred once it is this call's turn
                first = self._preferred
            index = (first + attempt) % count
            endpoint = self._endpoints[index]
            try:
                self._open(operation)  # closed while it waited
                response = await self._send(
                    endpoint + path, operation, idempotent, body, content, headers
                )
            except ssl.SSLError as exc:  # raised bare by some transports
                raise tls_failed(operation, endpoint, exc) from exc
            except httpx.PoolTimeout as exc:  # waiting for this client: no member's failure
                raise pool_timeout(operation, exc) from exc
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if (tls := tls_cause(exc)) is not None:
                    raise tls_failed(operation, endpoint, tls) from exc
                last, failed_at = exc, endpoint  # never delivered: the next member may take it
                self._preferred = (index + 1) % count
                attempt += 1
                continue
            except httpx.TransportError as exc:
                if (tls := tls_cause(exc)) is not None:
                    raise tls_failed(operation, endpoint, tls) from exc
                self._preferred = (index + 1) % count
                if idempotent:
                    last, failed_at = exc, endpoint
                    attempt += 1
                    continue
                raise BackendError(
                    f"{operation}: no answer from etcd at {endpoint} ({first_line(exc)}); "
                    "whether it was applied is unknown",
                    transient=True,
                ) from exc
            finally:
                lane.leave()
            if response.status_code == 200:
                self._preferred = index
                return response
            try:
                detail = response.json()
            except ValueError:
                detail = {"message": response.text[:200]}
            answer = judge_error(response.status_code, detail, operation, idempotent=idempotent)
            if answer.reauthenticate and authenticate and not reauthenticated:
                self._auth_token = None
                reauthenticated = True
                last, failed_at = answer.error, endpoint  # asked: named if no connection comes
                continue
            if not answer.elsewhere:
                raise answer.error
            last, failed_at = answer.error, endpoint
            self._preferred = (index + 1) % count
            attempt += 1
        if isinstance(last, BackendError):
            raise last
        raise BackendError(
            f"{operation}: no etcd member answered ({first_line(last) if last else 'none'}; "
            f"tried {', '.join(self._endpoints)})",
            transient=True,
        ) from last

    async def _send(
        self,
        url: str,
        operation: str,
        idempotent: bool,
        body: dict[str, Any] | None,
        content: str | None,
        headers: dict[str, str],
    ) -> httpx.Response:
        """POST one request. Should the backend close meanwhile, it raises what a closed
        backend raises: httpx refuses a request on its closed client with a bare
        ``RuntimeError``, and ends one in flight with a transport error."""
        try:
            if content is not None:
                headers["Content-Type"] = "application/json"
                return await self._client.post(url, content=content, headers=headers)
            return await self._client.post(url, json=body, headers=headers)
        except RuntimeError as exc:
            if self._closed:
                raise closed(operation) from exc
            raise
        except httpx.TransportError as exc:
            if self._closed:
                raise closed_in_flight(operation, idempotent) from exc
            raise

    async def _txn(
        self, body: dict[str, Any], operation: str, lane: _Lane | None = None
    ) -> dict[str, Any]:
        # Reads only (a snapshot of ranges): safe to send to another member after no answer.
        writes = any("request_range" not in op for op in (*body["success"], *body["failure"]))
        response = await self._post(
            "/v3/kv/txn", operation, idempotent=not writes, body=body, lane=lane
        )
        answer: dict[str, Any] = response.json()
        return answer

    async def _read_many(
        self, keys: Sequence[WorkKeys], operation: str, lane: _Lane | None = None
    ) -> dict[str, Record]:
        """Every key of each work ID, read in as few read-only transactions as fit."""
        found: dict[str, Record] = {}
        for part in chunks(keys, 1):
            # No compares: the transaction succeeds and runs its reads as one snapshot.
            answer = await self._txn(txn([], [k.read() for k in part], []), operation, lane)
            found.update(records(self._prefix, range_kvs(answer.get("responses"))))
        return {k.work_id: found.get(k.work_id) or Record(k.work_id) for k in keys}

    async def _read(self, keys: WorkKeys, operation: str) -> Record:
        response = await self._post(
            "/v3/kv/range",
            operation,
            idempotent=True,
            body={"key": b64(keys.base), "range_end": b64(keys.end)},
        )
        return record_of(self._prefix, keys.work_id, response.json().get("kvs", ()))

    async def _grant(self, ttl: float, operation: str, lane: _Lane | None = None) -> int:
        response = await self._post(
            "/v3/lease/grant",
            operation,
            idempotent=True,
            body={"TTL": lease_seconds(ttl)},
            lane=lane,
        )
        return int(response.json()["ID"])

    async def _keepalive(
        self, leases: Sequence[int], operation: str, lane: _Lane | None = None
    ) -> dict[int, int]:
        """Refresh etcd leases: lease -> its TTL (0: etcd answered it is gone), every lease
        answered. Requests small enough for the gateway to read whole before it answers;
        leases a short answer left out are sent again (``Keepalives``). Refreshing is safe to
        repeat, so a member reporting an error, or answering nothing, is left for the next;
        leases still unanswered then raise a transient ``BackendError``, never a loss."""
        refresh = Keepalives(leases, operation, len(self._endpoints))
        while refresh.waiting:
            for content in refresh.bodies():
                response = await self._post(
                    "/v3/lease/keepalive", operation, idempotent=True, content=content, lane=lane
                )
                if refresh.take(response.text):
                    self._preferred = (self._preferred + 1) % len(self._endpoints)
            refresh.next_round()
        return refresh.alive

    async def _commit(
        self, plans: Sequence[Plan], operation: str, lane: _Lane | None = None
    ) -> dict[int, int | Record]:
        """Send the plans (as few transactions as etcd's limits allow): plan index -> the
        revision of the transaction that wrote it, else the work ID's record read back (a
        chunk fails as a whole, so the record may show nothing wrong: the caller plans it
        again)."""
        outcome: dict[int, int | Record] = {}
        for part in cut(plans):
            compares = [c for plan in part for c in plan.compares]
            writes = [w for plan in part for w in plan.writes]
            answer = await self._txn(
                txn(compares, writes, [plan.keys.read() for plan in part]), operation, lane
            )
            if answer.get("succeeded"):
                revision = int(answer["header"]["revision"])
                for plan in part:
                    outcome[plan.index] = revision
                continue
            seen = records(self._prefix, range_kvs(answer.get("responses")))
            for plan in part:
                outcome[plan.index] = seen.get(plan.keys.work_id) or Record(plan.keys.work_id)
        return outcome

    def _keys(self, work_id: str) -> WorkKeys:
        return WorkKeys.of(self._prefix, work_id)

    def _cached(self, token: Token, ttl: float) -> int:
        """The etcd lease of ``token``'s grant made here with ``ttl``'s TTL, else 0."""
        entry = self._leases.get(token.work_id)
        if entry is None:
            return 0
        fencing, holder, lease, seconds = entry
        if fencing != token.fencing_token or holder != token.holder_id:
            return 0
        return lease if seconds == lease_seconds(ttl) else 0

    def _remember(self, token: Token, lease: int, ttl: float) -> None:
        if lease:
            self._leases[token.work_id] = (
                token.fencing_token,
                token.holder_id,
                lease,
                lease_seconds(ttl),
            )
        else:
            self._forget_lease(token)

    def _forget_lease(self, token: Token) -> None:
        entry = self._leases.get(token.work_id)
        if entry is not None and entry[0] == token.fencing_token:
            self._leases.pop(token.work_id, None)

    # -- acquire ---------------------------------------------------------------------------

    async def acquire(self, work_id: str, holder_id: str, ttl: float) -> Token:
        token, _ = await self.acquire_with_checkpoint(work_id, holder_id, ttl)
        return token

    async def acquire_with_checkpoint(
        self, work_id: str, holder_id: str, ttl: float
    ) -> tuple[Token, Checkpoint]:
        """Acquire and return the new holder's checkpoint in one step (optional method)."""
        check_work_id(work_id)
        seconds = backend_ttl(ttl)
        self._open("acquire")
        keys = self._keys(work_id)
        seen = await self._read(keys, "acquire")
        lease = 0
        started = wall_clock()
        for _ in range(RACES):
            if seen.held:
                raise held(work_id, seen.hold_holder, None)
            if seconds > 0 and not lease:
                started = wall_clock()
                lease = await self._grant(seconds, "acquire")
            writes = acquire_writes(keys, seen, holder_id, lease, wall_clock())
            plan = Plan(0, keys, None, acquire_compares(keys, seen), writes, lease)
            result = (await self._commit([plan], "acquire"))[0]
            if isinstance(result, Record):
                seen = result
                continue
            token = Token(work_id, holder_id, token_of(result, 0), expiry(started, seconds))
            self._remember(token, lease, seconds)
            prev_exit, prev_holder = seen.successor_prev()
            return token, Checkpoint(seen.checkpoint, prev_exit, prev_holder)
        raise BackendError(
            f"acquire: work ID {work_id!r} kept changing under {RACES} attempts", transient=True
        )

    async def acquire_many(
        self, work_ids: Sequence[str], holder_id: str, ttl: float
    ) -> list[tuple[Token, Checkpoint]]:
        """Acquire every free work ID of ``work_ids`` in one step per batch (optional
        method); work IDs somebody holds are left out, grants come in input order."""
        ids = distinct_work_ids(work_ids)
        seconds = backend_ttl(ttl)
        self._open("acquire_many")
        if not ids:
            return []
        keys = {work_id: self._keys(work_id) for work_id in ids}
        seen = await self._read_many(list(keys.values()), "acquire_many")
        leases: dict[str, tuple[int, float]] = {}
        grants: dict[str, tuple[Token, Checkpoint]] = {}
        for _ in range(RACES):
            free = [work_id for work_id in ids if work_id not in grants and not seen[work_id].held]
            if not free:
                break
            # One transaction per chunk; a grant's slot is its place in its transaction.
            for part in chunks(free, max(ACQUIRE_OPS, ACQUIRE_COMPARES)):
                try:
                    revision, plans = await self._acquire_chunk(
                        part, keys, seen, leases, holder_id, seconds
                    )
                except BackendError:
                    if not grants:
                        raise
                    # Earlier chunks were granted: hand those over rather than strand them
                    # (this chunk's work IDs are left out, as if somebody held them).
                    logger.warning(
                        "worklease: acquire_many granted %d work ID(s), then failed",
                        len(grants),
                        exc_info=True,
                    )
                    return [grants[work_id] for work_id in ids if work_id in grants]
                if revision is None:
                    continue  # ``seen`` now shows what changed: plan again
                for plan in plans:
                    work_id = plan.keys.work_id
                    record = seen[work_id]
                    started = leases[work_id][1] if work_id in leases else wall_clock()
                    fencing = token_of(revision, plan.index)
                    token = Token(work_id, holder_id, fencing, expiry(started, seconds))
                    self._remember(token, plan.lease, seconds)
                    prev_exit, prev_holder = record.successor_prev()
                    grants[work_id] = (token, Checkpoint(record.checkpoint, prev_exit, prev_holder))
        return [grants[work_id] for work_id in ids if work_id in grants]

    async def _acquire_chunk(
        self,
        part: Sequence[str],
        keys: dict[str, WorkKeys],
        seen: dict[str, Record],
        leases: dict[str, tuple[int, float]],
        holder_id: str,
        seconds: float,
    ) -> tuple[int | None, list[Plan]]:
        """One transaction of acquires (a grant's slot is its place in it): its revision, or
        ``None`` when refused (``seen`` then shows what changed)."""
        plans: list[Plan] = []
        for slot, work_id in enumerate(part):
            if seconds > 0 and work_id not in leases:
                started = wall_clock()
                leases[work_id] = (await self._grant(seconds, "acquire_many"), started)
            lease = leases[work_id][0] if seconds > 0 else 0
            record = seen[work_id]
            writes = acquire_writes(keys[work_id], record, holder_id, lease, wall_clock(), slot)
            compares = acquire_compares(keys[work_id], record)
            plans.append(Plan(slot, keys[work_id], None, compares, writes, lease))
        # One chunk fits one transaction (``chunks`` cut it so): one revision, or refused.
        done = await self._commit(plans, "acquire_many")
        revision = done[0]
        if isinstance(revision, Record):
            for plan in plans:
                result = done[plan.index]
                assert isinstance(result, Record)
                seen[plan.keys.work_id] = result
            return None, plans
        return revision, plans

    async def find_available(self, work_ids: Sequence[str]) -> list[str]:
        """The work IDs ``acquire`` would grant now, in input order (optional method)."""
        ids = distinct_work_ids(work_ids)
        self._open("find_available")
        holds = await self._holds(ids, "find_available")
        return [work_id for work_id in ids if work_id not in holds]

    async def _holds(self, ids: Sequence[str], operation: str) -> dict[str, str]:
        """Work ID -> holder, for the work IDs of ``ids`` that are held."""
        found: dict[str, str] = {}
        for part in chunks(ids, 1):
            reads = [
                {"request_range": {"key": b64(self._keys(work_id).key(b"h"))}} for work_id in part
            ]
            answer = await self._txn(txn([], reads, []), operation)
            for work_id, record in records(
                self._prefix, range_kvs(answer.get("responses"))
            ).items():
                if record.held and record.hold_holder is not None:
                    found[work_id] = record.hold_holder
        return found

    async def survey(self, work_ids: Sequence[str], prefix: str) -> PoolSurvey:
        """Who holds which of ``work_ids``, and the held leases under ``prefix`` with their
        checkpoints (optional method); writes nothing."""
        ids = distinct_work_ids(work_ids)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        self._open("survey")
        holds = await self._holds(ids, "survey")
        start = self._prefix + prefix.encode("utf-8")
        response = await self._post(
            "/v3/kv/range",
            "survey",
            idempotent=True,
            body={"key": b64(start), "range_end": b64(prefix_end(start))},
        )
        group = records(self._prefix, response.json().get("kvs", ()))
        counts: dict[str, int] = {}
        for holder in holds.values():
            counts[holder] = counts.get(holder, 0) + 1
        members = {
            record.hold_holder: record.checkpoint
            for record in group.values()
            if record.held and record.hold_holder is not None
        }
        free = tuple(work_id for work_id in ids if work_id not in holds)
        return PoolSurvey(free, counts, members)

    # -- writes by a holder ----------------------------------------------------------------

    async def read_checkpoint(self, token: Token) -> Checkpoint:
        self._open("read_checkpoint")
        record = await self._read(self._keys(token.work_id), "read_checkpoint")
        if record.token != token.fencing_token:
            raise fenced(token, "read_checkpoint")
        return record.checkpoint_view()

    async def checkpoint(self, token: Token, state: StateLike | None, ttl: float) -> None:
        data = normalize_state(state)
        seconds = backend_ttl(ttl)
        self._open("checkpoint")
        (outcome,) = await self._checkpoint_all([(token, data)], seconds, "checkpoint")
        if outcome is not None:
            raise outcome

    async def checkpoint_many(
        self, items: Sequence[tuple[Token, StateLike | None]], ttl: float
    ) -> list[LeaseLostError | None]:
        """Checkpoint every ``(token, state)`` in one step per batch (optional method)."""
        distinct_work_ids([token.work_id for token, _ in items])
        normalized = [(token, normalize_state(state)) for token, state in items]
        seconds = backend_ttl(ttl)
        self._open("checkpoint_many")
        return await self._checkpoint_all(normalized, seconds, "checkpoint")

    async def _checkpoint_all(
        self, items: Sequence[tuple[Token, bytes | None]], ttl: float, operation: str
    ) -> list[LeaseLostError | None]:
        outcomes: list[LeaseLostError | None] = [None] * len(items)
        # A grant made here keeps its etcd lease: refresh it, then write while it is still
        # the one holding the work ID. Anything else reads the record and plans from it.
        cached = {i: self._cached(token, ttl) for i, (token, _) in enumerate(items) if ttl > 0}
        alive = await self._keepalive([lease for lease in cached.values() if lease], operation)
        known = {i: lease for i, lease in cached.items() if lease and alive.get(lease, 0) > 0}
        unknown = [i for i in range(len(items)) if i not in known]
        pending: dict[int, Record | None] = dict.fromkeys(known)
        if unknown:
            seen = await self._read_many(
                [self._keys(items[i][0].work_id) for i in unknown], operation
            )
            for i in unknown:
                pending[i] = seen[items[i][0].work_id]
        for _ in range(RACES):
            plans: list[Plan] = []
            for i, record in pending.items():
                token, state = items[i]
                keys = self._keys(token.work_id)
                if record is None:  # the refreshed lease holds it
                    plans.append(checkpoint_held(i, keys, token, state, wall_clock(), known[i]))
                    continue
                lost = record.lost(token, operation)
                if lost is not None:
                    outcomes[i] = lost
                    continue
                # Lapsed (revive it) or held under another etcd lease: attach a fresh one.
                fresh = await self._grant(ttl, operation) if ttl > 0 else 0
                plans.append(checkpoint_from(i, keys, token, state, wall_clock(), record, fresh))
            if not plans:
                return outcomes
            done = await self._commit(plans, operation)
            pending = {}
            for plan in plans:
                result = done[plan.index]
                assert plan.token is not None
                if not isinstance(result, Record):
                    self._remember(plan.token, plan.lease, ttl)
                elif still_held_by(plan, result):
                    # Another work ID of the batch was refused: write again the same way.
                    known[plan.index] = plan.lease
                    pending[plan.index] = None
                else:
                    pending[plan.index] = result
            if not pending:
                return outcomes
        raise contended(items[next(iter(pending))][0], operation)

    async def renew(self, token: Token, ttl: float) -> None:
        seconds = backend_ttl(ttl)
        self._open("renew")
        (outcome,) = await self._renew_all([token], seconds)
        if outcome is not None:
            raise outcome

    async def renew_many(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        """Renew every token in one step per batch (optional method)."""
        distinct_work_ids([token.work_id for token in tokens])
        seconds = backend_ttl(ttl)
        self._open("renew_many")
        return await self._renew_all(tokens, seconds)

    async def _renew_all(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        outcomes: list[LeaseLostError | None] = [None] * len(tokens)
        if not tokens:
            return outcomes
        # A grant made here: refresh its etcd lease, then stamp the work ID while the hold
        # is still attached to that lease and the token is still the grant (a refreshed etcd
        # lease alone proves nothing once the hold was deleted). Anything else: read first.
        # Renewals have connections of their own: a crowd of other calls never delays them.
        lane = self._renewals
        cached = {i: self._cached(token, ttl) for i, token in enumerate(tokens) if ttl > 0}
        leases = [lease for lease in cached.values() if lease]
        alive = await self._keepalive(leases, "renew", lane)
        known = {i: lease for i, lease in cached.items() if lease and alive.get(lease, 0) > 0}
        unknown = [i for i in range(len(tokens)) if i not in known]
        pending: dict[int, Record | None] = dict.fromkeys(known)
        if unknown:
            keys = [self._keys(tokens[i].work_id) for i in unknown]
            seen = await self._read_many(keys, "renew", lane)
            for i in unknown:
                pending[i] = seen[tokens[i].work_id]
        for _ in range(RACES):
            plans = await self._renew_plans(tokens, ttl, pending, known, outcomes)
            if not plans:
                return outcomes
            done = await self._commit(plans, "renew", lane)
            pending = {}
            for plan in plans:
                result = done[plan.index]
                assert plan.token is not None
                if not isinstance(result, Record):
                    self._remember(plan.token, plan.lease, ttl)
                    continue
                known.pop(plan.index, None)
                pending[plan.index] = result  # planned again from what was read back
            if not pending:
                return outcomes
        raise contended(tokens[next(iter(pending))], "renew")

    async def _renew_plans(
        self,
        tokens: Sequence[Token],
        ttl: float,
        pending: dict[int, Record | None],
        known: dict[int, int],
        outcomes: list[LeaseLostError | None],
    ) -> list[Plan]:
        """The guarded writes of one renewal round; settles ``outcomes`` of lost leases."""
        plans: list[Plan] = []
        regrant: list[int] = []
        for i, record in pending.items():
            token = tokens[i]
            keys = self._keys(token.work_id)
            if record is None:  # refreshed just now
                plans.append(renew_held(i, keys, token, wall_clock(), known[i]))
                continue
            lost = record.lost(token, "renew")
            if lost is None and not record.held:
                lost = lease_expired(token, "renew", "the lease expired or was released")
            if lost is not None:
                outcomes[i] = lost
                continue
            if ttl <= 0:
                plans.append(renew_moved(i, keys, token, wall_clock(), record.hold_lease, 0))
                continue
            regrant.append(i)
        if not regrant:
            return plans
        # Held under an etcd lease this instance did not grant (or with another TTL): refresh
        # it when its TTL is the one asked for, else move the hold to a fresh one.
        leases = {i: record.hold_lease for i in regrant if (record := pending[i]) is not None}
        refreshed = await self._keepalive(list(leases.values()), "renew", self._renewals)
        for i in regrant:
            token, lease = tokens[i], leases[i]
            keys = self._keys(token.work_id)
            granted = refreshed.get(lease, 0)
            if granted == 0:
                outcomes[i] = lease_expired(token, "renew", "the lease expired or was released")
            elif granted == lease_seconds(ttl):
                plans.append(renew_held(i, keys, token, wall_clock(), lease))
            else:
                fresh = await self._grant(ttl, "renew", self._renewals)
                plans.append(renew_moved(i, keys, token, wall_clock(), lease, fresh))
        return plans

    async def release(self, token: Token, mode: ExitMode) -> None:
        declared = check_exit_mode(mode)
        self._open("release")
        (outcome,) = await self._release_all([token], declared)
        if outcome is not None:
            raise outcome

    async def release_many(
        self, tokens: Sequence[Token], mode: ExitMode
    ) -> list[LeaseLostError | None]:
        """Release every token with ``mode`` in one step per batch (optional method)."""
        declared = check_exit_mode(mode)
        distinct_work_ids([token.work_id for token in tokens])
        self._open("release_many")
        return await self._release_all(tokens, declared)

    async def _release_all(
        self, tokens: Sequence[Token], mode: ExitMode
    ) -> list[LeaseLostError | None]:
        outcomes: list[LeaseLostError | None] = [None] * len(tokens)
        pending = list(range(len(tokens)))
        for _ in range(RACES):
            plans = [
                release_plan(i, self._keys(tokens[i].work_id), tokens[i], mode, wall_clock())
                for i in pending
            ]
            done = await self._commit(plans, "release")
            pending = []
            for plan in plans:
                result = done[plan.index]
                assert plan.token is not None
                if not isinstance(result, Record):
                    self._forget_lease(plan.token)
                    continue
                lost = result.lost(plan.token, "release")
                if lost is not None:
                    outcomes[plan.index] = lost
                elif not result.held:
                    outcomes[plan.index] = lease_expired(
                        plan.token, "release", "the lease expired or was released"
                    )
                else:
                    pending.append(plan.index)  # refused for another work ID of its batch
            if not pending:
                return outcomes
        raise contended(tokens[pending[0]], "release")

    async def forget(self, token: Token) -> None:
        self._open("forget")
        keys = self._keys(token.work_id)
        answer = await self._txn(
            txn(same_token(keys, token), [delete(keys.base, keys.end)], []), "forget"
        )
        if not answer.get("succeeded"):
            raise fenced(token, "forget")
        self._forget_lease(token)

    async def expire(self, work_id: str) -> bool:
        """End the current grant of ``work_id`` now (an operator's action, optional method):
        its token is replaced by a greater one nobody holds, so the holder's next write is
        fenced, and the next acquire reads the previous exit ``expired``. ``False`` when the
        work ID is not held (nothing changes)."""
        check_work_id(work_id)
        self._open("expire")
        keys = self._keys(work_id)
        for _ in range(RACES):
            seen = await self._read(keys, "expire")
            if not seen.held or seen.exit_mode is not None:
                return False
            answer = await self._txn(expire_txn(keys, seen), "expire")
            if answer.get("succeeded"):
                return True
        raise BackendError(
            f"expire: work ID {work_id!r} kept changing under {RACES} attempts", transient=True
        )

    # -- housekeeping ----------------------------------------------------------------------

    async def sweep(self, retention: float, include_expired: bool) -> int:
        keep_for = non_negative_seconds(retention, "retention")
        expired_too = check_flag(include_expired, "include_expired")
        self._open("sweep")
        # Keys only first: unheld work IDs are the candidates; then their exit and stamp.
        unheld: list[str] = []
        for work_id, kinds in (await self._key_index("sweep")).items():
            if b"h" not in kinds and b"t" in kinds:
                unheld.append(work_id)
        if not unheld:
            return 0
        seen = await self._read_stamps(unheld, "sweep")
        now = wall_clock()
        doomed = [
            record
            for record in seen.values()
            if not record.held
            and record.updated is not None
            and now - record.updated > keep_for
            and (record.exit_mode is ExitMode.RETIRED or (expired_too and record.exit_mode is None))
        ]
        deleted = 0
        for part in chunks(doomed, 3):
            answer = await self._txn(sweep_txn(self._prefix, part), "sweep")
            if answer.get("succeeded"):
                deleted += len(part)
                continue
            for record in part:  # one changed meanwhile: each on its own
                single = await self._txn(sweep_txn(self._prefix, [record]), "sweep")
                deleted += bool(single.get("succeeded"))
        return deleted

    async def _key_index(self, operation: str) -> dict[str, set[bytes]]:
        """Work ID -> the kinds of key it has, over the whole prefix (keys only, paged)."""
        index: dict[str, set[bytes]] = {}
        start, end = self._prefix, prefix_end(self._prefix)
        while True:
            response = await self._post(
                "/v3/kv/range",
                operation,
                idempotent=True,
                body={"key": b64(start), "range_end": b64(end), "keys_only": True, "limit": 5000},
            )
            answer = response.json()
            kvs = answer.get("kvs", ())
            for kv in kvs:
                key = unb64(kv["key"])[len(self._prefix) :]
                name, _, kind = key.rpartition(b"\x00")
                index.setdefault(name.decode("utf-8", errors="replace"), set()).add(kind)
            if not answer.get("more") or not kvs:
                return index
            start = unb64(kvs[-1]["key"]) + b"\x00"

    async def _read_stamps(self, ids: Sequence[str], operation: str) -> dict[str, Record]:
        found: dict[str, Record] = {}
        for part in chunks(ids, 3):
            reads = [
                {"request_range": {"key": b64(self._keys(work_id).key(kind))}}
                for work_id in part
                for kind in (b"t", b"x", b"u")
            ]
            answer = await self._txn(txn([], reads, []), operation)
            found.update(records(self._prefix, range_kvs(answer.get("responses"))))
        return found

    async def rows(self) -> list[dict[str, Any]]:
        """Every work ID under the prefix, as a plain dict per work ID (for tools and the
        CLI): holder, token, held, checkpoint size, exit fields, the held etcd lease's TTL
        left in seconds, and the last write's time."""
        self._open("status")
        start = self._prefix
        response = await self._post(
            "/v3/kv/range",
            "status",
            idempotent=True,
            body={"key": b64(start), "range_end": b64(prefix_end(start))},
        )
        found = records(self._prefix, response.json().get("kvs", ()))
        rows: list[dict[str, Any]] = []
        for work_id in sorted(found):
            record = found[work_id]
            left: int | None = None
            if record.held and record.hold_lease:
                live = await self._post(
                    "/v3/lease/timetolive",
                    "status",
                    idempotent=True,
                    body={"ID": str(record.hold_lease)},
                )
                left = max(int(live.json().get("TTL", 0)), 0)
            rows.append(
                {
                    "work_id": work_id,
                    "holder_id": record.holder_id,
                    "fencing_token": record.token,
                    "held": record.held,
                    "ttl_left": left,
                    "checkpoint_bytes": len(record.checkpoint) if record.checkpoint else None,
                    "exit_mode": record.exit_mode,
                    "prev_exit": record.prev_exit,
                    "prev_holder_id": record.prev_holder_id,
                    "updated_at": (
                        None
                        if record.updated is None
                        else datetime.fromtimestamp(record.updated, UTC)
                    ),
                }
            )
        return rows

    # -- release watch ---------------------------------------------------------------------

    def watch_releases(self, work_ids: Iterable[str]) -> AsyncReleaseWatch | None:
        """A watch woken when one of ``work_ids`` is released, forgotten or lapses, seen
        through etcd's watch API from any client (optional method); ``None`` once closed."""
        if self._closed:
            return None
        watch = self._hub.watch(work_ids)
        if self._watcher is None:
            self._watcher = aspawn(self._watch_loop, name="worklease-etcd-watch")
        return watch

    async def _watch_loop(self) -> None:
        backoff = Backoff(initial=0.2, maximum=5.0)
        base = backoff.initial
        after: int | None = None  # the last revision seen: a new watch resumes after it
        start, end = self._prefix, prefix_end(self._prefix)
        while not self._watch_stop.is_set():
            endpoint = self._endpoints[self._preferred]
            request: dict[str, Any] = {
                "key": b64(start),
                "range_end": b64(end),
                "filters": ["NOPUT"],
            }
            if after is not None:
                request["start_revision"] = str(after + 1)
            created = [False]
            try:
                # etcd cancels the stream when its member loses the leader (gRPC metadata
                # "hasleader"), so a member cut off from the quorum is left for another.
                headers = await self._headers("watch") | {"Grpc-Metadata-hasleader": "true"}
                async with self._client.stream(
                    "POST",
                    endpoint + "/v3/watch",
                    json={"create_request": request},
                    headers=headers,
                    timeout=httpx.Timeout(self._timeout, read=_WATCH_TICK),
                ) as response:
                    if response.status_code != 200:
                        raise BackendError(f"watch: HTTP {response.status_code}", transient=True)
                    async for line in response.aiter_lines():
                        if not line.strip():
                            continue
                        after = self._watch_event(json.loads(line), after, created)
                        base = backoff.initial
            except httpx.ReadTimeout:
                if not created[0]:  # the member did not even set the watch up: another one
                    self._preferred = (self._preferred + 1) % len(self._endpoints)
                continue  # quiet for a tick: watch again from the last revision
            except _Compacted:
                after = None
                self._hub.wake_all()
                continue
            except Exception as exc:
                if self._watch_stop.is_set():
                    return
                logger.info(
                    "worklease: etcd release watch interrupted (%s); resuming", first_line(exc)
                )
                self._preferred = (self._preferred + 1) % len(self._endpoints)
                self._hub.wake_all()
                await self._watch_stop.wait_timeout(backoff.delay(base))
                base = backoff.next_base(base)

    def _watch_event(
        self, message: dict[str, Any], after: int | None, created: list[bool]
    ) -> int | None:
        result = message.get("result")
        if result is None:
            raise BackendError(f"watch: {message.get('error')}", transient=True)
        if result.get("compact_revision") and result.get("canceled"):
            raise _Compacted()
        if result.get("canceled"):
            raise BackendError(f"watch: canceled ({result.get('cancel_reason')})", transient=True)
        revision = int(result.get("header", {}).get("revision", 0))
        if result.get("created"):
            created[0] = True
            if after is None:
                # Watching from now on: a release between a watch's registration and this
                # moment went unseen, so every waiter looks again.
                after = revision
                self._watch_up = True
                self._hub.wake_all()
        for event in result.get("events", ()):
            key = unb64(event.get("kv", {}).get("key"))
            if event.get("type") == "DELETE" and key.endswith(b"\x00h"):
                work_id = key[len(self._prefix) : -2].decode("utf-8", errors="replace")
                self._hub.publish(work_id)
            after = max(after or 0, int(event.get("kv", {}).get("mod_revision", 0)))
        return after

    # -- lifetime --------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the backend (idempotent): later operations raise ``BackendError`` and
        ``watch_releases`` returns ``None``. Leases stay in etcd until they expire."""
        if self._closed:
            return
        self._closed = True
        self._watch_stop.set()
        watcher = self._watcher
        if watcher is not None:
            acancel_worker(watcher)
            await ajoin_all([watcher], timeout=1.0)
        self._hub.wake_all()
        await self._client.aclose()

    async def __aenter__(self) -> AsyncEtcdBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class _Compacted(Exception):
    """The watch's start revision was compacted away: watch from now, everyone looks again."""
