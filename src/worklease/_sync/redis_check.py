# Generated from src/worklease/_async/redis_check.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""``worklease check --redis``, written once for both flavours: asks the servers; the
judgements live in ``worklease._redis_check``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._check import CheckFinding, CheckReport, redact
from .._failures import first_line
from .._redis import DEFAULT_PREFIX, parse_redis_url, redact_url
from .._redis_check import (
    NodeFacts,
    judge_clock,
    judge_cluster,
    judge_connection,
    judge_eviction,
    judge_failover,
    judge_memory,
    judge_partitions,
    judge_persistence,
    judge_replication,
    judge_scripts,
)
from .._sredis import ClusterClient, ConnectionPool, RedisClient
from .._validation import check_ttl, positive_seconds
from ..errors import BackendError, WorkleaseError
from .redis import RedisBackend

__all__ = ["check_redis"]

_PROBE = "worklease-check-probe"


def check_redis(
    target: str | RedisClient | ClusterClient,
    *,
    prefix: str = DEFAULT_PREFIX,
    ttl: float = 30.0,
    replicas: int = 0,
    timeout: float = 5.0,
) -> CheckReport:
    """Check a Redis deployment for worklease; what it finds is reported, not raised.

    ``target``: a Redis URL as ``RedisBackend.from_url`` takes it (standalone, Cluster or
    Sentinel), or a client of this flavour. Checks, in order: the connection (version, that
    it reached a primary), whether the lease scripts load and run (a read-only probe), then
    on every primary: persistence (no AOF and no snapshots warns: a restart loses every
    lease), the eviction policy (one that can evict keys without a TTL fails: lease rows
    have none), ``maxmemory``, replicas (none warns; fewer than ``replicas`` fails),
    ``min-replicas-to-write`` (what a partitioned primary accepts), the clocks of the
    servers against each other and this client, the failover detection time against
    ``ttl`` (Sentinel's ``down-after-milliseconds``, the Cluster's ``cluster-node-timeout``),
    and a Cluster's state. No detail shows a password.
    """
    seconds = check_ttl(ttl)
    wait = positive_seconds(timeout, "timeout", maximum=300.0)
    kind: str
    if isinstance(target, str):
        parsed = parse_redis_url(target)
        where, kind, secret = redact_url(target), parsed.kind, parsed.password
        backend = RedisBackend.from_url(
            target, prefix=prefix, replicas=replicas if parsed.kind != "cluster" else 0,
            timeout=wait,
        )  # fmt: skip
    else:
        backend = RedisBackend(target, prefix=prefix)
        kind = "cluster" if isinstance(target, ClusterClient) else _kind_of(target)
        where, secret = _address(target), None
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be an int of 0 or more, got {replicas!r}")
    try:
        findings = _findings(backend, kind, where, seconds, replicas)
    finally:
        backend.close()
    return redact(findings, [secret] if secret else [])


def _findings(
    backend: RedisBackend, kind: str, where: str, ttl: float, replicas: int
) -> list[CheckFinding]:
    client: Any = backend.client
    try:
        client.ping()
    except Exception as exc:
        return [
            CheckFinding("connection", "fail", f"{where}: {type(exc).__name__}: {first_line(exc)}")
        ]
    if isinstance(client, ClusterClient):
        primaries = client.get_primaries()  # type: ignore[no-untyped-call,unused-ignore]
        nodes = [(node.name, _on(client, node)) for node in primaries]
    else:
        nodes = [(where, _on(client, None))]
    try:
        facts = [_facts(name, ask, client) for name, ask in nodes]
    except Exception as exc:
        return [
            CheckFinding("connection", "fail", f"{where}: {type(exc).__name__}: {first_line(exc)}")
        ]
    findings = [judge_connection(where, kind, facts)]
    if findings[0].status == "fail":
        return findings
    try:
        backend.find_available([_PROBE])
        findings.append(judge_scripts(None))
    except WorkleaseError as exc:
        findings.append(judge_scripts(first_line(exc)))
    detection = _detection(backend, kind, nodes[0][1])
    findings += [
        judge_persistence(facts),
        judge_eviction(facts),
        judge_memory(facts),
        judge_replication(kind, facts, replicas),
        judge_partitions(facts),
        judge_clock(facts, detection),
        judge_failover(kind, detection, ttl),
    ]
    if isinstance(client, ClusterClient):
        cluster = judge_cluster(_answer(nodes[0][1], "CLUSTER INFO"))
        if cluster is not None:
            findings.append(cluster)
    return findings


def _on(client: Any, node: Any) -> Callable[..., Any]:
    """A command sender for one primary (a Cluster's node, or the client's own server)."""
    if node is None:
        sender: Callable[..., Any] = client.execute_command
        return sender

    def ask(*args: Any) -> Any:
        return client.execute_command(*args, target_nodes=node)

    return ask


