#!/usr/bin/env python
"""Lease operations against the hand-written PostgreSQL floor, side by side, in both flavours.

For every lease operation (acquire, read_checkpoint, checkpoint, renew, release), acquire +
release, and a full Runner cycle (acquire, read, checkpoint, release), in the sync and the
asyncio flavour, this measures five sides on connections of one pool, in autocommit mode:

- worklease as it ships (``prepare=True``: prepared statements);
- worklease in its PgBouncer-compatible mode (``prepare=False``: simple protocol);
- **the floor**: what a user writes by hand: a plain upsert / select / guarded update on the
  same table, sent with ``conn.execute`` and psycopg's defaults (server-side parameters, a
  plan prepared after five executions);
- **the same-effect floor**: what a careful user writes by hand for the same effect as
  worklease's statements, on the same table and with the same psycopg defaults: the upsert
  also issues the timeline token (the WAL timeline in the high bits, never less than the
  row's token + 1) and records the previous holder and its exit, every write sets
  ``updated_at`` and is guarded by the holder too, the renewal refuses a released lease,
  and the release notifies waiters;
- the same-text floor: the very statement worklease's simple mode sends (same SQL text, same
  parameters) through a plain ``ClientCursor``, so the protocol's cost is visible.

The sides alternate in blocks (the order rotates) so that drift (other load on the machine,
cache warm-up, autovacuum) hits all alike. Ratios divide by the floor, and by the
same-effect floor beside it (acquire, acquire + release and the Runner cycle are bounded
against the same-effect floor, and acquire and acquire + release against the plain floor
too; the other operations against the plain floor). It also measures
acquire + release with ``pals`` (PostgreSQL advisory locks, which write nothing durable) when
that is installed, as a reference row without a target, and the in-memory backend's cost per
operation.

Results go to ``benchmarks/results/`` (``ops.md``, ``ops.json``, ``ops.png``). The run uses a
fresh database ``worklease_bench_<random>`` on the server of ``--dsn`` and drops it at the end.
See ``benchmarks/README.md``. The script reports; it never fails on a missed target.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import json
import math
import os
import platform
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from time import perf_counter_ns
from typing import Any

import psycopg
from psycopg import AsyncClientCursor, ClientCursor, sql
from psycopg.abc import AdaptContext
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from worklease import (
    AsyncLease,
    AsyncMemoryBackend,
    AsyncPostgresBackend,
    AsyncRunner,
    Checkpoint,
    ExitMode,
    Lease,
    MemoryBackend,
    PostgresBackend,
    Runner,
    Token,
)
from worklease._pg import Statements

LOCAL_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=5"
RESULTS = Path(__file__).resolve().parent / "results"
TARGETS_MARK = "<!-- targets -->"
"""Below this line the targets and verdicts (the performance guide includes what is above it)."""

OPERATIONS = ("acquire", "read_checkpoint", "checkpoint", "renew", "release")
ACQUIRE_RELEASE = "acquire+release"
RUNNER = "runner cycle"
PALS = "acquire+release vs pals"
FLAVOURS = ("sync", "async")
BOUNDS: dict[str, tuple[float | None, float | None]] = {
    # operation: (bound on the ratio to the same-effect floor, bound on the ratio to the plain
    # floor); None: no bound on that side.
    **dict.fromkeys(OPERATIONS, (None, 1.10)),
    "acquire": (1.10, 1.20),
    ACQUIRE_RELEASE: (1.10, 1.20),
    RUNNER: (1.15, None),
    PALS: (None, None),  # a reference: advisory locks write nothing durable
}
TARGETS: dict[str, float | None] = {operation: plain for operation, (_, plain) in BOUNDS.items()}
"""The bound on the ratio to the plain floor, per operation."""
SAME_EFFECT_TARGETS: dict[str, float | None] = {
    operation: effect for operation, (effect, _) in BOUNDS.items()
}
"""The bound on the ratio to the same-effect floor, per operation."""
ORDER = (*OPERATIONS, ACQUIRE_RELEASE, RUNNER, PALS)
# The statements a Runner cycle needs (issue 7): an acquire that returns the prior checkpoint,
# so the read right after it costs nothing, then the final checkpoint and the release.
RUNNER_FLOOR = ("acquire", "checkpoint", "release")

Step = Callable[[], int]
AStep = Callable[[], Awaitable[int]]
Rows = list[tuple[Any, ...]]


# -- statistics and results --------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """Summary of one series of timings, in microseconds."""

    n: int
    min_us: float
    median_us: float
    mean_us: float
    p90_us: float
    p99_us: float
    max_us: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> Stats:
        ordered = sorted(samples_ns)
        if not ordered:
            raise ValueError("no samples")

        def rank(q: float) -> float:  # nearest-rank percentile
            return ordered[max(math.ceil(q * len(ordered)) - 1, 0)] / 1000

        middle = len(ordered) // 2
        median = (
            ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
        )
        return cls(
            n=len(ordered),
            min_us=ordered[0] / 1000,
            median_us=median / 1000,
            mean_us=sum(ordered) / len(ordered) / 1000,
            p90_us=rank(0.90),
            p99_us=rank(0.99),
            max_us=ordered[-1] / 1000,
        )


@dataclass
class Comparison:
    """One table row: worklease (both modes) against the hand-written floor, the
    same-effect floor and the same-text floor, or against pals."""

    operation: str
    flavour: str
    baseline: str
    target: float | None
    same_effect_target: float | None = None
    worklease: Stats | None = None
    floor: Stats | None = None
    same_effect: Stats | None = None
    simple_mode: Stats | None = None
    same_text: Stats | None = None
    note: str = ""
    samples_ns: dict[str, list[int]] | None = None

    @property
    def ratio(self) -> float | None:
        return _ratio(self.worklease, self.floor)

    @property
    def same_effect_ratio(self) -> float | None:
        return _ratio(self.worklease, self.same_effect)

    @property
    def simple_mode_ratio(self) -> float | None:
        return _ratio(self.simple_mode, self.floor)

    def verdicts(self) -> dict[str, bool]:
        """Per bound that applies and was measured ("same effect", "floor"): whether met."""
        out: dict[str, bool] = {}
        for name, ratio, bound in (
            ("same effect", self.same_effect_ratio, self.same_effect_target),
            ("floor", self.ratio, self.target),
        ):
            if ratio is not None and bound is not None:
                out[name] = ratio <= bound
        return out

    @property
    def passed(self) -> bool | None:
        verdicts = self.verdicts()
        return all(verdicts.values()) if verdicts else None

    @property
    def failed(self) -> list[str]:
        """The bounds missed ("same effect", "floor")."""
        return [name for name, met in self.verdicts().items() if not met]


def _ratio(ours: Stats | None, floor: Stats | None) -> float | None:
    return None if ours is None or floor is None else ours.median_us / floor.median_us


@dataclass
class Measurement:
    """The in-memory backend's cost of one operation (no floor)."""

    operation: str
    flavour: str
    stats: Stats


