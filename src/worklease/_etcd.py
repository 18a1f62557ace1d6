"""The etcd backend's decisions, shared by both flavours: key layout, records, the request
bodies of every guarded transaction, and what each answer means.

Layout (ADR-0013). Every work ID owns a handful of keys, all starting with
``prefix + NUL + work_id + NUL`` (neither holds NUL, so one range reads exactly its keys, and
an application under a longer prefix is never mistaken for work IDs of this one):

- ``t``: the grant: ``slot NUL holder ID``. Written only by an acquire, so its
  ``mod_revision`` is the revision of the acquiring transaction, global and strictly
  increasing. The fencing token is ``revision * TOKEN_SLOTS + slot``, the slot being the
  grant's place in its transaction (an ``acquire_many`` grants several in one): distinct and
  strictly increasing across the whole cluster.
- ``h``: present while the lease is held; attached to an etcd lease whose TTL is the lease's
  expiry. etcd deletes it when that lease runs out, so expiry is decided by the etcd leader's
  lease clock, which every client shares; no client clock takes part. Value: the holder ID.
- ``c``: the checkpoint (absent: none).
- ``p``: how the previous holder left, JSON ``{"exit": mode, "holder": id}``.
- ``x``: the exit mode the holder declared with ``release`` (absent while held or lapsed).
- ``u``: the client's wall time of the last write, in seconds: only ``sweep``'s retention
  reads it (housekeeping, never a decision about who holds what).

Every operation is one guarded ``txn`` comparing ``t``'s revision and value (the token and
holder), then ``x`` or ``h`` as the operation needs; the failure branch reads the work ID's
keys back, so a refusal is classified (fenced before expired) without another round trip.
"""

from __future__ import annotations

import base64
import json
import math
import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from ._failures import fenced, first_line, lease_expired
from ._models import Checkpoint, ExitMode, Token
from .errors import BackendError, ConfigError, LeaseLostError

__all__ = [
    "MAX_TXN_OPS",
    "EtcdAnswer",
    "Record",
    "WorkKeys",
    "check_endpoints",
    "check_prefix",
    "lease_seconds",
]

MAX_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``: no list of a transaction (compares, success, failure)
may be longer. Batches are cut to fit it."""

MAX_TXN_BYTES = 1024 * 1024
"""Bytes of values one batch transaction carries at most: below etcd's default
``--max-request-bytes`` (1.5 MiB) with room for keys and encoding."""

ACQUIRE_OPS = 5
"""Success operations per work ID of an acquire (t, p, h, u put; x deleted)."""

ACQUIRE_COMPARES = 4
"""Compares per work ID of an acquire (t's, x's and c's revisions; h absent)."""

TOKEN_SLOTS = 1000
"""Fencing tokens per revision: more than the acquires one transaction can hold."""

_KINDS = (b"t", b"h", b"c", b"p", b"x", b"u")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(key: bytes) -> bytes:
    """The smallest key greater than every key starting with ``key`` (etcd's prefix range)."""
    stripped = key.rstrip(b"\xff")
    if not stripped:
        return b"\x00"  # every key
    return stripped[:-1] + bytes([stripped[-1] + 1])


def check_prefix(prefix: object) -> bytes:
    if not isinstance(prefix, str):
        raise ConfigError(f"prefix must be a str, not {type(prefix).__name__}")
    if not prefix or "\x00" in prefix:
        raise ConfigError("prefix must be a non-empty str without NUL characters")
    return prefix.encode("utf-8")


def check_endpoints(endpoints: object) -> tuple[str, ...]:
    """Endpoint URLs (``http://host:port`` or ``https://...``): one string, comma-separated
    ones, or a sequence; at least one, none repeated."""
    if isinstance(endpoints, str):
        items = [part.strip() for part in endpoints.split(",")]
    elif isinstance(endpoints, Sequence):
        items = list(endpoints)
    else:
        raise ConfigError(
            "endpoints must be a URL, a comma-separated list of URLs or a sequence of URLs"
        )
    if isinstance(endpoints, bytes | bytearray):
        raise ConfigError("endpoints must be str URLs, not bytes")
    urls: list[str] = []
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigError(f"an etcd endpoint must be a non-empty URL string, not {item!r}")
        url = item if "://" in item else "http://" + item
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"etcd endpoint {item!r} is not an http:// or https:// URL")
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"etcd endpoint {item!r} has a bad port") from None
        if port is None:  # no default of 2379: an HTTP URL would mean port 80
            raise ConfigError(f"etcd endpoint {item!r} needs a port (etcd's is usually 2379)")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ConfigError(f"etcd endpoint {item!r} must be scheme://host:port only")
        url = f"{parts.scheme}://{parts.netloc}"
        if url in urls:
            raise ConfigError(f"etcd endpoint {item!r} is listed twice")
        urls.append(url)
    if not urls:
        raise ConfigError("at least one etcd endpoint is needed")
    return tuple(urls)


