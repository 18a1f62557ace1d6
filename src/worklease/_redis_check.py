"""``worklease check --redis``: the judgements over what the servers said (no I/O;
``_async/redis_check.py`` asks). ADR-0020 states the premises these findings check:
persistence decides what a crash loses, replication what a failover loses, an eviction
policy must never drop lease rows, and the servers' clocks must differ by less than the
failover detection time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ._check import CLOCK_OFFSET_WARN, CheckFinding
from ._duration import format_duration

__all__ = ["NodeFacts"]

NEAR_FULL = 0.8
"""Above this share of ``maxmemory``, ``memory`` warns."""
EVICTS_ANY_KEY = ("allkeys-lru", "allkeys-lfu", "allkeys-random")
EVICTS_VOLATILE = ("volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl")


@dataclass
class NodeFacts:
    """What one primary reported (``None``: it would not say, e.g. ``CONFIG`` refused)."""

    name: str
    version: str = ""
    role: str = ""
    replicas: int = 0
    replica_addresses: list[tuple[str, int]] = field(default_factory=list)
    aof: bool | None = None
    appendfsync: str | None = None
    save: str | None = None
    policy: str | None = None
    maxmemory: int | None = None
    used_memory: int | None = None
    min_replicas_to_write: int | None = None
    clock_offset: float = 0.0
    """This server's clock minus the client's, in seconds (midpoint of the round trip)."""
    round_trip: float = 0.0
    replica_clocks: dict[str, float | str] = field(default_factory=dict)
    """Replica address -> its clock minus this primary's in seconds, or why it was not read."""


def _names(nodes: Sequence[NodeFacts]) -> str:
    return ", ".join(node.name for node in nodes)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        parts.append(int(piece) if piece.isdigit() else 0)
    return tuple(parts)


def judge_connection(where: str, kind: str, nodes: Sequence[NodeFacts]) -> CheckFinding:
    versions = sorted({node.version for node in nodes})
    shown = "/".join(versions) or "unknown"
    detail = f"Redis {shown} at {where} ({kind}"
    detail += f", {len(nodes)} masters)" if kind == "cluster" else ")"
    replicas = [node for node in nodes if node.role != "master"]
    if replicas:
        return CheckFinding(
            "connection",
            "fail",
            f"{detail}: {_names(replicas)} is a replica (read-only); point at the primary",
        )
    oldest = min((_version(v) for v in versions), default=(0,))
    if oldest < (5,):
        return CheckFinding(
            "connection", "fail", f"{detail}: needs Redis 5 or later (scripts' effects replicated)"
        )
    if oldest < (7,):
        return CheckFinding("connection", "warn", f"{detail}: tested on Redis 7")
    return CheckFinding("connection", "ok", detail)


def judge_scripts(error: str | None) -> CheckFinding:
    if error is not None:
        return CheckFinding(
            "scripts",
            "fail",
            f"a server-side script did not run ({error}): every lease operation is one "
            "(EVALSHA, SCRIPT LOAD); the user needs +@scripting",
        )
    return CheckFinding("scripts", "ok", "the lease scripts load and run (read-only probe)")


def judge_persistence(nodes: Sequence[NodeFacts]) -> CheckFinding:
    """Persistence off warns: a restart loses every lease row and checkpoint."""
    off = [n for n in nodes if n.aof is False and not n.save]
    snapshots = [n for n in nodes if n.aof is False and n.save]
    loose = [n for n in nodes if n.aof and n.appendfsync == "no"]
    unknown = [n for n in nodes if n.aof is None]
    if off:
        return CheckFinding(
            "persistence",
            "warn",
            f"no AOF and no snapshots on {_names(off)}: a restart loses every lease and "
            "checkpoint (tokens stay safe); set appendonly yes",
        )
    if snapshots:
        return CheckFinding(
            "persistence",
            "warn",
            f"snapshots only (save {snapshots[0].save!r}) on {_names(snapshots)}: a crash loses "
            "the checkpoints since the last snapshot; set appendonly yes",
        )
    if loose:
        return CheckFinding(
            "persistence",
            "warn",
            f"appendfsync no on {_names(loose)}: the OS decides when the AOF reaches disk; a "
            "crash can lose about 30 s of checkpoints (everysec: 1 s; always: none)",
        )
    if unknown:
        return CheckFinding(
            "persistence", "warn", f"could not read the persistence settings of {_names(unknown)}"
        )
    fsync = sorted({str(n.appendfsync) for n in nodes})
    if fsync == ["always"]:
        return CheckFinding(
            "persistence", "ok", "AOF with appendfsync always: acknowledged writes survive a crash"
        )
    shown = "/".join(fsync) if fsync != ["None"] else "unknown (CONFIG GET refused)"
    return CheckFinding(
        "persistence",
        "ok",
        f"AOF, appendfsync {shown}: a crash can lose the last second of writes "
        "(appendfsync always: none)",
    )


