"""worklease.contrib.django against PostgreSQL: a real Django project (``tests/django_project``)
run as ``python -m django`` subprocesses, as a team runs ``manage.py``: ``migrate`` creates
or upgrades the schema, ``check --database`` runs ``worklease check``, ``worklease_run`` runs
pools and leaders until SIGTERM and hands the work over, on Django's pool or a pool of its
own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import pg

pytest.importorskip("django")

ROOT = Path(__file__).resolve().parent.parent
V1_SCHEMA = Path(__file__).with_name("schema_history") / "v1.sql"
WORKERS = {
    "reports": "tests.django_project.workers.reports",
    "scheduler": "tests.django_project.workers.scheduler",
    "both": "tests.django_project.workers.both",
    "dying": "tests.django_project.workers.dying",
    "wrong": "tests.django_project.workers.wrong",
}

pytestmark = pytest.mark.postgres


def environment(dsn: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WL_TEST_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.django_project.settings",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        WL_TEST_DSN=dsn,
        WL_TEST_WORKLEASE=json.dumps({"WORKERS": WORKERS}),
    )
    env.update(extra)
    return env


def django(dsn: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=environment(dsn, **extra),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def schema_version(dsn: str, schema: str = "public") -> Any:
    rows = pg.execute(
        dsn,
        "SELECT obj_description(to_regclass(%s), 'pg_class')",
        (f"{schema}.worklease_leases",),
    )
    return rows[0][0]


class Running:
    """A ``worklease_run`` process whose output lines are collected as they come."""

    def __init__(self, dsn: str, *names: str, **extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "worklease_run", *names],
            env=environment(dsn, **extra),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None and not self._reader.is_alive():
                pytest.fail(f"exited {self.proc.returncode} before {text!r}:\n" + self.output())
            assert time.monotonic() < deadline, f"no {text!r} within {timeout}s:\n" + self.output()
            time.sleep(0.05)

    def finish(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return code

    def output(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def database(postgres_server: str) -> Iterator[str]:
    """A database migrated by ``manage.py migrate``, with a table the workers write to."""
    with pg.empty_database(postgres_server, "django") as dsn:
        result = django(dsn, "migrate", "--no-input")
        assert result.returncode == 0, result.stderr
        pg.execute(dsn, "CREATE TABLE steps_done (work_id text, step int, holder text)")
        yield dsn


def test_migrate_creates_the_schema_at_the_current_version(postgres_server: str) -> None:
    with pg.empty_database(postgres_server, "django") as dsn:
        result = django(dsn, "migrate", "--no-input")
        assert result.returncode == 0, result.stderr
        assert "Applying worklease.0001_schema... OK" in result.stdout
        assert schema_version(dsn) == "worklease schema version 4"
        shown = django(dsn, "showmigrations", "worklease")
        assert "[X] 0001_schema" in shown.stdout
        check = subprocess.run(
            [str(Path(sys.executable).with_name("worklease")), "migrate", "--check", "--dsn", dsn],
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr


def test_migrate_upgrades_a_first_release_table_and_keeps_its_rows(postgres_server: str) -> None:
    with pg.empty_database(postgres_server, "django") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(V1_SCHEMA.read_text(encoding="utf-8").encode())
            conn.execute(
                b"INSERT INTO worklease_leases (work_id, holder_id, expires_at, checkpoint)"
                b" VALUES ('kept', 'old', now(), 'state')"
            )
        result = django(dsn, "migrate", "--no-input")
        assert result.returncode == 0, result.stderr
        assert schema_version(dsn) == "worklease schema version 4"
        assert pg.execute(dsn, "SELECT work_id, checkpoint FROM worklease_leases") == [
            ("kept", b"state")
        ]
        indexes = pg.execute(
            dsn, "SELECT indexname FROM pg_indexes WHERE tablename = 'worklease_leases' ORDER BY 1"
        )
        assert indexes == [("idx_worklease_leases_members",), ("worklease_leases_pkey",)]


def test_migrate_honours_the_schema_setting(postgres_server: str) -> None:
    with pg.empty_database(postgres_server, "django") as dsn:
        setting = json.dumps({"SCHEMA": "leases", "WORKERS": WORKERS})
        result = django(dsn, "migrate", "--no-input", WL_TEST_WORKLEASE=setting)
        assert result.returncode == 0, result.stderr
        assert schema_version(dsn, "leases") == "worklease schema version 4"
        assert pg.execute(dsn, "SELECT to_regclass('public.worklease_leases')") == [(None,)]


def test_the_system_checks_read_the_schema_and_with_deploy_the_deployment(
    postgres_server: str, database: str
) -> None:
    good = django(database, "check", "--database", "default")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "worklease." not in good.stdout + good.stderr
    deploy = django(database, "check", "--deploy", "--database", "default")
    assert deploy.returncode == 0, deploy.stderr
    assert "worklease.E001" not in deploy.stderr
    # this server has no standby: worklease check warns, as the CLI does
    assert "worklease.W001) worklease check on database 'default': replication:" in deploy.stderr
    with pg.empty_database(postgres_server, "django") as dsn:  # never migrated: no table
        # A warning, not an error: `migrate` runs the database checks before it migrates.
        missing = django(dsn, "check", "--database", "default")
        assert missing.returncode == 0, missing.stderr
        assert (
            "worklease.W002) worklease on database 'default': no worklease table" in missing.stderr
        )
        assert "HINT: run `manage.py migrate`" in missing.stderr
        strict = django(dsn, "check", "--database", "default", "--fail-level", "WARNING")
        assert strict.returncode == 1
        # A table newer than this worklease is an error: migrate cannot fix it.
        assert django(dsn, "migrate", "--no-input").returncode == 0
        pg.execute(dsn, "COMMENT ON TABLE worklease_leases IS 'worklease schema version 5'")
        newer = django(dsn, "check", "--database", "default")
        assert newer.returncode == 1
        assert "worklease.E001" in newer.stderr
        assert "newer than this worklease knows" in newer.stderr
        # Without --database, Django runs no database checks: nothing is reached.
        assert django(dsn, "check").returncode == 0
    unreachable = django(
        "host=127.0.0.1 port=1 dbname=nowhere user=postgres", "check", "--database", "default"
    )
    assert unreachable.returncode == 1
    assert "worklease.E001) worklease on database 'default': cannot connect" in unreachable.stderr


def test_bad_settings_are_reported_by_check(database: str) -> None:
    for setting, message in (
        ({"DATABSE": "default"}, "WORKLEASE has unknown keys ['DATABSE']"),
        ({"DATABASE": "other"}, "WORKLEASE['DATABASE'] must name a database of DATABASES"),
        ({"POOL_SIZE": 0}, "WORKLEASE['POOL_SIZE'] must be a whole number from 1 to 1000"),
        ({"SCHEMA": ""}, "schema must be a non-empty string"),
        ({"CHECK_TTL": "soon"}, "WORKLEASE: "),
        ({"SHARE_DJANGO_POOL": True}, "WORKLEASE['SHARE_DJANGO_POOL'] needs Django's pool"),
        ({"SHARE_DJANGO_POOL": "yes"}, "WORKLEASE['SHARE_DJANGO_POOL'] must be True or False"),
    ):
        result = django(database, "check", WL_TEST_WORKLEASE=json.dumps(setting))
        assert result.returncode == 1, setting
        assert "worklease.E000" in result.stderr, setting
        assert message in result.stderr, (setting, result.stderr)


@pytest.mark.parametrize(
    ("pool", "share", "shared"),
    [("1", True, True), ("1", False, False), ("0", False, False)],
    ids=["shared-django-pool", "own-pool-beside-djangos", "own-pool"],
)
def test_the_backend_uses_its_own_pool_unless_told_to_share_djangos(
    database: str, pool: str, share: bool, shared: bool
) -> None:
    script = (
        "from datetime import UTC, datetime\n"
        "from django.db import connections\n"
        "from django.test.utils import override_settings\n"
        "import worklease\n"
        "from worklease.contrib.django import get_backend\n"
        "backend = get_backend()\n"
        "assert get_backend() is backend\n"
        "print('shared' if backend.pool is connections['default'].pool else 'own')\n"
        "lease = worklease.Lease(backend, holder_id='shell', ttl='30s')\n"
        "token = lease.acquire('from-a-view')\n"
        "lease.checkpoint(token, b'x')\n"
        "left = (token.expires_at - datetime.now(UTC)).total_seconds()\n"
        "assert 20 < left <= 31, left\n"
        "lease.release(token, 'finished')\n"
        "with override_settings(TIME_ZONE='Europe/Paris'):\n"  # Django replaces its pool
        "    again = get_backend()\n"
        "    assert again is not backend\n"
        "    lease = worklease.Lease(again, holder_id='shell', ttl='30s')\n"
        "    lease.release(lease.acquire('after-a-settings-change'), 'finished')\n"
        "print('ok')\n"
    )
    setting = json.dumps({"SHARE_DJANGO_POOL": share, "WORKERS": WORKERS})
    result = django(database, "shell", "-c", script, WL_TEST_POOL=pool, WL_TEST_WORKLEASE=setting)
    assert result.returncode == 0, result.stderr
    # Django 5.2 prints what it imported automatically first
    assert result.stdout.split()[-2:] == ["shared" if shared else "own", "ok"]


@pytest.mark.lengthy
def test_threads_using_the_orm_never_starve_the_leases(database: str) -> None:
    """Twelve threads that use the ORM and end without closing their connection (Django
    keeps a thread's connection until its request ends; these have no request) take all of
    Django's pool; the leases, on their own pool, go on."""
    script = (
        "import threading\n"
        "from django.db import connection\n"
        "import worklease\n"
        "from worklease.contrib.django import get_backend\n"
        "def use_orm():\n"
        "    with connection.cursor() as cursor:\n"
        "        cursor.execute('SELECT 1')\n"
        "threads = [threading.Thread(target=use_orm) for _ in range(12)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "lease = worklease.Lease(get_backend(), holder_id='shell', ttl='30s')\n"
        "lease.release(lease.acquire('still-free'), 'finished')\n"
        "print('ok')\n"
    )
    result = django(database, "shell", "-c", script, WL_TEST_POOL="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "ok"


@pytest.mark.parametrize("pool", ["1", "0"], ids=["django-pool", "own-pool"])
def test_worklease_run_runs_a_pool_to_the_end(database: str, pool: str) -> None:
    run = Running(database, "reports", WL_TEST_POOL=pool, WL_TEST_STEPS="3")
    try:
        assert run.finish() == 0, run.output()
    finally:
        run.kill()
    assert "running reports: pool" in run.lines
    assert run.lines[-1] == "stopped"
    rows = pg.execute(
        database, "SELECT work_id, exit_mode, checkpoint FROM worklease_leases ORDER BY 1"
    )
    assert rows == [
        ("report-1", "retired", b'{"step": 3}'),
        ("report-2", "retired", b'{"step": 3}'),
    ]
    steps = pg.execute(database, "SELECT work_id, count(*) FROM steps_done GROUP BY 1 ORDER BY 1")
    assert steps == [("report-1", 3), ("report-2", 3)]


def test_sigterm_hands_the_work_over_with_its_checkpoints(database: str) -> None:
    first = Running(
        database, "both", WL_TEST_STEPS="100000", WL_TEST_STEP_SECONDS="0.05", WL_TEST_HOLDER="one"
    )
    try:
        for text in ("report-1: from step 0", "report-2: from step 0", "elected with token"):
            first.wait_for(text)
        deadline = time.monotonic() + 60
        # Both reports past step 2 (a count of rows would equal 2 only for the ~50 ms
        # between the second report's step 2 and the next step: a poll can miss it for good)
        reached = "SELECT count(DISTINCT work_id) FROM steps_done WHERE step >= 2"
        while pg.execute(database, reached) != [(2,)]:
            assert time.monotonic() < deadline, first.output()
            time.sleep(0.05)
        first.proc.send_signal(signal.SIGTERM)
        assert first.finish() == 0, first.output()
    finally:
        first.kill()
    assert "stopping: handing the work over" in first.lines
    assert first.lines[-1] == "stopped"
    rows = pg.execute(
        database,
        "SELECT work_id, holder_id, exit_mode, checkpoint IS NOT NULL, expires_at <= now()"
        " FROM worklease_leases WHERE work_id NOT LIKE 'worklease.member/%%' ORDER BY 1",
    )
    assert rows == [
        ("report-1", "one", "abandoned", True, True),
        ("report-2", "one", "abandoned", True, True),
        ("scheduler", "one", "finished", False, True),  # its term returned: stepped down
    ]
    saved = dict(
        pg.execute(
            database,
            "SELECT work_id, checkpoint FROM worklease_leases WHERE checkpoint IS NOT NULL",
        )
    )

    # The next process resumes both reports where the first left them, at once.
    second = Running(database, "reports", WL_TEST_STEPS="100000", WL_TEST_HOLDER="two")
    try:
        for work_id, state in saved.items():
            step = json.loads(state)["step"]
            second.wait_for(f"{work_id}: from step {step} (previous exit abandoned)", 30)
        second.proc.send_signal(signal.SIGTERM)
        assert second.finish() == 0, second.output()
    finally:
        second.kill()


def test_a_failing_worker_stops_the_others_and_exits_1(database: str) -> None:
    run = Running(database, "dying")
    try:
        assert run.finish() == 1, run.output()
    finally:
        run.kill()
    assert "stopping: handing the work over" in run.lines
    assert "CommandError: dying: pool: AllSlotsDeadError" in run.output()
    scheduler = pg.execute(
        database, "SELECT exit_mode FROM worklease_leases WHERE work_id = 'scheduler'"
    )
    assert scheduler == [("finished",)]  # the leader stepped down


def test_worklease_run_refuses_what_it_cannot_run(database: str) -> None:
    listed = django(database, "worklease_run", "--list")
    assert listed.returncode == 0
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == sorted(WORKERS)
    for args, message in (
        ((), "name the workers to run: both, dying, reports, scheduler, wrong"),
        (("nope",), "no worker 'nope' in WORKLEASE['WORKERS']; known: both, dying, reports"),
        (("wrong",), "worker 'wrong' returned int: a worker function returns a worklease.Pool"),
    ):
        result = django(database, "worklease_run", *args)
        assert result.returncode == 1, args
        assert message in result.stderr, (args, result.stderr)
    assert pg.execute(database, "SELECT count(*) FROM worklease_leases") == [(0,)]
