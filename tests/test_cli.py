"""The command line, run as a real subprocess (``python -m worklease``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import pg
from worklease import schema_sql

QUICK_START = (
    'previous exit: none, saved state: ""\nprevious exit: finished, saved state: "step 1 done"\n'
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worklease", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_demo_prints_the_quick_start() -> None:
    result = run("demo")
    assert (result.returncode, result.stdout, result.stderr) == (0, QUICK_START, "")


def test_schema_prints_the_shipped_sql() -> None:
    result = run("schema")
    assert result.returncode == 0
    assert result.stdout == schema_sql()
    named = run("schema", "--schema", "team leases")
    assert named.returncode == 0
    assert 'CREATE TABLE IF NOT EXISTS "team leases".worklease_leases' in named.stdout


def test_bad_schema_name_is_one_line_and_status_1() -> None:
    result = run("schema", "--schema", "")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "schema must be" in result.stderr


def test_usage_errors_exit_2() -> None:
    assert run().returncode == 2
    assert run("no-such-command").returncode == 2


def test_help_for_every_command() -> None:
    for command in ("demo", "schema", "migrate"):
        result = run(command, "--help")
        assert result.returncode == 0
        assert "usage: worklease " + command in result.stdout


@pytest.mark.postgres
def test_migrate_is_idempotent_and_says_what_it_did(postgres_dsn: str) -> None:
    schema = "cli_migrate"
    try:
        first = run("migrate", "--dsn", postgres_dsn, "--schema", schema)
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith("created the worklease table")
        second = run("migrate", "--dsn", postgres_dsn, "--schema", schema)
        assert second.returncode == 0, second.stderr
        assert "already present" in second.stdout
        assert pg.execute(postgres_dsn, f"SELECT count(*) FROM {schema}.worklease_leases") == [(0,)]
    finally:
        pg.execute(postgres_dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_migrate_unreachable_database_is_one_line() -> None:
    result = run("migrate", "--dsn", "host=127.0.0.1 port=1 user=postgres connect_timeout=3")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("worklease migrate: migrate failed:")
    assert "Traceback" not in result.stderr
