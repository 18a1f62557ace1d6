"""The Redis / Valkey backend's decisions, shared by both flavours (ADR-0020): key layout,
the server-side script of every operation, token arithmetic and what each answer means.

Layout. A work ID is one hash, ``prefix + work_id``: a single key, so every script touches
one hash slot on any Cluster. Fields (times in the server's milliseconds):

- ``t``: the fencing token, ``max(previous + 1, now_ms * TOKEN_STEPS)`` (see ADR-0020).
- ``h``: the holder ID of the current (or last) grant.
- ``e``: when the grant expires; ``a`` / ``u``: when it was acquired / last written.
- ``c``: the checkpoint (absent: none).
- ``x``: the exit the holder declared with release (absent while held or lapsed).
- ``pe`` / ``ph``: how the previous holder left (``none`` for a first grant) and who it was.
- ``n``: the request ID of the release (or forget) that wrote the row last.
- ``f``: set on a forgotten row's tombstone (only ``t``, ``h``, ``n`` and ``f``; it expires once the
  server clock has passed its token): no row to anyone, but its token is never issued again.

Every script reads the hash, decides and writes in one atomic step, with ``TIME`` as the
clock: expiry is the server's decision, never a client's. A refusal says why in the same
reply (``FENCED`` before ``DECLARED`` before ``LAPSED``), so it is classified without
another round trip.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, cast
from urllib.parse import unquote

from ._failures import fenced, held, lease_expired
from ._models import Checkpoint, ExitMode, Token
from ._validation import positive_seconds
from .errors import BackendError, ConfigError, LeaseHeldError, LeaseLostError

__all__ = [
    "ACQUIRE",
    "BATCH",
    "CHECKPOINT",
    "DEFAULT_PREFIX",
    "EXPIRE",
    "FORGET",
    "HOLDER",
    "READ",
    "RELEASE",
    "RENEW",
    "TOKEN_STEPS",
    "Grant",
    "check_prefix",
    "decode_grant",
    "decode_guarded",
    "decode_read",
    "key_of",
    "milliseconds",
]

DEFAULT_PREFIX = "worklease:"
RELEASE_CHANNEL = "worklease:release"
"""The pub/sub channel a release or forget announces its work ID on."""
TOKEN_STEPS = 1024
"""Tokens per server millisecond of one work ID before the token runs ahead of the clock."""

GRANTED, HELD = 1, 0
OK, FENCED, DECLARED, LAPSED = 1, -1, -2, -3
"""Reply codes: the first element of every script's reply."""

_PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(n)
  return string.format('%.0f', n)
end
"""

_FENCE = """
local r = redis.call('HMGET', KEYS[1], 't', 'h', 'e', 'x', 'f', 'n')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] or r[5] then
  return {-1}
end
local now = now_ms()
"""
_DECLARED = """
if r[4] then
  return {-2, r[4]}
end
"""
_OWNED = _FENCE + _DECLARED
"""The check every guarded write starts with (``ARGV[1]`` token, ``ARGV[2]`` holder), in one
read of the hash: another token or no row is fenced; a declared exit is expired."""

_LAPSED = """
if tonumber(r[3]) <= now then
  return {-3, tonumber(r[3])}
end
"""
_GUARD = _OWNED + _LAPSED
"""``_OWNED``, and a passed expiry is expired too (renew, release: they cannot revive a
lapsed lease)."""

ACQUIRE = (
    _PRELUDE
    + """
local r = redis.call('HMGET', KEYS[1], 't', 'h', 'e', 'x', 'c', 'f')
local now = now_ms()
if r[6] then
  -- a forgotten row's tombstone: no row, but its token is not to be issued again
  redis.call('DEL', KEYS[1])
  r = {r[1], false, false, false, false}
elseif r[1] and not r[4] and tonumber(r[3]) > now then
  return {0, r[2], tonumber(r[3])}
end
local prev_exit = 'none'
if r[2] then
  prev_exit = r[4] or 'expired'
end
local token = math.max((tonumber(r[1]) or 0) + 1, now * 1024)
local expires = now + tonumber(ARGV[2])
-- Three calls in all: the previous holder goes in with the grant, or out with the exit
if r[2] then
  redis.call('HSET', KEYS[1], 't', int(token), 'h', ARGV[1], 'e', int(expires),
    'a', int(now), 'u', int(now), 'pe', prev_exit, 'ph', r[2])
  redis.call('HDEL', KEYS[1], 'x', 'n')