def judge_eviction(nodes: Sequence[NodeFacts]) -> CheckFinding:
    """A policy that may evict keys without a TTL fails: lease rows have none."""
    any_key = [n for n in nodes if n.policy in EVICTS_ANY_KEY]
    if any_key:
        return CheckFinding(
            "eviction",
            "fail",
            f"maxmemory-policy {any_key[0].policy} on {_names(any_key)} can evict lease rows: a "
            "holder's lease and checkpoint would vanish; use noeviction (or volatile-* on a "
            "server of its own)",
        )
    volatile = [n for n in nodes if n.policy in EVICTS_VOLATILE]
    if volatile:
        return CheckFinding(
            "eviction",
            "warn",
            f"maxmemory-policy {volatile[0].policy} on {_names(volatile)}: lease rows have no "
            "TTL and stay, but a forgotten row's short-lived tombstone may go early; "
            "noeviction is safest",
        )
    unknown = [n for n in nodes if n.policy is None]
    if unknown:
        return CheckFinding(
            "eviction", "warn", f"could not read maxmemory-policy of {_names(unknown)}"
        )
    return CheckFinding("eviction", "ok", "noeviction: no lease row is ever evicted")


def judge_memory(nodes: Sequence[NodeFacts]) -> CheckFinding:
    limited = [n for n in nodes if n.maxmemory]
    if not limited:
        return CheckFinding(
            "memory", "ok", "no maxmemory limit (the machine's memory is the bound)"
        )
    full = [
        n
        for n in limited
        if n.used_memory is not None and n.maxmemory and n.used_memory > NEAR_FULL * n.maxmemory
    ]
    sizes = ", ".join(
        f"{n.name} {_mib(n.used_memory or 0)} of {_mib(n.maxmemory or 0)}" for n in limited
    )
    if full:
        return CheckFinding(
            "memory",
            "warn",
            f"near maxmemory ({sizes}): at the limit every write, renewals included, is "
            "refused (OOM) under noeviction",
        )
    return CheckFinding("memory", "ok", f"maxmemory set ({sizes})")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def judge_replication(kind: str, nodes: Sequence[NodeFacts], wanted: int) -> CheckFinding:
    """No replica warns (a server failure stops every lease); fewer than ``replicas=`` fails
    (every write would be refused)."""
    short = [n for n in nodes if n.replicas < wanted]
    if short:
        return CheckFinding(
            "replication",
            "fail",
            f"replicas={wanted}, but {_names(short)} has {short[0].replicas} replica(s): every "
            "renew and checkpoint would wait and fail",
        )
    alone = [n for n in nodes if n.replicas == 0]
    if alone:
        return CheckFinding(
            "replication",
            "warn",
            f"no replica of {_names(alone)}: while it is down no lease can be acquired, "
            "renewed or checkpointed"
            + ("" if kind != "standalone" else " (and Sentinel or Cluster cannot fail over)"),
        )
    counts = "/".join(sorted({str(n.replicas) for n in nodes}))
    if wanted:
        return CheckFinding(
            "replication",
            "ok",
            f"{counts} replica(s) per primary; replicas={wanted}: a write returns once "
            f"{wanted} has it, so a failover keeps it",
        )
    return CheckFinding(
        "replication",
        "ok",
        f"{counts} replica(s) per primary, asynchronous: a failover can lose the last writes "
        "(checkpoints; never a token's order); replicas=1 makes each write wait for one",
    )


