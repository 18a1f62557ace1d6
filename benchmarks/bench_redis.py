#!/usr/bin/env python
"""Redis: worklease's backend beside hand-written Lua floors, handoff latency, renewal
throughput, and standalone versus Cluster scaling, in one run.

Servers: private ``redis-server`` processes from ``tests/redis_servers.py`` on loopback ports
(persistence off; never a Redis on 6379), stopped at the end. Client and servers share the
machine's CPUs, so every comparison is measured side by side in the same run.

**1. Per operation** (acquire, checkpoint of ``--state-bytes`` (256) bytes, renew, release,
acquire + release), sync and async, one call at a time, each side on its own keys:

- **Lease**: ``Lease(RedisBackend(redis.Redis(...)))`` / ``AsyncLease(AsyncRedisBackend(
  redis.asyncio.Redis(...)))``, what users call. Each operation is one ``EVALSHA`` of one of
  worklease's scripts (``worklease._redis``), with the arguments checked and the token sealed
  client-side, the observer called and the write sent through the lease's group commit (a
  lone call goes at once, alone): acquire = ``ACQUIRE`` (``HMGET`` of 6 fields, ``TIME``, the
  token ``max(previous + 1, now_ms * 1024)``, ``HSET`` of 7 fields, ``HDEL x n``, ``HSET`` or
  ``HDEL ph``; the reply also carries the previous exit, the previous holder and the
  checkpoint); checkpoint = ``CHECKPOINT`` (``HMGET`` of 6 fields: token, holder, expiry,
  declared exit, tombstone, request ID; ``TIME``; refused if fenced or released; ``HSET e u``,
  ``HSET c``); renew = ``RENEW`` (the same guard, refused if lapsed too; ``HSET e u``);
  release = ``RELEASE`` (the same read, a retried call recognised by its 8-byte request ID,
  the renew's guard, ``HSET x e u n``, ``PUBLISH worklease:release <key>``).
- **backend**: the same backend methods called directly (``backend.acquire(work_id, holder,
  ttl)``, ...): the same scripts without the lease layer.
- **same-effect hand-written** (the floor of the target): redis-py with its defaults
  (``redis.Redis`` / ``redis.asyncio.Redis``, ``decode_responses=False``), one script per
  operation registered with ``register_script`` and called the same way (``EVALSHA``), what a
  user would write by hand for the same effect as worklease's script, minimally (``SAME_*``):
  acquire = ``TIME``, ``HMGET`` of 5 fields, refused while held (the reply: the holder), else
  the token ``max(previous + 1, now_ms * 1024)`` (failover-safe), ``HSET`` token, holder,
  expiry, previous exit (its declared exit, ``expired`` or ``none``) and previous holder,
  ``HDEL`` the exit, the reply ``{token, expiry, previous exit, previous holder,
  checkpoint}``; checkpoint = ``TIME``, ``HMGET`` token, holder, exit, compare, refused once
  released, ``HSET`` state + expiry; renew = ``HMGET`` token, holder, expiry, exit, refused
  once released or lapsed, ``HSET`` expiry; release = the same check, ``HSET`` exit, time
  and expiry now, ``PUBLISH`` the key (on a channel nobody subscribes to, as worklease's in
  this part). Nothing beyond the effect: no tombstone, no request ID, no ``a`` / ``u``
  fields.
- **plain hand-written** (beside it, no target): the cheaper scripts a user might write first
  (``HAND_*``), doing less: acquire = grant if free, expired or released, ``HINCRBY`` the
  token (a counter a Sentinel failover can reissue), ``HSET`` holder + expiry, ``HDEL`` the
  exit, the reply only the token and expiry (no checkpoint, no previous exit or holder);
  checkpoint = ``HMGET`` token + holder, compare, ``HSET`` state + expiry; renew = the same
  check, ``HSET`` expiry; release = the same check, ``HSET`` expiry 0 + exit, ``PUBLISH``
  (no lapse or release check anywhere, no time recorded).
- **redis-py Lock** (a reference row, no target): ``client.lock(name, timeout=ttl)``,
  ``acquire(blocking=False)`` (``SET NX PX`` of a random token) + ``release()`` (one Lua
  script: ``GET``, compare, ``DEL``). It stores no checkpoint, issues no fencing token,
  records no exit and announces no release.

The sides take turns in blocks of ``--block`` iterations (the order rotating every block)
after ``--warmup`` untimed calls each, so drift hits them alike. Target (the issue's): the
Lease at most 1.15 x the same-effect hand-written script per operation (medians); the ratio to
the plain script is reported beside it. The "where the time goes" pass measures every script's
own server time (``SLOWLOG``): worklease's against the same-effect ones (the plain ones too).

**2. Handoff**: a successor waits in ``Lease.acquire(work_id, wait=True, timeout=60,
poll_interval=30)`` on a backend of its own (its own client); from just before the holder's
``release`` until the successor's acquire returns. Only the release announcement
(``watch_releases``, pub/sub) explains a fast one; sync (a thread) and async (a task).

**3. Renewal throughput**: 1,000 (``--leases``) work IDs acquired with ``acquire_many``, then
renewed over and over for ``--seconds`` per side, in alternating slices: ``renew_many`` (the
scripts pipelined, 256 per pipeline: 4 round trips), one ``renew`` call per lease, and the
same-effect hand-written renew script pipelined the same way (``EVALSHA`` on a pipeline, 256
at a time).

**4. Standalone vs Cluster**: ``--processes`` worker processes (``multiprocessing``, spawned),
each with its own client and ``Lease`` (sync), loop over their own ``--work-ids`` distinct
work IDs doing acquire + checkpoint + release for ``--seconds``, against one standalone
server, a Cluster of 1 master and a Cluster of 3 masters (``redis.cluster.RedisCluster``), in
``--rounds`` alternating rounds. Reported: cycles/s, the servers' CPU (``INFO cpu``
``used_cpu_user + used_cpu_sys`` deltas per node), the workers' CPU and the whole machine's
(``/proc/stat``), so a reader can tell which side was the limit. Target (the issue's): a
Cluster of 3 at least 2 x one master's throughput.

Results: ``benchmarks/results/redis.md`` and ``redis.json``; ``nox -s bench`` runs it. The
script reports; it never fails on a number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib
import json
import math
import multiprocessing
import os
import platform
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter, perf_counter_ns
from typing import Any

import redis
import redis.asyncio
from redis.cluster import RedisCluster

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_ops import RESULTS  # noqa: E402

from tests import redis_servers  # noqa: E402
from worklease import (  # noqa: E402
    AsyncLease,
    AsyncRedisBackend,
    ExitMode,
    Lease,
    RedisBackend,
    Token,
)
from worklease._redis import ACQUIRE, CHECKPOINT, RELEASE, RENEW  # noqa: E402

OPERATIONS = ("acquire", "checkpoint", "renew", "release", "acquire+release")
LOCK_ROW = "acquire+release vs redis-py Lock"
TARGET = 1.15
"""The issue's bound: worklease (through the Lease) / the same-effect hand-written script,
per operation."""
CLUSTER_TARGET = 2.0
"""The issue's bound: a Cluster of 3 masters / one master, in throughput."""
POLL = 30.0
HOLDER = "bench"
HAND_CHANNEL = "bench-hand:release"

Step = Callable[[], int]
AStep = Callable[[], Awaitable[int]]

# -- the hand-written floors -----------------------------------------------------------------
# Two per operation. **Same-effect**: what a user would write by hand to get what worklease's
# script does (the target's floor). **Plain**: a cheaper script that does less (kept beside it,
# so the price of the difference shows).

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_CHECK = """
local r = redis.call('HMGET', KEYS[1], 't', 'h')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] then
  return 0
end
"""