else
  redis.call('HSET', KEYS[1], 't', int(token), 'h', ARGV[1], 'e', int(expires),
    'a', int(now), 'u', int(now), 'pe', prev_exit)
  redis.call('HDEL', KEYS[1], 'x', 'n', 'ph')
end
return {1, int(token), expires, prev_exit, r[2] or false, r[5] or false}
"""
)
"""``ARGV``: holder ID, TTL in ms. Held: ``{0, holder, expires}``. Granted: ``{1, token,
expires, previous exit, previous holder, checkpoint}``."""

RENEW = (
    _PRELUDE
    + _GUARD
    + """
local expires = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'e', int(expires), 'u', int(now))
return expires
"""
)
"""``ARGV``: token, holder ID, TTL in ms. The new expiry, or a refusal (a list)."""

CHECKPOINT = (
    _PRELUDE
    + _OWNED
    + """
local expires = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'e', int(expires), 'u', int(now))
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[1], 'c')
else
  redis.call('HSET', KEYS[1], 'c', ARGV[4])
end
return expires
"""
)
"""``ARGV``: token, holder ID, TTL in ms, the state (empty: clear it). Written together with
the extension, or not at all. A lapsed grant nobody superseded is revived (as on every
backend: the holder's work was not taken over)."""

RELEASE = (
    _PRELUDE
    + _FENCE
    + """
if r[6] == ARGV[6] then
  return now  -- this very call, sent again (a client's retry): done already
end
"""
    + _DECLARED
    + _LAPSED
    + """
redis.call('HSET', KEYS[1], 'x', ARGV[3], 'e', int(now), 'u', int(now), 'n', ARGV[6])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return now
"""
)
"""``ARGV``: token, holder ID, exit mode, channel, key, request ID. Expires the grant now,
records the exit and announces the key. The same call sent again (same request ID: a client
that retried after sending) succeeds without writing; any other release of the token is
refused (expired), as on every backend."""

FORGET = (
    _PRELUDE
    + """
local r = redis.call('HMGET', KEYS[1], 't', 'h', 'f', 'n')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] then
  return {-1}
end
if r[3] then
  if r[4] == ARGV[5] then
    return 1  -- this very call, sent again (a client's retry): done already
  end
  return {-1}  -- forgotten already: no row
end
-- Kept until the server clock passed the token (it may run ahead of the clock), at least 1 s.
local hold_ms = math.max(1000, math.floor(tonumber(ARGV[1]) / 1024) - now_ms() + 1000)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 't', ARGV[1], 'h', ARGV[2], 'f', '1', 'n', ARGV[5])
redis.call('PEXPIRE', KEYS[1], hold_ms)
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
"""
)
"""``ARGV``: token, holder ID, channel, key, request ID. Deletes the row of the current
grant, leaving a tombstone (``f``) with its token and holder until the server clock has
passed the token, at least one second: an acquire meanwhile still issues a greater token
(afterwards the clock alone does). The same call sent again (same request ID) succeeds; a
second forget finds no row (fenced)."""

EXPIRE = (
    _PRELUDE
    + """
local r = redis.call('HMGET', KEYS[1], 't', 'e', 'x', 'f')
local now = now_ms()
if not r[1] or r[3] or r[4] or tonumber(r[2]) <= now then
  return 0
end
local token = math.max(tonumber(r[1]) + 1, now * 1024)
redis.call('HSET', KEYS[1], 't', int(token), 'e', int(now), 'u', int(now))
redis.call('HDEL', KEYS[1], 'n')
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
"""
)
"""``ARGV``: channel, key. An operator's expire: the grant ends now and its token is
replaced by a greater one nobody holds (the holder's next write is fenced; the next acquire
reads the previous exit ``expired``). ``0`` when not held."""

HOLDER = (
    _PRELUDE
    + """
local r = redis.call('HMGET', KEYS[1], 'h', 'e', 'x', 'f')
if not r[1] or r[3] or r[4] or tonumber(r[2]) <= now_ms() then
  return 0
end
if ARGV[1] == '1' then
  return {r[1], redis.call('HGET', KEYS[1], 'c') or false}
end
return {r[1]}
"""
)
"""``ARGV``: ``'1'`` to return the checkpoint too. Who holds the work ID now, by the
server's clock: ``0`` when an acquire would grant it, else ``{holder}`` (``{holder,
checkpoint}``). Writes nothing (``find_available``, ``survey``)."""

BATCH = 256
"""Scripts per pipeline of a batch operation: one round trip per node for each."""

READ = """
local r = redis.call('HMGET', KEYS[1], 't', 'c', 'pe', 'ph', 'f')
if r[1] ~= ARGV[1] or r[5] then
  return {-1}
end
return {1, r[2] or false, r[3], r[4] or false}
"""
"""``ARGV``: token. ``{1, checkpoint, previous exit, previous holder}`` or fenced."""


def check_replicas(replicas: object, timeout: object, *, cluster: bool) -> tuple[int, int]:
    """``replicas=`` and ``replica_timeout=`` as ``(replicas, timeout in ms)``."""
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise TypeError(f"replicas must be an int, not {replicas!r}")
    if replicas < 0:
        raise ValueError(f"replicas must be 0 or more, got {replicas!r}")
    seconds = positive_seconds(timeout, "replica_timeout", maximum=60.0)
    if replicas and cluster:
        raise ConfigError(
            "replicas= needs a standalone or Sentinel client: a Cluster pipeline cannot "
            "send WAIT to the master that took each write"
        )
    return replicas, max(1, math.ceil(seconds * 1000))


def check_replicated(operation: str, answer: object, replicas: int, timeout_ms: int) -> None:
    """``WAIT``'s answer after a write: fewer replicas than asked is a transient failure (the
    write is on the primary, and would be lost if it failed over now)."""
    if isinstance(answer, Exception):
        raise answer
    count = _int(answer)
    if count < replicas:
        raise BackendError(
            f"{operation}: written on the primary, but {count} of {replicas} replica(s) "
            f"confirmed it within {timeout_ms} ms (a failover now could lose it)",
            transient=True,
        )


def request_id() -> str:
    """A fresh ID for one release or forget call: the script tells the same call sent
    again (a client's retry after sending) from a second call."""
    return os.urandom(8).hex()


def check_prefix(prefix: object) -> str:
    """A key prefix: a non-empty string (keys are ``prefix + work_id``)."""
    if not isinstance(prefix, str) or not prefix:
        raise ConfigError(f"prefix must be a non-empty string, got {prefix!r}")
    return prefix


def key_of(prefix: str, work_id: str) -> str:
    return prefix + work_id


def milliseconds(seconds: float) -> int:
    """A TTL in whole milliseconds, rounded up (a lease never lasts less than asked); zero
    or less stays so (an already-expired lease, the test affordance of ``backend_ttl``)."""
    if seconds <= 0:
        return math.floor(seconds * 1000)
    return max(1, math.ceil(seconds * 1000))


def _text(value: object) -> str | None:
    if value is None or value is False:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | bytes | str):
        raise BackendError(f"unexpected reply from the server: {value!r}")
    return int(value)


