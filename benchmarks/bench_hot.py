#!/usr/bin/env python
"""HOT updates under a checkpoint load: the schema before issue 25 beside the one shipped.

Every renewal and checkpoint changes ``expires_at`` and ``updated_at``. With an index on
``updated_at`` (the schema before issue 25, and the Go library's), no such write can be a HOT
update: each one writes a new entry into every index of the table, and the table and its
indexes bloat until vacuum catches up. Three tables, each in a schema of its own in one fresh
database, take the same load in turn:

- **before**: the earlier schema (the ``updated_at`` index, fillfactor 100);
- **index dropped**: without the index, fillfactor 100;
- **as shipped**: without the index, fillfactor 90 (``schema.sql``).

The load: ``--work-ids`` leases acquired through one ``AsyncLease`` on a pool of 8
connections, then ``--writes`` writes by ``--tasks`` tasks, each cycling over its own work
IDs: checkpoints of ``--state-bytes`` bytes, every fourth write a renewal (concurrent calls
are grouped: batch statements and single ones both). Then the pool closes (its server
processes flush their statistics) and the table's ``pg_stat_user_tables`` counters and sizes
are read. The rounds alternate the tables' order. Results go to
``benchmarks/results/hot.{md,json}``. The script only reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from bench_ops import RESULTS, default_dsn, environment, fresh_database
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from worklease import AsyncLease, AsyncPostgresBackend, ExitMode
from worklease._pg import LEGACY_INDEX, TABLE, schema_statements

VARIANTS = ("before", "index dropped", "as shipped")


@dataclass
class Run:
    variant: str
    round: int
    writes: int
    seconds: float
    updates: int
    hot_updates: int
    table_bytes: int
    index_bytes: int

    @property
    def hot_ratio(self) -> float:
        return self.hot_updates / self.updates if self.updates else 0.0


def _schema_name(variant: str, round_: int) -> str:
    return f"hot_{variant.replace(' ', '_')}_{round_}"


def make_table(conn: psycopg.Connection[Any], variant: str, schema: str) -> None:
    for statement in schema_statements(schema):
        conn.execute(statement.encode())
    table = sql.Identifier(schema, TABLE)
    if variant == "before":
        conn.execute(
            sql.SQL("CREATE INDEX {} ON {} (updated_at)").format(
                sql.Identifier(LEGACY_INDEX), table
            )
        )
    if variant in ("before", "index dropped"):
        conn.execute(sql.SQL("ALTER TABLE {} RESET (fillfactor)").format(table))


async def load(dsn: str, schema: str, cfg: argparse.Namespace) -> tuple[int, float]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=8, max_size=8, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    try:
        async with AsyncPostgresBackend(pool, schema=schema, listen=False) as backend:
            lease = AsyncLease(backend, holder_id="bench-hot", ttl=60)
            tokens = [await lease.acquire(f"w-{i:06d}") for i in range(cfg.work_ids)]
            state = os.urandom(cfg.state_bytes)
            per_task = cfg.writes // cfg.tasks

            async def worker(index: int) -> None:
                mine = tokens[index :: cfg.tasks]
                for n in range(per_task):
                    token = mine[n % len(mine)]
                    if n % 4 == 3:
                        await lease.renew(token)
                    else:
                        await lease.checkpoint(token, state)

            started = time.perf_counter()
            await asyncio.gather(*(worker(i) for i in range(cfg.tasks)))
            seconds = time.perf_counter() - started
            for token in tokens:
                await lease.release(token, ExitMode.FINISHED)
        return per_task * cfg.tasks, seconds
    finally:
        await pool.close()


def counters(conn: psycopg.Connection[Any], schema: str, at_least: int) -> tuple[int, int]:
    """The table's update and HOT update counts, once its writers' statistics are flushed
    (a server process flushes them when it exits; polled for up to 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname = %s",
            (schema, TABLE),
        ).fetchone()
        updates, hot = (int(row[0]), int(row[1])) if row else (0, 0)
        if updates >= at_least or time.monotonic() > deadline:
            return updates, hot
        time.sleep(0.5)