def judge_partitions(nodes: Sequence[NodeFacts]) -> CheckFinding:
    """``min-replicas-to-write`` bounds what a primary cut off from its replicas accepts."""
    replicated = [n for n in nodes if n.replicas > 0]
    if not replicated:
        return CheckFinding("min-replicas", "ok", "no replicas: nothing to bound")
    unknown = [n for n in replicated if n.min_replicas_to_write is None]
    if unknown:
        return CheckFinding(
            "min-replicas", "warn", f"could not read min-replicas-to-write of {_names(unknown)}"
        )
    unset = [n for n in replicated if not n.min_replicas_to_write]
    if unset:
        return CheckFinding(
            "min-replicas",
            "warn",
            f"min-replicas-to-write 0 on {_names(unset)}: a primary cut off from its replicas "
            "(a partition) goes on granting leases a failover then loses; set "
            "min-replicas-to-write 1 and min-replicas-max-lag below the failover time (ADR-0020)",
        )
    return CheckFinding(
        "min-replicas",
        "ok",
        "min-replicas-to-write "
        + "/".join(sorted({str(n.min_replicas_to_write) for n in replicated}))
        + ": a primary cut off from its replicas stops taking writes",
    )


def judge_clock(nodes: Sequence[NodeFacts], detection: float | None) -> CheckFinding:
    """Client offset (display only: expiry is the server's) and the servers' offsets to each
    other, which must stay below the failover detection time for tokens to stay ordered."""
    worst = max(nodes, key=lambda n: abs(n.clock_offset))
    between: list[float] = [n.clock_offset - worst.clock_offset for n in nodes]
    problems: list[str] = []
    for node in nodes:
        for replica, offset in node.replica_clocks.items():
            if isinstance(offset, str):
                problems.append(f"replica {replica}: {offset}")
            else:
                between.append(offset)
    skew = max((abs(value) for value in between), default=0.0)
    bound = min(detection, CLOCK_OFFSET_WARN) if detection else CLOCK_OFFSET_WARN
    detail = (
        f"servers within {skew * 1000:.0f} ms of each other, "
        f"{abs(worst.clock_offset) * 1000:.0f} ms from this client "
        f"(round trip {worst.round_trip * 1000:.1f} ms)"
    )
    if detection and skew >= detection:
        return CheckFinding(
            "clock",
            "fail",
            f"{detail}: at or above the failover detection time ({format_duration(detection)}), "
            "a promoted replica can issue tokens a deposed holder's undercut (ADR-0020); run NTP",
        )
    if skew >= bound:
        return CheckFinding("clock", "warn", f"{detail}: run NTP on every server (ADR-0020)")
    if abs(worst.clock_offset) >= CLOCK_OFFSET_WARN:
        return CheckFinding(
            "clock",
            "warn",
            f"{detail}: expiry is the server's, but expires_at in tokens reads wrong here",
        )
    if problems:
        return CheckFinding("clock", "warn", f"{detail}; could not read {'; '.join(problems)}")
    return CheckFinding("clock", "ok", detail)


def judge_failover(kind: str, detection: float | None, ttl: float) -> CheckFinding:
    """A lease whose TTL is shorter than a failover lapses during one."""
    if kind == "standalone":
        return CheckFinding(
            "failover", "ok", "standalone: no automatic failover (Sentinel or Cluster adds one)"
        )
    if detection is None:
        return CheckFinding("failover", "warn", "could not read the failover detection time")
    source = "down-after-milliseconds" if kind == "sentinel" else "cluster-node-timeout"
    detail = f"detected after {format_duration(detection)} ({source})"
    if ttl <= detection * 2:
        return CheckFinding(
            "failover",
            "warn",
            f"{detail}; a TTL of {format_duration(ttl)} does not outlast detection plus "
            "election: holders lose their leases in a failover (their successors resume)",
        )
    return CheckFinding(
        "failover", "ok", f"{detail}; leases with a TTL of {format_duration(ttl)} outlast it"
    )


def judge_cluster(info: Mapping[str, str] | None) -> CheckFinding | None:
    """A Cluster's own state (``None`` off a Cluster)."""
    if info is None:
        return None
    state = info.get("cluster_state", "?")
    slots = info.get("cluster_slots_ok", "?")
    masters = info.get("cluster_size", "?")
    detail = f"cluster_state {state}, {slots} of 16384 slots served, {masters} masters"
    if state != "ok" or slots != "16384":
        return CheckFinding(
            "cluster",
            "fail",
            f"{detail}: work IDs in unserved slots can be neither acquired nor renewed",
        )
    return CheckFinding("cluster", "ok", detail)
