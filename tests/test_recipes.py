"""The framework recipes under examples/recipes/, each run against this run's PostgreSQL
database as a user would run it, its story checked line by line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

RECIPES = Path(__file__).resolve().parent.parent / "examples" / "recipes"

pytestmark = pytest.mark.postgres

STORY: dict[str, tuple[str, ...]] = {
    "django_pool_command": (
        *(rf"report-[0-9a-f]{{8}}-{n}: step {step} of 3" for n in range(4) for step in (1, 2, 3)),
        "all 4 partitions retired; the pool stopped",
    ),
    "sqlalchemy_shared_pool": (
        r"resuming after id 0 \(previous exit: none\)",
        "copied up to id 4",
        r"resuming after id 4 \(previous exit: finished\)",
        "copied up to id 8",
        "copied up to id 10",
        r"target holds ids 1\.\.10, 10 rows, none twice",
        r"one pool served both: 4 connections at most",
    ),
    "fastapi_lifespan": (
        "leader elected: True",
        "tenants synced: 3 of 3",
        "after shutdown the leader stepped down: True",
    ),
    "celery_task_per_key": (
        r"report-[0-9a-f]{8}: step 2 done",
        "first run: StepFailed: step 3 failed",
        r"duplicate: report-[0-9a-f]{8}: not started, held by celery-other-worker",
        r"report-[0-9a-f]{8}: previous exit abandoned; resuming after step 2",
        r"second run: report-[0-9a-f]{8}: all 4 steps done",
    ),
}


def test_every_recipe_has_a_story() -> None:
    assert sorted(p.stem for p in RECIPES.glob("*.py")) == sorted(STORY)


@pytest.mark.parametrize("recipe", sorted(STORY))
def test_recipe_runs_on_postgres(recipe: str, postgres_dsn: str) -> None:
    env = {**os.environ, "WORKLEASE_DSN": postgres_dsn}
    result = subprocess.run(
        [sys.executable, str(RECIPES / f"{recipe}.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for pattern in STORY[recipe]:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, result.stdout)
    assert "Traceback" not in result.stderr, result.stderr
