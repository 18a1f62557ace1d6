#!/usr/bin/env python
"""The acquire statement, old design beside new, against the hand-written same-effect upsert.

Each side acquires one work ID whose previous holder released it (the takeover a Runner cycle
meets), sent by hand through one pool with psycopg's defaults (``conn.execute``: server-side
parameters, a plan prepared after five executions), the release after it untimed:

- **same effect**: the hand-written upsert with the same effect (``bench_ops.Texts``);
- **CTE + holder branch**: the statement worklease sent until ADR-0024, a data-modifying CTE
  with a ``UNION ALL`` branch reading the holder when nothing was granted (kept here, text
  and all, as the old design);
- **flat upsert**: the statement worklease sends now (``Statements.acquire``);
- **Lease.acquire**: the sync lease as it ships, on the same pool (the flat upsert plus the
  library's own Python).

The sides alternate in blocks whose order rotates; ratios divide by the same-effect median.
Results go to ``benchmarks/results/acquire_statement.md`` and ``.json``; the run uses a fresh
database on the server of ``--dsn`` and drops it. The script reports; it never fails on a
number.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from bench_ops import RESULTS, Params, Texts, default_dsn, environment, fresh_database
from psycopg_pool import ConnectionPool

from worklease import ExitMode, Lease, PostgresBackend
from worklease._pg import Statements, single_statement

OLD_CTE = b"""WITH granted AS (
    INSERT INTO "worklease_leases" AS l (work_id, holder_id, expires_at, fencing_token)
    VALUES (%(work_id)s, %(holder_id)s, now() + %(ttl)s, ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint << 40) + nextval('worklease_fencing_seq')))
    ON CONFLICT (work_id) DO UPDATE SET
        holder_id = EXCLUDED.holder_id,
        fencing_token = GREATEST(EXCLUDED.fencing_token, l.fencing_token + 1),
        expires_at = EXCLUDED.expires_at,
        exit_mode = NULL,
        prev_exit_mode = COALESCE(l.exit_mode, 'expired'),
        prev_holder_id = l.holder_id,
        updated_at = now()
    WHERE l.expires_at < now()
    RETURNING fencing_token, expires_at
)
SELECT true, fencing_token, expires_at, NULL::text, current_schema() FROM granted
UNION ALL
SELECT false, NULL::bigint,
       CASE WHEN expires_at >= now() THEN expires_at END,
       CASE WHEN expires_at >= now() THEN holder_id END,
       current_schema()
FROM "worklease_leases"
WHERE work_id = %(work_id)s AND NOT EXISTS (SELECT 1 FROM granted)"""  # noqa: E501
"""The acquire statement before ADR-0024, as it was rendered for the search path."""

SIDES = ("same effect", "CTE + holder branch", "flat upsert", "Lease.acquire")


def run(dsn: str, iterations: int, block: int, warmup: int) -> dict[str, list[int]]:
    params = Params("bench-holder", 60.0, b"")
    same = Texts.same_effect()
    flat = single_statement(Statements(None).acquire)
    assert flat is not None
    texts: dict[str, tuple[bytes, int]] = {
        "same effect": (same.acquire, 1),
        "CTE + holder branch": (OLD_CTE, 1),
        "flat upsert": (flat, 0),
    }
    kwargs = {"autocommit": True}
    with ConnectionPool(dsn, min_size=2, max_size=2, kwargs=kwargs, open=True) as pool:
        lease = Lease(PostgresBackend(pool), ttl=60.0, holder_id="bench-holder")
        prefix = uuid.uuid4().hex[:8]

        def by_hand(side: str) -> Callable[[], int]:
            text, column = texts[side]
            work_id = f"{prefix}-{side}"

            def step() -> int:
                start = perf_counter_ns()
                with pool.connection() as conn:
                    rows = conn.execute(text, params.acquire(work_id)).fetchall()
                elapsed = perf_counter_ns() - start
                if not rows or rows[0][column] is None:
                    raise RuntimeError(f"{side}: not granted: {rows!r}")
                with pool.connection() as conn:
                    release = params.release(work_id, int(rows[0][column]))
                    if not conn.execute(same.release, release).fetchall():
                        raise RuntimeError(f"{side}: the release matched no row")
                return elapsed

            return step

        def through_lease() -> int:
            start = perf_counter_ns()
            token = lease.acquire(f"{prefix}-lease")
            elapsed = perf_counter_ns() - start
            lease.release(token, ExitMode.FINISHED)
            return elapsed

        steps = {side: by_hand(side) for side in texts}
        steps["Lease.acquire"] = through_lease
        for step in steps.values():
            for _ in range(warmup):
                step()
        samples: dict[str, list[int]] = {side: [] for side in SIDES}
        gc.disable()
        try:
            rounds = max(iterations // block, 1)
            for index in range(rounds):
                shift = index % len(SIDES)
                for side in SIDES[shift:] + SIDES[:shift]:
                    step = steps[side]
                    samples[side].extend(step() for _ in range(block))
        finally:
            gc.enable()
    return samples


def summary(samples: dict[str, list[int]]) -> list[dict[str, Any]]:
    base = statistics.median(samples["same effect"])
    rows = []
    for side in SIDES:
        values = sorted(samples[side])
        median = statistics.median(values)
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        rows.append(
            {
                "side": side,
                "median_us": median / 1000,
                "p99_us": p99 / 1000,
                "ratio": median / base,
                "n": len(values),
            }
        )
    return rows


def render(env: dict[str, Any], rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "# The acquire statement: old design beside new",
        "",
        f"Run {env['started_at']}: PostgreSQL {env['postgresql']} on {env['host']}, Python "
        f"{env['python']}, {env['cpus']} CPUs, load average at start "
        f"{env['load_average_at_start'][0]:.2f}. {args.iterations} acquires per side in "
        f"alternating blocks of {args.block} (order rotating), {args.warmup} warm-up each; "
        "each acquire takes over a row its previous holder released. µs, median / p99; ratio "
        "= median / same-effect median. See `bench_acquire_statement.py` and ADR-0024.",
        "",
        "| side | median | p99 | ratio |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['side']} | {row['median_us']:.0f} | {row['p99_us']:,.0f} | "
            f"{row['ratio']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", default=default_dsn(), help="server (a fresh database is used)")
    parser.add_argument("--iterations", type=int, default=3000, help="acquires per side")
    parser.add_argument("--block", type=int, default=50, help="acquires per alternating block")
    parser.add_argument("--warmup", type=int, default=100, help="untimed acquires per side")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.block < 1 or args.warmup < 0:
        parser.error("--iterations and --block must be positive, --warmup not negative")
    with fresh_database(args.dsn) as (database, dsn):
        env = environment(dsn, database)
        rows = summary(run(dsn, args.iterations, args.block, args.warmup))
    text = render(env, rows, args)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "acquire_statement.md").write_text(text, encoding="utf-8")
    result = {"environment": env, "rows": rows, "iterations": args.iterations}
    (args.output / "acquire_statement.json").write_text(
        json.dumps(result, indent=2) + "\n", encoding="utf-8"
    )
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