def lease_seconds(ttl: float) -> int:
    """The etcd lease TTL for a lease TTL: whole seconds, rounded up (etcd leases count whole
    seconds), at least 1. etcd may raise it further to its own minimum (1-2 s by default):
    a lease is never shorter than asked, so a holder's own view of its window stays safe."""
    return max(1, math.ceil(ttl))


def wall_clock() -> float:
    return time.time()


# -- keys and records ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkKeys:
    """The keys of one work ID."""

    work_id: str
    base: bytes  # prefix + work ID + NUL

    @classmethod
    def of(cls, prefix: bytes, work_id: str) -> WorkKeys:
        return cls(work_id, prefix + work_id.encode("utf-8") + b"\x00")

    def key(self, kind: bytes) -> bytes:
        return self.base + kind

    @property
    def end(self) -> bytes:
        return self.base[:-1] + b"\x01"

    def read(self) -> dict[str, Any]:
        """A range op reading every key of the work ID."""
        return {"request_range": {"key": b64(self.base), "range_end": b64(self.end)}}


@dataclass(frozen=True, slots=True)
class Record:
    """What etcd holds for one work ID (absent keys as zero revisions / ``None``)."""

    work_id: str
    holder_id: str | None = None  # from t's value
    token: int = 0  # the current grant's fencing token (0: never acquired)
    token_revision: int = 0  # t's mod_revision
    held: bool = False  # h exists
    hold_holder: str | None = None  # h's value
    hold_lease: int = 0  # h's etcd lease
    checkpoint: bytes | None = None
    checkpoint_revision: int = 0
    prev_exit: ExitMode = ExitMode.NONE
    prev_holder_id: str | None = None
    exit_mode: ExitMode | None = None
    exit_revision: int = 0  # x's mod_revision (0: absent)
    updated: float | None = None  # u's value (client wall time)
    updated_revision: int = 0

    @property
    def exists(self) -> bool:
        return self.token != 0

    def owned_by(self, token: Token) -> bool:
        return self.token == token.fencing_token and self.holder_id == token.holder_id

    def lost(self, token: Token, operation: str) -> LeaseLostError | None:
        """Why a write by ``token`` is refused, fencing first: ``FencedError`` when the
        token is not the current grant, ``LeaseExpiredError`` when its holder released it;
        ``None`` otherwise (the refusal was about the hold alone)."""
        if not self.owned_by(token):
            return fenced(token, operation)
        if self.exit_mode is not None:
            return lease_expired(
                token, operation, f"the holder already released it ({self.exit_mode})"
            )
        return None

    def checkpoint_view(self) -> Checkpoint:
        return Checkpoint(self.checkpoint, self.prev_exit, self.prev_holder_id)

    def successor_prev(self) -> tuple[ExitMode, str | None]:
        """How a new holder records its predecessor's leaving."""
        if not self.exists:
            return ExitMode.NONE, None
        return self.exit_mode or ExitMode.EXPIRED, self.holder_id