@dataclass
class Report:
    settings: dict[str, Any]
    environment: dict[str, Any] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)
    memory: list[Measurement] = field(default_factory=list)
    statements_per_runner_cycle: dict[str, dict[str, int]] = field(default_factory=dict)
    runtime_s: float = 0.0

    def ordered(self) -> list[Comparison]:
        return sorted(
            self.comparisons,
            key=lambda c: (ORDER.index(c.operation), FLAVOURS.index(c.flavour)),
        )


@dataclass(frozen=True)
class Config:
    iterations: int
    runner_iterations: int
    memory_iterations: int
    warmup: int
    block: int
    ttl: float
    state: bytes
    samples: bool


# -- measuring ----------------------------------------------------------------------------------


def _schedule(n: int, block: int) -> Iterator[tuple[int, bool]]:
    """Blocks of at most ``block`` iterations; which side goes first alternates per block."""
    done, index = 0, 0
    while done < n:
        size = min(block, n - done)
        yield size, index % 2 == 0
        done += size
        index += 1


def compare(cfg: Config, n: int, steps: Sequence[Step]) -> list[list[int]]:
    """Timings of each step, in blocks whose order rotates (every side goes first as often)."""
    for _ in range(cfg.warmup):
        for step in steps:
            step()
    gc.collect()
    out: list[list[int]] = [[] for _ in steps]
    for index, (size, _) in enumerate(_schedule(n, cfg.block)):
        for k in range(len(steps)):
            side = (index + k) % len(steps)
            step, samples = steps[side], out[side]
            for _ in range(size):
                samples.append(step())
    return out


async def acompare(cfg: Config, n: int, steps: Sequence[AStep]) -> list[list[int]]:
    for _ in range(cfg.warmup):
        for step in steps:
            await step()
    gc.collect()
    out: list[list[int]] = [[] for _ in steps]
    for index, (size, _) in enumerate(_schedule(n, cfg.block)):
        for k in range(len(steps)):
            side = (index + k) % len(steps)
            step, samples = steps[side], out[side]
            for _ in range(size):
                samples.append(await step())
    return out


def measure(cfg: Config, n: int, step: Step) -> list[int]:
    for _ in range(cfg.warmup):
        step()
    gc.collect()
    return [step() for _ in range(n)]


async def ameasure(cfg: Config, n: int, step: AStep) -> list[int]:
    for _ in range(cfg.warmup):
        await step()
    gc.collect()
    return [await step() for _ in range(n)]


def timed(fn: Callable[[], object]) -> Step:
    def step() -> int:
        start = perf_counter_ns()
        fn()
        return perf_counter_ns() - start

    return step


def atimed(fn: Callable[[], Awaitable[object]]) -> AStep:
    async def step() -> int:
        start = perf_counter_ns()
        await fn()
        return perf_counter_ns() - start

    return step


SIDES = ("worklease", "simple_mode", "floor", "same_effect", "same_text")


def comparison(
    cfg: Config,
    operation: str,
    flavour: str,
    samples: Sequence[list[int]],
    baseline: str = "hand-written, psycopg defaults",
) -> Comparison:
    """A row from the timings of ``SIDES`` (in that order), or of worklease and pals."""
    row = Comparison(
        operation=operation,
        flavour=flavour,
        baseline=baseline,
        target=TARGETS[operation],
        same_effect_target=SAME_EFFECT_TARGETS[operation] if baseline != "pals" else None,
    )
    names = SIDES if len(samples) == len(SIDES) else ("worklease", "floor")
    for name, series in zip(names, samples, strict=True):
        setattr(row, name, Stats.of(series))
    if cfg.samples:
        row.samples_ns = dict(zip(names, samples, strict=True))
    return row


def iterations_for(cfg: Config, operation: str) -> int:
    return cfg.runner_iterations if operation in (RUNNER, PALS, ACQUIRE_RELEASE) else cfg.iterations


# -- the floor: worklease's statements through plain psycopg ------------------------------------


