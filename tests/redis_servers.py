"""Private Redis servers for the tests: ``redis-server`` (Debian's package; ``.ci/run``
installs it, or ``WORKLEASE_TEST_REDIS`` names the binary) on a free loopback port, data in
a temporary directory, stopped at the end. A Redis that may answer on 6379 is never used."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


class Unavailable(Exception):
    """No redis-server binary was found, or it did not start."""


def find_redis_server() -> str | None:
    named = os.environ.get("WORKLEASE_TEST_REDIS")
    if named:
        return named
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too, both below the kernel's
    ephemeral range (where an outgoing connection could take one meanwhile): Cluster ports
    must be at most 55535."""
    for _ in range(200):
        port = random.randrange(12000, 22000)
        if _is_free(port) and _is_free(port + 10000):
            return port
    raise Unavailable("no free port pair for a Redis Cluster node")


@dataclass
class RedisServer:
    port: int
    directory: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self, *, keep_files: bool = False) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if not keep_files:
            shutil.rmtree(self.directory, ignore_errors=True)


def start(
    *extra: str,
    attempts: int = 3,
    cluster: bool = False,
    port: int | None = None,
    directory: Path | None = None,
) -> RedisServer:
    """A standalone server with persistence off (tests that need it pass their own options);
    ``cluster``: a node of a Redis Cluster yet to be formed; ``port`` and ``directory``: a
    server started again where an earlier one ran (its data files kept)."""
    binary = find_redis_server()
    if binary is None:
        raise Unavailable("no redis-server binary (apt-get install redis-server)")
    last = ""
    chosen, kept = port, directory
    for _ in range(attempts):
        port = chosen or (_cluster_port() if cluster else _free_port())
        if cluster:
            extra = (*extra, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                     "--cluster-config-file", "nodes.conf")  # fmt: skip
        directory = kept or Path(tempfile.mkdtemp(prefix="worklease-redis-"))
        log = directory / "redis.log"
        with log.open("wb") as output:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(directory), "--daemonize", "no", *extra],
                stdout=output,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        server = RedisServer(port, directory, process)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return server
            except OSError:
                time.sleep(0.05)
        last = log.read_text(errors="replace")[-500:] if log.exists() else ""
        server.stop(keep_files=kept is not None)
    raise Unavailable(f"redis-server did not start: {last.strip()[:500]}")


