"""Transactional step vs the same two statements in a hand-written transaction (issue 14).

One step = one user INSERT + the checkpoint, committed together. ``worklease`` runs it as
``lease.transaction(token)`` (explicit READ COMMITTED transaction, the guard UPDATE before
COMMIT, simple protocol); the floor is what a user would write by hand with psycopg's
defaults on a connection of the same pool: ``with conn.transaction():`` the INSERT and a
fenced checkpoint UPDATE. Both run in alternating blocks in the same process against the
same server, sync and asyncio; a DBOS ``@DBOS.transaction`` step is measured too when the
``dbos`` package is installed (reported otherwise as not installed).

    python benchmarks/bench_transaction.py [--dsn DSN] [--iterations 2000] [--output DIR]

Writes ``transaction.md`` and ``transaction.json`` under ``benchmarks/results`` (or
``--output``). Medians and p99 in microseconds; the ratio is ours / floor (median).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import statistics
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from time import perf_counter_ns
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import pg
from worklease import AsyncLease, AsyncPostgresBackend, Lease, PostgresBackend

TARGETS_MARK = "<!-- targets -->"
"""Below it the targets and verdicts (the performance guide includes what is above it)."""
TARGET = 1.15
STATE = b"x" * 64
TTL = 30.0
INSERT = b"INSERT INTO bench_effects (work_id, fencing_token, n) VALUES (%s, %s, %s)"
# The fenced checkpoint a careful user writes by hand (same conditions as the library's).
GUARD = (
    b"UPDATE worklease_leases SET checkpoint = %s, expires_at = now() + %s, updated_at = now() "
    b"WHERE work_id = %s AND holder_id = %s AND fencing_token = %s AND exit_mode IS NULL "
    b"AND expires_at > now()"
)


def summary(samples: list[int]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"median_us": statistics.median(ordered) / 1000, "p99_us": p99 / 1000, "n": len(ordered)}


def paired(
    ours: Callable[[], None], floor: Callable[[], None], n: int, block: int
) -> tuple[list[int], list[int]]:
    a: list[int] = []
    b: list[int] = []
    for start in range(0, n, block):
        order = [(ours, a), (floor, b)] if (start // block) % 2 == 0 else [(floor, b), (ours, a)]
        for fn, into in order:
            for _ in range(min(block, n - start)):
                t = perf_counter_ns()
                fn()
                into.append(perf_counter_ns() - t)
    return a, b


async def apaired(
    ours: Callable[[], Awaitable[None]], floor: Callable[[], Awaitable[None]], n: int, block: int
) -> tuple[list[int], list[int]]:
    a: list[int] = []
    b: list[int] = []
    for start in range(0, n, block):
        order = [(ours, a), (floor, b)] if (start // block) % 2 == 0 else [(floor, b), (ours, a)]
        for fn, into in order:
            for _ in range(min(block, n - start)):
                t = perf_counter_ns()
                await fn()
                into.append(perf_counter_ns() - t)
    return a, b


def bench_sync(dsn: str, n: int, warmup: int, block: int) -> dict[str, Any]:
    with ConnectionPool(dsn, min_size=2, max_size=4, open=True) as pool:
        backend = PostgresBackend(pool, listen=False)
        lease = Lease(backend, holder_id="bench", ttl=TTL)
        ours_token = lease.acquire("tx-ours-sync")
        floor_token = lease.acquire("tx-floor-sync")
        counter = iter(range(10**9))

        def ours() -> None:
            with lease.transaction(ours_token) as tx:
                tx.connection.execute(
                    INSERT, ("tx-ours-sync", ours_token.fencing_token, next(counter))
                )
                tx.checkpoint(STATE)

        def floor() -> None:
            with pool.connection() as conn, conn.transaction():
                conn.execute(INSERT, ("tx-floor-sync", floor_token.fencing_token, next(counter)))
                cursor = conn.execute(
                    GUARD,
                    (
                        STATE,
                        timedelta(seconds=TTL),
                        "tx-floor-sync",
                        "bench",
                        floor_token.fencing_token,
                    ),
                )
                if cursor.rowcount != 1:
                    raise RuntimeError("the hand-written step was not fenced through")

        paired(ours, floor, warmup, block)
        a, b = paired(ours, floor, n, block)
        backend.close()
    return {"ours": summary(a), "floor": summary(b)}


async def bench_async(dsn: str, n: int, warmup: int, block: int) -> dict[str, Any]:
    async with AsyncConnectionPool(dsn, min_size=2, max_size=4, open=False) as pool:
        backend = AsyncPostgresBackend(pool, listen=False)
        lease = AsyncLease(backend, holder_id="bench", ttl=TTL)
        ours_token = await lease.acquire("tx-ours-async")
        floor_token = await lease.acquire("tx-floor-async")
        counter = iter(range(10**9))

        async def ours() -> None:
            async with lease.transaction(ours_token) as tx:
                await tx.connection.execute(
                    INSERT, ("tx-ours-async", ours_token.fencing_token, next(counter))
                )
                tx.checkpoint(STATE)

        async def floor() -> None:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute(
                    INSERT, ("tx-floor-async", floor_token.fencing_token, next(counter))
                )
                cursor = await conn.execute(
                    GUARD,
                    (
                        STATE,
                        timedelta(seconds=TTL),
                        "tx-floor-async",
                        "bench",
                        floor_token.fencing_token,
                    ),
                )
                if cursor.rowcount != 1:
                    raise RuntimeError("the hand-written step was not fenced through")

        await apaired(ours, floor, warmup, block)
        a, b = await apaired(ours, floor, n, block)
        await backend.close()
    return {"ours": summary(a), "floor": summary(b)}


def bench_dbos(dsn: str, n: int, warmup: int, block: int) -> dict[str, Any]:
    """Ours against a DBOS datasource transaction (``@ds.transaction()``, its successor of
    ``@DBOS.transaction``), both called from one DBOS workflow in alternating blocks: the
    same INSERT, committed together with DBOS's own record of the step."""
    import sqlalchemy as sa  # type: ignore[import-not-found,unused-ignore]
    from dbos import DBOS, SQLAlchemyDatasource  # type: ignore[import-not-found,unused-ignore]

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    url = (
        f"postgresql+psycopg://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}"
        f":{params.get('port', 5432)}/{params['dbname']}"
    )
    DBOS(config={"name": "worklease-bench", "system_database_url": url, "log_level": "WARNING"})
    datasource = SQLAlchemyDatasource.create(url)
    counter = iter(range(10**9))

    @datasource.transaction()  # type: ignore[untyped-decorator,unused-ignore]
    def dbos_step(n: int) -> None:
        datasource.sql_session().execute(
            sa.text("INSERT INTO bench_effects VALUES ('tx-dbos', 0, :n)"), {"n": n}
        )

    with ConnectionPool(dsn, min_size=2, max_size=4, open=True) as pool:
        backend = PostgresBackend(pool, listen=False)
        lease = Lease(backend, holder_id="bench", ttl=TTL)
        token = lease.acquire("tx-ours-dbos")

        def ours() -> None:
            with lease.transaction(token) as tx:
                tx.connection.execute(INSERT, ("tx-ours-dbos", token.fencing_token, next(counter)))
                tx.checkpoint(STATE)

        def theirs() -> None:
            dbos_step(next(counter))

        @DBOS.workflow()  # type: ignore[untyped-decorator,unused-ignore]
        def run(count: int) -> tuple[list[int], list[int]]:
            return paired(ours, theirs, count, block)

        DBOS.launch()
        try:
            run(warmup)
            a, b = run(n)
        finally:
            backend.close()
            DBOS.destroy()
    return {"ours": summary(a), "dbos": summary(b)}