@dataclass(frozen=True)
class Texts:
    """The statements worklease sends, rendered once to the bytes psycopg receives."""

    acquire: bytes
    read_checkpoint: bytes
    checkpoint: bytes
    renew: bytes
    release: bytes
    token_column: int = 1
    """Where the acquire's row carries the fencing token (worklease's own upsert returns a
    row only when it grants, token first; the hand-written ones lead with ``true``)."""

    @classmethod
    def render(cls, statements: Statements, renewal: Statements, conn: AdaptContext) -> Texts:
        """The simple-protocol texts of worklease's simple mode (a renewal is bounded)."""
        return cls(
            acquire=statements.acquire,
            read_checkpoint=statements.read_checkpoint,
            checkpoint=statements.checkpoint,
            renew=renewal.bounded(renewal.renew),
            release=statements.release,
            token_column=0,
        )

    @classmethod
    def hand(cls) -> Texts:
        """What a user writes by hand for the same jobs on the same table: a plain upsert
        taking over an expired row, a select, and updates guarded by the fencing token."""
        return cls(
            acquire=b"""INSERT INTO worklease_leases AS l
    (work_id, holder_id, expires_at, fencing_token)
VALUES (%(work_id)s, %(holder_id)s, now() + %(ttl)s, nextval('worklease_fencing_seq'))
ON CONFLICT (work_id) DO UPDATE SET holder_id = EXCLUDED.holder_id,
    fencing_token = EXCLUDED.fencing_token, expires_at = EXCLUDED.expires_at,
    exit_mode = NULL
WHERE l.expires_at < now()
RETURNING true, fencing_token""",
            read_checkpoint=b"""SELECT fencing_token, checkpoint FROM worklease_leases
WHERE work_id = %(work_id)s""",
            checkpoint=b"""UPDATE worklease_leases
SET checkpoint = %(state)s, expires_at = now() + %(ttl)s
WHERE work_id = %(work_id)s AND fencing_token = %(token)s AND exit_mode IS NULL
RETURNING true""",
            renew=b"""UPDATE worklease_leases SET expires_at = now() + %(ttl)s
WHERE work_id = %(work_id)s AND fencing_token = %(token)s AND expires_at > now()
RETURNING true""",
            release=b"""UPDATE worklease_leases SET exit_mode = %(mode)s, expires_at = now()
WHERE work_id = %(work_id)s AND fencing_token = %(token)s AND expires_at > now()
RETURNING true""",
        )

    @classmethod
    def same_effect(cls) -> Texts:
        """What a careful user writes by hand for the same effect as worklease's statements,
        on the same table: the upsert issues the timeline token (the WAL timeline in the high
        bits, never less than the row's token + 1) and records the previous holder and its
        exit; every write sets ``updated_at`` and is guarded by the holder as well as the
        token; the renewal refuses a released lease; the release notifies waiters. No
        transaction pin, no read of the holder when
        not granted, no ``current_schema()``: one plain statement per operation."""
        return cls(
            acquire=b"""INSERT INTO worklease_leases AS l
    (work_id, holder_id, expires_at, fencing_token)
VALUES (%(work_id)s, %(holder_id)s, now() + %(ttl)s,
    ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint << 40)
        + nextval('worklease_fencing_seq')))
ON CONFLICT (work_id) DO UPDATE SET holder_id = EXCLUDED.holder_id,
    fencing_token = GREATEST(EXCLUDED.fencing_token, l.fencing_token + 1),
    expires_at = EXCLUDED.expires_at, exit_mode = NULL,
    prev_exit_mode = COALESCE(l.exit_mode, 'expired'), prev_holder_id = l.holder_id,
    updated_at = now()
WHERE l.expires_at < now()
RETURNING true, fencing_token, prev_exit_mode, prev_holder_id""",
            read_checkpoint=b"""SELECT fencing_token, checkpoint, prev_exit_mode, prev_holder_id
FROM worklease_leases WHERE work_id = %(work_id)s""",
            checkpoint=b"""UPDATE worklease_leases
SET checkpoint = %(state)s, expires_at = now() + %(ttl)s, updated_at = now()
WHERE work_id = %(work_id)s AND holder_id = %(holder_id)s AND fencing_token = %(token)s
    AND exit_mode IS NULL
RETURNING true""",
            renew=b"""UPDATE worklease_leases SET expires_at = now() + %(ttl)s, updated_at = now()
WHERE work_id = %(work_id)s AND holder_id = %(holder_id)s AND fencing_token = %(token)s
    AND expires_at > now() AND exit_mode IS NULL
RETURNING true""",
            release=b"""UPDATE worklease_leases
SET exit_mode = %(mode)s, expires_at = now() - interval '1 millisecond', updated_at = now()
WHERE work_id = %(work_id)s AND holder_id = %(holder_id)s AND fencing_token = %(token)s
    AND expires_at > now()
RETURNING true, pg_notify('worklease_release', work_id)""",
        )


class Params:
    """The parameters worklease binds, built the way a hand-written caller would."""

    def __init__(self, holder_id: str, ttl: float, state: bytes) -> None:
        self.holder_id = holder_id
        self.ttl = timedelta(seconds=ttl)
        self.statement_timeout = str(max(int(ttl * 1000), 1))
        self.state = state

    def acquire(self, work_id: str) -> dict[str, Any]:
        return {"work_id": work_id, "holder_id": self.holder_id, "ttl": self.ttl}

    def owned(self, work_id: str, token: int) -> dict[str, Any]:
        return {"work_id": work_id, "holder_id": self.holder_id, "token": token}

    def checkpoint(self, work_id: str, token: int) -> dict[str, Any]:
        return {**self.owned(work_id, token), "state": self.state, "ttl": self.ttl}

    def renew(self, work_id: str, token: int) -> dict[str, Any]:
        params = self.owned(work_id, token)
        params["ttl"] = self.ttl
        params["statement_timeout"] = self.statement_timeout
        return params

    def release(self, work_id: str, token: int) -> dict[str, Any]:
        return {**self.owned(work_id, token), "mode": "finished"}


def _granted(rows: Rows, work_id: str, texts: Texts) -> int:
    token = rows[0][texts.token_column] if rows else None
    if not rows or not rows[0][0] or token is None:
        raise RuntimeError(f"floor: acquire of {work_id!r} was not granted: {rows!r}")
    return int(token)


def _done(rows: Rows, what: str) -> None:
    if not rows or not rows[0][0]:
        raise RuntimeError(f"floor: {what} matched no row: {rows!r}")


class SyncFloor:
    def __init__(
        self,
        pool: ConnectionPool[Any],
        renewal_pool: ConnectionPool[Any],
        texts: Texts,
        params: Params,
        *,
        simple: bool,
    ) -> None:
        self.pool = pool
        self.renewal_pool = renewal_pool
        self.texts = texts
        self.params = params
        self.simple = simple

    def run(self, pool: ConnectionPool[Any], query: bytes, params: dict[str, Any]) -> Rows:
        with pool.connection() as conn:
            if not self.simple:  # psycopg's defaults
                rows: Rows = conn.execute(query, params).fetchall()
                return rows
            cursor = ClientCursor(conn)
            cursor.execute(query, params)
            while cursor.nextset():
                pass
            return cursor.fetchall()

    def acquire(self, work_id: str) -> int:
        rows = self.run(self.pool, self.texts.acquire, self.params.acquire(work_id))
        return _granted(rows, work_id, self.texts)

    def read_checkpoint(self, work_id: str) -> Rows:
        return self.run(self.pool, self.texts.read_checkpoint, {"work_id": work_id})

    def checkpoint(self, work_id: str, token: int) -> None:
        query, params = self.texts.checkpoint, self.params.checkpoint(work_id, token)
        _done(self.run(self.pool, query, params), "checkpoint")

    def renew(self, work_id: str, token: int) -> None:
        query, params = self.texts.renew, self.params.renew(work_id, token)
        _done(self.run(self.renewal_pool, query, params), "renew")

    def release(self, work_id: str, token: int) -> None:
        query, params = self.texts.release, self.params.release(work_id, token)
        _done(self.run(self.pool, query, params), "release")