def command(port: int, *args: str, timeout: float = 10) -> str:
    """One command through ``redis-cli`` (its reply as text)."""
    cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
    done = subprocess.run(
        [cli, "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.stdout.strip()


@dataclass
class RedisCluster:
    """A private Redis Cluster: ``masters`` masters, each with ``replicas`` replicas."""

    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def wait_ok(self, ports: Sequence[int] | None = None, timeout: float = 30) -> None:
        """Until every node (of ``ports``) reports the cluster ``ok`` with every slot served."""
        deadline = time.monotonic() + timeout
        pending = list(ports if ports is not None else self.ports)
        while pending and time.monotonic() < deadline:
            info = command(pending[0], "cluster", "info")
            if "cluster_state:ok" in info and "cluster_slots_ok:16384" in info:
                pending.pop(0)
            else:
                time.sleep(0.1)
        if pending:
            raise Unavailable(
                f"the Redis Cluster did not settle: {command(pending[0], 'cluster', 'info')}"
            )


def start_cluster(masters: int = 3, replicas: int = 0, attempts: int = 3) -> RedisCluster:
    """A Redis Cluster of ``masters`` masters (and ``replicas`` replicas each) on loopback
    ports, formed with ``redis-cli --cluster create``."""
    last = ""
    for _ in range(attempts):
        cluster = RedisCluster()
        try:
            for _ in range(masters * (1 + replicas)):
                cluster.nodes.append(start(cluster=True))
            if masters * (1 + replicas) < 3:  # redis-cli --cluster create wants 3 nodes
                if replicas:
                    raise Unavailable("a Cluster with replicas needs at least 3 nodes here")
                command(cluster.ports[0], "cluster", "addslotsrange", "0", "16383")
                cluster.wait_ok()
                return cluster
            cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
            created = subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in cluster.ports),
                 "--cluster-replicas", str(replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if created.returncode != 0:
                output = (created.stdout + created.stderr)[-400:]
                raise Unavailable(f"redis-cli --cluster create failed: {output}")
            cluster.wait_ok()
            if replicas:
                _wait_replicas(cluster, masters * replicas)
            return cluster
        except (Unavailable, OSError, subprocess.SubprocessError) as exc:
            last = str(exc)
            cluster.stop()
    raise Unavailable(f"no Redis Cluster: {last[:500]}")


def _wait_replicas(cluster: RedisCluster, expected: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = command(cluster.ports[0], "cluster", "nodes")
        linked = sum(1 for line in nodes.splitlines() if " slave " in line and " connected" in line)
        synced = all(
            "master_link_status:up" in command(port, "info", "replication")
            for port in cluster.ports
            if "role:slave" in command(port, "info", "replication")
        )
        if linked >= expected and synced:
            return
        time.sleep(0.2)
    raise Unavailable("the Redis Cluster's replicas did not link up")


@dataclass
class SentinelGroup:
    """A primary, its replicas and the sentinels that watch them (master name ``MASTER``)."""

    primary: RedisServer
    replicas: list[RedisServer]
    sentinels: list[RedisServer]

    MASTER = "worklease-test"

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", sentinel.port) for sentinel in self.sentinels]

    def master_port(self) -> int | None:
        """The port the sentinels name as the master now (``None`` when they cannot say)."""
        for sentinel in self.sentinels:
            reply = command(
                sentinel.port, "sentinel", "get-master-addr-by-name", self.MASTER, timeout=5
            )
            lines = reply.splitlines()
            if len(lines) == 2 and lines[1].isdigit():
                return int(lines[1])
        return None

    def stop(self) -> None:
        for server in [*self.sentinels, *self.replicas, self.primary]:
            server.stop()


def start_sentinel_group(
    replicas: int = 1, sentinels: int = 3, down_after_ms: int = 1000
) -> SentinelGroup:
    """A primary with ``replicas`` asynchronous replicas and ``sentinels`` sentinels (quorum:
    a majority), every replica linked and every sentinel aware of the others."""
    primary = start()
    group = SentinelGroup(primary, [], [])
    try:
        for _ in range(replicas):
            group.replicas.append(start("--replicaof", "127.0.0.1", str(primary.port)))
        _wait_linked(primary.port, replicas)
        quorum = sentinels // 2 + 1
        for _ in range(sentinels):
            group.sentinels.append(_start_sentinel(primary.port, quorum, down_after_ms))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            known = [
                command(s.port, "sentinel", "master", SentinelGroup.MASTER) for s in group.sentinels
            ]
            if all(_field(k, "num-other-sentinels") == str(sentinels - 1) for k in known) and all(
                _field(k, "num-slaves") == str(replicas) for k in known
            ):
                return group
            time.sleep(0.2)
        raise Unavailable("the sentinels did not find each other and the replicas")
    except BaseException:
        group.stop()
        raise


def _field(reply: str, name: str) -> str | None:
    lines = reply.splitlines()
    for index in range(0, len(lines) - 1, 2):
        if lines[index] == name:
            return lines[index + 1]
    return None


def _wait_linked(port: int, replicas: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = command(port, "info", "replication")
        if f"connected_slaves:{replicas}" in info and info.count("state=online") == replicas:
            return
        time.sleep(0.1)
    raise Unavailable(f"the replicas did not link up: {command(port, 'info', 'replication')}")


def _start_sentinel(primary_port: int, quorum: int, down_after_ms: int) -> RedisServer:
    binary = find_redis_server()
    if binary is None:
        raise Unavailable("no redis-server binary (apt-get install redis-server)")
    port = _free_port()
    directory = Path(tempfile.mkdtemp(prefix="worklease-sentinel-"))
    config = directory / "sentinel.conf"
    name = SentinelGroup.MASTER
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
        f"sentinel monitor {name} 127.0.0.1 {primary_port} {quorum}\n"
        f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
        f"sentinel failover-timeout {name} 10000\n"
        f"sentinel parallel-syncs {name} 1\n"
    )
    log = directory / "sentinel.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [binary, str(config), "--sentinel"], stdout=output, stderr=subprocess.STDOUT
        )
    server = RedisServer(port, directory, process)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and process.poll() is None:
        if command(port, "ping", timeout=2) == "PONG":
            return server
        time.sleep(0.05)
    server.stop()
    raise Unavailable(f"redis-sentinel did not start: {log.read_text(errors='replace')[-300:]}")
