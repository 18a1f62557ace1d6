"""Redis faults beyond a Sentinel failover (issue 27; that one: test_redis_failover.py):
a crash of a server with ``appendfsync always`` (no acknowledged checkpoint lost), a
stopped client fenced after a takeover, ``CLUSTER FAILOVER`` of a slot's master under a
live holder, and the script cache flushed while holders write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("redis")

import redis
from redis.cluster import RedisCluster

from tests import redis_servers
from worklease import (
    BackendError,
    ExitMode,
    Lease,
    LeaseLostError,
    RedisBackend,
)

from .conftest import scaled

pytestmark = [pytest.mark.redis, pytest.mark.faults]

WORKER = Path(__file__).with_name("redis_holder_worker.py")


class Writer:
    """A thread checkpointing ``n`` = 1, 2, ... through ``backend``; ``acked`` is the last
    write that returned."""

    def __init__(self, backend: RedisBackend, work_id: str, ttl: float = 30.0) -> None:
        self.backend = backend
        self.token = backend.acquire(work_id, "writer", ttl)
        self.ttl = ttl
        self.acked = 0
        self.failures: list[Exception] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = self.acked
        while not self.stop.is_set():
            n += 1
            try:
                self.backend.checkpoint(self.token, str(n).encode(), self.ttl)
            except BackendError as exc:
                self.failures.append(exc)
                time.sleep(0.05)
                continue
            except LeaseLostError as exc:
                self.failures.append(exc)
                return
            self.acked = n

    def join(self) -> None:
        self.stop.set()
        self.thread.join(10)


def test_a_crash_with_appendfsync_always_loses_no_acknowledged_checkpoint() -> None:
    """kill -9 of the server while holders checkpoint; started again on its AOF, it has
    every checkpoint a holder saw acknowledged (and each lease, with its token)."""
    rounds = scaled(2, 10)
    server = redis_servers.start("--appendonly", "yes", "--appendfsync", "always")
    port, directory = server.port, server.directory
    try:
        for round_number in range(rounds):
            client = redis.Redis.from_url(server.url, socket_timeout=2)
            backend = RedisBackend(client, prefix=f"aof-{round_number}:")
            writers = [Writer(backend, f"job-{n}") for n in range(4)]
            time.sleep(0.3)
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait(10)
            for writer in writers:
                writer.join()
            acked = {writer.token.work_id: writer.acked for writer in writers}
            assert all(count > 0 for count in acked.values())
            server = redis_servers.start(
                "--appendonly", "yes", "--appendfsync", "always", port=port, directory=directory
            )
            for writer in writers:
                stored = backend.read_checkpoint(writer.token)  # the token survived too
                assert int(stored.state or b"0") >= acked[writer.token.work_id], writer.token
                backend.release(writer.token, ExitMode.FINISHED)
            client.close()
    finally:
        server.stop()


def test_a_stopped_client_is_fenced_after_a_takeover(redis_server: Any) -> None:
    """A holder process is stopped (SIGSTOP) past its TTL; a rival takes the work ID over;
    continued, the holder's next write is refused and the rival's state stands."""
    prefix = f"stop-{uuid.uuid4().hex[:8]}:"
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), "--url", redis_server.url, "--prefix", prefix,
         "--work-id", "job", "--ttl", "1"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        first = json.loads(worker.stdout.readline())
        assert first["ack"] == 1
        os.kill(worker.pid, signal.SIGSTOP)
        rival_backend = RedisBackend.from_url(redis_server.url, prefix=prefix)
        rival = Lease(rival_backend, holder_id="rival", ttl=30)
        token = rival.acquire("job", wait=True, timeout=20)
        assert token.fencing_token > first["token"]
        rival.checkpoint(token, b"rival's")
        os.kill(worker.pid, signal.SIGCONT)
        lines = [json.loads(line) for line in worker.stdout]
        assert worker.wait(20) == 0
        # Refused by the server (fenced), or before sending by the holder itself once its
        # renewal window ran out in the stop: either way no write of it lands.
        assert lines[-2]["lost"] in ("FencedError", "LeaseWindowExhaustedError"), lines
        assert lines[-1] == {"direct": "FencedError"}  # and the server refuses it
        assert (rival.read_checkpoint(token)).state == b"rival's"
        rival.release(token, ExitMode.FINISHED)
        rival_backend.close()
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
            worker.wait(10)
        if worker.stdout is not None:
            worker.stdout.close()


def test_cluster_failover_of_a_slot_master_keeps_the_holder() -> None:
    """``CLUSTER FAILOVER`` on the replica of the master holding a work ID's slot: the holder
    goes on writing through the redirect (MOVED), keeps its lease and every checkpoint, and
    the next token is greater."""
    cluster = redis_servers.start_cluster(3, replicas=1)
    try:
        client = RedisCluster.from_url(cluster.url, socket_timeout=2)
        backend = RedisBackend(client, prefix="cf:")
        writer = Writer(backend, "job")
        time.sleep(0.3)
        key = backend._key("job")
        master = client.get_node_from_key(key)  # type: ignore[no-untyped-call,unused-ignore]
        assert master is not None
        replica = next(
            port
            for port in cluster.ports
            if f"master_port:{master.port}" in redis_servers.command(port, "info", "replication")
        )
        assert redis_servers.command(replica, "cluster", "failover") == "OK"
        deadline = time.monotonic() + 30
        while "role:master" not in redis_servers.command(replica, "info", "replication"):
            assert time.monotonic() < deadline, "the replica did not take over"
            time.sleep(0.1)
        acked_at_switch = writer.acked
        time.sleep(0.5)
        writer.join()
        assert writer.acked > acked_at_switch  # it kept writing on the new master
        assert not [f for f in writer.failures if isinstance(f, LeaseLostError)]
        stored = backend.read_checkpoint(writer.token)
        assert int(stored.state or b"0") == writer.acked
        backend.renew(writer.token, 30)
        backend.release(writer.token, ExitMode.FINISHED)
        successor = backend.acquire("job", "next", 30)
        assert successor.fencing_token > writer.token.fencing_token
        assert client.get_node_from_key(key).port == replica  # type: ignore[no-untyped-call,union-attr,unused-ignore]
        client.close()
    finally:
        cluster.stop()


def test_a_flushed_script_cache_mid_run_costs_no_write(redis_server: Any) -> None:
    """``SCRIPT FLUSH`` again and again while holders checkpoint and renew: every write is
    loaded again and goes through; none fails."""
    client = redis.Redis.from_url(redis_server.url)
    backend = RedisBackend(client, prefix=f"flush-{uuid.uuid4().hex[:8]}:")
    writers = [Writer(backend, f"job-{n}") for n in range(3)]
    tokens = [backend.acquire(f"batch-{n}", "h", 30) for n in range(20)]
    for _ in range(20):
        client.script_flush()
        assert backend.renew_many(tokens, 30) == [None] * len(tokens)
        time.sleep(0.01)
    for writer in writers:
        writer.join()
        assert writer.failures == []
        assert writer.acked > 0
        assert backend.read_checkpoint(writer.token).state == str(writer.acked).encode()
    client.close()