def environment(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        version = conn.execute(b"SELECT version()").fetchone()
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "server": version[0] if version else "?",
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
        "dbos": "installed" if importlib.util.find_spec("dbos") else "not installed",
    }


def render(results: dict[str, Any], env: dict[str, Any], n: int) -> str:
    lines = [
        "# Transactional step: worklease vs a hand-written transaction",
        "",
        f"Run {env['when']}: {env['server'].split(' on ')[0]}, Python {env['python']}, "
        f"psycopg {env['psycopg']}, {env['cpus']} CPUs (client and server on one machine), "
        f"load {env['load']:.2f}; {n} steps per side in alternating blocks; DBOS: {env['dbos']}.",
        "",
        "One step: one user INSERT + the checkpoint in one transaction. Floor: the same INSERT "
        "and a fenced checkpoint UPDATE in `with conn.transaction():` with psycopg's defaults.",
        "",
        "| flavour | worklease median / p99 (µs) | hand-written median / p99 (µs) | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    verdicts = [
        "",
        TARGETS_MARK,
        "",
        f"Target: ratio ≤ {TARGET}.",
        "",
        "| flavour | ratio | target |",
        "| --- | ---: | --- |",
    ]
    for flavour, result in results.items():
        if flavour == "dbos":
            continue
        ours, floor = result["ours"], result["floor"]
        ratio = ours["median_us"] / floor["median_us"]
        result["ratio"] = ratio
        verdict = "pass" if ratio <= TARGET else "FAIL"
        lines.append(
            f"| {flavour} | {ours['median_us']:.0f} / {ours['p99_us']:.0f} | "
            f"{floor['median_us']:.0f} / {floor['p99_us']:.0f} | {ratio:.2f} |"
        )
        verdicts.append(f"| {flavour} | {ratio:.2f} | ≤ {TARGET}: {verdict} |")
    dbos = results.pop("dbos", None)
    if dbos is None:
        lines += ["", "DBOS: not measured (the `dbos` package is not installed)."]
    else:
        ratio = dbos["ours"]["median_us"] / dbos["dbos"]["median_us"]
        dbos["ratio"] = ratio
        results["dbos"] = dbos
        lines += [
            "",
            "Against DBOS (a datasource `@transaction` step inside a workflow, which also "
            "records the step; sync flavour, alternating blocks in one workflow):",
            "",
            "| worklease median / p99 (µs) | DBOS median / p99 (µs) | ratio (worklease / DBOS) |",
            "| ---: | ---: | ---: |",
            f"| {dbos['ours']['median_us']:.0f} / {dbos['ours']['p99_us']:.0f} | "
            f"{dbos['dbos']['median_us']:.0f} / {dbos['dbos']['p99_us']:.0f} | {ratio:.2f} |",
        ]

    return "\n".join(lines + verdicts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", help="a server to create the benchmark database on")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    server = args.dsn or pg.LOCAL_DSN
    with pg.fresh_database(server) as dsn:
        pg.execute(dsn, "CREATE TABLE bench_effects (work_id TEXT, fencing_token BIGINT, n BIGINT)")
        env = environment(dsn)
        results = {
            "sync": bench_sync(dsn, args.iterations, args.warmup, args.block),
            "async": asyncio.run(bench_async(dsn, args.iterations, args.warmup, args.block)),
        }
        if env["dbos"] == "installed":
            results["dbos"] = bench_dbos(dsn, args.iterations, args.warmup, args.block)
    text = render(results, env, args.iterations)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "transaction.md").write_text(text, encoding="utf-8")
    (args.output / "transaction.json").write_text(
        json.dumps({"environment": env, "results": results}, indent=2) + "\n", encoding="utf-8"
    )
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