def _answer(ask: Callable[..., Any], *args: Any) -> Any:
    """The reply, or ``None`` when the server refused the command (ACL, renamed CONFIG)."""
    try:
        return ask(*args)
    except Exception:
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _config(ask: Callable[..., Any], name: str) -> str | None:
    reply = _answer(ask, "CONFIG", "GET", name)
    if not isinstance(reply, dict):
        return None
    for key, value in reply.items():
        if _text(key) == name:
            return _text(value)
    return None


def _clock(ask: Callable[..., Any]) -> tuple[float, float, float]:
    """``(server time, offset to this client, round trip)`` in seconds."""
    sent = time.time()
    seconds, micros = ask("TIME")
    back = time.time()
    server = int(seconds) + int(micros) / 1e6
    return server, server - (sent + back) / 2, back - sent


def _facts(name: str, ask: Callable[..., Any], client: Any) -> NodeFacts:
    facts = NodeFacts(name)
    server = _answer(ask, "INFO", "server") or {}
    facts.version = str(server.get("redis_version", ""))
    replication = _answer(ask, "INFO", "replication") or {}
    facts.role = str(replication.get("role", ""))
    facts.replicas = int(replication.get("connected_slaves", 0) or 0)
    for key, value in replication.items():
        if str(key).startswith("slave") and isinstance(value, dict) and "port" in value:
            facts.replica_addresses.append((str(value.get("ip")), int(value["port"])))
    persistence = _answer(ask, "INFO", "persistence")
    if isinstance(persistence, dict) and "aof_enabled" in persistence:
        facts.aof = bool(int(persistence["aof_enabled"]))
    facts.appendfsync = _config(ask, "appendfsync")
    facts.save = _config(ask, "save")
    memory = _answer(ask, "INFO", "memory") or {}
    facts.policy = _text(memory.get("maxmemory_policy"))
    facts.maxmemory = int(memory["maxmemory"]) if "maxmemory" in memory else None
    facts.used_memory = int(memory["used_memory"]) if "used_memory" in memory else None
    least = _config(ask, "min-replicas-to-write")
    facts.min_replicas_to_write = int(least) if least is not None and least.isdigit() else None
    _, facts.clock_offset, facts.round_trip = _clock(ask)
    for host, port in facts.replica_addresses:
        address = f"{host}:{port}"
        try:
            replica_offset = _replica_offset(client, host, port)
        except Exception as exc:
            facts.replica_clocks[address] = f"{type(exc).__name__}: {first_line(exc)}"
            continue
        facts.replica_clocks[address] = replica_offset - facts.clock_offset
    return facts


def _replica_offset(client: Any, host: str, port: int) -> float:
    """A replica's clock minus this client's, read on a connection of its own with the
    client's credentials."""
    if isinstance(client, ClusterClient):
        node = client.get_node(host=host, port=port)  # type: ignore[no-untyped-call,unused-ignore]
        if node is None:
            raise BackendError("not a node this Cluster client knows")
        _, offset, _ = _clock(_on(client, node))
        return offset
    pool = client.connection_pool
    options = dict(pool.connection_kwargs)
    for name in ("host", "port", "path"):
        options.pop(name, None)
    # The primary's connection class and options (credentials, TLS), another address; a
    # Sentinel pool's class asks the sentinels for its address, so a plain one is used there.
    connection_class = pool.connection_class
    if getattr(pool, "service_name", None):
        connection_class = RedisClient().connection_pool.connection_class
        for name in ("connection_pool", "is_master", "check_connection"):
            options.pop(name, None)
    replica = RedisClient(
        connection_pool=ConnectionPool(
            connection_class=connection_class, host=host, port=port, **options
        )
    )
    try:
        replica.ping()  # connected first: the timed round trip is one
        _, offset, _ = _clock(replica.execute_command)
    finally:
        replica.close()
    return offset


def _detection(backend: RedisBackend, kind: str, ask: Callable[..., Any]) -> float | None:
    """Seconds until a failed primary is noticed: Sentinel's ``down-after-milliseconds``, a
    Cluster's ``cluster-node-timeout``; ``None`` when it cannot be read (or standalone)."""
    if kind == "cluster":
        value = _config(ask, "cluster-node-timeout")
        return int(value) / 1000 if value is not None and value.isdigit() else None
    if kind != "sentinel":
        return None
    sentinel = backend._owned[1] if backend._owned is not None else None
    if sentinel is None:
        return None
    name = getattr(getattr(backend.client, "connection_pool", None), "service_name", None)
    for connection in sentinel.sentinels:
        try:
            master = connection.sentinel_master(name)
        except Exception:
            continue
        value = master.get("down-after-milliseconds") if isinstance(master, dict) else None
        if value is not None:
            return int(value) / 1000
    return None


def _kind_of(client: Any) -> str:
    pool = getattr(client, "connection_pool", None)
    return "sentinel" if getattr(pool, "service_name", None) else "standalone"


def _address(client: Any) -> str:
    options = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if "path" in options:
        return f"unix://{options['path']}"
    return f"{options.get('host', '?')}:{options.get('port', '?')}"
