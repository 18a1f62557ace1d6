"""Smoke test of benchmarks/bench_ops.py: it runs and writes its tables (numbers unchecked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import pg

pytestmark = pytest.mark.postgres

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_ops.py"
OPERATIONS = ["acquire", "read_checkpoint", "checkpoint", "renew", "release", "runner cycle"]
PALS = "acquire+release vs pals"


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

    data = json.loads((tmp_path / "ops.json").read_text(encoding="utf-8"))
    rows = {(row["operation"], row["flavour"]): row for row in data["comparisons"]}
    assert set(rows) == {(op, f) for op in [*OPERATIONS, PALS] for f in ("sync", "async")}
    for operation in OPERATIONS:
        for flavour in ("sync", "async"):
            row = rows[operation, flavour]
            assert row["worklease"]["n"] == row["floor"]["n"] > 0
            assert row["ratio"] is not None
            assert isinstance(row["passed"], bool)
    for flavour in ("sync", "async"):  # pals is optional: numbers or the reason why not
        pals_row = rows[PALS, flavour]
        assert pals_row["ratio"] is not None or "pals" in pals_row["note"]
    memory = {(m["operation"], m["flavour"]) for m in data["memory"]}
    assert memory == {(op, f) for op in OPERATIONS for f in ("sync", "async")}
    assert set(data["statements_per_runner_cycle"]) == {"sync", "async"}

    # The benchmark's own database is gone.
    database = data["environment"]["database"]
    assert database.startswith("worklease_bench_")
    left = pg.execute(postgres_dsn, "SELECT 1 FROM pg_database WHERE datname = %s", (database,))
    assert left == []