def _bytes(value: object) -> bytes | None:
    return bytes(value) if isinstance(value, bytes | bytearray) else None


def at(ms: int) -> datetime:
    """A server time in milliseconds as an aware datetime."""
    return datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(frozen=True)
class Grant:
    """What an acquire returned: the new token's number and expiry, and the checkpoint the
    previous holder left with how it left."""

    fencing_token: int
    expires_at: datetime
    prior: Checkpoint


def decode_grant(work_id: str, reply: list[object]) -> Grant | LeaseHeldError:
    """An acquire's reply: the grant, or the refusal naming the holder (returned, for the
    caller to raise or count)."""
    code = reply[0]
    if code == HELD:
        return held(work_id, _text(reply[1]), at(_int(reply[2])))
    if code != GRANTED:
        raise BackendError(f"acquire: unexpected reply from the server: {reply!r}")
    token, expires, prev_exit, prev_holder, state = reply[1:6]
    exit_name = _text(prev_exit) or "none"
    prior = Checkpoint(_bytes(state), ExitMode.from_stored(exit_name), _text(prev_holder))
    return Grant(_int(token), at(_int(expires)), prior)


def decode_guarded(token: Token, operation: str, reply: object) -> datetime:
    """A guarded write's reply: the new expiry (a bare integer, the cheapest reply to read),
    or the loss raised (a refusal is a list: fenced before expired)."""
    if isinstance(reply, int) and not isinstance(reply, bool) and reply > 0:
        return at(reply)
    if not isinstance(reply, list) or not reply:
        raise BackendError(f"{operation}: unexpected reply from the server: {reply!r}")
    raise refusal(token, operation, reply)