class AsyncFloor:
    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        renewal_pool: AsyncConnectionPool[Any],
        texts: Texts,
        params: Params,
        *,
        simple: bool,
    ) -> None:
        self.pool = pool
        self.renewal_pool = renewal_pool
        self.texts = texts
        self.params = params
        self.simple = simple

    async def run(
        self, pool: AsyncConnectionPool[Any], query: bytes, params: dict[str, Any]
    ) -> Rows:
        async with pool.connection() as conn:
            if not self.simple:  # psycopg's defaults
                found: Rows = await (await conn.execute(query, params)).fetchall()
                return found
            cursor = AsyncClientCursor(conn)
            await cursor.execute(query, params)
            while cursor.nextset():
                pass
            return await cursor.fetchall()

    async def acquire(self, work_id: str) -> int:
        rows = await self.run(self.pool, self.texts.acquire, self.params.acquire(work_id))
        return _granted(rows, work_id, self.texts)

    async def read_checkpoint(self, work_id: str) -> Rows:
        return await self.run(self.pool, self.texts.read_checkpoint, {"work_id": work_id})

    async def checkpoint(self, work_id: str, token: int) -> None:
        query, params = self.texts.checkpoint, self.params.checkpoint(work_id, token)
        _done(await self.run(self.pool, query, params), "checkpoint")

    async def renew(self, work_id: str, token: int) -> None:
        query, params = self.texts.renew, self.params.renew(work_id, token)
        _done(await self.run(self.renewal_pool, query, params), "renew")

    async def release(self, work_id: str, token: int) -> None:
        query, params = self.texts.release, self.params.release(work_id, token)
        _done(await self.run(self.pool, query, params), "release")


# -- steps: one timed iteration each ------------------------------------------------------------


@contextlib.contextmanager
def lease_step(
    operation: str, lease: Lease, runner: Runner, work_id: str, state: bytes
) -> Iterator[Step]:
    """A timed iteration of ``operation`` through the sync lease (setup left untimed)."""
    if operation == "acquire":

        def acquire() -> int:
            start = perf_counter_ns()
            token = lease.acquire(work_id)
            elapsed = perf_counter_ns() - start
            lease.release(token, ExitMode.FINISHED)
            return elapsed

        yield acquire
    elif operation == "release":

        def release() -> int:
            token = lease.acquire(work_id)
            start = perf_counter_ns()
            lease.release(token, ExitMode.FINISHED)
            return perf_counter_ns() - start

        yield release
    elif operation == RUNNER:
        yield timed(lambda: runner.run(work_id))
    elif operation in (PALS, ACQUIRE_RELEASE):

        def acquire_release() -> int:
            start = perf_counter_ns()
            lease.release(lease.acquire(work_id), ExitMode.FINISHED)
            return perf_counter_ns() - start

        yield acquire_release
    else:
        token = lease.acquire(work_id)
        lease.checkpoint(token, state)
        try:
            if operation == "read_checkpoint":
                yield timed(lambda: lease.read_checkpoint(token))
            elif operation == "checkpoint":
                yield timed(lambda: lease.checkpoint(token, state))
            elif operation == "renew":
                yield timed(lambda: lease.renew(token))
            else:
                raise ValueError(operation)
        finally:
            lease.release(token, ExitMode.FINISHED)


@contextlib.asynccontextmanager
async def alease_step(
    operation: str, lease: AsyncLease, runner: AsyncRunner, work_id: str, state: bytes
) -> AsyncIterator[AStep]:
    """A timed iteration of ``operation`` through the asyncio lease (setup left untimed)."""
    if operation == "acquire":

        async def acquire() -> int:
            start = perf_counter_ns()
            token = await lease.acquire(work_id)
            elapsed = perf_counter_ns() - start
            await lease.release(token, ExitMode.FINISHED)
            return elapsed

        yield acquire
    elif operation == "release":

        async def release() -> int:
            token = await lease.acquire(work_id)
            start = perf_counter_ns()
            await lease.release(token, ExitMode.FINISHED)
            return perf_counter_ns() - start

        yield release
    elif operation == RUNNER:
        yield atimed(lambda: runner.run(work_id))
    elif operation in (PALS, ACQUIRE_RELEASE):

        async def acquire_release() -> int:
            start = perf_counter_ns()
            await lease.release(await lease.acquire(work_id), ExitMode.FINISHED)
            return perf_counter_ns() - start

        yield acquire_release
    else:
        token = await lease.acquire(work_id)
        await lease.checkpoint(token, state)
        try:
            if operation == "read_checkpoint":
                yield atimed(lambda: lease.read_checkpoint(token))
            elif operation == "checkpoint":
                yield atimed(lambda: lease.checkpoint(token, state))
            elif operation == "renew":
                yield atimed(lambda: lease.renew(token))
            else:
                raise ValueError(operation)
        finally:
            await lease.release(token, ExitMode.FINISHED)


@contextlib.contextmanager
def floor_step(operation: str, floor: SyncFloor, work_id: str) -> Iterator[Step]:
    """A timed iteration of ``operation``'s statement(s) through plain psycopg."""
    if operation == "acquire":

        def acquire() -> int:
            start = perf_counter_ns()
            token = floor.acquire(work_id)
            elapsed = perf_counter_ns() - start
            floor.release(work_id, token)
            return elapsed

        yield acquire
    elif operation == "release":

        def release() -> int:
            token = floor.acquire(work_id)
            start = perf_counter_ns()
            floor.release(work_id, token)
            return perf_counter_ns() - start

        yield release
    elif operation == ACQUIRE_RELEASE:

        def acquire_release() -> int:
            start = perf_counter_ns()
            floor.release(work_id, floor.acquire(work_id))
            return perf_counter_ns() - start

        yield acquire_release
    elif operation == RUNNER:

        def cycle() -> int:
            start = perf_counter_ns()
            token = floor.acquire(work_id)
            floor.checkpoint(work_id, token)
            floor.release(work_id, token)
            return perf_counter_ns() - start

        yield cycle
    else:
        token = floor.acquire(work_id)
        floor.checkpoint(work_id, token)
        try:
            if operation == "read_checkpoint":
                yield timed(lambda: floor.read_checkpoint(work_id))
            elif operation == "checkpoint":
                yield timed(lambda: floor.checkpoint(work_id, token))
            elif operation == "renew":
                yield timed(lambda: floor.renew(work_id, token))
            else:
                raise ValueError(operation)
        finally:
            floor.release(work_id, token)