HAND_ACQUIRE = (
    _NOW
    + """
local e = redis.call('HGET', KEYS[1], 'e')
if e and tonumber(e) > now then
  return 0
end
local token = redis.call('HINCRBY', KEYS[1], 't', 1)
local expires = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'h', ARGV[1], 'e', string.format('%.0f', expires))
redis.call('HDEL', KEYS[1], 'x')
return {token, expires}
"""
)
"""Plain. ``ARGV``: holder, TTL in ms. ``{token, expires}``, or 0 while somebody holds it. The
token is a counter (a failover to a replica that missed the last increment reissues it), and
the successor learns neither the checkpoint nor how its predecessor left."""

HAND_CHECKPOINT = (
    _CHECK
    + _NOW
    + """
redis.call('HSET', KEYS[1], 'c', ARGV[4], 'e', string.format('%.0f', now + tonumber(ARGV[3])))
return 1
"""
)
"""Plain. ``ARGV``: token, holder, TTL in ms, state. Writes after a release too (reviving it)."""

HAND_RENEW = (
    _CHECK
    + _NOW
    + """
redis.call('HSET', KEYS[1], 'e', string.format('%.0f', now + tonumber(ARGV[3])))
return 1
"""
)
"""Plain. ``ARGV``: token, holder, TTL in ms. Extends a lapsed or released lease too."""

HAND_RELEASE = (
    _CHECK
    + """
redis.call('HSET', KEYS[1], 'e', '0', 'x', ARGV[3])
redis.call('PUBLISH', ARGV[4], KEYS[1])
return 1
"""
)
"""Plain. ``ARGV``: token, holder, exit, channel. Releases a lapsed lease too (whose work may
be another's by then), records no time."""

SAME_ACQUIRE = (
    _NOW
    + """
local r = redis.call('HMGET', KEYS[1], 't', 'h', 'e', 'x', 'c')
if r[2] and not r[4] and tonumber(r[3]) > now then
  return r[2]
end
local left = 'none'
if r[2] then
  left = r[4] or 'expired'
end
local token = math.max((tonumber(r[1]) or 0) + 1, now * 1024)
local expires = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 't', string.format('%.0f', token), 'h', ARGV[1],
  'e', string.format('%.0f', expires), 'pe', left, 'ph', r[2] or '')
redis.call('HDEL', KEYS[1], 'x')
return {token, expires, left, r[2] or false, r[5] or false}
"""
)
"""Same effect. ``ARGV``: holder, TTL in ms. Granted when there is no row, or it lapsed, or it
was released: the token ``max(previous + 1, server ms * 1024)`` (never reissued after a
failover that lost the last grants: the clock has moved on), the holder and expiry, and how the
previous holder left (its declared exit, ``expired`` or ``none``) with its ID. ``{token,
expires, previous exit, previous holder, checkpoint}``; while held, the holder."""

SAME_CHECKPOINT = (
    _NOW
    + """
local r = redis.call('HMGET', KEYS[1], 't', 'h', 'x')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] then
  return 0
end
if r[3] then
  return -1
end
redis.call('HSET', KEYS[1], 'c', ARGV[4], 'e', string.format('%.0f', now + tonumber(ARGV[3])))
return 1
"""
)
"""Same effect. ``ARGV``: token, holder, TTL in ms, state. The plain script's check, and a
released lease refused (-1): the state is written together with the extension, or not at all
(a lapsed lease nobody took is revived, as worklease does)."""

SAME_RENEW = (
    _NOW
    + """
local r = redis.call('HMGET', KEYS[1], 't', 'h', 'e', 'x')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] then
  return 0
end
if r[4] or tonumber(r[3]) <= now then
  return -1
end
redis.call('HSET', KEYS[1], 'e', string.format('%.0f', now + tonumber(ARGV[3])))
return 1
"""
)
"""Same effect. ``ARGV``: token, holder, TTL in ms. The plain script's check, and a released or
lapsed lease refused (-1): a renewal cannot revive it."""

SAME_RELEASE = (
    _NOW
    + """
local r = redis.call('HMGET', KEYS[1], 't', 'h', 'e', 'x')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] then
  return 0
end
if r[4] or tonumber(r[3]) <= now then
  return -1
end
local stamp = string.format('%.0f', now)
redis.call('HSET', KEYS[1], 'x', ARGV[3], 'r', stamp, 'e', stamp)
redis.call('PUBLISH', ARGV[4], KEYS[1])
return 1
"""
)
"""Same effect. ``ARGV``: token, holder, exit, channel. Refused when released already or lapsed
(-1); records the exit and the time (``r``), expires the grant now and announces the key."""

PLAIN = {
    "acquire": HAND_ACQUIRE,
    "checkpoint": HAND_CHECKPOINT,
    "renew": HAND_RENEW,
    "release": HAND_RELEASE,
}
SAME_EFFECT = {
    "acquire": SAME_ACQUIRE,
    "checkpoint": SAME_CHECKPOINT,
    "renew": SAME_RENEW,
    "release": SAME_RELEASE,
}
SAME, PLAIN_SIDE = "same-effect hand-written", "plain hand-written"
"""The two floors' side names."""


def _granted(reply: Any) -> tuple[str, int]:
    """Either acquire script's grant: the token (as the other scripts compare it) and expiry;
    the same-effect one's previous exit, holder and checkpoint come in the same list."""
    if not isinstance(reply, list):
        raise RuntimeError(f"hand-written acquire refused: {reply!r}")
    return str(reply[0]), int(reply[1])


def _done(reply: Any, operation: str) -> None:
    if reply != 1:
        raise RuntimeError(f"hand-written {operation} refused: {reply!r}")


# -- statistics ------------------------------------------------------------------------------


