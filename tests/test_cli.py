"""The command line, run as a real subprocess (``python -m worklease``)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pty
import select
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from time import monotonic, sleep
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

import worklease
from tests import pg
from worklease import ExitMode, PostgresBackend, schema_sql

QUICK_START = (
    'previous exit: none, saved state: ""\nprevious exit: finished, saved state: "step 1 done"\n'
)


CONSOLE_SCRIPT = Path(sys.executable).with_name("worklease")
"""The installed console script (``pip install`` puts it beside the interpreter)."""


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real ``worklease`` console script (``env``: added to the environment, with
    the DSN variables cleared first)."""
    environment = {
        k: v for k, v in os.environ.items() if k not in ("WORKLEASE_DSN", "DATABASE_URL")
    }
    environment.update(env or {})
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=environment,
    )


def test_console_script_is_installed_and_module_form_matches() -> None:
    assert CONSOLE_SCRIPT.exists(), "install the package (pip install -e .) to get the script"
    module = subprocess.run(
        [sys.executable, "-m", "worklease", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (module.returncode, module.stdout) == (0, QUICK_START)


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
    for command in ("demo", "schema", "migrate", "status", "sweep", "check"):
        result = run(command, "--help")
        assert result.returncode == 0
        assert "usage: worklease " + command in result.stdout


@pytest.mark.postgres
def test_migrate_is_idempotent_and_says_what_it_did(postgres_dsn: str) -> None:
    schema = "cli_migrate"
    try:
        first = run("migrate", "--dsn", postgres_dsn, "--schema", schema)
        assert first.returncode == 0, first.stderr
        assert first.stdout == (f"created the worklease schema (version 4) in schema '{schema}'\n")
        second = run("migrate", "--dsn", postgres_dsn, "--schema", schema)
        assert second.returncode == 0, second.stderr
        assert second.stdout == (
            f"the worklease schema in schema '{schema}' is at version 4 (current); nothing to do\n"
        )
        assert pg.execute(postgres_dsn, f"SELECT count(*) FROM {schema}.worklease_leases") == [(0,)]
    finally:
        pg.execute(postgres_dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.postgres
def test_migrate_upgrades_a_table_of_an_earlier_version(postgres_dsn: str) -> None:
    """A version-4 table that regained the updated_at index of earlier schemas (the Go
    library's migration creates it): it is behind again; migrate runs step 4 once more (drops
    the index, sets the fillfactor), says so, and keeps the rows."""
    schema = "cli_migrate_legacy"
    try:
        assert run("migrate", "--dsn", postgres_dsn, "--schema", schema).returncode == 0
        pg.execute(
            postgres_dsn,
            f"CREATE INDEX idx_worklease_leases_updated_at ON {schema}.worklease_leases "
            f"(updated_at); ALTER TABLE {schema}.worklease_leases RESET (fillfactor); "
            f"INSERT INTO {schema}.worklease_leases (work_id, holder_id, expires_at) "
            "VALUES ('kept', 'h', now())",
        )
        behind = run("migrate", "--check", "--dsn", postgres_dsn, "--schema", schema)
        assert behind.returncode == 1
        assert "is behind: version 3 of 4; pending: step 4 (lease writes are HOT" in behind.stdout
        result = run("migrate", "--dsn", postgres_dsn, "--schema", schema)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(
            f"upgraded the worklease schema in schema '{schema}' from version 3 to 4: step 4 "
        )
        assert pg.execute(
            postgres_dsn,
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s ORDER BY 1",
            (schema,),
        ) == [("idx_worklease_leases_members",), ("worklease_leases_pkey",)]
        assert pg.execute(postgres_dsn, f"SELECT work_id FROM {schema}.worklease_leases") == [
            ("kept",)
        ]
        again = run("migrate", "--dsn", postgres_dsn, "--schema", schema)
        assert "is at version 4 (current); nothing to do" in again.stdout
        fillfactor = (
            f"SELECT reloptions FROM pg_class WHERE oid = '{schema}.worklease_leases'::regclass"
        )
        assert pg.execute(postgres_dsn, fillfactor) == [(["fillfactor=90"],)]
    finally:
        pg.execute(postgres_dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_migrate_unreachable_database_is_one_line() -> None:
    result = run("migrate", "--dsn", "host=127.0.0.1 port=1 user=postgres connect_timeout=3")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    # the message names the database it tried (never a password)
    assert result.stderr.startswith(
        "worklease migrate: migrate failed on host=127.0.0.1 port=1 user=postgres:"
    )
    assert "Traceback" not in result.stderr


def _make_rows(dsn: str) -> dict[str, int]:
    """One held, one expired and one released lease (plus a retired one), made through the
    library itself; returns their fencing tokens."""
    pg.reset(dsn)
    tokens: dict[str, int] = {}
    with (
        ConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool,
        PostgresBackend(pool) as backend,
    ):
        held = backend.acquire("held-1", "worker-1", 300)
        backend.checkpoint(held, b"12345", 300)
        expired = backend.acquire("expired-1", "worker-2", -1)
        released = backend.acquire("released-1", "worker-3", 300)
        backend.release(released, ExitMode.FINISHED)
        retired = backend.acquire("retired-1", "worker-3", 300)
        backend.release(retired, ExitMode.RETIRED)
        for name, token in (
            ("held-1", held),
            ("expired-1", expired),
            ("released-1", released),
            ("retired-1", retired),
        ):
            tokens[name] = token.fencing_token
    return tokens


@pytest.mark.postgres
def test_status_table_has_one_aligned_row_per_lease(postgres_dsn: str) -> None:
    tokens = _make_rows(postgres_dsn)
    result = run("status", "--dsn", postgres_dsn)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "WORK", "ID", "HOLDER", "TOKEN", "STATE", "EXIT", "PREV", "EXIT", "EXPIRES",
        "CHECKPOINT", "UPDATED",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert sorted(rows) == ["expired-1", "held-1", "released-1", "retired-1"]
    held = rows["held-1"]
    assert held[:6] == ["held-1", "worker-1", str(tokens["held-1"]), "held", "-", "none"]
    assert held[6] == "in"
    assert held[8:10] == ["5", "B"]
    expired = rows["expired-1"]
    assert expired[:5] == ["expired-1", "worker-2", str(tokens["expired-1"]), "expired", "-"]
    assert expired[7] == "ago"
    assert expired[8] == "-"
    released = rows["released-1"]
    assert released[3:5] == ["released", "finished"]
    assert rows["retired-1"][3:5] == ["released", "retired"]
    column = lines[0].index("STATE")
    for line in lines[1:]:  # every row's state starts exactly under the STATE header
        assert line[column - 1] == " "
        assert line[column:].split()[0] in {"held", "expired", "released"}


@pytest.mark.postgres
def test_status_json_and_filters(postgres_dsn: str) -> None:
    tokens = _make_rows(postgres_dsn)
    result = run("status", "--dsn", postgres_dsn, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [entry["work_id"] for entry in document] == [
        "expired-1",
        "held-1",
        "released-1",
        "retired-1",
    ]
    held = next(entry for entry in document if entry["work_id"] == "held-1")
    assert set(held) == {
        "work_id", "holder_id", "fencing_token", "state", "exit_mode", "prev_exit",
        "prev_holder_id", "expires_at", "checkpoint_size", "updated_at",
    }  # fmt: skip
    assert held["fencing_token"] == tokens["held-1"]
    assert (held["state"], held["exit_mode"], held["prev_exit"]) == ("held", None, "none")
    assert (held["prev_holder_id"], held["checkpoint_size"]) == (None, 5)
    assert held["expires_at"].endswith("Z")
    assert datetime.fromisoformat(held["expires_at"]) > datetime.now(UTC)
    expired = next(entry for entry in document if entry["work_id"] == "expired-1")
    assert (expired["state"], expired["checkpoint_size"]) == ("expired", None)

    only_released = json.loads(
        run("status", "--dsn", postgres_dsn, "--json", "--state", "released").stdout
    )
    assert [entry["work_id"] for entry in only_released] == ["released-1", "retired-1"]
    globbed = json.loads(
        run("status", "--dsn", postgres_dsn, "--json", "--work-id", "*ed-1").stdout
    )
    assert [entry["work_id"] for entry in globbed] == ["expired-1", "released-1", "retired-1"]
    none = run("status", "--dsn", postgres_dsn, "--work-id", "nothing-*")
    assert (none.returncode, none.stdout) == (0, "no leases match\n")


@pytest.mark.postgres
def test_status_by_holder_counts_work_and_pool_groups(postgres_dsn: str) -> None:
    """--by-holder: held work IDs per holder (lapsed and released ones not counted), pool
    memberships counted apart; --json gives the same counts."""
    pg.reset(postgres_dsn)
    with (
        ConnectionPool(postgres_dsn, min_size=1, max_size=2, open=False) as pool,
        PostgresBackend(pool) as backend,
    ):
        for work_id in ("part-1", "part-2", "part-3"):
            backend.acquire(work_id, "worker-a", 300)
        backend.acquire("part-4", "worker-b", 300)
        backend.acquire("part-5", "worker-b", -1)  # lapsed
        done = backend.acquire("part-6", "worker-c", 300)
        backend.release(done, ExitMode.FINISHED)
        backend.acquire("worklease.member/ids-x/aaaa", "worker-a", 300)
        backend.acquire("worklease.member/ids-x/bbbb", "worker-b", 300)
    table = run("status", "--dsn", postgres_dsn, "--by-holder")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines() == [
        "HOLDER    HELD  POOL GROUPS",
        "worker-a     3            1",
        "worker-b     1            1",
        "4 work ID(s) held by 2 holder(s)",
    ]
    document = json.loads(run("status", "--dsn", postgres_dsn, "--by-holder", "--json").stdout)
    assert document == [
        {"holder_id": "worker-a", "held": 3, "pool_groups": 1},
        {"holder_id": "worker-b", "held": 1, "pool_groups": 1},
    ]
    only = json.loads(
        run("status", "--dsn", postgres_dsn, "--by-holder", "--json", "--work-id", "part-4").stdout
    )
    assert only == [
        {"holder_id": "worker-b", "held": 1, "pool_groups": 1},
        {"holder_id": "worker-a", "held": 0, "pool_groups": 1},
    ]
    wrong = run("status", "--dsn", postgres_dsn, "--by-holder", "--state", "expired")
    assert wrong.returncode == 1
    assert "--by-holder" in wrong.stderr


@pytest.mark.postgres
def test_sweep_dry_run_then_delete(postgres_dsn: str) -> None:
    _make_rows(postgres_dsn)
    sleep(0.05)  # rows must be strictly older than the retention below
    dry = run("sweep", "--dsn", postgres_dsn, "--retention", "10ms", "--dry-run")
    assert (dry.returncode, dry.stdout) == (
        0,
        "would delete 1 retired row(s) not updated for 10ms\n",
    )
    dry_all = run(
        "sweep", "--dsn", postgres_dsn, "--retention", "10ms", "--include-expired", "--dry-run"
    )
    assert "would delete 2 retired and lapsed row(s)" in dry_all.stdout
    kept = run("sweep", "--dsn", postgres_dsn, "--retention", "1h")
    assert kept.stdout == "deleted 0 retired row(s) not updated for 1h\n"
    done = run("sweep", "--dsn", postgres_dsn, "--retention", "10ms", "--include-expired")
    assert done.stdout == "deleted 2 retired and lapsed row(s) not updated for 10ms\n"
    remaining = pg.execute(postgres_dsn, "SELECT work_id FROM worklease_leases ORDER BY 1")
    assert remaining == [("held-1",), ("released-1",)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sweep", "--retention", "10x"), "bad duration '10x'"),
        (("sweep", "--retention", "0s"), "must be greater than zero"),
        (("sweep", "--retention", "0"), "must be greater than zero"),
        (("status", "--work-id", "a[b"), "bad pattern 'a[b'"),
    ],
)
def test_bad_arguments_are_one_line_and_status_1(args: tuple[str, ...], message: str) -> None:
    result = run(*args, "--dsn", "host=127.0.0.1 port=1 connect_timeout=1")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert message in result.stderr


@pytest.mark.postgres
def test_status_on_a_missing_schema_names_the_fix(postgres_dsn: str) -> None:
    result = run("status", "--dsn", postgres_dsn, "--schema", "not_there")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "worklease migrate" in result.stderr


def test_status_unreachable_database_is_one_line() -> None:
    result = run("status", "--dsn", "host=127.0.0.1 port=1 user=postgres connect_timeout=3")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "worklease status: cannot connect to host=127.0.0.1 port=1 user=postgres:"
    )
    assert result.stderr.count("\n") == 1


@pytest.mark.postgres
def test_check_prints_one_line_per_finding_and_exits_0_when_nothing_failed(
    postgres_dsn: str,
) -> None:
    result = run("check", "--dsn", postgres_dsn)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines][:2] == [["ok", "connection"], ["ok", "schema"]]
    # the test server has no standby: the one warning
    assert {line.split()[1]: line.split()[0] for line in lines if not line.startswith("ok")} == {
        "replication": "warn"
    }
    report = json.loads(run("check", "--dsn", postgres_dsn, "--json").stdout)
    assert report["ok"] is True
    assert report["clean"] is False
    assert {f["name"] for f in report["findings"]} >= {
        "schema",
        "writes",
        "replication",
        "connections",
        "listen",
    }


@pytest.mark.postgres
def test_check_fails_when_the_processes_pools_exceed_max_connections(postgres_dsn: str) -> None:
    ((limit, reserved),) = pg.execute(
        postgres_dsn,
        "SELECT current_setting('max_connections')::int, "
        "current_setting('superuser_reserved_connections')::int",
    )
    allowed = limit - reserved
    pool_size = max(allowed // 2 - 9, 1)  # two processes of pool_size + 10 each: one too many
    need = 2 * (pool_size + 10)
    assert need > allowed
    result = run("check", "--dsn", postgres_dsn, "--pool-size", str(pool_size), "--processes", "2")
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if " connections " in line]
    assert line.startswith(f"fail  connections         {need} connections for 2 processes")
    assert f"exceed the {allowed} the server allows (max_connections {limit}" in line


@pytest.mark.postgres
def test_check_exits_1_on_a_failure_and_with_strict_on_a_warning(
    postgres_server: str, pgbouncer_dsn: str
) -> None:
    with pg.fresh_database(postgres_server) as dsn:
        pg.execute(dsn, "DROP TABLE worklease_leases")
        missing = run("check", "--dsn", dsn)
    assert missing.returncode == 1
    assert any(line.startswith("fail  schema") for line in missing.stdout.splitlines())
    assert missing.stderr == ""
    assert run("check", "--dsn", pgbouncer_dsn).returncode == 0  # warnings only
    strict = run("check", "--dsn", pgbouncer_dsn, "--strict")
    assert strict.returncode == 1
    assert "warn  pooler" in strict.stdout


@pytest.mark.postgres
def test_durations_are_seconds_as_bare_numbers(postgres_dsn: str) -> None:
    """The command line takes what the API takes: a bare number is seconds."""
    swept = run("sweep", "--dsn", postgres_dsn, "--retention", "86400", "--dry-run")
    assert swept.returncode == 0, swept.stderr
    assert "not updated for 86400" in swept.stdout
    checked = run("check", "--dsn", postgres_dsn, "--ttl", "30", "--json")
    assert checked.stderr == ""
    assert json.loads(checked.stdout)["findings"]


def test_check_bad_ttl_is_one_line_and_status_1() -> None:
    result = run("check", "--dsn", "host=nowhere.invalid", "--ttl", "soon")
    assert result.returncode == 1
    assert result.stderr.startswith("worklease check: ")


def test_check_bad_pool_size_or_processes_is_one_line_and_status_1() -> None:
    result = run("check", "--dsn", "host=nowhere.invalid", "--pool-size", "0")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("worklease check: pool_size must be a whole number")
    assert result.stderr.count("\n") == 1
    result = run("check", "--dsn", "host=nowhere.invalid", "--processes", "0")
    assert result.returncode == 1
    assert "processes must be a whole number" in result.stderr
    assert run("check", "--processes", "many").returncode == 2  # not a number: usage


def test_check_never_prints_the_dsn_s_password() -> None:
    # libpq quotes the token it could not decode: here, the password
    result = run("check", "--dsn", "postgresql://postgres:hun%zzter2@127.0.0.1/db")
    assert result.returncode == 1
    assert "zzter2" not in result.stdout + result.stderr
    assert result.stdout.startswith("fail  connection  cannot connect: ")


def test_check_never_prints_the_listen_dsn_s_password() -> None:
    # libpq quotes the token it could not decode; the listen DSN is checked before any I/O
    result = run(
        "check",
        "--dsn",
        "host=nowhere.invalid",
        "--listen-dsn",
        "postgresql://postgres:Sekr3t%zzXY@127.0.0.1/db",
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("worklease check: listen_dsn is not a valid conninfo string")
    assert "Sekr3t" not in result.stderr


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"worklease {worklease.__version__}"
    assert worklease.__version__ == importlib.metadata.version("worklease")  # one source


UNREACHABLE = "host=127.0.0.1 port=1 user=postgres dbname={} connect_timeout=3"


@pytest.mark.parametrize(
    ("given", "env", "reached"),
    [
        # --dsn first, then WORKLEASE_DSN, then DATABASE_URL, then libpq's variables
        (
            UNREACHABLE.format("from_flag"),
            {
                "WORKLEASE_DSN": UNREACHABLE.format("from_worklease"),
                "DATABASE_URL": UNREACHABLE.format("from_url"),
            },
            "from_flag",
        ),
        (
            None,
            {
                "WORKLEASE_DSN": UNREACHABLE.format("from_worklease"),
                "DATABASE_URL": UNREACHABLE.format("from_url"),
            },
            "from_worklease",
        ),
        (None, {"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/from_url"}, "from_url"),
        (
            None,
            {
                "PGHOST": "127.0.0.1",
                "PGPORT": "1",
                "PGDATABASE": "from_pg",
                "PGUSER": "postgres",
                "PGCONNECT_TIMEOUT": "3",
            },
            "from_pg",
        ),
    ],
)
def test_dsn_comes_from_the_flag_then_the_environment(
    given: str | None, env: dict[str, str], reached: str
) -> None:
    args = ["status"] if given is None else ["status", "--dsn", given]
    result = run(*args, env=env)
    assert result.returncode == 1
    assert f"dbname={reached}" in result.stderr, result.stderr


def test_status_watch_prints_plain_frames_into_a_pipe(postgres_dsn: str) -> None:
    _make_rows(postgres_dsn)
    process = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "status", "--dsn", postgres_dsn, "--watch", "100ms"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    seen = b""
    deadline = monotonic() + 30
    try:
        # Interrupt only once three frames arrived: a signal during start-up
        # (still importing) is not what this test is about.
        while seen.count(b"every 100ms, ") < 3 and monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 0.5)
            if ready:
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    break
                seen += chunk
    finally:
        process.send_signal(signal.SIGINT)
        try:
            rest, err_bytes = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()  # never leave the child behind
            process.communicate()
            raise
    out, err = (seen + rest).decode(), err_bytes.decode()
    assert seen.count(b"every 100ms, ") >= 3, (out, err)  # all before the interrupt
    assert process.returncode == 0, err
    assert "\x1b" not in out  # no terminal codes in a pipe or a log
    frames = out.split("every 100ms, ")[1:]
    assert len(frames) >= 2, out
    for frame in frames[:-1]:  # the last may be cut short by the interrupt
        assert "held-1" in frame
    assert "Traceback" not in err


def test_status_watch_redraws_in_place_on_a_terminal(postgres_dsn: str) -> None:
    _make_rows(postgres_dsn)
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "status", "--dsn", postgres_dsn, "--watch", "100ms"],
        stdout=follower,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(follower)
    seen = b""
    deadline = monotonic() + 20
    try:
        while seen.count(b"\x1b[H\x1b[2J") < 3 and monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    break
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
        os.close(leader)
    assert process.returncode == 0, err
    frames = seen.decode(errors="replace").split("\x1b[H\x1b[2J")[1:]
    assert len(frames) >= 2, seen  # drawn more than once, each time from the top
    assert frames[0].startswith("every 100ms, ")
    assert "held-1" in frames[0]


def test_status_watch_refuses_json() -> None:
    result = run("status", "--dsn", "host=127.0.0.1 port=1", "--watch", "--json")
    assert result.returncode == 1
    assert (
        result.stderr == "worklease status: --watch redraws a table: it does not go with --json\n"
    )


@pytest.mark.etcd
def test_status_and_sweep_read_etcd(etcd_cluster: Any) -> None:
    prefix = f"cli-{os.getpid()}-{datetime.now(UTC).timestamp():.0f}/"
    endpoints = ",".join(etcd_cluster.endpoints)
    target = ("--etcd", endpoints, "--etcd-prefix", prefix)
    with worklease.EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as backend:
        held = backend.acquire("job-held", "worker-a", 60.0)
        backend.checkpoint(held, b"12345", 60.0)
        retired = backend.acquire("job-retired", "worker-b", 60.0)
        backend.release(retired, ExitMode.RETIRED)
        table = run("status", *target)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split()[:4] == ["WORK", "ID", "HOLDER", "TOKEN"]
        row = next(line for line in lines if line.startswith("job-held"))
        assert "worker-a" in row
        assert str(held.fencing_token) in row
        assert "held" in row
        assert "5 B" in row
        assert "in " in row  # the etcd lease's TTL left
        released = run("status", *target, "--state", "released", "--json")
        assert released.returncode == 0, released.stderr
        document = json.loads(released.stdout)
        assert [(d["work_id"], d["exit_mode"]) for d in document] == [("job-retired", "retired")]
        sleep(1.1)
        swept = run("sweep", *target, "--retention", "1s")
        assert swept.returncode == 0, swept.stderr
        assert swept.stdout.startswith("deleted 1 retired work ID(s) not updated for 1s")
        after = json.loads(run("status", *target, "--json").stdout)
        assert [d["work_id"] for d in after] == ["job-held"]
        refused = run("status", *target, "--by-holder")
        assert refused.returncode == 1
        assert "PostgreSQL only" in refused.stderr


@pytest.mark.redis
@pytest.mark.parametrize("where", ["standalone", "cluster"])
def test_status_and_sweep_read_redis(request: pytest.FixtureRequest, where: str) -> None:
    """The same columns and JSON keys from Redis (standalone, or a Cluster URL); the TTL
    left is by the server's clock."""
    prefix = f"cli-{os.getpid()}-{datetime.now(UTC).timestamp():.0f}:"
    if where == "cluster":
        url = "redis+cluster://" + request.getfixturevalue("redis_cluster").url.split("://")[1]
    else:
        url = request.getfixturevalue("redis_server").url
    target = ("--redis", url, "--redis-prefix", prefix)
    with worklease.RedisBackend.from_url(url, prefix=prefix) as backend:
        held = backend.acquire("job-held", "worker-a", 60.0)
        backend.checkpoint(held, b"12345", 60.0)
        retired = backend.acquire("job-retired", "worker-b", 60.0)
        backend.release(retired, ExitMode.RETIRED)
        table = run("status", *target)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split()[:4] == ["WORK", "ID", "HOLDER", "TOKEN"]
        row = next(line for line in lines if line.startswith("job-held"))
        assert "worker-a" in row
        assert str(held.fencing_token) in row
        assert "held" in row
        assert "5 B" in row
        assert "in 5" in row  # about a minute left
        released = run("status", *target, "--state", "released", "--json")
        assert released.returncode == 0, released.stderr
        document = json.loads(released.stdout)
        assert [(d["work_id"], d["exit_mode"]) for d in document] == [("job-retired", "retired")]
        assert set(document[0]) == set(json.loads(run("status", *target, "--json").stdout)[0])
        picked = json.loads(run("status", *target, "--work-id", "job-h*", "--json").stdout)
        assert [d["work_id"] for d in picked] == ["job-held"]
        sleep(1.1)
        swept = run("sweep", *target, "--retention", "1s")
        assert swept.returncode == 0, swept.stderr
        assert swept.stdout.startswith("deleted 1 retired work ID(s) not updated for 1s")
        after = json.loads(run("status", *target, "--json").stdout)
        assert [d["work_id"] for d in after] == ["job-held"]
        for refused in (
            run("status", *target, "--by-holder"),
            run("sweep", *target, "--retention", "1s", "--dry-run"),
        ):
            assert refused.returncode == 1
            assert "PostgreSQL only; use it without --redis" in refused.stderr


@pytest.mark.redis
def test_check_redis_reports_persistence_and_fails_an_evicting_policy(
    redis_server: Any,
) -> None:
    """Persistence off warns (exit 0; 1 with --strict); a policy that can evict lease rows
    fails; --json carries the same findings. A server configured as the guide says is clean."""
    report = run("check", "--redis", redis_server.url)
    assert report.returncode == 0, report.stdout + report.stderr
    lines = {line.split()[1]: line for line in report.stdout.splitlines()}
    assert lines["persistence"].startswith("warn")
    assert lines["eviction"].startswith("ok")
    assert lines["scripts"].startswith("ok")
    assert run("check", "--redis", redis_server.url, "--strict").returncode == 1
    from tests import redis_servers

    evicting = redis_servers.start("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
    try:
        failed = run("check", "--redis", evicting.url, "--json")
        assert failed.returncode == 1
        document = json.loads(failed.stdout)
        assert document["ok"] is False
        findings = {f["name"]: f for f in document["findings"]}
        assert findings["eviction"]["status"] == "fail"
        assert "allkeys-lru" in findings["eviction"]["detail"]
    finally:
        evicting.stop()
    configured = redis_servers.start(
        "--appendonly", "yes", "--appendfsync", "always", "--maxmemory", "256mb",
        "--maxmemory-policy", "noeviction", "--min-replicas-to-write", "1",
    )  # fmt: skip
    replica = redis_servers.start("--replicaof", "127.0.0.1", str(configured.port))
    try:
        redis_servers._wait_linked(configured.port, 1)
        clean = run("check", "--redis", configured.url, "--replicas", "1", "--strict")
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert all(line.startswith("ok") for line in clean.stdout.splitlines()), clean.stdout
        short = run("check", "--redis", configured.url, "--replicas", "2", "--json")
        assert short.returncode == 1
        assert {f["name"]: f["status"] for f in json.loads(short.stdout)["findings"]}[
            "replication"
        ] == "fail"
    finally:
        replica.stop()
        configured.stop()


def test_redis_flags_are_checked_and_hide_the_password() -> None:
    both = run("status", "--redis", "redis://127.0.0.1:1", "--etcd", "http://127.0.0.1:1")
    assert both.returncode == 1
    assert "give one of --dsn, --etcd and --redis, not --etcd and --redis" in both.stderr
    alone = run("sweep", "--redis-prefix", "app:", "--retention", "1d")
    assert alone.stderr.strip() == "worklease sweep: --redis-prefix needs --redis"
    scheme = run("status", "--redis", "http://127.0.0.1:1")
    assert scheme.returncode == 1
    assert "unknown Redis URL scheme 'http'" in scheme.stderr
    unreachable = run("check", "--redis", "redis://:hunter2secret@127.0.0.1:1/0")
    assert unreachable.returncode == 1
    assert unreachable.stdout.startswith("fail  connection  redis://:***@127.0.0.1:1/0: ")
    assert "hunter2secret" not in unreachable.stdout + unreachable.stderr
    lost = run("status", "--redis", "redis://:hunter2secret@127.0.0.1:1/0")
    assert lost.returncode == 1
    assert len(lost.stderr.strip().splitlines()) == 1
    assert "hunter2secret" not in lost.stderr
    assert run("check", "--replicas", "1", "--dsn", "dbname=x").returncode == 1


def test_etcd_and_dsn_flags_do_not_mix() -> None:
    both = run("status", "--etcd", "http://127.0.0.1:1", "--dsn", "dbname=x")
    assert both.returncode == 1
    assert both.stderr.strip() == (
        "worklease status: give one of --dsn, --etcd and --redis, not --dsn and --etcd"
    )
    alone = run("sweep", "--etcd-prefix", "app/", "--retention", "1d")
    assert alone.returncode == 1
    assert alone.stderr.strip() == "worklease sweep: --etcd-prefix needs --etcd"
    unreachable = run("status", "--etcd", "http://127.0.0.1:1")
    assert unreachable.returncode == 1
    assert len(unreachable.stderr.strip().splitlines()) == 1
    assert "no etcd member answered" in unreachable.stderr


@pytest.mark.postgres
def test_expire_and_forget_from_the_command_line(postgres_dsn: str) -> None:
    pg.reset(postgres_dsn)
    with worklease.PostgresBackend.connect(postgres_dsn, max_size=1) as backend:
        held = backend.acquire("job-held", "worker-a", 60.0)
        backend.checkpoint(held, b"progress", 60.0)
        retired = backend.acquire("job-retired", "worker-b", 60.0)
        backend.release(retired, ExitMode.RETIRED)
        unasked = run("expire", "job-held", "--dsn", postgres_dsn)  # no terminal, no --yes
        assert unasked.returncode == 1
        assert (
            unasked.stderr.strip() == "worklease expire: not a terminal to confirm on: give --yes"
        )
        backend.renew(held, 60.0)  # untouched
        expired = run("expire", "job-held", "--dsn", postgres_dsn, "--yes", "--json")
        assert expired.returncode == 0, expired.stderr
        assert json.loads(expired.stdout) == {
            "work_id": "job-held", "expired": True, "holder_id": "worker-a",
            "fencing_token": held.fencing_token,
        }  # fmt: skip
        with pytest.raises(worklease.FencedError):
            backend.checkpoint(held, b"zombie", 60.0)
        again = run("expire", "job-held", "--dsn", postgres_dsn, "--yes")
        assert again.returncode == 1
        assert again.stdout.strip() == "job-held is not held: nothing to expire"
        refused = run("forget", "job-missing", "--dsn", postgres_dsn, "--yes")
        assert refused.returncode == 1
        taken = backend.acquire("job-held", "worker-c", 60.0)
        busy = run("forget", "job-held", "--dsn", postgres_dsn, "--yes")
        assert busy.returncode == 1
        assert "is held by worker-c: expire it first" in busy.stderr
        backend.renew(taken, 60.0)
        forgot = run("forget", "job-retired", "--dsn", postgres_dsn, "--yes")
        assert forgot.returncode == 0, forgot.stderr
        assert forgot.stdout.strip() == f"forgot job-retired (token {retired.fencing_token})"
        assert [r["work_id"] for r in backend.rows()] == ["job-held"]


@pytest.mark.postgres
def test_sweep_and_migrate_print_json(postgres_dsn: str) -> None:
    swept = run("sweep", "--dsn", postgres_dsn, "--retention", "7d", "--json")
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout) == {"deleted": 0, "retention": "7d", "include_expired": False}
    dry = json.loads(run("sweep", "--dsn", postgres_dsn, "--retention", "7d", "--dry-run",
                         "--json").stdout)  # fmt: skip
    assert dry["would_delete"] == 0
    migrated = run("migrate", "--dsn", postgres_dsn, "--json")
    assert migrated.returncode == 0, migrated.stderr
    document = json.loads(migrated.stdout)
    assert (document["changed"], document["steps"], document["created"]) == (False, [], False)
    checked = json.loads(run("migrate", "--dsn", postgres_dsn, "--check", "--json").stdout)
    assert checked["current"] is True
    assert checked["version"] == checked["current_version"]
    both = run("migrate", "--dsn", postgres_dsn, "--sql", "--json")
    assert both.returncode == 1
    assert "does not go with --json" in both.stderr


def test_abbreviated_options_are_refused() -> None:
    """argparse would take --ret for --retention silently; here it is a usage error."""
    short = run("sweep", "--dsn", "host=127.0.0.1 port=1", "--ret", "7d")
    assert short.returncode == 2
    assert (
        "unrecognized arguments: --ret" in short.stderr or "required: --retention" in short.stderr
    )
    top = run("--vers")
    assert top.returncode == 2