def records(prefix: bytes, kvs: Iterable[Mapping[str, Any]]) -> dict[str, Record]:
    """Group range results (``kvs`` of one or more ranges) into records by work ID."""
    fields: dict[str, dict[str, Any]] = {}
    for kv in kvs:
        key = unb64(kv.get("key"))
        if not key.startswith(prefix):
            continue
        name, sep, kind = key[len(prefix) :].rpartition(b"\x00")
        if not sep or kind not in _KINDS:
            continue
        work_id = name.decode("utf-8", errors="replace")
        value = unb64(kv.get("value"))
        mod = int(kv.get("mod_revision", 0))
        row = fields.setdefault(work_id, {"work_id": work_id})
        if kind == b"t":
            slot, _, holder = value.partition(b"\x00")
            row["holder_id"] = holder.decode("utf-8")
            row["token"] = token_of(mod, int(slot))
            row["token_revision"] = mod
        elif kind == b"h":
            row["held"] = True
            row["hold_holder"] = value.decode("utf-8")
            row["hold_lease"] = int(kv.get("lease", 0))
        elif kind == b"c":
            row["checkpoint"] = value or None
            row["checkpoint_revision"] = mod
        elif kind == b"p":
            prev = json.loads(value)
            row["prev_exit"] = ExitMode(prev["exit"])
            row["prev_holder_id"] = prev["holder"]
        elif kind == b"x":
            row["exit_mode"] = ExitMode(value.decode("ascii"))
            row["exit_revision"] = mod
        else:
            row["updated"] = float(value)
            row["updated_revision"] = mod
    return {work_id: Record(**row) for work_id, row in fields.items()}


def record_of(prefix: bytes, work_id: str, kvs: Iterable[Mapping[str, Any]]) -> Record:
    return records(prefix, kvs).get(work_id) or Record(work_id)