def sizes(conn: psycopg.Connection[Any], schema: str) -> tuple[int, int]:
    name = sql.Identifier(schema, TABLE).as_string(conn)
    row = conn.execute(
        "SELECT pg_table_size(%s::regclass), pg_indexes_size(%s::regclass)", (name, name)
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def render(report: dict[str, Any]) -> str:
    env, cfg = report["environment"], report["settings"]
    lines = [
        "# HOT updates under a checkpoint load",
        "",
        f"Run {env['started_at']}: PostgreSQL {env['postgresql']} on {env['host']}, Python "
        f"{env['python']}, psycopg {env['packages'].get('psycopg', '?')}, {env['cpus']} CPUs. "
        f"{cfg['work_ids']:,} leases, {cfg['writes']:,} writes per table by {cfg['tasks']} "
        f"tasks through one `AsyncLease` (pool of 8): checkpoints of {cfg['state_bytes']} "
        "bytes, every fourth a renewal; "
        f"{cfg['rounds']} rounds, the tables' order alternating. Medians over the rounds.",
        "",
        "| table | updates counted | HOT | HOT ratio | table after | indexes after | writes/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for variant in VARIANTS:
        runs = [r for r in report["runs"] if r["variant"] == variant]
        if not runs:
            continue
        lines.append(
            f"| {variant} | {statistics.median(r['updates'] for r in runs):,.0f} | "
            f"{statistics.median(r['hot_updates'] for r in runs):,.0f} | "
            f"{statistics.median(r['hot_ratio'] for r in runs):.1%} | "
            f"{statistics.median(r['table_bytes'] for r in runs) / 1024:,.0f} KiB | "
            f"{statistics.median(r['index_bytes'] for r in runs) / 1024:,.0f} KiB | "
            f"{statistics.median(r['writes'] / r['seconds'] for r in runs):,.0f} |"
        )
    lines += [
        "",
        "Updates counted include the releases (one per lease; the acquires are inserts); "
        "the target (issue 25) is at least 90 % HOT as shipped.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=default_dsn())
    parser.add_argument("--work-ids", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=20_000)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--state-bytes", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", type=Path, default=RESULTS)
    cfg = parser.parse_args(argv)
    runs: list[Run] = []
    with fresh_database(cfg.dsn) as (database, dsn):
        env = environment(dsn, database)
        with psycopg.connect(dsn, autocommit=True) as admin:
            for round_ in range(cfg.rounds):
                order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    schema = _schema_name(variant, round_)
                    make_table(admin, variant, schema)
                    writes, seconds = asyncio.run(load(dsn, schema, cfg))
                    # writes + the releases; the acquires were inserts
                    updates, hot = counters(admin, schema, writes + cfg.work_ids)
                    table_bytes, index_bytes = sizes(admin, schema)
                    run = Run(
                        variant, round_, writes, seconds, updates, hot, table_bytes, index_bytes
                    )
                    runs.append(run)
                    print(
                        f"round {round_ + 1} {variant:13}: {run.hot_ratio:6.1%} HOT of "
                        f"{updates:,} updates, table {table_bytes / 1024:,.0f} KiB, indexes "
                        f"{index_bytes / 1024:,.0f} KiB, {writes / seconds:,.0f} writes/s",
                        file=sys.stderr,
                    )
    report = {
        "settings": {k: v for k, v in vars(cfg).items() if k not in ("dsn", "output")},
        "environment": env,
        "runs": [asdict(r) | {"hot_ratio": r.hot_ratio} for r in runs],
    }
    text = render(report)
    print(text)
    cfg.output.mkdir(parents=True, exist_ok=True)
    (cfg.output / "hot.md").write_text(text, encoding="utf-8")
    (cfg.output / "hot.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