def stats(samples_ns: Sequence[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)

    def rank(q: float) -> float:  # nearest-rank percentile
        return ordered[max(math.ceil(q * len(ordered)) - 1, 0)] / 1000

    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {
        "n": len(ordered),
        "min_us": ordered[0] / 1000,
        "median_us": median / 1000,
        "mean_us": sum(ordered) / len(ordered) / 1000,
        "p99_us": rank(0.99),
        "max_us": ordered[-1] / 1000,
    }


def ms_stats(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {
        "n": len(ordered),
        "median_ms": median * 1e3,
        "p99_ms": ordered[max(math.ceil(0.99 * len(ordered)) - 1, 0)] * 1e3,
        "max_ms": ordered[-1] * 1e3,
    }


def alternate(sides: dict[str, Step], iterations: int, block: int, warmup: int) -> dict[str, Any]:
    names = list(sides)
    for name in names:
        for _ in range(warmup):
            sides[name]()
    samples: dict[str, list[int]] = {name: [] for name in names}
    done = rounds = 0
    while done < iterations:
        count = min(block, iterations - done)
        shift = rounds % len(names)
        for name in names[shift:] + names[:shift]:
            fn = sides[name]
            for _ in range(count):
                samples[name].append(fn())
        done += count
        rounds += 1
    return samples


async def aalternate(
    sides: dict[str, AStep], iterations: int, block: int, warmup: int
) -> dict[str, Any]:
    names = list(sides)
    for name in names:
        for _ in range(warmup):
            await sides[name]()
    samples: dict[str, list[int]] = {name: [] for name in names}
    done = rounds = 0
    while done < iterations:
        count = min(block, iterations - done)
        shift = rounds % len(names)
        for name in names[shift:] + names[:shift]:
            fn = sides[name]
            for _ in range(count):
                samples[name].append(await fn())
        done += count
        rounds += 1
    return samples


# -- the sides, sync -------------------------------------------------------------------------
# Every step returns the nanoseconds of its timed call; what it does around it is untimed.


def lease_steps(lease: Lease, name: str, state: bytes) -> dict[str, Step]:
    cycle = f"{name}-cycle"
    held = lease.acquire(f"{name}-held")

    def acquire() -> int:
        start = perf_counter_ns()
        token = lease.acquire(cycle)
        took = perf_counter_ns() - start
        lease.release(token, ExitMode.FINISHED)
        return took

    def checkpoint() -> int:
        start = perf_counter_ns()
        lease.checkpoint(held, state)
        return perf_counter_ns() - start

    def renew() -> int:
        start = perf_counter_ns()
        lease.renew(held)
        return perf_counter_ns() - start

    def release() -> int:
        token = lease.acquire(cycle)
        start = perf_counter_ns()
        lease.release(token, ExitMode.FINISHED)
        return perf_counter_ns() - start

    def acquire_release() -> int:
        start = perf_counter_ns()
        token = lease.acquire(cycle)
        lease.release(token, ExitMode.FINISHED)
        return perf_counter_ns() - start

    return {
        "acquire": acquire,
        "checkpoint": checkpoint,
        "renew": renew,
        "release": release,
        "acquire+release": acquire_release,
    }


def backend_steps(backend: RedisBackend, name: str, state: bytes, ttl: float) -> dict[str, Step]:
    cycle = f"{name}-cycle"
    held = backend.acquire(f"{name}-held", HOLDER, ttl)
    done = ExitMode.FINISHED

    def acquire() -> int:
        start = perf_counter_ns()
        token = backend.acquire(cycle, HOLDER, ttl)
        took = perf_counter_ns() - start
        backend.release(token, done)
        return took

    def checkpoint() -> int:
        start = perf_counter_ns()
        backend.checkpoint(held, state, ttl)
        return perf_counter_ns() - start

    def renew() -> int:
        start = perf_counter_ns()
        backend.renew(held, ttl)
        return perf_counter_ns() - start

    def release() -> int:
        token = backend.acquire(cycle, HOLDER, ttl)
        start = perf_counter_ns()
        backend.release(token, done)
        return perf_counter_ns() - start

    def acquire_release() -> int:
        start = perf_counter_ns()
        token = backend.acquire(cycle, HOLDER, ttl)
        backend.release(token, done)
        return perf_counter_ns() - start

    return {
        "acquire": acquire,
        "checkpoint": checkpoint,
        "renew": renew,
        "release": release,
        "acquire+release": acquire_release,
    }


class Hand:
    """A user's own scripts (``PLAIN`` or ``SAME_EFFECT``), registered once on a client of
    either flavour."""

    def __init__(
        self,
        client: redis.Redis | redis.asyncio.Redis,
        ttl: float,
        scripts: dict[str, str] = PLAIN,
    ) -> None:
        self.acquire = client.register_script(scripts["acquire"])
        self.checkpoint = client.register_script(scripts["checkpoint"])
        self.renew = client.register_script(scripts["renew"])
        self.release = client.register_script(scripts["release"])
        self.ttl_ms = int(ttl * 1000)


def hand_steps(
    client: redis.Redis, name: str, state: bytes, ttl: float, floor: dict[str, str]
) -> dict[str, Step]:
    scripts = Hand(client, ttl, floor)
    ttl_ms = scripts.ttl_ms
    cycle, held_key = f"bench-hand:{name}-cycle", f"bench-hand:{name}-held"
    held, _ = _granted(scripts.acquire(keys=[held_key], args=[HOLDER, ttl_ms]))

    def take() -> str:
        token, _ = _granted(scripts.acquire(keys=[cycle], args=[HOLDER, ttl_ms]))
        return token

    def give_back(token: str) -> None:
        args = [token, HOLDER, "finished", HAND_CHANNEL]
        _done(scripts.release(keys=[cycle], args=args), "release")

    def acquire() -> int:
        start = perf_counter_ns()
        token = take()
        took = perf_counter_ns() - start
        give_back(token)
        return took

    def checkpoint() -> int:
        start = perf_counter_ns()
        args: list[str | int | bytes] = [held, HOLDER, ttl_ms, state]
        _done(scripts.checkpoint(keys=[held_key], args=args), "checkpoint")
        return perf_counter_ns() - start

    def renew() -> int:
        start = perf_counter_ns()
        _done(scripts.renew(keys=[held_key], args=[held, HOLDER, ttl_ms]), "renew")
        return perf_counter_ns() - start

    def release() -> int:
        token = take()
        start = perf_counter_ns()
        give_back(token)
        return perf_counter_ns() - start

    def acquire_release() -> int:
        start = perf_counter_ns()
        give_back(take())
        return perf_counter_ns() - start

    return {
        "acquire": acquire,
        "checkpoint": checkpoint,
        "renew": renew,
        "release": release,
        "acquire+release": acquire_release,
    }


def lock_step(client: redis.Redis, name: str, ttl: float) -> Step:
    lock = client.lock(f"bench-lock:{name}", timeout=ttl)

    def acquire_release() -> int:
        start = perf_counter_ns()
        if not lock.acquire(blocking=False):
            raise RuntimeError("redis-py Lock: not acquired")
        lock.release()
        return perf_counter_ns() - start

    return acquire_release


# -- where the time goes: the server's share -------------------------------------------------

SCRIPTS = {
    "worklease": {"acquire": ACQUIRE, "checkpoint": CHECKPOINT, "renew": RENEW, "release": RELEASE},
    "same-effect": SAME_EFFECT,
    "plain": PLAIN,
}


def _sha(text: str) -> bytes:
    return hashlib.sha1(text.encode()).hexdigest().encode()


def server_times(
    admin: redis.Redis, sides: dict[str, dict[str, Step]], lock: Step, calls: int
) -> dict[str, Any]:
    """The server's execution time of every script, from ``SLOWLOG`` with every command
    logged (a separate, untimed pass of ``calls`` steps per operation and side: logging
    costs the server a little too). Median and mean microseconds per call, by script: under
    ``worklease``, ``hand-written`` (``same-effect`` and ``plain``) and ``redis-py Lock``."""
    names = {_sha(text): (side, op) for side, ops in SCRIPTS.items() for op, text in ops.items()}
    names[_sha(redis.lock.Lock.LUA_RELEASE_SCRIPT)] = ("redis-py Lock", "release")
    saved = admin.config_get("slowlog-*")
    found: dict[tuple[str, str], list[int]] = {}
    try:
        admin.config_set("slowlog-max-len", 1_000_000)
        admin.config_set("slowlog-log-slower-than", 0)
        for steps in (sides["backend"], sides[SAME], sides[PLAIN_SIDE]):
            for operation in ("acquire", "checkpoint", "renew", "release"):
                admin.slowlog_reset()
                for _ in range(calls):
                    steps[operation]()
                _collect(admin, names, found)
        admin.slowlog_reset()
        for _ in range(calls):
            lock()
        _collect(admin, names, found)
    finally:
        for name, default in (("slowlog-log-slower-than", "10000"), ("slowlog-max-len", "128")):
            admin.config_set(name, str(saved.get(name) or default))
        admin.slowlog_reset()
    out: dict[str, Any] = {}
    for (side, operation), durations in sorted(found.items()):
        ordered = sorted(durations)
        place = out.setdefault("hand-written", {}) if side in ("same-effect", "plain") else out
        place.setdefault(side, {})[operation] = {
            "n": len(ordered),
            "median_us": float(ordered[len(ordered) // 2]),
            "mean_us": sum(ordered) / len(ordered),
        }
    return out


def _collect(
    admin: redis.Redis,
    names: dict[bytes, tuple[str, str]],
    found: dict[tuple[str, str], list[int]],
) -> None:
    for entry in admin.slowlog_get(1_000_000):
        command = entry["command"]
        words = (command if isinstance(command, bytes) else str(command).encode()).split(b" ")
        verb = words[0].upper()
        if verb == b"EVALSHA" and len(words) > 1 and words[1] in names:
            name = names[words[1]]
        elif verb == b"SET":
            name = ("redis-py Lock", "acquire (SET NX PX)")
        else:
            continue
        found.setdefault(name, []).append(int(entry["duration"]))


# -- the sides, async ------------------------------------------------------------------------


async def alease_steps(lease: AsyncLease, name: str, state: bytes) -> dict[str, AStep]:
    cycle = f"{name}-cycle"
    held = await lease.acquire(f"{name}-held")

    async def acquire() -> int:
        start = perf_counter_ns()
        token = await lease.acquire(cycle)
        took = perf_counter_ns() - start
        await lease.release(token, ExitMode.FINISHED)
        return took

    async def checkpoint() -> int:
        start = perf_counter_ns()
        await lease.checkpoint(held, state)
        return perf_counter_ns() - start

    async def renew() -> int:
        start = perf_counter_ns()
        await lease.renew(held)
        return perf_counter_ns() - start

    async def release() -> int:
        token = await lease.acquire(cycle)
        start = perf_counter_ns()
        await lease.release(token, ExitMode.FINISHED)
        return perf_counter_ns() - start

    async def acquire_release() -> int:
        start = perf_counter_ns()
        token = await lease.acquire(cycle)
        await lease.release(token, ExitMode.FINISHED)
        return perf_counter_ns() - start

    return {
        "acquire": acquire,
        "checkpoint": checkpoint,
        "renew": renew,
        "release": release,
        "acquire+release": acquire_release,
    }


async def abackend_steps(
    backend: AsyncRedisBackend, name: str, state: bytes, ttl: float
) -> dict[str, AStep]:
    cycle = f"{name}-cycle"
    held = await backend.acquire(f"{name}-held", HOLDER, ttl)
    done = ExitMode.FINISHED

    async def acquire() -> int:
        start = perf_counter_ns()
        token = await backend.acquire(cycle, HOLDER, ttl)
        took = perf_counter_ns() - start
        await backend.release(token, done)
        return took

    async def checkpoint() -> int:
        start = perf_counter_ns()
        await backend.checkpoint(held, state, ttl)
        return perf_counter_ns() - start

    async def renew() -> int:
        start = perf_counter_ns()
        await backend.renew(held, ttl)
        return perf_counter_ns() - start

    async def release() -> int:
        token = await backend.acquire(cycle, HOLDER, ttl)
        start = perf_counter_ns()
        await backend.release(token, done)
        return perf_counter_ns() - start

    async def acquire_release() -> int:
        start = perf_counter_ns()
        token = await backend.acquire(cycle, HOLDER, ttl)
        await backend.release(token, done)
        return perf_counter_ns() - start

    return {
        "acquire": acquire,
        "checkpoint": checkpoint,
        "renew": renew,
        "release": release,
        "acquire+release": acquire_release,
    }


async def ahand_steps(
    client: redis.asyncio.Redis, name: str, state: bytes, ttl: float, floor: dict[str, str]
) -> dict[str, AStep]:
    scripts = Hand(client, ttl, floor)
    ttl_ms = scripts.ttl_ms
    cycle, held_key = f"bench-ahand:{name}-cycle", f"bench-ahand:{name}-held"
    held, _ = _granted(await scripts.acquire(keys=[held_key], args=[HOLDER, ttl_ms]))

    async def take() -> str:
        token, _ = _granted(await scripts.acquire(keys=[cycle], args=[HOLDER, ttl_ms]))
        return token

    async def give_back(token: str) -> None:
        args = [token, HOLDER, "finished", HAND_CHANNEL]
        _done(await scripts.release(keys=[cycle], args=args), "release")

    async def acquire() -> int:
        start = perf_counter_ns()
        token = await take()
        took = perf_counter_ns() - start
        await give_back(token)
        return took

    async def checkpoint() -> int:
        start = perf_counter_ns()
        args: list[str | int | bytes] = [held, HOLDER, ttl_ms, state]
        _done(await scripts.checkpoint(keys=[held_key], args=args), "checkpoint")
        return perf_counter_ns() - start

    async def renew() -> int:
        start = perf_counter_ns()
        _done(await scripts.renew(keys=[held_key], args=[held, HOLDER, ttl_ms]), "renew")
        return perf_counter_ns() - start

    async def release() -> int:
        token = await take()
        start = perf_counter_ns()
        await give_back(token)
        return perf_counter_ns() - start

    async def acquire_release() -> int:
        start = perf_counter_ns()
        await give_back(await take())
        return perf_counter_ns() - start

    return {
        "acquire": acquire,
        "checkpoint": checkpoint,
        "renew": renew,
        "release": release,
        "acquire+release": acquire_release,
    }


def alock_step(client: redis.asyncio.Redis, name: str, ttl: float) -> AStep:
    lock = client.lock(f"bench-alock:{name}", timeout=ttl)

    async def acquire_release() -> int:
        start = perf_counter_ns()
        if not await lock.acquire(blocking=False):
            raise RuntimeError("redis-py Lock: not acquired")
        await lock.release()
        return perf_counter_ns() - start

    return acquire_release


def rows_of(flavour: str, operation: str, samples: dict[str, list[int]]) -> list[dict[str, Any]]:
    """One row per operation (and the Lock's reference row from the acquire + release run):
    the ratios and the target against the same-effect floor, the plain floor's ratios
    beside them."""
    sides = {name: stats(values) for name, values in samples.items()}
    same, plain = sides[SAME]["median_us"], sides[PLAIN_SIDE]["median_us"]
    lease, backend = sides["Lease"]["median_us"], sides["backend"]["median_us"]
    row: dict[str, Any] = {
        "flavour": flavour,
        "operation": operation,
        "sides": {name: sides[name] for name in ("Lease", "backend", SAME, PLAIN_SIDE)},
        "lease_ratio": lease / same,
        "backend_ratio": backend / same,
        "lease_plain_ratio": lease / plain,
        "backend_plain_ratio": backend / plain,
        "same_plain_ratio": same / plain,
        "target": TARGET,
    }
    row["lease_meets"] = row["lease_ratio"] <= TARGET
    row["backend_meets"] = row["backend_ratio"] <= TARGET
    row["lease_meets_plain"] = row["lease_plain_ratio"] <= TARGET
    rows = [row]
    if "redis-py Lock" in sides:
        lock = sides["redis-py Lock"]
        rows.append(
            {
                "flavour": flavour,
                "operation": LOCK_ROW,
                "sides": {
                    "Lease": sides["Lease"],
                    "backend": sides["backend"],
                    "redis-py Lock": lock,
                },
                "lease_ratio": sides["Lease"]["median_us"] / lock["median_us"],
                "backend_ratio": sides["backend"]["median_us"] / lock["median_us"],
                "target": None,
                "note": "a reference: redis-py's Lock stores no checkpoint, issues no fencing "
                "token, records no exit and announces no release",
            }
        )
    return rows


# -- 1. per operation ------------------------------------------------------------------------


def run_operations(
    args: argparse.Namespace, url: str, state: bytes
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    ours = redis.Redis.from_url(url)
    theirs = redis.Redis.from_url(url)
    backend = RedisBackend(ours, prefix=f"bench-{uuid.uuid4().hex[:8]}:")
    rows: list[dict[str, Any]] = []
    try:
        lease = Lease(backend, holder_id=HOLDER, ttl=args.ttl)
        sides = {
            "Lease": lease_steps(lease, "lease", state),
            "backend": backend_steps(backend, "backend", state, args.ttl),
            SAME: hand_steps(theirs, "sync-same", state, args.ttl, SAME_EFFECT),
            PLAIN_SIDE: hand_steps(theirs, "sync-plain", state, args.ttl, PLAIN),
        }
        for operation in OPERATIONS:
            print(f"sync {operation} ...", file=sys.stderr, flush=True)
            steps = {name: side[operation] for name, side in sides.items()}
            if operation == "acquire+release":
                steps["redis-py Lock"] = lock_step(theirs, "sync", args.ttl)
            samples = alternate(steps, args.iterations, args.block, args.warmup)
            rows.extend(rows_of("sync", operation, samples))
        print("server time per script ...", file=sys.stderr, flush=True)
        server = server_times(
            theirs, sides, lock_step(theirs, "slowlog", args.ttl), args.server_calls
        )
    finally:
        backend.close()
        ours.close()
        theirs.close()
    return rows, server


async def arun_operations(args: argparse.Namespace, url: str, state: bytes) -> list[dict[str, Any]]:
    ours = redis.asyncio.Redis.from_url(url)
    theirs = redis.asyncio.Redis.from_url(url)
    rows: list[dict[str, Any]] = []
    try:
        async with AsyncRedisBackend(ours, prefix=f"abench-{uuid.uuid4().hex[:8]}:") as backend:
            lease = AsyncLease(backend, holder_id=HOLDER, ttl=args.ttl)
            sides = {
                "Lease": await alease_steps(lease, "lease", state),
                "backend": await abackend_steps(backend, "backend", state, args.ttl),
                SAME: await ahand_steps(theirs, "async-same", state, args.ttl, SAME_EFFECT),
                PLAIN_SIDE: await ahand_steps(theirs, "async-plain", state, args.ttl, PLAIN),
            }
            for operation in OPERATIONS:
                print(f"async {operation} ...", file=sys.stderr, flush=True)
                steps = {name: side[operation] for name, side in sides.items()}
                if operation == "acquire+release":
                    steps["redis-py Lock"] = alock_step(theirs, "async", args.ttl)
                samples = await aalternate(steps, args.iterations, args.block, args.warmup)
                rows.extend(rows_of("async", operation, samples))
    finally:
        await ours.aclose()
        await theirs.aclose()
    return rows


# -- 2. handoff ------------------------------------------------------------------------------


def _settle(backend: RedisBackend | AsyncRedisBackend, deadline: float) -> None:
    while not backend.watching and perf_counter() < deadline:
        time.sleep(0.005)


def run_handoff(args: argparse.Namespace, url: str) -> dict[str, Any]:
    prefix = f"handoff-{uuid.uuid4().hex[:8]}:"
    holder_client, successor_client = redis.Redis.from_url(url), redis.Redis.from_url(url)
    holder_backend = RedisBackend(holder_client, prefix=prefix)
    successor_backend = RedisBackend(successor_client, prefix=prefix)
    holder = Lease(holder_backend, holder_id="holder", ttl=args.ttl)
    successor = Lease(successor_backend, holder_id="successor", ttl=args.ttl)
    samples: list[float] = []
    errors: list[str] = []
    try:
        for _ in range(args.handoffs):
            token = holder.acquire("work")
            got: dict[str, Any] = {}
            ready = threading.Event()

            def wait(box: dict[str, Any] = got, ready: threading.Event = ready) -> None:
                ready.set()
                try:
                    taken = successor.acquire(
                        "work", wait=True, timeout=POLL * 2, poll_interval=POLL
                    )
                except Exception as exc:
                    box["error"] = f"{type(exc).__name__}: {exc}"
                    return
                box["at"] = perf_counter()
                successor.release(taken, ExitMode.FINISHED)

            thread = threading.Thread(target=wait)
            thread.start()
            ready.wait()
            # The successor's first try is refused and its watch subscribed (the first round).
            _settle(successor_backend, perf_counter() + 5)
            time.sleep(0.05)
            start = perf_counter()
            holder.release(token, ExitMode.FINISHED)
            thread.join(timeout=POLL * 2 + 5)
            if "at" in got:
                samples.append(got["at"] - start)
            else:
                errors.append(got.get("error", "the successor did not return"))
    finally:
        holder_backend.close()
        successor_backend.close()
        holder_client.close()
        successor_client.close()
    return (ms_stats(samples) if samples else {"n": 0}) | {"errors": errors}


async def arun_handoff(args: argparse.Namespace, url: str) -> dict[str, Any]:
    prefix = f"ahandoff-{uuid.uuid4().hex[:8]}:"
    holder_client = redis.asyncio.Redis.from_url(url)
    successor_client = redis.asyncio.Redis.from_url(url)
    samples: list[float] = []
    errors: list[str] = []
    try:
        async with (
            AsyncRedisBackend(holder_client, prefix=prefix) as holder_backend,
            AsyncRedisBackend(successor_client, prefix=prefix) as successor_backend,
        ):
            holder = AsyncLease(holder_backend, holder_id="holder", ttl=args.ttl)
            successor = AsyncLease(successor_backend, holder_id="successor", ttl=args.ttl)

            async def wait() -> float:
                taken = await successor.acquire(
                    "work", wait=True, timeout=POLL * 2, poll_interval=POLL
                )
                at = perf_counter()
                await successor.release(taken, ExitMode.FINISHED)
                return at

            for _ in range(args.handoffs):
                token = await holder.acquire("work")
                task = asyncio.ensure_future(wait())
                deadline = perf_counter() + 5
                while not successor_backend.watching and perf_counter() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.05)
                start = perf_counter()
                await holder.release(token, ExitMode.FINISHED)
                try:
                    samples.append(await task - start)
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        await holder_client.aclose()
        await successor_client.aclose()
    return (ms_stats(samples) if samples else {"n": 0}) | {"errors": errors}


# -- 3. renewal throughput -------------------------------------------------------------------


def run_renewals(args: argparse.Namespace, url: str) -> dict[str, Any]:
    client, hand_client = redis.Redis.from_url(url), redis.Redis.from_url(url)
    backend = RedisBackend(client, prefix=f"renew-{uuid.uuid4().hex[:8]}:")
    ttl: float = args.ttl
    n: int = args.leases
    try:
        ids = [f"lease-{i}" for i in range(n)]
        tokens: list[Token] = [token for token, _ in backend.acquire_many(ids, HOLDER, ttl)]
        if len(tokens) != n:
            raise RuntimeError(f"acquire_many granted {len(tokens)} of {n}")
        scripts = Hand(hand_client, ttl, SAME_EFFECT)
        hand_client.script_load(HAND_ACQUIRE)
        hand_client.script_load(HAND_RENEW)
        hand_keys = [f"bench-hand-renew:{i}" for i in range(n)]
        hand_tokens = [
            _granted(scripts.acquire(keys=[key], args=[HOLDER, scripts.ttl_ms]))[0]
            for key in hand_keys
        ]
        lost = {"renew_many": 0, "renew": 0, "hand": 0}

        def many() -> int:
            lost["renew_many"] += sum(o is not None for o in backend.renew_many(tokens, ttl))
            return n

        def one_by_one() -> int:
            for token in tokens:
                backend.renew(token, ttl)
            return n

        def hand() -> int:
            sha = scripts.renew.sha
            for start in range(0, n, 256):
                pipe = hand_client.pipeline(transaction=False)
                for key, token in zip(
                    hand_keys[start : start + 256], hand_tokens[start : start + 256], strict=True
                ):
                    pipe.evalsha(sha, 1, key, token, HOLDER, scripts.ttl_ms)
                lost["hand"] += sum(reply != 1 for reply in pipe.execute())
            return n

        sides: dict[str, Callable[[], int]] = {
            "renew_many": many,
            "renew, one call per lease": one_by_one,
            "same-effect hand-written renew script, pipelined 256 at a time": hand,
        }
        for fn in sides.values():
            fn()  # warm-up
        counts = dict.fromkeys(sides, 0)
        spent = dict.fromkeys(sides, 0.0)
        slice_s = min(0.5, args.seconds)
        rounds = max(1, round(args.seconds / slice_s))
        names = list(sides)
        for index in range(rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                start = perf_counter()
                while perf_counter() - start < slice_s:
                    counts[name] += sides[name]()
                spent[name] += perf_counter() - start
        return {
            "leases": n,
            "seconds_per_side": sum(spent.values()) / len(spent),
            "sides": {
                name: {
                    "renewals": counts[name],
                    "seconds": spent[name],
                    "renewals_per_s": counts[name] / spent[name],
                }
                for name in names
            },
            "lost": lost,
        }
    finally:
        backend.close()
        client.close()
        hand_client.close()


# -- 4. standalone vs Cluster ----------------------------------------------------------------


def scale_worker(setup: dict[str, Any], ready: Any, go: Any, results: Any) -> None:
    """One worker process: its own client, backend and Lease, its own work IDs."""
    host, port = "127.0.0.1", int(setup["port"])
    client: redis.Redis | RedisCluster = (
        RedisCluster(host=host, port=port) if setup["cluster"] else redis.Redis(host, port)
    )
    backend = RedisBackend(client, prefix=setup["prefix"])
    lease = Lease(backend, holder_id=f"worker-{setup['index']}", ttl=setup["ttl"])
    work_ids = [f"{setup['index']}-{i}" for i in range(setup["work_ids"])]
    state = os.urandom(setup["state_bytes"])
    errors: list[str] = []

    def cycle(work_id: str) -> bool:
        try:
            token = lease.acquire(work_id)
            lease.checkpoint(token, state)
            lease.release(token, ExitMode.FINISHED)
        except Exception as exc:
            if len(errors) < 5:
                errors.append(f"{type(exc).__name__}: {exc}")
            return False
        return True

    for work_id in work_ids[:50]:  # warm-up: connections made, slots learnt, scripts loaded
        cycle(work_id)
    errors.clear()
    ready.put(setup["index"])
    go.wait()
    cpu = time.process_time()
    start = perf_counter()
    deadline = start + setup["seconds"]
    done = failed = 0
    count = len(work_ids)
    while perf_counter() < deadline:
        if cycle(work_ids[(done + failed) % count]):
            done += 1
        else:
            failed += 1
    elapsed = perf_counter() - start
    results.put(
        {
            "index": setup["index"],
            "cycles": done,
            "failed": failed,
            "elapsed": elapsed,
            "cpu_s": time.process_time() - cpu,
            "errors": errors,
        }
    )
    backend.close()
    client.close()


def _server_counters(ports: Sequence[int]) -> dict[int, tuple[float, int]]:
    """Per node: CPU seconds so far (user + sys) and commands processed."""
    counters: dict[int, tuple[float, int]] = {}
    for port in ports:
        with redis.Redis("127.0.0.1", port) as node:
            cpu = node.info("cpu")
            processed = node.info("stats")["total_commands_processed"]
        counters[port] = (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), processed)
    return counters


def _machine_busy() -> float | None:
    """Seconds of CPU the whole machine spent busy so far (``/proc/stat``), or ``None``."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:9]
    except OSError:
        return None
    ticks = [int(value) for value in fields]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def run_scale_once(
    args: argparse.Namespace, name: str, port: int, ports: Sequence[int], cluster: bool
) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    prefix = f"scale-{uuid.uuid4().hex[:8]}:"
    processes = [
        context.Process(
            target=scale_worker,
            args=(
                {
                    "index": index,
                    "port": port,
                    "cluster": cluster,
                    "prefix": prefix,
                    "ttl": args.ttl,
                    "work_ids": args.work_ids,
                    "state_bytes": args.state_bytes,
                    "seconds": args.seconds,
                },
                ready,
                go,
                results,
            ),
            daemon=True,
        )
        for index in range(args.processes)
    ]
    for process in processes:
        process.start()
    try:
        for _ in processes:
            ready.get(timeout=120)
        before, busy_before = _server_counters(ports), _machine_busy()
        start = perf_counter()
        go.set()
        workers = [results.get(timeout=args.seconds + 120) for _ in processes]
        wall = perf_counter() - start
        after, busy_after = _server_counters(ports), _machine_busy()
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    nodes = {
        str(node): {
            "cpu_s": after[node][0] - before[node][0],
            "cores": (after[node][0] - before[node][0]) / wall,
            "commands": after[node][1] - before[node][1],
        }
        for node in ports
    }
    cycles = sum(worker["cycles"] for worker in workers)
    return {
        "setup": name,
        "wall_s": wall,
        "cycles": cycles,
        "cycles_per_s": sum(worker["cycles"] / worker["elapsed"] for worker in workers),
        "failed": sum(worker["failed"] for worker in workers),
        "errors": [error for worker in workers for error in worker["errors"]][:5],
        "server_cores": sum(node["cores"] for node in nodes.values()),
        "client_cores": sum(worker["cpu_s"] for worker in workers) / wall,
        "machine_cores": (
            (busy_after - busy_before) / wall
            if busy_after is not None and busy_before is not None
            else None
        ),
        "nodes": nodes,
    }


def start_cluster(masters: int, notes: list[str]) -> redis_servers.RedisCluster:
    """``redis_servers.start_cluster(masters)`` (one master: one node given every slot)."""
    if masters == 1:
        notes.append("the Cluster of 1 master is one cluster-enabled node serving every slot")
    return redis_servers.start_cluster(masters)


def run_scaling(args: argparse.Namespace, standalone: redis_servers.RedisServer) -> dict[str, Any]:
    setups: list[tuple[str, int, list[int], bool]] = [
        ("standalone", standalone.port, [standalone.port], False)
    ]
    clusters: list[redis_servers.RedisCluster] = []
    notes: list[str] = []
    result: dict[str, Any] = {"processes": args.processes, "runs": [], "notes": notes}
    try:
        if args.skip_cluster:
            notes.append("Clusters skipped (--skip-cluster)")
        else:
            for masters in (1, 3):
                print(f"starting a Cluster of {masters} ...", file=sys.stderr, flush=True)
                try:
                    cluster = start_cluster(masters, notes)
                except redis_servers.Unavailable as exc:
                    notes.append(f"no Cluster of {masters}: {exc}")
                    continue
                clusters.append(cluster)
                label = f"Cluster of {masters} master{'s' if masters > 1 else ''}"
                setups.append((label, cluster.ports[0], cluster.ports, True))
        for index in range(args.rounds):
            order = setups[index % len(setups) :] + setups[: index % len(setups)]
            for name, port, ports, is_cluster in order:
                print(f"scale: {name}, round {index + 1} ...", file=sys.stderr, flush=True)
                run = run_scale_once(args, name, port, ports, is_cluster)
                run["round"] = index + 1
                result["runs"].append(run)
    finally:
        for cluster in clusters:
            cluster.stop()
    summary: dict[str, Any] = {}
    for name, *_ in setups:
        runs = [run for run in result["runs"] if run["setup"] == name]
        if not runs:
            continue
        summary[name] = {
            "cycles_per_s": sum(run["cycles_per_s"] for run in runs) / len(runs),
            "server_cores": sum(run["server_cores"] for run in runs) / len(runs),
            "client_cores": sum(run["client_cores"] for run in runs) / len(runs),
            "machine_cores": (
                sum(run["machine_cores"] for run in runs) / len(runs)
                if all(run["machine_cores"] is not None for run in runs)
                else None
            ),
            "per_node_cores": {
                node: sum(run["nodes"][node]["cores"] for run in runs) / len(runs)
                for node in runs[0]["nodes"]
            },
            "per_node_commands_per_s": {
                node: sum(run["nodes"][node]["commands"] / run["wall_s"] for run in runs)
                / len(runs)
                for node in runs[0]["nodes"]
            },
            "failed": sum(run["failed"] for run in runs),
        }
    result["summary"] = summary
    one, three = summary.get("Cluster of 1 master"), summary.get("Cluster of 3 masters")
    if one and three:
        ratio = three["cycles_per_s"] / one["cycles_per_s"]
        result["cluster_ratio"] = ratio
        result["cluster_target_met"] = ratio >= CLUSTER_TARGET
    if three and "standalone" in summary:
        result["cluster_vs_standalone"] = (
            three["cycles_per_s"] / summary["standalone"]["cycles_per_s"]
        )
    return result


# -- run -------------------------------------------------------------------------------------


def environment(url: str) -> dict[str, Any]:
    with redis.Redis.from_url(url) as client:
        server = client.info("server")
        resp = client.client_info().get("resp", "?")
    versions: dict[str, str] = {}
    for package in ("redis", "hiredis"):
        with contextlib.suppress(ImportError):
            versions[package] = str(getattr(importlib.import_module(package), "__version__", "?"))
    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "redis": server.get("redis_version", "?"),
        "redis_server": "standalone, persistence off, loopback",
        "resp": resp,
        "packages": versions,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = perf_counter()
    state = os.urandom(args.state_bytes)
    server = redis_servers.start()
    try:
        result: dict[str, Any] = {
            "environment": environment(server.url),
            "settings": {
                key: getattr(args, key)
                for key in (
                    "iterations",
                    "warmup",
                    "block",
                    "handoffs",
                    "ttl",
                    "state_bytes",
                    "seconds",
                    "leases",
                    "processes",
                    "work_ids",
                    "rounds",
                    "skip_cluster",
                    "server_calls",
                )
            },
        }
        rows, result["server_times"] = run_operations(args, server.url, state)
        rows += asyncio.run(arun_operations(args, server.url, state))
        result["rows"] = rows
        print("handoff ...", file=sys.stderr, flush=True)
        result["handoff"] = {
            "sync": run_handoff(args, server.url),
            "async": asyncio.run(arun_handoff(args, server.url)),
        }
        print("renewal throughput ...", file=sys.stderr, flush=True)
        result["renewals"] = run_renewals(args, server.url)
        result["scaling"] = run_scaling(args, server)
    finally:
        server.stop()
    result["environment"]["load_average_at_end"] = list(os.getloadavg())
    result["runtime_s"] = perf_counter() - started
    return result


# -- output ----------------------------------------------------------------------------------


def _us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _cell(side: dict[str, float] | None) -> str:
    return f"{_us(side['median_us'])} / {_us(side['p99_us'])}" if side else "-"


def _load(values: Sequence[float] | None) -> str:
    return " ".join(f"{value:.2f}" for value in values) if values else "?"


def where_time_goes(result: dict[str, Any]) -> list[str]:
    """The sync medians' differences beside the scripts' own execution time on the server."""
    server = result.get("server_times") or {}
    ours = server.get("worklease", {})
    same = server.get("hand-written", {}).get("same-effect", {})
    plain = server.get("hand-written", {}).get("plain", {})
    rows = {row["operation"]: row for row in result["rows"] if row["flavour"] == "sync"}
    lines = [
        "",
        "## Where the time goes (sync)",
        "",
        "Server: each script's execution time on the server, mean µs per call, from "
        f"`SLOWLOG` with every command logged (a separate pass of {result['settings']['server_calls']} "  # noqa: E501
        "steps per operation and side). The last two columns are differences of the medians "
        "above: what the backend's call costs beyond the same-effect hand-written one, of "
        "which the server difference is the scripts' share (the rest is client-side: "
        "arguments, the reply's decoding, the token), and what the Lease adds on top of the "
        "backend (checks, sealing, the observer, the group commit's bookkeeping).",
        "",
        "| operation | worklease script (server) | same-effect script (server) | server "
        "difference | plain script (server) | backend - same-effect | Lease - backend |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def total(times: dict[str, Any], parts: Sequence[str]) -> float:
        try:
            return float(sum(times[part]["mean_us"] for part in parts))
        except KeyError:
            return math.nan

    for operation in OPERATIONS:
        row = rows.get(operation)
        if row is None:
            continue
        parts = ("acquire", "release") if operation == "acquire+release" else (operation,)
        mine, theirs, cheap = total(ours, parts), total(same, parts), total(plain, parts)
        sides = row["sides"]
        lease, backend = sides["Lease"]["median_us"], sides["backend"]["median_us"]
        floor = sides[SAME]["median_us"]
        lines.append(
            f"| {operation} | {mine:.1f} | {theirs:.1f} | {mine - theirs:+.1f} | {cheap:.1f} "
            f"| {backend - floor:+.1f} | {lease - backend:+.1f} |"
        )
    lock = server.get("redis-py Lock", {})
    if lock:
        said = [f"{name} {value['mean_us']:.1f} µs" for name, value in lock.items()]
        lines += ["", "redis-py Lock on the server: " + ", ".join(said) + "."]
    return lines


def render(result: dict[str, Any]) -> str:
    env, settings = result["environment"], result["settings"]
    packages = env["packages"]
    lines = [
        "# Redis: worklease beside the hand-written Lua floors",
        "",
        f"Run {env['started_at']}: Python {env['python']}, {env['cpus']} CPUs (client and "
        f"server share them), Redis {env['redis']} ({env['redis_server']}), redis-py "
        f"{packages.get('redis', '?')} with its defaults (hiredis "
        f"{packages.get('hiredis', 'not installed')}), load average at start "
        f"{_load(env.get('load_average_at_start'))}, at end "
        f"{_load(env.get('load_average_at_end'))}. {settings['iterations']} iterations per "
        f"operation and side, {settings['warmup']} warm-up, alternating blocks of "
        f"{settings['block']}; checkpoint state {settings['state_bytes']} bytes; TTL "
        f"{settings['ttl']:g} s. Runtime {result['runtime_s']:.0f} s.",
        "",
        "Times in µs, median / p99, one call at a time. **Lease**: `Lease` / `AsyncLease` over "
        "`RedisBackend` / `AsyncRedisBackend` (what users call); **backend**: the backend's "
        "method called directly; **same-effect**: one Lua script per operation written by hand "
        "for the same effect as worklease's (acquire: the failover-safe token `max(previous + "
        "1, server ms * 1024)`, the previous holder and how it left recorded, and returned "
        "with the checkpoint in the same reply; checkpoint: refused once released; renew and "
        "release: refused once released or lapsed; release records the exit and the time); "
        "**plain**: the cheaper scripts a user might write first, doing less (a counter for "
        "the token, which a failover can reissue; no previous holder, exit or checkpoint on "
        "acquire; no lapse or release check on checkpoint, renew and release). Both with "
        "`register_script` and redis-py's defaults; see the scripts' docstrings. Ratios = "
        "median / median (shown rounded; the verdicts use the unrounded ratio). Target: "
        f"Lease ≤ {TARGET:g} x the same-effect floor.",
        "",
        "| flavour | operation | Lease | backend | same-effect hand-written | plain "
        "hand-written | Lease / same-effect | backend / same-effect | Lease / plain "
        f"| Lease ≤ {TARGET:g} | backend ≤ {TARGET:g} |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for row in result["rows"]:
        sides = row["sides"]
        if row["target"] is None:
            continue
        lines.append(
            f"| {row['flavour']} | {row['operation']} | {_cell(sides['Lease'])} "
            f"| {_cell(sides['backend'])} | {_cell(sides[SAME])} | {_cell(sides[PLAIN_SIDE])} "
            f"| {row['lease_ratio']:.2f} | {row['backend_ratio']:.2f} "
            f"| {row['lease_plain_ratio']:.2f} "
            f"| {'yes' if row['lease_meets'] else 'no'} "
            f"| {'yes' if row['backend_meets'] else 'no'} |"
        )
    lines += [
        "",
        "Reference (no target): acquire + release beside redis-py's own `Lock` "
        "(`client.lock(name, timeout=...)`, `acquire(blocking=False)` + `release()`: `SET NX "
        "PX` + a compare-and-delete script), measured in the same alternation as the "
        "acquire + release row. The Lock stores no checkpoint, issues no fencing token, "
        "records no exit and announces no release.",
        "",
        "| flavour | operation | Lease | backend | redis-py Lock | Lease / Lock | backend / Lock |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in result["rows"]:
        if row["target"] is not None:
            continue
        sides = row["sides"]
        lines.append(
            f"| {row['flavour']} | {row['operation']} | {_cell(sides['Lease'])} "
            f"| {_cell(sides['backend'])} | {_cell(sides['redis-py Lock'])} "
            f"| {row['lease_ratio']:.2f} | {row['backend_ratio']:.2f} |"
        )
    lines += where_time_goes(result)
    lines += [
        "",
        "## Handoff",
        "",
        "From just before the holder's release until the successor's "
        f"`acquire(wait=True, timeout={POLL * 2:g}, poll_interval={POLL:g})` returns (the "
        "successor on its own client and backend; only the release announcement through "
        "pub/sub explains a fast one).",
        "",
        "| flavour | n | median ms | p99 ms | max ms | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for flavour, row in result["handoff"].items():
        if not row["n"]:
            lines.append(f"| {flavour} | 0 | - | - | - | {len(row['errors'])} |")
            continue
        lines.append(
            f"| {flavour} | {row['n']} | {row['median_ms']:.2f} | {row['p99_ms']:.2f} "
            f"| {row['max_ms']:.2f} | {len(row['errors'])} |"
        )
    renewals = result["renewals"]
    lines += [
        "",
        "## Renewal throughput",
        "",
        f"{renewals['leases']:,} leases held by one process (sync), renewed over and over for "
        f"about {renewals['seconds_per_side']:.1f} s per side in alternating slices.",
        "",
        "| side | renewals/s | renewals |",
        "| --- | ---: | ---: |",
    ]
    for name, side in renewals["sides"].items():
        label = {
            "renew_many": "`backend.renew_many(tokens)` (pipelined, 256 scripts per pipeline)",
            "renew, one call per lease": "`backend.renew(token)`, one call per lease",
        }.get(name, name)
        lines.append(f"| {label} | {side['renewals_per_s']:,.0f} | {side['renewals']:,} |")
    sides = renewals["sides"]
    lines += [
        "",
        f"renew_many / one call per lease: "
        f"{sides['renew_many']['renewals_per_s'] / sides['renew, one call per lease']['renewals_per_s']:.1f} x; "  # noqa: E501
        f"renew_many / plain hand-written pipeline: "
        f"{sides['renew_many']['renewals_per_s'] / sides['same-effect hand-written renew script, pipelined 256 at a time']['renewals_per_s']:.2f}. "  # noqa: E501
        f"Renewals refused: {sum(renewals['lost'].values())}.",
    ]
    scaling = result["scaling"]
    lines += [
        "",
        "## Standalone vs Cluster",
        "",
        f"{scaling['processes']} worker processes (sync `Lease`, each its own client and "
        f"{settings['work_ids']} work IDs), acquire + checkpoint ({settings['state_bytes']} "
        f"bytes) + release cycles for {settings['seconds']:g} s per run, "
        f"{settings['rounds']} alternating round(s); {env['cpus']} CPUs shared by workers and "
        "servers. CPU columns: cores' worth busy during the run (server: `INFO cpu` user + "
        "sys deltas summed over the nodes; workers: their process time; machine: "
        "`/proc/stat`).",
        "",
        "| setup | cycles/s | scripts/s | server CPU (cores) | per node (cores) | scripts per "
        "server CPU-second | worker CPU (cores) | worker CPU µs per cycle | machine busy "
        "(cores) | failed |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in scaling["summary"].items():
        per_node = ", ".join(f"{cores:.2f}" for cores in row["per_node_cores"].values())
        machine = f"{row['machine_cores']:.2f}" if row["machine_cores"] is not None else "?"
        scripts = row["cycles_per_s"] * 3
        per_server = f"{scripts / row['server_cores']:,.0f}" if row["server_cores"] > 0 else "-"
        per_cycle = row["client_cores"] / row["cycles_per_s"] * 1e6 if row["cycles_per_s"] else 0
        lines.append(
            f"| {name} | {row['cycles_per_s']:,.0f} | {scripts:,.0f} "
            f"| {row['server_cores']:.2f} | {per_node} | {per_server} "
            f"| {row['client_cores']:.2f} | {per_cycle:,.0f} | {machine} | {row['failed']} |"
        )
    for note in scaling["notes"]:
        lines += ["", f"Note: {note}."]
    lines += ["", "## Targets", ""]
    for row in result["rows"]:
        if row["target"] is None:
            continue
        lines.append(
            f"- {row['flavour']} {row['operation']}: Lease / same-effect "
            f"{row['lease_ratio']:.2f} ({'met' if row['lease_meets'] else 'NOT met'}; the "
            f"backend alone {row['backend_ratio']:.2f}, "
            f"{'met' if row['backend_meets'] else 'not met'}); Lease / plain "
            f"{row['lease_plain_ratio']:.2f}"
        )
    if "cluster_ratio" in scaling:
        lines.append(
            f"- Cluster of 3 / Cluster of 1 master: {scaling['cluster_ratio']:.2f} x (target "
            f"≥ {CLUSTER_TARGET:g}: {'met' if scaling['cluster_target_met'] else 'NOT met'}); "
            f"Cluster of 3 / standalone: {scaling.get('cluster_vs_standalone', 0):.2f} x"
        )
    else:
        lines.append("- Cluster of 3 / one master: not measured")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=1000, help="timed calls per side")
    parser.add_argument("--warmup", type=int, default=100, help="untimed calls per side")
    parser.add_argument("--block", type=int, default=25, help="calls per turn of a side")
    parser.add_argument("--handoffs", type=int, default=50, help="handoffs per flavour")
    parser.add_argument("--ttl", type=float, default=60.0)
    parser.add_argument("--state-bytes", type=int, default=256)
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="per side or run of the throughput parts"
    )
    parser.add_argument("--leases", type=int, default=1000, help="leases renewed (part 3)")
    parser.add_argument("--processes", type=int, default=4, help="worker processes (part 4)")
    parser.add_argument("--work-ids", type=int, default=200, help="work IDs per worker (part 4)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (part 4)")
    parser.add_argument("--skip-cluster", action="store_true", help="standalone only (part 4)")
    parser.add_argument(
        "--server-calls", type=int, default=200, help="calls per script for the SLOWLOG pass"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = run(args)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "redis.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    text = render(result)
    (args.output / "redis.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
