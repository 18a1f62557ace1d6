"""Private Redis servers for the tests: ``redis-server`` (Debian's package; ``.ci/run``
installs it, or ``WORKLEASE_TEST_REDIS`` names the binary) on a free loopback port, data in
a temporary directory, stopped at the end. A Redis that may answer on 6379 is never used."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
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


@dataclass
class RedisServer:
    port: int
    directory: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


def start(*extra: str, attempts: int = 3) -> RedisServer:
    """A standalone server with persistence off (tests that need it pass their own options)."""
    binary = find_redis_server()
    if binary is None:
        raise Unavailable("no redis-server binary (apt-get install redis-server)")
    last = ""
    for _ in range(attempts):
        port = _free_port()
        directory = Path(tempfile.mkdtemp(prefix="worklease-redis-"))
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
        server.stop()
    raise Unavailable(f"redis-server did not start: {last.strip()[:500]}")
