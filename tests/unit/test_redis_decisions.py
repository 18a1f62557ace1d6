"""The Redis backend's shared decisions that need no server: URLs and the check's
judgements (``worklease._redis``, ``worklease._redis_check``)."""

from __future__ import annotations

import pytest

from worklease import ConfigError
from worklease._redis import parse_redis_url, redact_url
from worklease._redis_check import (
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
)


def test_urls_name_the_deployment() -> None:
    plain = parse_redis_url("rediss://user:pw@host:6380/2")
    assert (plain.kind, plain.url, plain.tls) == (
        "standalone",
        "rediss://user:pw@host:6380/2",
        True,
    )
    cluster = parse_redis_url("redis+cluster://node:7000")
    assert (cluster.kind, cluster.url) == ("cluster", "redis://node:7000")
    sentinel = parse_redis_url("redis+sentinel://app:p%40ss@s1:26380,s2/primary/3")
    assert sentinel.kind == "sentinel"
    assert sentinel.sentinels == (("s1", 26380), ("s2", 26379))
    assert (sentinel.master, sentinel.db, sentinel.username, sentinel.password) == (
        "primary", 3, "app", "p@ss",
    )  # fmt: skip
    assert parse_redis_url("redis+sentinel://:secret@s1/m").password == "secret"
    assert parse_redis_url("unix:///run/redis.sock").kind == "standalone"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("localhost:6379", "a Redis URL looks like"),
        ("http://host", "unknown Redis URL scheme 'http'"),
        ("redis+sentinel://s1:26379", "names the master after the hosts"),
        ("redis+sentinel://s1:x/m", "host[:port], got 's1:x'"),
        ("redis+sentinel://s1/m/db", "is a number, got 'db'"),
        ("redis+sentinel://:secret@s1:x/m", "host[:port]"),
    ],
)
def test_a_bad_url_says_what_is_wrong_without_the_password(url: str, message: str) -> None:
    with pytest.raises(
        ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")
    ) as caught:
        parse_redis_url(url)
    assert "secret" not in str(caught.value)


def test_redacted_urls_hide_only_the_password() -> None:
    assert redact_url("redis://user:secret@h:1/0") == "redis://user:***@h:1/0"
    assert redact_url("redis://:secret@h:1/0") == "redis://:***@h:1/0"
    assert redact_url("redis://secret@h") == "redis://***@h"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"


def node(**facts: object) -> NodeFacts:
    base: dict[str, object] = {
        "version": "7.0.15", "role": "master", "aof": True, "appendfsync": "always",
        "save": "", "policy": "noeviction", "maxmemory": 0, "used_memory": 1, "replicas": 1,
        "min_replicas_to_write": 1,
    }  # fmt: skip
    base.update(facts)
    return NodeFacts("n1", **base)  # type: ignore[arg-type]


def test_the_check_judges_each_premise() -> None:
    assert judge_connection("h", "standalone", [node()]).status == "ok"
    assert judge_connection("h", "standalone", [node(role="slave")]).status == "fail"
    assert judge_connection("h", "standalone", [node(version="6.2.1")]).status == "warn"
    assert judge_connection("h", "standalone", [node(version="4.0.0")]).status == "fail"
    assert judge_persistence([node(aof=False, save="")]).status == "warn"
    assert "snapshots only" in judge_persistence([node(aof=False, save="3600 1")]).detail
    assert judge_persistence([node(appendfsync="no")]).status == "warn"
    assert judge_persistence([node(appendfsync="everysec")]).status == "ok"
    assert judge_persistence([node(aof=None)]).status == "warn"
    assert judge_eviction([node(policy="allkeys-lru")]).status == "fail"
    assert judge_eviction([node(policy="volatile-ttl")]).status == "warn"
    assert judge_eviction([node(policy=None)]).status == "warn"
    assert judge_memory([node(maxmemory=100, used_memory=90)]).status == "warn"
    assert judge_memory([node(maxmemory=100, used_memory=10)]).status == "ok"
    assert judge_replication("sentinel", [node(replicas=0)], 0).status == "warn"
    assert judge_replication("sentinel", [node(replicas=1)], 2).status == "fail"
    assert judge_replication("sentinel", [node(replicas=2)], 1).status == "ok"
    assert judge_partitions([node(min_replicas_to_write=0)]).status == "warn"
    assert judge_partitions([node(replicas=0, min_replicas_to_write=0)]).status == "ok"
    assert judge_failover("sentinel", 5.0, 8.0).status == "warn"  # TTL within detection x 2
    assert judge_failover("sentinel", 5.0, 30.0).status == "ok"
    assert judge_failover("cluster", None, 30.0).status == "warn"
    assert judge_cluster({"cluster_state": "fail", "cluster_slots_ok": "10000"}).status == "fail"  # type: ignore[union-attr]
    assert judge_cluster(None) is None


def test_the_clock_finding_weighs_server_skew_against_detection() -> None:
    steady = node(replica_clocks={"r:1": 0.002})
    assert judge_clock([steady], 5.0).status == "ok"
    assert judge_clock([node(replica_clocks={"r:1": 1.5})], 30.0).status == "warn"
    skewed = judge_clock([node(replica_clocks={"r:1": -6.0})], 5.0)
    assert skewed.status == "fail"
    assert "detection time" in skewed.detail
    assert judge_clock([node(clock_offset=3.0)], 5.0).status == "warn"  # this client only
    unread = judge_clock([node(replica_clocks={"r:1": "ConnectionError: refused"})], 5.0)
    assert unread.status == "warn"
    assert "could not read replica r:1" in unread.detail