@contextlib.asynccontextmanager
async def afloor_step(operation: str, floor: AsyncFloor, work_id: str) -> AsyncIterator[AStep]:
    """A timed iteration of ``operation``'s statement(s) through plain psycopg (asyncio)."""
    if operation == "acquire":

        async def acquire() -> int:
            start = perf_counter_ns()
            token = await floor.acquire(work_id)
            elapsed = perf_counter_ns() - start
            await floor.release(work_id, token)
            return elapsed

        yield acquire
    elif operation == "release":

        async def release() -> int:
            token = await floor.acquire(work_id)
            start = perf_counter_ns()
            await floor.release(work_id, token)
            return perf_counter_ns() - start

        yield release
    elif operation == ACQUIRE_RELEASE:

        async def acquire_release() -> int:
            start = perf_counter_ns()
            await floor.release(work_id, await floor.acquire(work_id))
            return perf_counter_ns() - start

        yield acquire_release
    elif operation == RUNNER:

        async def cycle() -> int:
            start = perf_counter_ns()
            token = await floor.acquire(work_id)
            await floor.checkpoint(work_id, token)
            await floor.release(work_id, token)
            return perf_counter_ns() - start

        yield cycle
    else:
        token = await floor.acquire(work_id)
        await floor.checkpoint(work_id, token)
        try:
            if operation == "read_checkpoint":
                yield atimed(lambda: floor.read_checkpoint(work_id))
            elif operation == "checkpoint":
                yield atimed(lambda: floor.checkpoint(work_id, token))
            elif operation == "renew":
                yield atimed(lambda: floor.renew(work_id, token))
            else:
                raise ValueError(operation)
        finally:
            await floor.release(work_id, token)


def pals_step(locker: Any, name: str) -> Step:
    lock = locker.lock(name, blocking=False)  # a try-lock: pals' cheapest acquire

    def acquire_release() -> int:
        start = perf_counter_ns()
        acquired = lock.acquire()
        lock.release()
        elapsed = perf_counter_ns() - start
        if acquired is not True:
            raise RuntimeError(f"pals: lock {name!r} was not acquired")
        return elapsed

    return acquire_release


def _sync_work(state: bytes) -> Callable[[Token, Checkpoint], bytes]:
    def work(token: Token, prior: Checkpoint) -> bytes:
        return state

    return work


def _async_work(state: bytes) -> Callable[[Token, Checkpoint], Awaitable[bytes]]:
    async def work(token: Token, prior: Checkpoint) -> bytes:
        return state

    return work


def work_id(flavour: str, operation: str, side: str) -> str:
    return f"bench/{flavour}/{operation.replace(' ', '-')}/{side}"


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the sync flavour ---------------------------------------------------------------------------


def _renewal_target_sync(backend: PostgresBackend, lease: Lease, probe: str) -> None:
    """Make the backend open its renewal pool and learn its renewal statements (one renew)."""
    token = lease.acquire(probe)
    lease.renew(token)
    lease.release(token, ExitMode.FINISHED)


def bench_sync(cfg: Config, dsn: str, report: Report, locker: str | None) -> None:
    flavour = "sync"
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=2, max_size=4, kwargs={"autocommit": True}, open=False, name="bench-sync"
    )
    pool.open(wait=True)
    backend = PostgresBackend(pool)
    simple_backend = PostgresBackend(pool, prepare=False)
    try:
        lease = Lease(backend, holder_id=f"bench-{flavour}", ttl=cfg.ttl)
        runner = Runner(lease, _sync_work(cfg.state))
        simple_lease = Lease(simple_backend, holder_id=f"bench-{flavour}", ttl=cfg.ttl)
        simple_runner = Runner(simple_lease, _sync_work(cfg.state))
        _renewal_target_sync(backend, lease, work_id(flavour, "probe", "worklease"))
        _renewal_target_sync(simple_backend, simple_lease, work_id(flavour, "probe", "simple"))
        # Private attributes, read only: renewals go through the backend's own small pool and
        # (once the schema is known) schema-qualified statements; the floors use the same.
        renewal_pool = backend._renewal_pool or pool
        renewal = backend._renewal_statements or backend._statements
        with pool.connection() as conn:
            texts = Texts.render(backend._statements, renewal, conn)
        params = Params(lease.holder_id, cfg.ttl, cfg.state)
        floor = SyncFloor(pool, renewal_pool, Texts.hand(), params, simple=False)
        effect = SyncFloor(pool, renewal_pool, Texts.same_effect(), params, simple=False)
        same_text = SyncFloor(pool, renewal_pool, texts, params, simple=True)

        for operation in (*OPERATIONS, ACQUIRE_RELEASE, RUNNER):
            _progress(f"  {flavour} {operation}")
            with (
                lease_step(
                    operation, lease, runner, work_id(flavour, operation, "worklease"), cfg.state
                ) as ours,
                lease_step(
                    operation,
                    simple_lease,
                    simple_runner,
                    work_id(flavour, operation, "simple"),
                    cfg.state,
                ) as simple,
                floor_step(operation, floor, work_id(flavour, operation, "floor")) as base,
                floor_step(operation, effect, work_id(flavour, operation, "effect")) as alike,
                floor_step(operation, same_text, work_id(flavour, operation, "same")) as same,
            ):
                steps = (ours, simple, base, alike, same)  # in the order of SIDES
                samples = compare(cfg, iterations_for(cfg, operation), steps)
            report.comparisons.append(comparison(cfg, operation, flavour, samples))

        report.statements_per_runner_cycle[flavour] = {
            "worklease": _count_requests(
                pool, lambda: runner.run(work_id(flavour, RUNNER, "worklease"))
            ),
            "floor": len(RUNNER_FLOOR),
            "same_effect": len(RUNNER_FLOOR),
        }

        with pals_locker(locker, dsn) as pals:
            if isinstance(pals, str):
                report.comparisons.append(
                    Comparison(PALS, flavour, "pals", TARGETS[PALS], note=pals)
                )
            else:
                _progress(f"  {flavour} {PALS}")
                with lease_step(
                    PALS, lease, runner, work_id(flavour, "pals", "worklease"), cfg.state
                ) as ours:
                    theirs = pals_step(pals, work_id(flavour, "pals", "pals"))
                    samples = compare(cfg, iterations_for(cfg, PALS), (ours, theirs))
                report.comparisons.append(comparison(cfg, PALS, flavour, samples, baseline="pals"))
    finally:
        simple_backend.close()
        backend.close()
        pool.close()


def _count_requests(pool: ConnectionPool[Any], fn: Callable[[], object]) -> int:
    pool.pop_stats()
    fn()
    return pool.get_stats().get("requests_num", 0)


# -- the asyncio flavour ------------------------------------------------------------------------