def refusal(token: Token, operation: str, reply: list[object]) -> LeaseLostError:
    code = reply[0]
    if code == FENCED:
        return fenced(token, operation)
    if code == DECLARED:
        return lease_expired(token, operation, f"the lease was released ({_text(reply[1])})")
    if code == LAPSED:
        return lease_expired(token, operation, "the lease expired")
    raise BackendError(f"{operation}: unexpected reply from the server: {reply!r}")


def outcome(token: Token, operation: str, reply: object) -> LeaseLostError | None:
    """A guarded write's reply in a batch: ``None`` when it was written, else the loss the
    single operation would raise (returned, one per item)."""
    if isinstance(reply, int) and not isinstance(reply, bool) and reply > 0:
        return None
    if not isinstance(reply, list) or not reply:
        raise BackendError(f"{operation}: unexpected reply from the server: {reply!r}")
    return refusal(token, operation, reply)


def decode_holder(reply: object) -> tuple[str, bytes | None] | None:
    """``HOLDER``'s reply: ``(holder, checkpoint)`` while held, ``None`` when free."""
    if reply == 0:
        return None
    if not isinstance(reply, list) or not reply:
        raise BackendError(f"unexpected reply from the server: {reply!r}")
    return _text(reply[0]) or "", _bytes(reply[1]) if len(reply) > 1 else None


def work_id_of(prefix: str, message: object) -> str | None:
    """The work ID a release announcement names, ``None`` when it is another prefix's (the
    channel is shared by every prefix on the server; the message is the row's key)."""
    key = _text(message) if isinstance(message, bytes | str) else None
    if key is None or not key.startswith(prefix):
        return None
    return key[len(prefix) :]


def decode_read(token: Token, reply: list[object]) -> Checkpoint:
    if reply[0] != OK:
        raise refusal(token, "read_checkpoint", reply)
    state, prev_exit, prev_holder = reply[1:4]
    return Checkpoint(
        _bytes(state), ExitMode.from_stored(_text(prev_exit) or "none"), _text(prev_holder)
    )


def is_held(outcome: Grant | LeaseHeldError) -> bool:
    return isinstance(outcome, LeaseHeldError)


