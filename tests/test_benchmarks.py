"""Smoke tests of the benchmark scripts: each runs with tiny settings and writes every row of its
tables (numbers unchecked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import pg

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_ops.py"
OPERATIONS = [
    "acquire",
    "read_checkpoint",
    "checkpoint",
    "renew",
    "release",
    "acquire+release",
    "runner cycle",
]
PALS = "acquire+release vs pals"


@pytest.mark.postgres
def test_bench_ops_writes_every_row(postgres_dsn: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--dsn",
            postgres_dsn,
            "--iterations",
            "20",
            "--warmup",
            "2",
            "--block",
            "5",
            "--skip-chart",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert not (tmp_path / "ops.png").exists()

    table = (tmp_path / "ops.md").read_text(encoding="utf-8")
    for flavour in ("sync", "async"):
        for operation in [*OPERATIONS, PALS]:
            assert f"| {operation} | {flavour} |" in table, (operation, flavour)
    assert "## In-memory backend" in table
    # The comparison (what the guide includes) above the marker, the verdicts below it.
    comparison, verdicts = table.split("<!-- targets -->")
    assert "| FAIL" not in comparison
    assert "| pass |" not in comparison
    assert "| target | result |" in verdicts
    for flavour in ("sync", "async"):
        for operation in [*OPERATIONS, PALS]:
            assert f"| {operation} | {flavour} |" in verdicts, (operation, flavour)

    data = json.loads((tmp_path / "ops.json").read_text(encoding="utf-8"))
    rows = {(row["operation"], row["flavour"]): row for row in data["comparisons"]}
    assert set(rows) == {(op, f) for op in [*OPERATIONS, PALS] for f in ("sync", "async")}
    for operation in OPERATIONS:
        for flavour in ("sync", "async"):
            row = rows[operation, flavour]
            sides = ("worklease", "simple_mode", "floor", "same_text")
            assert len({row[side]["n"] for side in sides}) == 1, row
            assert row["floor"]["n"] > 0
            assert row["ratio"] is not None
            assert row["simple_mode_ratio"] is not None
            assert isinstance(row["passed"], bool)
    for flavour in ("sync", "async"):  # pals is optional: numbers or the reason why not
        pals_row = rows[PALS, flavour]
        assert pals_row["ratio"] is not None or "pals" in pals_row["note"]
        assert pals_row["target"] is None
        assert pals_row["passed"] is None
    memory = {(m["operation"], m["flavour"]) for m in data["memory"]}
    assert memory == {(op, f) for op in OPERATIONS for f in ("sync", "async")}
    assert set(data["statements_per_runner_cycle"]) == {"sync", "async"}

    # The benchmark's own database is gone.
    database = data["environment"]["database"]
    assert database.startswith("worklease_bench_")
    left = pg.execute(postgres_dsn, "SELECT 1 FROM pg_database WHERE datname = %s", (database,))
    assert left == []


SCALE_SCRIPT = SCRIPT.with_name("bench_scale.py")
SCALE_ROWS = [
    "| coverage: processes started → all 200 work IDs held |",
    "| steady state: statements/s in total (pg_stat_database) |",
    "| steady state: statements/s in total (pg_stat_statements) |",
    "| work IDs held by the killed process |",
    "| failover: kill -9 → all held again by the survivors |",
]


@pytest.mark.postgres
@pytest.mark.slow
def test_bench_scale_writes_every_row(postgres_dsn: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(SCALE_SCRIPT),
            "--dsn",
            postgres_dsn,
            "--work-ids",
            "200",
            "--processes",
            "2",
            "--window",
            "2",
            "--ttl",
            "2",
            "--skip-old",
            "--skip-chart",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert not (tmp_path / "scale.png").exists()

    table = (tmp_path / "scale.md").read_text(encoding="utf-8")
    for row in SCALE_ROWS:
        assert row in table, row

    data = json.loads((tmp_path / "scale.json").read_text(encoding="utf-8"))
    new, old = data["sides"]["new"], data["sides"]["old"]
    assert old["measured"] is False
    assert old["note"] == "skipped (--skip-old)"
    assert new["measured"] is True, new.get("note")
    # Liveness, not timing: two pools cover 200 work IDs within the 60 s bound, and the
    # survivor takes over the killed process's work IDs within TTL + 20 s.
    assert new["coverage"]["covered"] is True
    assert new["failover"]["recovered"] is True
    assert new["failover"]["victim_held"] > 0
    assert isinstance(new["steady"]["statements_per_s"], float)
    assert set(new["held_before_kill"]) == {"proc-0", "proc-1"}
    assert len(new["timeline"]["t"]) == len(new["timeline"]["held"]) > 0

    # The benchmark's own database is gone.
    database = new["database"]
    assert database.startswith("worklease_bench_scale_")
    left = pg.execute(postgres_dsn, "SELECT 1 FROM pg_database WHERE datname = %s", (database,))
    assert left == []


HANDOFF_SCRIPT = SCRIPT.with_name("bench_handoff.py")


@pytest.mark.postgres
def test_bench_handoff_writes_every_row(postgres_dsn: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(HANDOFF_SCRIPT),
            "--dsn",
            postgres_dsn,
            "--rounds",
            "3",
            "--crash-rounds",
            "1",
            "--ttl",
            "0.5",
            "--skip-chart",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=HANDOFF_SCRIPT.parent,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    table = (tmp_path / "handoff.md").read_text(encoding="utf-8")
    for flavour in ("sync", "async"):
        assert f"| release → successor acquired | {flavour} |" in table
        assert f"| crash → successor acquired, over the TTL (0.5 s) | {flavour} |" in table
    data = json.loads((tmp_path / "handoff.json").read_text(encoding="utf-8"))
    counts = {(s["scenario"], s["flavour"]): len(s["samples_ms"]) for s in data["series"]}
    assert counts == {
        ("release", "sync"): 3,
        ("release", "async"): 3,
        ("crash", "sync"): 1,
        ("crash", "async"): 1,
    }
    database = data["environment"]["database"]
    left = pg.execute(postgres_dsn, "SELECT 1 FROM pg_database WHERE datname = %s", (database,))
    assert left == []


ACQUIRE_SCRIPT = SCRIPT.with_name("bench_acquire_statement.py")


@pytest.mark.postgres
def test_bench_acquire_statement_writes_every_side(postgres_dsn: str, tmp_path: Path) -> None:
    """Both designs of the acquire statement grant (the script checks every grant and the
    release after it) and every side gets its row."""
    result = subprocess.run(
        [
            sys.executable,
            str(ACQUIRE_SCRIPT),
            "--dsn",
            postgres_dsn,
            "--iterations",
            "8",
            "--block",
            "2",
            "--warmup",
            "6",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ACQUIRE_SCRIPT.parent,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    table = (tmp_path / "acquire_statement.md").read_text(encoding="utf-8")
    sides = ("same effect", "CTE + holder branch", "flat upsert", "Lease.acquire")
    for side in sides:
        assert f"| {side} |" in table
    data = json.loads((tmp_path / "acquire_statement.json").read_text(encoding="utf-8"))
    assert [(row["side"], row["n"]) for row in data["rows"]] == [(side, 8) for side in sides]
    database = data["environment"]["database"]
    left = pg.execute(postgres_dsn, "SELECT 1 FROM pg_database WHERE datname = %s", (database,))
    assert left == []


TX_SCRIPT = SCRIPT.with_name("bench_transaction.py")


@pytest.mark.postgres
def test_bench_transaction_writes_both_flavours(postgres_server: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(TX_SCRIPT),
            "--dsn",
            postgres_server,
            "--iterations",
            "20",
            "--warmup",
            "2",
            "--block",
            "5",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    table = (tmp_path / "transaction.md").read_text(encoding="utf-8")
    assert "| sync |" in table
    assert "| async |" in table
    data = json.loads((tmp_path / "transaction.json").read_text(encoding="utf-8"))
    for flavour in ("sync", "async"):
        row = data["results"][flavour]
        assert row["ours"]["n"] == row["floor"]["n"] == 20
        assert row["ratio"] > 0


CONCURRENCY_SCRIPT = SCRIPT.with_name("bench_concurrency.py")


@pytest.mark.postgres
def test_bench_concurrency_writes_every_row(postgres_dsn: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(CONCURRENCY_SCRIPT),
            "--dsn",
            postgres_dsn,
            "--seconds",
            "0.2",
            "--concurrency",
            "1",
            "4",
            "--skip-chart",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    table = (tmp_path / "concurrency.md").read_text(encoding="utf-8")
    for flavour in ("sync", "async"):
        for concurrency in (1, 4):
            assert f"| {flavour} | {concurrency} |" in table, (flavour, concurrency)
    data = json.loads((tmp_path / "concurrency.json").read_text(encoding="utf-8"))
    runs = {(r["flavour"], r["concurrency"], r["side"]): r for r in data["runs"]}
    assert set(runs) == {
        (f, c, s)
        for f in ("sync", "async")
        for c in (1, 4)
        for s in ("worklease", "two_rounds", "no_group", "hand")
    }
    for run in runs.values():
        assert run["calls"] > 0
        assert run["latency"]["n"] == run["calls"]
    database = data["environment"]["database"]
    left = pg.execute(postgres_dsn, "SELECT 1 FROM pg_database WHERE datname = %s", (database,))
    assert left == []


REDIS_SCRIPT = SCRIPT.with_name("bench_redis.py")
REDIS_OPERATIONS = ["acquire", "checkpoint", "renew", "release", "acquire+release"]


@pytest.mark.redis
@pytest.mark.usefixtures("redis_server")  # skips (or fails under CI=true) without redis-server
def test_bench_redis_writes_every_row(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(REDIS_SCRIPT),
            "--iterations",
            "10",
            "--warmup",
            "2",
            "--block",
            "5",
            "--handoffs",
            "2",
            "--seconds",
            "0.2",
            "--leases",
            "20",
            "--processes",
            "2",
            "--work-ids",
            "10",
            "--rounds",
            "1",
            "--server-calls",
            "5",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    table = (tmp_path / "redis.md").read_text(encoding="utf-8")
    for flavour in ("sync", "async"):
        for operation in REDIS_OPERATIONS:
            assert f"| {flavour} | {operation} |" in table, (flavour, operation)
        assert f"| {flavour} | acquire+release vs redis-py Lock |" in table, flavour
    for setup in ("standalone", "Cluster of 1 master", "Cluster of 3 masters"):
        assert f"| {setup} |" in table, setup
    assert "## Targets" in table

    data = json.loads((tmp_path / "redis.json").read_text(encoding="utf-8"))
    rows = {(row["flavour"], row["operation"]): row for row in data["rows"]}
    assert set(rows) == {
        (flavour, operation)
        for flavour in ("sync", "async")
        for operation in [*REDIS_OPERATIONS, "acquire+release vs redis-py Lock"]
    }
    for (_, operation), row in rows.items():
        sides = row["sides"].values()
        assert {side["n"] for side in sides} == {10}, row
        assert row["lease_ratio"] > 0
        assert (row["target"] is None) == (operation == "acquire+release vs redis-py Lock")
    for flavour in ("sync", "async"):
        handoff = data["handoff"][flavour]
        assert handoff["n"] == 2, handoff
        assert handoff["errors"] == []
    renewals = data["renewals"]["sides"]
    assert len(renewals) == 3
    assert all(side["renewals"] > 0 for side in renewals.values())
    assert sum(data["renewals"]["lost"].values()) == 0
    summary = data["scaling"]["summary"]
    assert set(summary) == {"standalone", "Cluster of 1 master", "Cluster of 3 masters"}
    assert all(row["cycles_per_s"] > 0 and row["failed"] == 0 for row in summary.values())
    assert len(summary["Cluster of 3 masters"]["per_node_cores"]) == 3
    assert isinstance(data["scaling"]["cluster_target_met"], bool)
    assert set(data["server_times"]) == {"worklease", "hand-written", "redis-py Lock"}


CAPACITY_SCRIPT = SCRIPT.with_name("bench_redis_capacity.py")


@pytest.mark.redis
@pytest.mark.usefixtures("redis_server")  # skips (or fails under CI=true) without redis-server
def test_bench_redis_capacity_writes_both_clusters(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(CAPACITY_SCRIPT), "--calls", "2000", "--rounds", "2",
         "--clients", "4", "--pipeline", "2", "--threads", "1", "--output", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    table = (tmp_path / "redis_capacity.md").read_text(encoding="utf-8")
    assert "| 1 |" in table
    assert "| 3 |" in table
    assert "3 masters / 1 master:" in table
    data = json.loads((tmp_path / "redis_capacity.json").read_text(encoding="utf-8"))
    rounds = data["rounds"]
    assert sorted(r["masters"] for r in rounds) == [1, 1, 3, 3]
    for entry in rounds:
        assert entry["calls"] == 2000
        assert entry["seconds"] > 0
        assert len(entry["server_cpu"]) == entry["masters"]
        assert sum(entry["server_cpu"]) > 0  # the servers ran the script