async def bench_async(cfg: Config, dsn: str, report: Report, locker: str | None) -> None:
    flavour = "async"
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=2, max_size=4, kwargs={"autocommit": True}, open=False, name="bench-async"
    )
    await pool.open(wait=True)
    backend = AsyncPostgresBackend(pool)
    simple_backend = AsyncPostgresBackend(pool, prepare=False)
    try:
        lease = AsyncLease(backend, holder_id=f"bench-{flavour}", ttl=cfg.ttl)
        runner = AsyncRunner(lease, _async_work(cfg.state))
        simple_lease = AsyncLease(simple_backend, holder_id=f"bench-{flavour}", ttl=cfg.ttl)
        simple_runner = AsyncRunner(simple_lease, _async_work(cfg.state))
        for probe_lease, side in ((lease, "worklease"), (simple_lease, "simple")):
            probe = await probe_lease.acquire(work_id(flavour, "probe", side))
            await probe_lease.renew(probe)
            await probe_lease.release(probe, ExitMode.FINISHED)
        renewal_pool = backend._renewal_pool or pool
        renewal = backend._renewal_statements or backend._statements
        async with pool.connection() as conn:
            texts = Texts.render(backend._statements, renewal, conn)
        params = Params(lease.holder_id, cfg.ttl, cfg.state)
        floor = AsyncFloor(pool, renewal_pool, Texts.hand(), params, simple=False)
        effect = AsyncFloor(pool, renewal_pool, Texts.same_effect(), params, simple=False)
        same_text = AsyncFloor(pool, renewal_pool, texts, params, simple=True)

        for operation in (*OPERATIONS, ACQUIRE_RELEASE, RUNNER):
            _progress(f"  {flavour} {operation}")
            async with (
                alease_step(
                    operation, lease, runner, work_id(flavour, operation, "worklease"), cfg.state
                ) as ours,
                alease_step(
                    operation,
                    simple_lease,
                    simple_runner,
                    work_id(flavour, operation, "simple"),
                    cfg.state,
                ) as simple,
                afloor_step(operation, floor, work_id(flavour, operation, "floor")) as base,
                afloor_step(operation, effect, work_id(flavour, operation, "effect")) as alike,
                afloor_step(operation, same_text, work_id(flavour, operation, "same")) as same,
            ):
                steps = (ours, simple, base, alike, same)  # in the order of SIDES
                samples = await acompare(cfg, iterations_for(cfg, operation), steps)
            report.comparisons.append(comparison(cfg, operation, flavour, samples))

        pool.pop_stats()
        await runner.run(work_id(flavour, RUNNER, "worklease"))
        report.statements_per_runner_cycle[flavour] = {
            "worklease": pool.get_stats().get("requests_num", 0),
            "floor": len(RUNNER_FLOOR),
            "same_effect": len(RUNNER_FLOOR),
        }

        with pals_locker(locker, dsn) as pals:
            if isinstance(pals, str):
                report.comparisons.append(
                    Comparison(PALS, flavour, "pals", TARGETS[PALS], note=pals)
                )
            else:
                _progress(f"  {flavour} {PALS} (pals is sync-only: its calls block the loop)")
                sync_pals = pals_step(pals, work_id(flavour, "pals", "pals"))

                async def theirs() -> int:
                    return sync_pals()

                async with alease_step(
                    PALS, lease, runner, work_id(flavour, "pals", "worklease"), cfg.state
                ) as ours:
                    samples = await acompare(cfg, iterations_for(cfg, PALS), (ours, theirs))
                report.comparisons.append(comparison(cfg, PALS, flavour, samples, baseline="pals"))
    finally:
        await simple_backend.close()
        await backend.close()
        await pool.close()


# -- the in-memory backend ----------------------------------------------------------------------


def bench_memory_sync(cfg: Config, report: Report) -> None:
    lease = Lease(MemoryBackend(), holder_id="bench-memory", ttl=cfg.ttl)
    runner = Runner(lease, _sync_work(cfg.state))
    for operation in (*OPERATIONS, ACQUIRE_RELEASE, RUNNER):
        with lease_step(
            operation, lease, runner, work_id("sync", operation, "memory"), cfg.state
        ) as step:
            samples = measure(cfg, iterations_for(cfg, operation), step)
        report.memory.append(Measurement(operation, "sync", Stats.of(samples)))


async def bench_memory_async(cfg: Config, report: Report) -> None:
    lease = AsyncLease(AsyncMemoryBackend(), holder_id="bench-memory", ttl=cfg.ttl)
    runner = AsyncRunner(lease, _async_work(cfg.state))
    for operation in (*OPERATIONS, ACQUIRE_RELEASE, RUNNER):
        async with alease_step(
            operation, lease, runner, work_id("async", operation, "memory"), cfg.state
        ) as step:
            samples = await ameasure(cfg, iterations_for(cfg, operation), step)
        report.memory.append(Measurement(operation, "async", Stats.of(samples)))


# -- pals ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def pals_locker(skip: str | None, dsn: str) -> Iterator[Any | str]:
    """A pals ``Locker`` for one row, its engine disposed right after (``skip``, or why
    there is none, instead). pals' SQLAlchemy connections, left open, made every later
    statement of the run slower (measured: the asyncio rows after the sync pals row at about
    twice their cost); each row gets a fresh engine that is gone before the next row."""
    if skip is not None:
        yield skip
        return
    locker, engine = make_locker(dsn)
    try:
        yield locker
    finally:
        if engine is not None:
            engine.dispose()


def make_locker(dsn: str) -> tuple[Any | str, Any]:
    """A pals ``Locker`` on ``dsn`` (SQLAlchemy over psycopg 3), or why there is none."""
    try:
        pals = importlib.import_module("pals")
        sqlalchemy = importlib.import_module("sqlalchemy")
    except ImportError:
        return "pals not installed", None
    engine = sqlalchemy.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    locker = pals.Locker("worklease-bench", create_engine_callable=lambda: engine)
    return locker, engine


# -- the database -------------------------------------------------------------------------------


def default_dsn() -> str:
    return os.environ.get("WORKLEASE_TEST_DSN") or LOCAL_DSN


@contextlib.contextmanager
def fresh_database(server_dsn: str) -> Iterator[tuple[str, str]]:
    """Create ``worklease_bench_<random>`` with the worklease schema; drop it afterwards."""
    name = f"worklease_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            PostgresBackend.apply_schema(conn)
        yield name, dsn
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def environment(dsn: str, database: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        host = conn.info.host
    versions: dict[str, str] = {}
    for package in ("psycopg", "psycopg_pool", "pals", "sqlalchemy", "matplotlib"):
        with contextlib.suppress(ImportError):
            versions[package] = str(getattr(importlib.import_module(package), "__version__", "?"))
    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "postgresql": row[0] if row else "?",
        "host": host,
        "database": database,
        "packages": versions,
    }


