"""Private etcd clusters for the tests: members on loopback ports, data in a temporary
directory (in memory where /dev/shm exists), stopped at the end.

The ``etcd`` binary comes from Debian's ``etcd-server`` package (``.ci/run`` installs it) or
``WORKLEASE_TEST_ETCD`` (a path). Ports are picked free; a member that cannot bind (another
process took the port meanwhile) makes the whole start retry on new ports.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


class Unavailable(Exception):
    """No etcd binary was found, or no cluster could be started."""


def find_etcd() -> str | None:
    named = os.environ.get("WORKLEASE_TEST_ETCD")
    if named:
        return named
    return shutil.which("etcd") or (
        "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None
    )


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass(frozen=True)
class TLSFiles:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls(directory: Path) -> TLSFiles:
    """Certificates made with the openssl command line (valid for a day)."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
            "/CN=worklease-test-ca", "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject in (("server", "/CN=127.0.0.1"), ("client", "/CN=worklease-app")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "1", "-extfile", "san.cnf",
                "-out", f"{name}.pem")  # fmt: skip
    return TLSFiles(
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
        directory / "client.pem",
        directory / "client.key",
    )


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    scheme: str = "http"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"


@dataclass
class EtcdCluster:
    binary: str
    root: Path
    members: list[Member]
    heartbeat_ms: int
    election_ms: int
    token: str = field(default="")
    tls: TLSFiles | None = None
    extra_args: tuple[str, ...] = ()

    def http(self) -> httpx.Client:
        """A client that reaches the members (with the test CA and client certificate)."""
        if self.tls is None:
            return httpx.Client(timeout=2.0)
        import ssl

        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return httpx.Client(timeout=2.0, verify=context)

    @property
    def endpoints(self) -> list[str]:
        return [member.client_url for member in self.members]

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def _launch(self, member: Member, state: str) -> None:
        args = [
            self.binary,
            "--name", member.name,
            "--data-dir", str(member.data_dir),
            "--listen-client-urls", member.client_url,
            "--advertise-client-urls", member.client_url,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", self._initial_cluster(),
            "--initial-cluster-state", state,
            "--initial-cluster-token", self.token,
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--log-level", "warn",
            *self.extra_args,
        ]  # fmt: skip
        if self.tls is not None:
            args += [
                "--cert-file", str(self.tls.server_cert),
                "--key-file", str(self.tls.server_key),
                "--trusted-ca-file", str(self.tls.ca),
                "--client-cert-auth",
            ]  # fmt: skip
        log = member.log.open("ab")
        member.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        member.paused = False

    def start(self) -> None:
        for member in self.members:
            self._launch(member, "new")
        self.wait_healthy(timeout=30.0)

    def alive(self, member: Member) -> bool:
        return member.process is not None and member.process.poll() is None

    def wait_healthy(self, timeout: float = 20.0, members: list[Member] | None = None) -> None:
        """Until every given (running) member reports a leader."""
        deadline = time.monotonic() + timeout
        waiting = [m for m in (members or self.members) if self.alive(m) and not m.paused]
        while waiting:
            for member in list(waiting):
                if member.process is not None and member.process.poll() is not None:
                    raise Unavailable(f"etcd member {member.name} exited: {self.tail(member)}")
                with contextlib.suppress(httpx.HTTPError, ValueError), self.http() as client:
                    answer = client.get(member.client_url + "/health").json()
                    if answer.get("health") == "true":
                        waiting.remove(member)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(m.name for m in waiting)
                raise Unavailable(f"etcd member(s) {names} not healthy after {timeout}s")
            if waiting:
                time.sleep(0.05)

    def status(self, member: Member) -> dict[str, object]:
        answer: dict[str, object] = httpx.post(
            member.client_url + "/v3/maintenance/status", json={}, timeout=2.0
        ).json()
        return answer

    def leader(self, timeout: float = 20.0) -> Member:
        """The member that leads now (waits for an election to finish)."""
        deadline = time.monotonic() + timeout
        while True:
            for member in self.members:
                if not self.alive(member) or member.paused:
                    continue
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    status = self.status(member)
                    header = status["header"]
                    assert isinstance(header, dict)
                    if status.get("leader") and status["leader"] == header["member_id"]:
                        return member
            if time.monotonic() > deadline:
                raise Unavailable("no etcd leader")
            time.sleep(0.05)

    def kill(self, member: Member) -> None:
        """SIGKILL: the member dies at once, as in a crash."""
        if member.process is not None:
            if member.paused:
                member.process.send_signal(signal.SIGCONT)
            member.process.kill()
            member.process.wait(timeout=10)

    def restart(self, member: Member) -> None:
        """Start a killed member again on its data (it rejoins the cluster)."""
        self._launch(member, "existing")
        self.wait_healthy(members=[member])

    def pause(self, member: Member) -> None:
        """SIGSTOP: the member stops answering anyone (a partition, from the outside).
        Returns once every thread of it has stopped: a thread busy on another CPU stops only
        at its next entry into the kernel, and until then it may still answer a request (seen
        on a loaded machine: an answer 2 ms after the signal)."""
        assert member.process is not None
        member.process.send_signal(signal.SIGSTOP)
        member.paused = True
        tasks = Path(f"/proc/{member.process.pid}/task")
        deadline = time.monotonic() + 10.0
        while True:
            states = []
            for stat in tasks.glob("*/stat"):
                with contextlib.suppress(OSError):
                    # the state follows the command name in parentheses
                    states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
            if states and all(state in ("T", "t") for state in states):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"member {member.name} did not stop: {states}")
            time.sleep(0.001)

    def resume(self, member: Member) -> None:
        assert member.process is not None
        member.process.send_signal(signal.SIGCONT)
        member.paused = False

    def tail(self, member: Member, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(member.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                if member.paused:
                    member.process.send_signal(signal.SIGCONT)
                member.process.terminate()
        for member in self.members:
            if member.process is not None:
                try:
                    member.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    member.process.kill()
                    member.process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster(
    size: int = 3,
    *,
    heartbeat_ms: int = 50,
    election_ms: int = 500,
    tls: TLSFiles | None = None,
    extra_args: tuple[str, ...] = (),
) -> EtcdCluster:
    """A running cluster of ``size`` members with a leader; stop it with ``stop()``.
    ``tls``: serve clients over HTTPS and require a client certificate; ``extra_args``: more
    etcd flags (``--auth-token-ttl``, say)."""
    binary = find_etcd()
    if binary is None:
        raise Unavailable(
            "no etcd binary (install Debian's etcd-server or set WORKLEASE_TEST_ETCD)"
        )
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    last: Exception | None = None
    for _ in range(5):
        root = Path(tempfile.mkdtemp(prefix="worklease-etcd-", dir=base))
        ports = _free_ports(2 * size)
        members = [
            Member(
                f"m{i}",
                ports[2 * i],
                ports[2 * i + 1],
                root / f"m{i}",
                root / f"m{i}.log",
                scheme="https" if tls is not None else "http",
            )
            for i in range(size)
        ]
        cluster = EtcdCluster(
            binary, root, members, heartbeat_ms, election_ms, root.name, tls, extra_args
        )
        try:
            cluster.start()
        except Unavailable as exc:  # a port taken meanwhile, most likely: new ports
            last = exc
            cluster.stop()
            continue
        return cluster
    raise Unavailable(f"could not start an etcd cluster: {last}")


@contextlib.contextmanager
def cluster(size: int = 3, **kwargs: Any) -> Iterator[EtcdCluster]:
    started = start_cluster(size, **kwargs)
    try:
        yield started
    finally:
        started.stop()


# -- a gateway proxy that misbehaves on request ------------------------------------------------


class GatewayProxy:
    """An HTTP proxy in front of one member's JSON gateway, for cases that need the gateway to
    misbehave in a known way. Requests are forwarded as they come (one at a time per
    connection, keep-alive), answers are sent back whole; the release watch is not proxied.

    ``keepalive``: what reaches the member of a keepalive stream's lines. ``"all"``;
    ``"half"``: the first half (rounded up), the rest is dropped unanswered, as the gateway
    does when it starts answering before it has read a whole request (the answer comes back
    short and the dropped keepalives are never applied); ``"none"``: nothing, an empty
    answer.

    ``hold(path)``: answers to ``path`` are held, while the connection stays busy (a blank
    sent every 0.2 s keeps the client's read timeout from firing), until ``release()``.
    ``held`` counts the answers being held now; ``requests`` counts requests per path.
    """

    def __init__(self, target: str) -> None:
        import http.server
        import threading

        self.target = target
        self.keepalive = "all"
        self.requests: dict[str, int] = {}
        self.held = 0
        self._holding: set[str] = set()
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._client = httpx.Client(
            timeout=30.0, limits=httpx.Limits(max_connections=None, max_keepalive_connections=64)
        )
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                proxy._handle(self)

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False
            request_queue_size = 512

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(0.05,),  # the poll interval: a close does not wait half a second
            name="test-gateway-proxy",
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def hold(self, path: str) -> None:
        with self._lock:
            self._holding.add(path)
            self._released.clear()

    def release(self) -> None:
        with self._lock:
            self._holding.clear()
            self._released.set()

    def _handle(self, handler: Any) -> None:
        path = handler.path
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        with self._lock:
            self.requests[path] = self.requests.get(path, 0) + 1
            holding = path in self._holding
        if path == "/v3/lease/keepalive":
            lines = [line for line in body.split(b"\n") if line.strip()]
            if self.keepalive == "half":
                lines = lines[: (len(lines) + 1) // 2]
            elif self.keepalive == "none":
                lines = []
            body = b"\n".join(lines)
        if path == "/v3/lease/keepalive" and not body:
            status, answer, kind = 200, b"", "application/json"
        else:
            headers = {
                name: handler.headers[name]
                for name in ("Content-Type", "Authorization")
                if handler.headers.get(name)
            }
            forwarded = self._client.post(self.target + path, content=body, headers=headers)
            status, answer = forwarded.status_code, forwarded.content
            kind = forwarded.headers.get("Content-Type", "application/json")
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        if not holding:
            handler.send_header("Content-Length", str(len(answer)))
            handler.end_headers()
            handler.wfile.write(answer)
            return
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        with self._lock:
            self.held += 1
        try:
            while not self._released.wait(0.2):
                handler.wfile.write(b"1\r\n \r\n")  # a blank: JSON allows it before the value
                handler.wfile.flush()
            if answer:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(answer), answer))
            handler.wfile.write(b"0\r\n\r\n")
        finally:
            with self._lock:
                self.held -= 1

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def __enter__(self) -> GatewayProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lease_ttls(cluster: EtcdCluster, leases: list[int]) -> dict[int, int]:
    """Each etcd lease's TTL left, in seconds, as the cluster reports it (-1: gone)."""
    found: dict[int, int] = {}
    with cluster.http() as client:
        for lease in leases:
            answer = client.post(
                cluster.endpoints[0] + "/v3/lease/timetolive", json={"ID": str(lease)}
            ).json()
            found[lease] = int(answer.get("TTL", -1))
    return found


def _keys(cluster: EtcdCluster, prefix: str) -> list[tuple[str, bytes, int]]:
    """(work ID, kind of key, its etcd lease) of every key under a backend's ``prefix`` (read
    from etcd directly: the backend's key layout, ADR-0013)."""
    import base64

    start = prefix.encode() + b"\x00"
    end = prefix.encode() + b"\x01"
    with cluster.http() as client:
        answer = client.post(
            cluster.endpoints[0] + "/v3/kv/range",
            json={
                "key": base64.b64encode(start).decode(),
                "range_end": base64.b64encode(end).decode(),
                "keys_only": True,
            },
        ).json()
    found: list[tuple[str, bytes, int]] = []
    for kv in answer.get("kvs", ()):
        key = base64.b64decode(kv["key"])[len(start) :]
        work_id, _, kind = key.rpartition(b"\x00")
        found.append((work_id.decode(), kind, int(kv.get("lease", 0))))
    return found


def hold_leases(cluster: EtcdCluster, prefix: str) -> dict[str, int]:
    """Work ID -> the etcd lease its hold key is attached to, for the held work IDs of a
    backend's ``prefix``."""
    return {work_id: lease for work_id, kind, lease in _keys(cluster, prefix) if kind == b"h"}


def work_ids(cluster: EtcdCluster, prefix: str) -> set[str]:
    """The work IDs that have keys under a backend's ``prefix``: every one ever granted (and
    not swept or forgotten since)."""
    return {work_id for work_id, _, _ in _keys(cluster, prefix)}