def range_kvs(responses: Sequence[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    """Every kv of the range responses of a txn answer."""
    found: list[Mapping[str, Any]] = []
    for response in responses or ():
        found.extend(response.get("response_range", {}).get("kvs", ()))
    return found


# -- request pieces --------------------------------------------------------------------------


def _compare(key: bytes, target: str, field: str, value: Any, result: str) -> dict[str, Any]:
    return {"key": b64(key), "target": target, field: value, "result": result}


def token_of(revision: int, slot: int) -> int:
    return revision * TOKEN_SLOTS + slot


def grant_value(slot: int, holder_id: str) -> bytes:
    return str(slot).encode("ascii") + b"\x00" + holder_id.encode("utf-8")


def same_token(keys: WorkKeys, token: Token) -> list[dict[str, Any]]:
    """The token is the current grant and its holder is the token's."""
    t = keys.key(b"t")
    revision, slot = divmod(token.fencing_token, TOKEN_SLOTS)
    return [
        _compare(t, "MOD", "mod_revision", str(revision), "EQUAL"),
        _compare(t, "VALUE", "value", b64(grant_value(slot, token.holder_id)), "EQUAL"),
    ]


def absent(key: bytes) -> dict[str, Any]:
    return _compare(key, "CREATE", "create_revision", "0", "EQUAL")


def present(key: bytes) -> dict[str, Any]:
    return _compare(key, "CREATE", "create_revision", "0", "GREATER")


def revision_is(key: bytes, revision: int) -> dict[str, Any]:
    return _compare(key, "MOD", "mod_revision", str(revision), "EQUAL")


def attached_to(key: bytes, lease: int) -> dict[str, Any]:
    return _compare(key, "LEASE", "lease", str(lease), "EQUAL")


def put(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete(key: bytes, end: bytes | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key)}
    if end is not None:
        body["range_end"] = b64(end)
    return {"request_delete_range": body}


def stamp(keys: WorkKeys, now: float) -> dict[str, Any]:
    return put(keys.key(b"u"), repr(now).encode("ascii"))


def txn(
    compare: list[dict[str, Any]], success: list[dict[str, Any]], failure: list[dict[str, Any]]
) -> dict[str, Any]:
    return {"compare": compare, "success": success, "failure": failure}


def expire_txn(keys: WorkKeys, seen: Record) -> dict[str, Any]:
    """An operator's expire of the grant ``seen`` shows held: the grant key written again
    with the same value (its new revision is a token nobody holds, so the holder's next
    write is fenced), the hold deleted (the lease lapses now: a waiter's watch sees it);
    refused when anything changed since ``seen`` was read."""
    t = keys.key(b"t")
    return txn(
        [revision_is(t, seen.token_revision), present(keys.key(b"h")), absent(keys.key(b"x"))],
        [put(t, grant_value(seen.token % TOKEN_SLOTS, seen.holder_id or "")),
         delete(keys.key(b"h"))],
        [],
    )  # fmt: skip


def acquire_compares(keys: WorkKeys, seen: Record) -> list[dict[str, Any]]:
    """Nothing changed since ``seen`` was read, and nobody holds the work ID."""
    return [
        revision_is(keys.key(b"t"), seen.token_revision),
        absent(keys.key(b"h")),
        revision_is(keys.key(b"x"), seen.exit_revision),
        revision_is(keys.key(b"c"), seen.checkpoint_revision),
    ]


def acquire_writes(
    keys: WorkKeys, seen: Record, holder_id: str, lease: int, now: float, slot: int = 0
) -> list[dict[str, Any]]:
    """A new grant in ``slot`` of its transaction: grant, predecessor, hold (when
    ``lease``), stamp; no exit."""
    prev_exit, prev_holder = seen.successor_prev()
    holder = holder_id.encode("utf-8")
    writes = [
        put(keys.key(b"t"), grant_value(slot, holder_id)),
        put(keys.key(b"p"), json.dumps({"exit": prev_exit.value, "holder": prev_holder}).encode()),
        delete(keys.key(b"x")),
        stamp(keys, now),
    ]
    if lease:
        writes.insert(2, put(keys.key(b"h"), holder, lease))
    return writes


def checkpoint_writes(keys: WorkKeys, state: bytes | None, now: float) -> list[dict[str, Any]]:
    c = keys.key(b"c")
    return [put(c, state) if state else delete(c), stamp(keys, now)]


def hold(keys: WorkKeys, token: Token, lease: int) -> dict[str, Any]:
    return put(keys.key(b"h"), token.holder_id.encode("utf-8"), lease)


def chunks(items: Sequence[Any], per_item: int) -> list[Sequence[Any]]:
    """``items`` cut so no txn list exceeds ``MAX_TXN_OPS`` at ``per_item`` entries each."""
    size = max(1, MAX_TXN_OPS // per_item)
    return [items[i : i + size] for i in range(0, len(items), size)]


# -- answers ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EtcdAnswer:
    """What to make of an HTTP answer from the gateway that was not a success."""

    error: BackendError
    elsewhere: bool  # another member may answer instead, without risk of a double write
    reauthenticate: bool = False


# gRPC status codes the gateway reports in its JSON error body.
_UNAVAILABLE = 14
_DEADLINE = 4
_UNAUTHENTICATED = 16
# Refused before anything was proposed to Raft ("stopped" is not one of them: a member may
# stop after proposing).
_NOT_APPLIED = ("no leader", "not capable", "too many requests")


def judge_error(
    status: int, body: Mapping[str, Any] | None, operation: str, *, idempotent: bool
) -> EtcdAnswer:
    """An error answer: transient or not, and whether trying another member is safe.

    A write whose outcome is unknown (leader changed, request timed out) is not sent again:
    it raises a transient error, as a lost connection during a PostgreSQL commit does."""
    body = body or {}
    code = int(body.get("code") or body.get("grpc_code") or 0)
    message = str(body.get("message") or body.get("error") or f"HTTP {status}")
    text = f"{operation}: etcd answered {message!r} (HTTP {status})"
    if code == _UNAUTHENTICATED and "token" in message:
        return EtcdAnswer(BackendError(text, transient=True), False, reauthenticate=True)
    if code in (_UNAVAILABLE, _DEADLINE) or status in (502, 503, 504):
        applied_maybe = not any(reason in message for reason in _NOT_APPLIED)
        return EtcdAnswer(BackendError(text, transient=True), idempotent or not applied_maybe)
    return EtcdAnswer(BackendError(text, transient=False), False)


# -- connections -----------------------------------------------------------------------------
# One HTTP/1.1 connection carries one request at a time. httpx's pool could queue the callers
# beyond its connections itself, but its wait is bounded by the request timeout, and a caller
# that waited it out failed over as if every member had failed (issue 23: 300 concurrent
# acquires, every one "no etcd member answered (PoolTimeout)"); its bookkeeping also costs
# requests x connections on every request (those 300 acquires took 6 to 9 s on a 2-core
# machine, nearly all of it the client's CPU; 1.9 s in the lanes). So the backend queues its
# callers itself, first come first served, in lanes with connections of their own: ordinary
# calls, and renewals apart (a crowd of other calls never delays a renewal, as PostgreSQL's
# private pool keeps them apart). httpx's pool has a connection for every request a lane lets
# through, plus one for the release watch, so it never makes anyone wait. 16 connections for
# ordinary calls: the same 300 acquires took 2.6 s with 16, 4.3 s with 32 and 6.3 s with 64
# (ADR-0016); a Python client spends more CPU per request than etcd's round trip takes, so
# more requests in flight than that buy nothing.

MAIN_CONNECTIONS = 16
"""Requests one backend has in flight at once for its ordinary calls; more wait their turn."""
RENEWAL_CONNECTIONS = 4
"""Requests in flight at once for renewals (``renew``, ``renew_many``), apart from the rest."""
WATCH_CONNECTIONS = 1
CONNECTIONS = MAIN_CONNECTIONS + RENEWAL_CONNECTIONS + WATCH_CONNECTIONS
"""The HTTP client's connections: every lane's, and the release watch's."""
QUEUE_WAIT = 30.0
"""Seconds a call waits at most for a connection of its lane (or the request timeout, when
longer). The queue moves as requests in flight end, but nothing bounds how long one takes as
a whole: httpx's timeout bounds each step (connecting, sending, each read), so a member that
trickles its answer holds its connection for as long as it goes on. The bound keeps a call
from waiting on without end behind such requests, or behind a crowd that keeps coming."""


def queue_wait(timeout: float) -> float:
    """How long a call waits for a connection of its lane, for a request ``timeout``."""
    return max(QUEUE_WAIT, timeout)


def lane_wait(bound: float, left: float | None) -> tuple[float, bool]:
    """How long a request waits for a connection of its lane: the lane's ``bound``, or what
    is left of its caller's deadline (``left``: ``worklease._deadline.seconds_left()``) when
    that comes first, with ``True`` beside it then. A request still waiting at its caller's
    deadline is never sent: the caller has given up (an acquire's timeout) or its lease's
    window has closed (a sync checkpoint or release inside a renewal), and a request sent
    later would act for nobody: grant a lease to hand back, or write to a lease already
    reported lost. A wait of 0 with ``True``: the deadline has passed, send nothing."""
    if left is None or left >= bound:
        return bound, False
    return max(left, 0.0), True


def queue_timeout(
    operation: str,
    lane: str,
    size: int,
    waited: float,
    *,
    deadline: bool = False,
    last: BaseException | None = None,
    member: str | None = None,
) -> BackendError:
    """A request that got no connection of its lane in time, so it was never sent: the
    lane's bound ran out (this backend was busy: no member failed), or its caller's deadline
    came first (``deadline``, see ``lane_wait``). ``last``: the error of ``member``, asked
    before by the same call (this was a failover attempt), named and chained; without it no
    member was asked."""
    busy = f"one of this backend's {size} connections for {lane}"
    busy += " (every one busy with this backend's other calls)"
    if not deadline:
        text = f"{operation}: waited {waited:g} s for {busy}"
    elif waited > 0:
        text = f"{operation}: the caller's deadline came while it waited {waited:.3g} s for {busy}"
    else:
        text = f"{operation}: the caller's deadline had passed"
    if last is not None:
        said = first_line(last).removeprefix(f"{operation}: ")
        text += f"; the request was not sent again after etcd at {member} failed ({said})"
    elif deadline:
        text += "; the request was never sent: no etcd member was asked"
    else:
        text += "; no etcd member was asked"
    error = BackendError(text, transient=True)
    error.__cause__ = last
    return error


def closed_in_flight(operation: str, idempotent: bool) -> BackendError:
    """A request in flight when the backend was closed (httpx ends it with a transport
    error): what a closed backend raises (``closed``), saying a write may have been applied."""
    unknown = "" if idempotent else "; whether its write was applied is unknown"
    return BackendError(
        f"{operation}: the backend is closed (it was closed while the request was in flight"
        f"{unknown})"
    )


def pool_timeout(operation: str, exc: BaseException) -> BackendError:
    """httpx gave up waiting for a connection of its own pool: a local wait, no member's
    failure (the lanes keep it from happening; should it happen, nothing fails over)."""
    return BackendError(
        f"{operation}: waited for a free connection of the backend's HTTP client "
        f"({first_line(exc)}); no etcd member was asked",
        transient=True,
    )


RACES = 8
"""Rounds a guarded write is planned again after the work ID changed under it (another
client's acquire or sweep in between); the answer then says what happened."""


@dataclass(slots=True)
class Plan:
    """One work ID's part of a guarded transaction."""

    index: int
    keys: WorkKeys
    token: Token | None
    compares: list[dict[str, Any]]
    writes: list[dict[str, Any]]
    lease: int = 0  # the etcd lease the write attaches (or expects)


# -- the guarded writes of each operation ----------------------------------------------------
# Each builds one work ID's part of a transaction (``Plan``); the backend refreshes or grants
# the etcd leases they name before sending them.


def checkpoint_held(
    index: int, keys: WorkKeys, token: Token, state: bytes | None, now: float, lease: int
) -> Plan:
    """A checkpoint while ``lease`` (just refreshed) still holds the work ID."""
    guard = [*same_token(keys, token), absent(keys.key(b"x")), attached_to(keys.key(b"h"), lease)]
    return Plan(index, keys, token, guard, checkpoint_writes(keys, state, now), lease)


def checkpoint_from(
    index: int,
    keys: WorkKeys,
    token: Token,
    state: bytes | None,
    now: float,
    seen: Record,
    fresh: int,
) -> Plan:
    """A checkpoint planned from the record ``seen`` (neither fenced nor released): with
    ``fresh`` (a new etcd lease) it revives a lapsed lease or moves the hold onto it;
    without, it writes the state and lets the lease lapse (a non-positive TTL)."""
    guard = [*same_token(keys, token), absent(keys.key(b"x"))]
    writes = checkpoint_writes(keys, state, now)
    if not fresh:
        return Plan(index, keys, token, guard, [*writes, delete(keys.key(b"h"))])
    hold_guard = (
        attached_to(keys.key(b"h"), seen.hold_lease) if seen.held else absent(keys.key(b"h"))
    )
    return Plan(
        index, keys, token, [*guard, hold_guard], [*writes, hold(keys, token, fresh)], fresh
    )


def renew_held(index: int, keys: WorkKeys, token: Token, now: float, lease: int) -> Plan:
    """A renewal's stamp while ``lease`` (just refreshed) still holds the work ID."""
    guard = [*same_token(keys, token), attached_to(keys.key(b"h"), lease)]
    return Plan(index, keys, token, guard, [stamp(keys, now)], lease)


def renew_moved(
    index: int, keys: WorkKeys, token: Token, now: float, held_by: int, fresh: int
) -> Plan:
    """A renewal that moves the hold from ``held_by`` onto ``fresh`` (another TTL), or ends
    it now (``fresh`` 0: a non-positive TTL)."""
    guard = [*same_token(keys, token), attached_to(keys.key(b"h"), held_by)]
    if not fresh:
        return Plan(index, keys, token, guard, [delete(keys.key(b"h")), stamp(keys, now)])
    return Plan(index, keys, token, guard, [hold(keys, token, fresh), stamp(keys, now)], fresh)


def release_plan(index: int, keys: WorkKeys, token: Token, mode: ExitMode, now: float) -> Plan:
    """A release: the grant still holds the work ID; records the exit, ends the hold."""
    guard = [*same_token(keys, token), present(keys.key(b"h"))]
    writes = [
        put(keys.key(b"x"), mode.value.encode("ascii")),
        delete(keys.key(b"h")),
        stamp(keys, now),
    ]
    return Plan(index, keys, token, guard, writes)


def still_held_by(plan: Plan, seen: Record) -> bool:
    """Whether a refused plan's own guard held (another work ID of its transaction was the
    refused one): the grant is current, unreleased and still on the plan's etcd lease."""
    assert plan.token is not None
    return bool(
        plan.lease
        and seen.owned_by(plan.token)
        and seen.exit_mode is None
        and seen.hold_lease == plan.lease
    )


# -- keepalives ------------------------------------------------------------------------------
# etcd refreshes leases only through its keepalive stream; the gateway carries it as one JSON
# line per lease in (POST /v3/lease/keepalive) and one answer line per lease out. An answer
# stream can come back short: the gateway is Go's net/http server, which, when a handler
# starts writing its answer before it has read the whole request, discards the unread rest of
# the request body (up to 256 KiB; Go issue 15527). The gateway writes the first answer as
# soon as etcd has it, while it is still decoding lines, so the lines it had not decoded by
# then never reach etcd: they are neither applied nor answered, and nothing says so (measured
# on etcd 3.4, benchmarks/etcd_keepalive_stream.py: a 1,000-line request came back short 18
# times in 30, down to 19 lines, always a prefix, the unanswered leases' TTLs still running
# down; padded past 256 KiB, which Go does not discard, it was always answered whole). Go's
# JSON decoder reads 512 bytes first, so a request of at most 512 bytes is read whole before
# any answer is written: 19 lines (512 bytes) never came back short, 20 (539 bytes) did 16
# times in 60 (ADR-0016). So requests carry at most ``KEEPALIVE_BODY_BYTES``, and any lease
# still unanswered is sent again: an unanswered lease is unknown, never gone (etcd answers a
# lease it does not have, with TTL 0).

KEEPALIVE_BODY_BYTES = 512
"""Bytes of keepalive lines per request: what the gateway reads before it answers."""


def keepalive_line(lease: int) -> str:
    """One keepalive request line (the ID as a JSON number: shorter, and etcd reads an int64
    exactly)."""
    return f'{{"ID":{lease}}}'


def keepalive_bodies(leases: Sequence[int]) -> list[str]:
    """The request bodies refreshing ``leases``: lines in order, each body at most
    ``KEEPALIVE_BODY_BYTES`` (a line longer than that goes alone)."""
    bodies: list[str] = []
    lines: list[str] = []
    size = 0
    for lease in leases:
        line = keepalive_line(lease)
        grown = size + len(line) + (1 if lines else 0)
        if lines and grown > KEEPALIVE_BODY_BYTES:
            bodies.append("\n".join(lines))
            lines, grown = [], len(line)
        lines.append(line)
        size = grown
    if lines:
        bodies.append("\n".join(lines))
    return bodies


def keepalive_answers(text: str, operation: str) -> tuple[dict[int, int], BackendError | None]:
    """The leases one answer stream answered (lease -> TTL; 0: etcd does not have it, it is
    gone) and the error the member reported in it, if any. A lease without an answer line is
    not in the result: whether it was refreshed is unknown."""
    answered: dict[int, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        message = json.loads(line)
        if "error" in message:
            return answered, judge_error(503, message["error"], operation, idempotent=True).error
        result = message.get("result", {})
        if "ID" in result:
            answered[int(result["ID"])] = max(int(result.get("TTL", 0)), 0)
    return answered, None


class Keepalives:
    """One refresh of etcd leases, request by request, until every lease is answered.

    ``bodies()`` gives the next round's requests (the leases still unanswered); ``take(text)``
    records an answer stream and says whether the next request should go to another member
    (the member reported an error, or answered none of the request's leases);
    ``next_round()`` ends a round (``waiting`` empty: done). A round that gets no new answer
    counts as a stall; after one stall per member (each on another member) the refresh gives
    up with a transient ``BackendError``: the leases without an answer may or may not have
    been refreshed, which is never reported as a loss. Every request whose stream works is
    answered at least its first line, so a refresh sends at most about one request per lease.
    """

    def __init__(self, leases: Iterable[int], operation: str, members: int) -> None:
        self.operation = operation
        self.members = max(members, 1)
        self.alive: dict[int, int] = {}
        self.waiting: list[int] = list(dict.fromkeys(leases))
        self._asked = len(self.waiting)
        self._progress = 0
        self._stalls = 0
        self._rounds = 0
        self._error: BackendError | None = None

    def bodies(self) -> list[str]:
        return keepalive_bodies(self.waiting)

    def take(self, text: str) -> bool:
        answered, error = keepalive_answers(text, self.operation)
        fresh = 0
        for lease, ttl in answered.items():
            if lease not in self.alive:
                self.alive[lease] = ttl
                fresh += 1
        self._progress += fresh
        if error is not None:
            self._error = error
        return error is not None or fresh == 0

    def next_round(self) -> None:
        """End a round: ``waiting`` keeps the leases still unanswered (the next round's);
        raises the transient error once rounds stopped getting answers."""
        self._rounds += 1
        self.waiting = [lease for lease in self.waiting if lease not in self.alive]
        if not self.waiting:
            return
        self._stalls = 0 if self._progress else self._stalls + 1
        self._progress = 0
        if self._stalls >= self.members:
            raise self.unanswered()

    def unanswered(self) -> BackendError:
        cause = f"; the member said: {self._error}" if self._error is not None else ""
        error = BackendError(
            f"{self.operation}: etcd answered the keepalives of {len(self.alive)} of "
            f"{self._asked} leases; {len(self.waiting)} got no answer in {self._rounds} "
            f"rounds, so whether they were refreshed is unknown{cause}",
            transient=True,
        )
        error.__cause__ = self._error
        return error


def cut(plans: Sequence[Plan]) -> list[Sequence[Plan]]:
    """Plans in groups that fit one transaction: its compare and write lists, and the bytes
    it carries (etcd refuses a request over ``--max-request-bytes``; a plan too large for
    any request goes alone, and etcd's refusal is its own)."""
    groups: list[Sequence[Plan]] = []
    current: list[Plan] = []
    compares = writes = size = 0
    for plan in plans:
        c, w, b = len(plan.compares), len(plan.writes), plan_bytes(plan)
        if current and (
            compares + c > MAX_TXN_OPS
            or writes + w > MAX_TXN_OPS
            or len(current) >= MAX_TXN_OPS
            or size + b > MAX_TXN_BYTES
        ):
            groups.append(current)
            current, compares, writes, size = [], 0, 0, 0
        current.append(plan)
        compares += c
        writes += w
        size += b
    if current:
        groups.append(current)
    return groups


def plan_bytes(plan: Plan) -> int:
    return sum(len(op.get("request_put", {}).get("value", "")) for op in plan.writes) + 256


def sweep_txn(prefix: bytes, part: Sequence[Record]) -> dict[str, Any]:
    compares: list[dict[str, Any]] = []
    deletes: list[dict[str, Any]] = []
    for record in part:
        keys = WorkKeys.of(prefix, record.work_id)
        compares += [
            absent(keys.key(b"h")),
            revision_is(keys.key(b"t"), record.token_revision),
            revision_is(keys.key(b"u"), record.updated_revision),
        ]
        deletes.append(delete(keys.base, keys.end))
    return txn(compares, deletes, [])


def expiry(started: float, ttl: float) -> datetime:
    """The expiry a holder may count on: from before the request, so never later than
    etcd's (whose lease starts when the grant arrives and lasts at least ``ttl``)."""
    now = datetime.fromtimestamp(started, UTC)
    if ttl <= 0:
        return now + min(timedelta(seconds=ttl), -timedelta(microseconds=1))
    return now + timedelta(seconds=ttl)


def tls_context(ca_file: str | None, cert_file: str | None, key_file: str | None) -> ssl.SSLContext:
    """The client's TLS settings from files; a file that cannot be used is a ``ConfigError``
    naming it (before any I/O)."""
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"ca_file {ca_file!r} cannot be used: {exc}") from None
    if cert_file is not None and key_file is not None:
        try:
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cert_file {cert_file!r} / key_file {key_file!r} cannot be used: {exc}"
            ) from None
    return context


def tls_cause(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a transport error, if that is what it was."""
    seen = exc.__cause__ or exc.__context__
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def tls_failed(operation: str, endpoint: str, exc: BaseException) -> BackendError:
    """A TLS handshake that failed: a setting to fix, not a member to skip."""
    return BackendError(
        f"{operation}: TLS with etcd at {endpoint} failed ({first_line(exc)}); check "
        "ca_file, cert_file and key_file (or ssl_context)",
        transient=False,
    )


def contended(token: Token, operation: str) -> BackendError:
    return BackendError(
        f"{operation}: work ID {token.work_id!r} kept changing under {RACES} attempts",
        transient=True,
    )
