#!/usr/bin/env python
"""How long a sweep makes a concurrent acquire of a swept work ID wait (issue 24).

A fresh schema (``worklease_bench_sweep_<random>``, dropped at the end) gets ``--rows``
sweepable rows (default 100,000: released ``RETIRED`` an hour ago), optionally interleaved with
``--unsweepable`` rows released ``FINISHED`` (never swept: a table where most old rows are
kept). Then the table is swept with ``retention`` = 60 s, two ways, in the same run on the same
server:

- **single DELETE**: the statement ``sweep`` sent before issue 24, inline here, one
  transaction over the whole table (its row locks last until it commits);
- **batched**: ``PostgresBackend.sweep``, statements of at most ``Statements.sweep_batch``
  rows each (``--batch`` overrides it), each its own transaction, skipping locked rows.

While the sweep runs, a thread with a backend of its own (``PostgresBackend.acquire``, the
library's ``INSERT ... ON CONFLICT`` takeover) acquires work IDs that are being swept, one after
the other, and times each acquire. For the single DELETE they are random sweepable work IDs
(any row it has passed stays locked until it commits). For the batched sweep they are random
work IDs among the next two batches after the cursor of the batch last finished (the rows the
running batch locks, or is about to): an acquire there waits for the batch in progress, the
worst case. A row an acquire took is held and no longer sweepable; it is left. A second
thread, a live holder with a backend of its own, checkpoints its own lease (256 bytes) in a
loop meanwhile: the longest of its checkpoints is what a sweep costs a worker (issue 25: under
500 ms with 200,000 retired rows).

Each (method, updated_at index present / dropped) runs ``--runs`` times (default 5), the order
alternating, on a freshly filled and vacuumed table. Reported per combination, as medians over
the runs: the longest and the 99th percentile acquire latency, the total sweep time, the number
of statements and the longest single statement (the bound on how long a batch holds its
locks). Results go to ``--output`` (default ``benchmarks/results/``: ``sweep.md``,
``sweep.json``; every acquire's latency too with ``--samples``). The script only reports; it
never fails on a number.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from worklease import ExitMode, LeaseHeldError, PostgresBackend
from worklease._pg import LEGACY_INDEX, TABLE, Rows, Statements

RESULTS = Path(__file__).resolve().parent / "results"
LOCAL_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"
RETENTION = 60.0
OLD_SWEEP = """DELETE FROM {table}
WHERE updated_at < now() - %(retention)s
  AND expires_at < now()
  AND (exit_mode = 'retired' OR (%(include_expired)s AND exit_mode IS NULL))"""
"""The sweep statement before issue 24, for comparison."""


NAMES = {"none": "no sweep (baseline)", "single": "single DELETE", "batched": "batched"}


@dataclass
class Run:
    method: str
    index: str
    sweep_s: float
    deleted: int
    statements: int
    longest_statement_ms: float
    acquires_ms: list[float] = field(default_factory=list)
    checkpoints_ms: list[float] = field(default_factory=list)

    def checkpoint_max(self) -> float:
        return max(self.checkpoints_ms, default=0.0)

    def acquire_max(self) -> float:
        return max(self.acquires_ms, default=0.0)

    def acquire_p99(self) -> float:
        ordered = sorted(self.acquires_ms)
        if not ordered:
            return 0.0
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def work_id(n: int) -> str:
    return f"w-{n:07d}"


def sweepable_from(g: int, rows: int, total: int) -> int:
    """The number of the first sweepable row at or after row ``g`` (see :func:`fill`)."""
    k = -(-g * rows // total)  # ceil: the k-th sweepable row is the first at or after g
    return min(-(-k * total // rows), total)


def fill(
    conn: psycopg.Connection[Any], schema: str, rows: int, unsweepable: int, state_bytes: int
) -> None:
    """``rows`` sweepable rows and ``unsweepable`` FINISHED ones, interleaved in work_id order
    (row g of ``total`` is sweepable when ``g * rows // total`` steps up at g), each with a
    checkpoint of ``state_bytes`` (none: 0)."""
    table = sql.Identifier(schema, TABLE)
    conn.execute(sql.SQL("TRUNCATE {}").format(table))
    total = rows + unsweepable
    conn.execute(
        sql.SQL(
            """INSERT INTO {} (work_id, holder_id, expires_at, exit_mode, updated_at, checkpoint)
SELECT 'w-' || lpad(g::text, 7, '0'), 'bench-holder', now() - interval '1 hour',
       CASE WHEN (g::bigint * %s) / %s = ((g::bigint - 1) * %s) / %s
            THEN 'finished' ELSE 'retired' END,
       now() - interval '1 hour',
       CASE WHEN %s > 0 THEN decode(repeat('ab', %s), 'hex') END
FROM generate_series(1, %s) AS g"""
        ).format(table),
        (rows, total, rows, total, state_bytes, state_bytes, total),
    )
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))


def set_index(conn: psycopg.Connection[Any], schema: str, present: bool) -> None:
    index = sql.Identifier(schema, LEGACY_INDEX)
    if present:
        conn.execute(
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (updated_at)").format(
                sql.Identifier(LEGACY_INDEX), sql.Identifier(schema, TABLE)
            )
        )
    else:
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(index))


class Acquirer(threading.Thread):
    """Acquires work IDs ``pick()`` names, one after the other, timing each, until stopped."""

    def __init__(self, backend: PostgresBackend, pick: Any) -> None:
        super().__init__(daemon=True)
        self.backend = backend
        self.pick = pick
        self.go = threading.Event()
        self.stop = threading.Event()
        self.samples: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.go.wait()
            while not self.stop.is_set():  # checked before each acquire starts
                target = self.pick()
                started = time.perf_counter()
                try:
                    self.backend.acquire(target, "bench-acquirer", 60.0)
                except LeaseHeldError:
                    pass  # taken by an earlier pick: a fast answer all the same
                # every acquire started before the sweep ended counts (the one it blocked, too)
                self.samples.append((time.perf_counter() - started) * 1000)
        except BaseException as exc:  # reported by the main thread
            self.error = exc


HOLDER_WORK_ID = "w-holder"
"""The live holder's work ID: it sorts after the swept rows ('w-0...'), so the last batch reads
it; held, it is never sweepable."""


class Holder(threading.Thread):
    """A live holder beside the sweep: checkpoints its own lease (256 bytes) in a loop, timing
    each, until stopped."""

    def __init__(self, backend: PostgresBackend, state_bytes: int) -> None:
        super().__init__(daemon=True)
        self.backend = backend
        self.state = os.urandom(state_bytes)
        self.go = threading.Event()
        self.stop = threading.Event()
        self.samples: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            token = self.backend.acquire(HOLDER_WORK_ID, "bench-holder-live", 60.0)
            self.go.wait()
            while not self.stop.is_set():
                started = time.perf_counter()
                self.backend.checkpoint(token, self.state, 60.0)
                self.samples.append((time.perf_counter() - started) * 1000)
            self.backend.release(token, ExitMode.FINISHED)
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def one_run(
    method: str,
    index_present: bool,
    args: argparse.Namespace,
    schema: str,
    admin: psycopg.Connection[Any],
    sweeper: PostgresBackend,
    acquirer_backend: PostgresBackend,
    holder_backend: PostgresBackend,
) -> Run:
    set_index(admin, schema, index_present)
    fill(admin, schema, args.rows, args.unsweepable, args.state_bytes)
    total = args.rows + args.unsweepable
    rng = random.Random(args.seed)
    frontier = [0]  # the row number the sweep reached (batched), 0 for the single DELETE
    batch = Statements.sweep_batch
    statement_times: list[float] = []

    def pick() -> str:
        low, high = 1, total
        if method == "batched":
            low = min(frontier[0] + 1, total)
            high = min(low + 2 * batch, total)
        return work_id(sweepable_from(rng.randint(low, high), args.rows, total))

    acquirer = Acquirer(acquirer_backend, pick)
    acquirer.start()
    holder = Holder(holder_backend, 256)
    holder.start()
    params: dict[str, Any] = {"retention": timedelta(seconds=RETENTION), "include_expired": False}
    started = time.perf_counter()
    acquirer.go.set()
    holder.go.set()
    if method == "none":  # the baseline: acquires while nothing sweeps
        time.sleep(args.baseline)
        deleted = 0
    elif method == "single":
        statement = sql.SQL(OLD_SWEEP).format(table=sql.Identifier(schema, TABLE))
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            t = time.perf_counter()
            deleted = conn.execute(statement, params).rowcount
            statement_times.append(time.perf_counter() - t)
    else:
        statements = sweeper._statements
        last = [time.perf_counter()]

        def swept(rows: Rows) -> tuple[int, str | None]:
            now = time.perf_counter()
            statement_times.append(now - last[0])
            last[0] = now
            count, after = Statements.swept(rows)
            if after is not None:
                frontier[0] = int(after[2:])
            return count, after

        statements.swept = swept  # type: ignore[method-assign]
        last[0] = time.perf_counter()
        try:
            deleted = sweeper.sweep(RETENTION, False)
        finally:
            del statements.swept
    sweep_s = 0.0 if method == "none" else time.perf_counter() - started
    acquirer.stop.set()
    holder.stop.set()
    acquirer.join(60)
    holder.join(60)
    if acquirer.error is not None:
        raise acquirer.error
    if holder.error is not None:
        raise holder.error
    admin.execute(
        sql.SQL("DELETE FROM {} WHERE work_id = %s").format(sql.Identifier(schema, TABLE)),
        (HOLDER_WORK_ID,),
    )
    return Run(
        method,
        "present" if index_present else "dropped",
        sweep_s,
        deleted,
        len(statement_times),
        max(statement_times, default=0.0) * 1000,
        acquirer.samples,
        holder.samples,
    )


def run_record(run: Run, *, samples: bool) -> dict[str, Any]:
    """One run for the JSON file: its figures, and every acquire's latency with ``samples``."""
    record = asdict(run)
    del record["acquires_ms"], record["checkpoints_ms"]
    record.update(
        acquires=len(run.acquires_ms),
        acquire_max_ms=run.acquire_max(),
        acquire_p99_ms=run.acquire_p99(),
        holder_checkpoints=len(run.checkpoints_ms),
        holder_checkpoint_max_ms=run.checkpoint_max(),
    )
    if samples:
        record["acquires_ms"] = run.acquires_ms
    return record


def summary(runs: list[Run]) -> list[dict[str, Any]]:
    rows = []
    for method in ("none", "single", "batched"):
        for index in ("present", "dropped"):
            chosen = [r for r in runs if r.method == method and r.index == index]
            if not chosen:
                continue
            rows.append(
                {
                    "method": NAMES[method],
                    "updated_at index": index,
                    "runs": len(chosen),
                    "acquires per run": statistics.median(len(r.acquires_ms) for r in chosen),
                    "acquire max ms": statistics.median(r.acquire_max() for r in chosen),
                    "acquire p99 ms": statistics.median(r.acquire_p99() for r in chosen),
                    "sweep total ms": statistics.median(r.sweep_s * 1000 for r in chosen),
                    "statements": statistics.median(r.statements for r in chosen),
                    "longest statement ms": statistics.median(
                        r.longest_statement_ms for r in chosen
                    ),
                    "deleted": statistics.median(r.deleted for r in chosen),
                    "holder checkpoints": statistics.median(len(r.checkpoints_ms) for r in chosen),
                    "holder checkpoint max ms": max(r.checkpoint_max() for r in chosen),
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    keys = list(rows[0])
    lines = [header, "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("WORKLEASE_TEST_DSN") or LOCAL_DSN)
    parser.add_argument("--rows", type=int, default=100_000, help="sweepable rows")
    parser.add_argument("--unsweepable", type=int, default=0, help="FINISHED rows among them")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=None, help="Statements.sweep_batch")
    parser.add_argument("--skip-single", action="store_true", help="the batched sweep only")
    parser.add_argument("--state-bytes", type=int, default=0, help="checkpoint per row")
    parser.add_argument(
        "--baseline", type=float, default=0.3, help="seconds of acquires without a sweep"
    )
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--samples", action="store_true", help="every acquire in the JSON")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.batch is not None:
        Statements.sweep_batch = args.batch
    schema = f"worklease_bench_sweep_{uuid.uuid4().hex[:8]}"
    methods = ["batched"] if args.skip_single else ["single", "batched"]
    runs: list[Run] = []
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        server = admin.execute("SHOW server_version").fetchone()
        PostgresBackend.apply_schema(admin, schema=schema)
        try:
            with (
                ConnectionPool(args.dsn, min_size=1, max_size=2, open=True) as sweep_pool,
                ConnectionPool(args.dsn, min_size=1, max_size=2, open=True) as acquire_pool,
                ConnectionPool(args.dsn, min_size=1, max_size=2, open=True) as holder_pool,
                PostgresBackend(sweep_pool, schema=schema, listen=False) as sweeper,
                PostgresBackend(acquire_pool, schema=schema, listen=False) as acquirer,
                PostgresBackend(holder_pool, schema=schema, listen=False) as holder,
            ):
                for n in range(args.runs):
                    order = methods if n % 2 == 0 else methods[::-1]
                    for index_present in (True, False):
                        for method in ["none", *order] if index_present else order:
                            run = one_run(
                                method,
                                index_present,
                                args,
                                schema,
                                admin,
                                sweeper,
                                acquirer,
                                holder,
                            )
                            runs.append(run)
                            print(
                                f"run {n + 1} {method:7} index {run.index:7}: "
                                f"sweep {run.sweep_s * 1000:7.0f} ms, {run.statements:4} "
                                f"statement(s), longest {run.longest_statement_ms:6.1f} ms; "
                                f"{len(run.acquires_ms):4} acquires, max "
                                f"{run.acquire_max():6.1f} ms, p99 {run.acquire_p99():6.1f} ms",
                                file=sys.stderr,
                            )
        finally:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    rows = summary(runs)
    header = (
        f"# Sweep vs a concurrent acquire and a live holder ({args.rows:,} sweepable rows"
        + (f" among {args.unsweepable:,} FINISHED" if args.unsweepable else "")
        + (f", {args.state_bytes}-byte checkpoints" if args.state_bytes else "")
        + f", batch {Statements.sweep_batch}, medians of {args.runs} runs)"
    )
    table = markdown(rows, header)
    print(table)
    args.output.mkdir(parents=True, exist_ok=True)
    suffix = f"_{args.unsweepable}" if args.unsweepable else ""
    suffix += f"_state{args.state_bytes}" if args.state_bytes else ""
    (args.output / f"sweep{suffix}.md").write_text(table, encoding="utf-8")
    environment = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_at_end": list(os.getloadavg()),
        "postgresql": server[0] if server else "?",
        "batch": Statements.sweep_batch,
        "rows": args.rows,
        "unsweepable": args.unsweepable,
        "state_bytes": args.state_bytes,
    }
    document = {
        "environment": environment,
        "summary": rows,
        "runs": [run_record(r, samples=args.samples) for r in runs],
    }
    (args.output / f"sweep{suffix}.json").write_text(
        json.dumps(document, indent=2) + "\n", encoding="utf-8"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