SWEEP = (
    _PRELUDE
    + """
local r = redis.call('HMGET', KEYS[1], 't', 'e', 'x', 'u', 'f', 'h')
if r[1] ~= ARGV[1] or r[5] or not r[6] then
  return 0
end
local now = now_ms()
if not r[3] and tonumber(r[2]) > now then
  return 0
end
if tonumber(r[4]) >= now - tonumber(ARGV[2]) then
  return 0
end
if tonumber(r[1]) >= now * 1024 then
  return 0  -- its token ran ahead of the clock: deleting it could let an acquire undercut it
end
if r[3] == 'retired' or (ARGV[3] == '1' and not r[3]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""
)
"""``ARGV``: the token seen, the retention in ms, ``'1'`` to include lapsed undeclared rows.
Deletes the row only if it is still the one seen (not a tombstone), not held, last written
more than the retention ago by the server's clock, retired (or lapsed, if asked), and its
token below what the clock issues now, so the next acquire's token is greater without it."""

_GLOB_SPECIAL = str.maketrans({c: "\\" + c for c in "*?[]\\"})


def scan_pattern(prefix: str) -> str:
    """The ``SCAN MATCH`` pattern of every key under ``prefix`` (its glob characters
    escaped)."""
    return prefix.translate(_GLOB_SPECIAL) + "*"


ROW_FIELDS = ("t", "h", "e", "x", "pe", "ph", "u", "f", "c")


@dataclass(frozen=True)
class Row:
    """A work ID's hash as read for ``rows()`` and ``sweep``."""

    work_id: str
    token: int
    holder_id: str
    expires_ms: int
    exit_mode: str | None
    prev_exit: str | None
    prev_holder_id: str | None
    updated_ms: int
    checkpoint_bytes: int | None

    def held(self, now_ms: int) -> bool:
        return self.exit_mode is None and self.expires_ms > now_ms

    def sweepable(self, now_ms: int, cutoff_ms: int, include_expired: bool) -> bool:
        """A first guess (the sweep script decides, on the server's clock)."""
        if self.held(now_ms) or self.updated_ms >= cutoff_ms:
            return False
        return self.exit_mode == "retired" or (include_expired and self.exit_mode is None)


def decode_row(prefix: str, key: bytes | str, values: list[object]) -> Row | None:
    """A hash's fields (``ROW_FIELDS`` order, the checkpoint as its length); ``None`` for a
    key that is not a lease row (gone meanwhile, or another application's)."""
    token, holder, expires, exit_mode, prev_exit, prev_holder, updated, tomb, size = values
    try:
        name = key.decode() if isinstance(key, bytes) else key
    except UnicodeDecodeError:
        return None  # not a work ID of ours (work IDs are text)
    if token is None or holder is None or expires is None or tomb is not None:
        return None
    if not name.startswith(prefix):
        return None
    try:
        return Row(
            name[len(prefix) :],
            _int(token),
            _text(holder) or "",
            _int(expires),
            _text(exit_mode),
            _text(prev_exit),
            _text(prev_holder),
            _int(updated) if updated is not None else 0,
            _int(size) if size else None,
        )
    except (BackendError, UnicodeDecodeError):
        return None


# -- where the server is --------------------------------------------------------------------

TargetKind = Literal["standalone", "cluster", "sentinel"]


@dataclass(frozen=True)
class RedisTarget:
    """A Redis URL read: what kind of deployment and how to reach it.

    - ``redis://[user:password@]host[:port][/db]`` (``rediss://`` for TLS, ``unix://path``):
      one server (a standalone primary);
    - ``redis+cluster://[user:password@]host[:port]`` (``rediss+cluster://``): a Redis
      Cluster, through any of its nodes;
    - ``redis+sentinel://[user:password@]host[:port][,host[:port]...]/master[/db]``
      (``rediss+sentinel://``): the primary the sentinels name for ``master``; the
      credentials are the primary's.
    """

    kind: TargetKind
    url: str
    """What redis-py's ``from_url`` takes (standalone, cluster); empty for a sentinel."""
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False


_SCHEMES = {
    "redis": ("standalone", "redis"),
    "rediss": ("standalone", "rediss"),
    "unix": ("standalone", "unix"),
    "redis+cluster": ("cluster", "redis"),
    "rediss+cluster": ("cluster", "rediss"),
    "redis+sentinel": ("sentinel", "redis"),
    "rediss+sentinel": ("sentinel", "rediss"),
}


def parse_redis_url(url: object) -> RedisTarget:
    """Read a Redis URL (see ``RedisTarget``); ``ConfigError`` says what is wrong with it,
    never repeating a password."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(
            "a Redis URL looks like redis://host:6379/0, redis+cluster://host:7000 or "
            "redis+sentinel://host:26379/mymaster"
        )
    scheme, rest = url.split("://", 1)
    known = _SCHEMES.get(scheme.lower())
    if known is None:
        raise ConfigError(
            f"unknown Redis URL scheme {scheme!r}: use one of {', '.join(sorted(_SCHEMES))}"
        )
    kind, plain = known
    if kind != "sentinel":
        return RedisTarget(cast(TargetKind, kind), f"{plain}://{rest}", tls=plain == "rediss")
    credentials, _, location = rest.rpartition("@")
    hosts, _, path = location.partition("/")
    parts = [part for part in path.split("/") if part]
    if not parts or len(parts) > 2:
        raise ConfigError(
            "a Sentinel URL names the master after the hosts: "
            "redis+sentinel://host:26379[,host:26379...]/mymaster[/db]"
        )
    sentinels: list[tuple[str, int]] = []
    for host in hosts.split(","):
        name, _, port = host.strip().rpartition(":") if ":" in host else (host.strip(), "", "")
        if not name or (port and not port.isdigit()):
            raise ConfigError(f"a sentinel address is host[:port], got {host.strip()!r}")
        sentinels.append((name, int(port) if port else 26379))
    if len(parts) == 2 and not parts[1].isdigit():
        raise ConfigError(f"the database after the master is a number, got {parts[1]!r}")
    username, password = None, None
    if credentials:
        user, colon, secret = credentials.partition(":")
        username, password = (user or None, secret) if colon else (None, user)
    return RedisTarget(
        "sentinel",
        "",
        tuple(sentinels),
        unquote(parts[0]),
        int(parts[1]) if len(parts) == 2 else 0,
        unquote(username) if username else None,
        unquote(password) if password is not None else None,
        plain == "rediss",
    )


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for messages and reports)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    credentials, at_sign, location = rest.rpartition("@")
    if not at_sign:
        return url
    user, colon, _ = credentials.partition(":")
    hidden = f"{user}:***" if colon else "***"
    return f"{scheme}://{hidden}@{location}"