# -- output -------------------------------------------------------------------------------------


def _us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def render_markdown(report: Report) -> str:
    env, settings = report.environment, report.settings
    lines = [
        "# worklease lease operations against the hand-written PostgreSQL floor",
        "",
        f"Run {env.get('started_at', '?')}: PostgreSQL {env.get('postgresql', '?')} on "
        f"{env.get('host', '?')}, Python {env.get('python', '?')}, "
        f"psycopg {env.get('packages', {}).get('psycopg', '?')}, {env.get('cpus', '?')} CPUs, "
        f"load average at start {_load(env.get('load_average_at_start'))}, "
        f"at end {_load(env.get('load_average_at_end'))}. "
        f"{settings['iterations']} iterations per operation "
        f"({settings['runner_iterations']} per Runner cycle and pals comparison), "
        f"{settings['warmup']} warm-up, alternating blocks of {settings['block']}; "
        f"checkpoint state {settings['state_bytes']} bytes. Runtime {report.runtime_s:.1f} s.",
        "",
        "Times in µs, median / p99. **worklease**: as shipped (`prepare=True`). **simple "
        "mode**: `prepare=False`, the PgBouncer-compatible mode. **floor**: the same job "
        "written by hand (plain upsert, select or token-guarded update on the same table) "
        "with `conn.execute` and psycopg's defaults. **same effect**: the floor written to do "
        "everything worklease's statement does, still by hand, one plain statement each, "
        "with the same defaults: the acquire also issues the timeline token (the server's "
        "WAL timeline in the high bits, never less than the row's last token + 1) and "
        "records the previous holder and how it exited, every write also sets `updated_at` "
        "and checks the holder as well as the token, the renewal refuses a released lease, "
        "and the release wakes waiters with a notification. **same text**: the statement "
        "worklease's simple mode sends, through "
        "a plain `ClientCursor`. All on connections of one pool. Ratio = median / floor "
        "median; ratio (same effect) = median / same-effect median. For the Runner cycle the "
        "floors run acquire + checkpoint + release in a row; in the pals row the floor column "
        "holds pals' acquire + release (a reference: advisory locks write nothing durable).",
        "",
        "| operation | flavour | worklease | simple mode | floor | same effect | same text "
        "| ratio | ratio (same effect) | simple-mode ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = [
        "",
        TARGETS_MARK,
        "",
        "Targets (issue 25): acquire and acquire + release: ratio (same effect) ≤ 1.10 and "
        "ratio ≤ 1.20; the Runner cycle: ratio (same effect) ≤ 1.15; the other operations: "
        "ratio ≤ 1.10. A FAIL names the bound missed; pals is a reference, with no target.",
        "",
        "| operation | flavour | ratio | ratio (same effect) | target | result |",
        "|---|---|---:|---:|---|---|",
    ]

    def cell(stats: Stats | None) -> str:
        return "-" if stats is None else f"{_us(stats.median_us)} / {_us(stats.p99_us)}"

    def fraction(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for row in report.ordered():
        bounds = [
            f"≤ {bound:.2f} {name}"
            for name, bound in (("same effect", row.same_effect_target), ("floor", row.target))
            if bound is not None
        ]
        target = ", ".join(bounds) or "reference"
        if row.worklease is None or row.floor is None:
            result = row.note or "not measured"
        elif row.passed is None:
            result = "-"
        else:
            result = "pass" if row.passed else f"FAIL ({', '.join(row.failed)})"
        lines.append(
            f"| {row.operation} | {row.flavour} | {cell(row.worklease)} "
            f"| {cell(row.simple_mode)} | {cell(row.floor)} | {cell(row.same_effect)} "
            f"| {cell(row.same_text)} | {fraction(row.ratio)} "
            f"| {fraction(row.same_effect_ratio)} | {fraction(row.simple_mode_ratio)} |"
        )
        verdicts.append(
            f"| {row.operation} | {row.flavour} | {fraction(row.ratio)} "
            f"| {fraction(row.same_effect_ratio)} | {target} | {result} |"
        )
    counts = report.statements_per_runner_cycle
    if counts:
        parts = [f"{flavour} {c['worklease']}" for flavour, c in counts.items()]
        lines += [
            "",
            "Statements per Runner cycle (pool checkouts, one statement each): worklease "
            + ", ".join(parts)
            + f"; the floors count {len(RUNNER_FLOOR)} ({' + '.join(RUNNER_FLOOR)}).",
        ]
    if report.memory:
        lines += [
            "",
            "## In-memory backend",
            "",
            "Cost of each operation through the lease on `MemoryBackend` / `AsyncMemoryBackend` "
            "(µs; no floor).",
            "",
            "| operation | flavour | median | p99 |",
            "|---|---|---:|---:|",
        ]
        order = [*OPERATIONS, ACQUIRE_RELEASE, RUNNER]
        for m in sorted(
            report.memory,
            key=lambda m: (order.index(m.operation), FLAVOURS.index(m.flavour)),
        ):
            lines.append(
                f"| {m.operation} | {m.flavour} | {_us(m.stats.median_us)} "
                f"| {_us(m.stats.p99_us)} |"
            )
    return "\n".join(lines + verdicts) + "\n"


def _load(value: object) -> str:
    if isinstance(value, list) and value:
        return f"{float(value[0]):.2f}"
    return "?"


def render_json(report: Report) -> dict[str, Any]:
    rows = []
    for row in report.ordered():
        item: dict[str, Any] = {
            "operation": row.operation,
            "flavour": row.flavour,
            "baseline": row.baseline,
            "target": row.target,
            "same_effect_target": row.same_effect_target,
            "ratio": row.ratio,
            "same_effect_ratio": row.same_effect_ratio,
            "simple_mode_ratio": row.simple_mode_ratio,
            "passed": row.passed,
            "failed": row.failed,
            "note": row.note,
            **{name: asdict(stats) if (stats := getattr(row, name)) else None for name in SIDES},
        }
        if row.samples_ns is not None:
            item["samples_ns"] = row.samples_ns
        rows.append(item)
    return {
        "settings": report.settings,
        "environment": report.environment,
        "runtime_s": round(report.runtime_s, 3),
        "comparisons": rows,
        "statements_per_runner_cycle": report.statements_per_runner_cycle,
        "memory": [
            {"operation": m.operation, "flavour": m.flavour, "stats": asdict(m.stats)}
            for m in report.memory
        ],
    }


def render_chart(report: Report, path: Path) -> str | None:
    """Bar chart of the ratios (to the plain floor, and hatched to the same-effect floor) with
    each group's bounds; returns why not, if not drawn."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return "matplotlib not installed (pip install -e . --group bench): no chart"
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    groups = list(ORDER)
    ratios: dict[tuple[str, str, str], float | None] = {}
    for row in report.comparisons:
        ratios[row.operation, row.flavour, "floor"] = row.ratio
        ratios[row.operation, row.flavour, "same effect"] = row.same_effect_ratio
    series = [(flavour, base) for flavour in ("sync", "async") for base in ("floor", "same effect")]
    width = 0.2
    fig, ax = plt.subplots(figsize=(12, 5.5), dpi=120)
    colours = {"sync": "#4C72B0", "async": "#DD8452"}
    for k, (flavour, base) in enumerate(series):
        offset = (k - (len(series) - 1) / 2) * width
        xs = [i + offset for i, g in enumerate(groups) if ratios.get((g, flavour, base))]
        ys = [r for g in groups if (r := ratios.get((g, flavour, base)))]
        alike = base == "same effect"
        bars = ax.bar(
            xs,
            ys,
            width,
            label=f"{flavour} / {base}",
            color="white" if alike else colours[flavour],
            edgecolor=colours[flavour],
            hatch="///" if alike else None,
        )
        ax.bar_label(
            bars,
            labels=[f"{y:.2f}" for y in ys],
            fontsize=7,
            padding=2,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8},
            zorder=3,
        )
    labelled: set[str] = set()
    for i, group in enumerate(groups):
        for name, goal, colour, style in (
            ("floor", TARGETS[group], "#C44E52", "dashed"),
            ("same effect", SAME_EFFECT_TARGETS[group], "#8172B3", "dotted"),
        ):
            if goal is None:
                continue
            label = None if name in labelled else f"target ({name})"
            labelled.add(name)
            ax.hlines(goal, i - 0.48, i + 0.48, colors=colour, linestyles=style, label=label)
        if all(ratios.get((group, f, b)) is None for f, b in series):
            ax.text(i, 0.05, "n/a", ha="center", fontsize=8)
    ax.axhline(1.0, color="#888888", linewidth=0.8)
    ax.set_xticks(range(len(groups)), [g.replace(" vs ", "\nvs ") for g in groups], fontsize=9)
    ax.set_ylabel("median ratio (worklease / hand-written floor; last group: / pals)")
    ax.set_title(
        "worklease vs the hand-written psycopg floors, plain and same-effect (hatched) "
        "(lower is better)"
    )
    ax.legend(loc="upper left", fontsize=8, ncols=3)
    ax.set_ylim(0, max([1.4, *[r * 1.2 for r in ratios.values() if r is not None]]))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--dsn",
        default=default_dsn(),
        help="server to benchmark on; a fresh database is created and dropped there "
        "(default: $WORKLEASE_TEST_DSN or the local server on 127.0.0.1:5432)",
    )
    parser.add_argument("--iterations", type=int, default=2000, help="per single operation")
    parser.add_argument(
        "--runner-iterations",
        type=int,
        default=None,
        help="per Runner cycle and per pals comparison (default: half of --iterations)",
    )
    parser.add_argument(
        "--memory-iterations",
        type=int,
        default=None,
        help="per in-memory operation (default: --iterations)",
    )
    parser.add_argument("--warmup", type=int, default=200, help="untimed iterations per side")
    parser.add_argument("--block", type=int, default=50, help="iterations per alternating block")
    parser.add_argument("--ttl", type=float, default=60.0, help="lease TTL in seconds")
    parser.add_argument("--state-bytes", type=int, default=256, help="checkpoint state size")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--skip-chart", action="store_true", help="do not draw ops.png")
    parser.add_argument("--skip-pals", action="store_true", help="leave pals out")
    parser.add_argument(
        "--samples", action="store_true", help="also store every timing (ns) in ops.json"
    )
    args = parser.parse_args(argv)
    for name in ("iterations", "warmup", "block", "state_bytes"):
        if getattr(args, name) < (0 if name in ("warmup", "state_bytes") else 1):
            parser.error(f"--{name.replace('_', '-')} is out of range")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = perf_counter_ns()
    iterations: int = args.iterations
    cfg = Config(
        iterations=iterations,
        runner_iterations=max(args.runner_iterations or iterations // 2, 1),
        memory_iterations=max(args.memory_iterations or iterations, 1),
        warmup=args.warmup,
        block=args.block,
        ttl=args.ttl,
        state=os.urandom(args.state_bytes),
        samples=args.samples,
    )
    report = Report(
        settings={
            "iterations": cfg.iterations,
            "runner_iterations": cfg.runner_iterations,
            "memory_iterations": cfg.memory_iterations,
            "warmup": cfg.warmup,
            "block": cfg.block,
            "ttl_s": cfg.ttl,
            "state_bytes": len(cfg.state),
            "targets": TARGETS,
            "same_effect_targets": SAME_EFFECT_TARGETS,
            "runner_floor_statements": list(RUNNER_FLOOR),
        }
    )
    output: Path = args.output
    output.mkdir(parents=True, exist_ok=True)

    with fresh_database(args.dsn) as (database, dsn):
        _progress(f"benchmarking in database {database}")
        report.environment = environment(dsn, database)
        locker = "pals skipped (--skip-pals)" if args.skip_pals else None
        bench_sync(cfg, dsn, report, locker)
        asyncio.run(bench_async(cfg, dsn, report, locker))
    _progress("  in-memory backend")
    mem_cfg = replace(cfg, iterations=cfg.memory_iterations)
    bench_memory_sync(mem_cfg, report)
    asyncio.run(bench_memory_async(mem_cfg, report))

    report.environment["load_average_at_end"] = list(os.getloadavg())
    report.runtime_s = (perf_counter_ns() - started) / 1e9
    (output / "ops.md").write_text(render_markdown(report), encoding="utf-8")
    (output / "ops.json").write_text(json.dumps(render_json(report), indent=2) + "\n")
    if not args.skip_chart:
        why = render_chart(report, output / "ops.png")
        if why:
            _progress(why)
    print(render_markdown(report))
    print(f"results written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
