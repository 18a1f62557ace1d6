"""The Redis backend on a private standalone Redis 7 (issue 27, first step): the public
conformance suite, the client check, and the status rows and sweep read off the server
(the scripts themselves: tests/test_redis_scripts.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from time import monotonic

import pytest

from tests import redis_servers
from tests._acompat import asleep
from tests._async.conftest import redis_backend
from tests.redis_servers import RedisServer
from worklease import AsyncRedisBackend, BackendError, ConfigError, ExitMode
from worklease._aredis import ClusterClient, RedisClient
from worklease._async.watch import AsyncReleaseWatch
from worklease.conformance import AsyncBackendConformance

pytestmark = pytest.mark.redis


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[RedisClient]:
    redis = RedisClient.from_url(redis_server.url)
    try:
        yield redis
    finally:
        await redis.aclose()


@pytest.fixture
async def backend(client: RedisClient) -> AsyncIterator[AsyncRedisBackend]:
    async with AsyncRedisBackend(client, prefix=f"test-{uuid.uuid4().hex[:12]}:") as redis:
        yield redis


class TestRedisConformance(AsyncBackendConformance):
    """Every conformance case on standalone Redis and on a 3-master Cluster; tokens are
    ordered per work ID (from the server clock), not across work IDs (ADR-0020)."""

    TOKENS_ORDERED_ACROSS_WORK_IDS = False

    @pytest.fixture(params=["standalone", "cluster"])
    async def backend(self, request: pytest.FixtureRequest) -> AsyncIterator[AsyncRedisBackend]:
        async with redis_backend(request, cluster=request.param == "cluster") as redis:
            yield redis


async def test_a_client_that_decodes_responses_is_refused(redis_server: RedisServer) -> None:
    decoding = RedisClient.from_url(redis_server.url, decode_responses=True)
    try:
        with pytest.raises(ConfigError, match="decode_responses=False"):
            AsyncRedisBackend(decoding)
    finally:
        await decoding.aclose()
    with pytest.raises(ConfigError, match="redis-py client of this flavour"):
        AsyncRedisBackend(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="prefix must be a non-empty string"):
        AsyncRedisBackend(RedisClient(), prefix="")


async def test_rows_and_sweep_read_the_server_state(
    backend: AsyncRedisBackend, client: RedisClient
) -> None:
    held = await backend.acquire("held", "w1", 30)
    await backend.checkpoint(held, b"12345", 30)
    retired = await backend.acquire("retired", "w1", 30)
    await backend.release(retired, ExitMode.RETIRED)
    rows = {row["work_id"]: row for row in await backend.rows()}
    assert set(rows) == {"held", "retired"}
    assert rows["held"]["held"] is True
    assert rows["held"]["checkpoint_bytes"] == 5
    assert 0 < rows["held"]["ttl_left"] <= 30
    assert rows["held"]["fencing_token"] == held.fencing_token
    assert (rows["retired"]["held"], rows["retired"]["exit_mode"]) == (False, "retired")
    # another application's key under a longer prefix is not a lease row of this one
    await client.set(backend.prefix + "not-a-hash", b"x")
    await asleep(0.02)  # the server clock moves past the retired row's last write
    assert await backend.sweep(0, include_expired=True) == 1  # the retired row only
    assert [row["work_id"] for row in await backend.rows()] == ["held"]
    assert await client.exists(backend.prefix + "not-a-hash") == 1


async def _settled(backend: AsyncRedisBackend, work_ids: list[str]) -> AsyncReleaseWatch:
    """A watch on ``work_ids`` once the backend's subscription is up (its first wake-up, for
    releases it may have missed, consumed)."""
    watch = backend.watch_releases(work_ids)
    assert watch is not None
    deadline = monotonic() + 10
    while not backend.watching and monotonic() < deadline:
        await asleep(0.01)
    assert backend.watching
    await watch.wait(0.2)  # the subscription's wake-up of every watch
    return watch


@pytest.mark.parametrize("where", ["standalone", "cluster"])
async def test_a_release_through_another_client_wakes_the_watch_at_once(
    request: pytest.FixtureRequest, where: str
) -> None:
    """The scripts announce the row's key: a waiter on another client is woken by a release
    or forget of its work ID, not by one under another prefix; on a Cluster too (PUBLISH
    reaches every node)."""
    cluster = where == "cluster"
    async with (
        redis_backend(request, cluster=cluster) as waiter,
        redis_backend(request, cluster=cluster) as elsewhere,
    ):
        holder = AsyncRedisBackend(waiter._client, prefix=waiter.prefix)
        watch = await _settled(waiter, ["job", "other"])
        with watch:
            stranger = await elsewhere.acquire("job", "h", 30)
            await elsewhere.release(stranger, ExitMode.FINISHED)  # another prefix
            assert not await watch.wait(0.3)
            token = await holder.acquire("job", "h", 30)
            started = monotonic()
            await holder.release(token, ExitMode.FINISHED)
            assert await watch.wait(5.0)
            assert monotonic() - started < 5.0
            other = await holder.acquire("other", "h", 30)
            await holder.forget(other)
            assert await watch.wait(5.0)
        await holder.close()


async def test_the_watch_resubscribes_after_its_connection_is_killed(
    backend: AsyncRedisBackend, client: RedisClient
) -> None:
    """A killed pub/sub connection: the watch subscribes again, wakes every waiter (a
    release meanwhile went unseen), and later releases wake it again."""
    watch = await _settled(backend, ["job"])
    with watch:
        assert await client.client_kill_filter(_type="pubsub") >= 1
        assert await watch.wait(10.0)  # woken by the resubscription, or the killed link
        deadline = monotonic() + 10
        while not backend.watching and monotonic() < deadline:
            await asleep(0.01)
        await watch.wait(0.5)  # a second wake-up of the same reconnect, if any
        token = await backend.acquire("job", "h", 30)
        await backend.release(token, ExitMode.FINISHED)
        assert await watch.wait(10.0)


@pytest.mark.parametrize("where", ["standalone", "cluster"])
async def test_batches_survive_a_flushed_script_cache(
    request: pytest.FixtureRequest, where: str
) -> None:
    """``SCRIPT FLUSH`` between batches: the pipelined calls answered NOSCRIPT are sent
    again once the script is loaded (on every master of a Cluster), each exactly once."""
    async with redis_backend(request, cluster=where == "cluster") as backend:
        ids = [f"job-{n}" for n in range(40)]  # spread over the Cluster's slots
        grants = await backend.acquire_many(ids, "h", 30)
        assert len(grants) == len(ids)
        tokens = [token for token, _ in grants]
        await backend._client.script_flush()
        states = [(token, token.work_id.encode()) for token in tokens]
        assert await backend.checkpoint_many(states, 30) == [None] * len(ids)
        await backend._client.script_flush()
        assert await backend.renew_many(tokens, 30) == [None] * len(ids)
        for token in tokens[:3]:
            assert (await backend.read_checkpoint(token)).state == token.work_id.encode()
        await backend._client.script_flush()
        assert await backend.release_many(tokens, ExitMode.FINISHED) == [None] * len(ids)
        assert await backend.find_available(ids) == ids


async def test_a_cluster_spreads_work_ids_over_its_masters(request: pytest.FixtureRequest) -> None:
    """Each work ID is one key: its slot's master holds it, and the batch operations reach
    every master (one pipeline per node)."""
    async with redis_backend(request, cluster=True) as backend:
        ids = [f"spread-{n}" for n in range(60)]
        assert len(await backend.acquire_many(ids, "h", 30)) == len(ids)
        client = backend._client
        assert isinstance(client, ClusterClient)
        owners = set()
        for work_id in ids:
            node = client.get_node_from_key(backend.prefix + work_id)  # type: ignore[no-untyped-call,unused-ignore]
            assert node is not None
            owners.add(node.name)
        assert len(owners) == 3
        assert sorted(row["work_id"] for row in await backend.rows()) == sorted(ids)


async def test_replicas_waits_for_the_replica_and_says_when_it_did_not_confirm(
    request: pytest.FixtureRequest,
) -> None:
    """``replicas=1``: renew, checkpoint, release and forget return once a replica has the
    write (``WAIT`` on the same connection); without one in time they raise a transient
    ``BackendError`` saying the write is only on the primary. Acquire does not wait."""
    primary = redis_servers.start()
    replica: RedisServer | None = None
    client = RedisClient.from_url(primary.url)
    try:
        backend = AsyncRedisBackend(client, prefix="rep:", replicas=1, replica_timeout=0.2)
        assert backend.replicas == 1
        token = await backend.acquire("job", "h", 30)  # no replica yet: acquire does not wait
        with pytest.raises(BackendError, match="0 of 1 replica") as caught:
            await backend.checkpoint(token, b"only on the primary", 30)
        assert caught.value.transient
        assert (await backend.read_checkpoint(token)).state == b"only on the primary"
        with pytest.raises(BackendError, match="0 of 1 replica"):
            await backend.renew_many([token], 30)
        replica = redis_servers.start("--replicaof", "127.0.0.1", str(primary.port))
        deadline = monotonic() + 30
        while await client.wait(1, 100) < 1:
            assert monotonic() < deadline, "the replica did not link up"
        # Confirmed writes, with a bound a loaded machine meets (0.2 s refused them above)
        backend = AsyncRedisBackend(client, prefix="rep:", replicas=1, replica_timeout=30)
        await backend.checkpoint(token, b"on both", 30)
        await backend.renew(token, 30)
        assert await backend.checkpoint_many([(token, b"both again")], 30) == [None]
        await backend.release(token, ExitMode.FINISHED)
        replica_client = RedisClient.from_url(replica.url)
        try:  # confirmed means there: the replica has the checkpoint and the exit
            assert await replica_client.hmget("rep:job", ["c", "x"]) == [b"both again", b"finished"]
        finally:
            await replica_client.aclose()
        again = await backend.acquire("job", "h2", 30)
        await backend.forget(again)
    finally:
        await client.aclose()
        if replica is not None:
            replica.stop()
        primary.stop()


async def test_replicas_is_checked_and_refused_on_a_cluster(request: pytest.FixtureRequest) -> None:
    for bad, error in ((-1, ValueError), (True, TypeError), ("1", TypeError)):
        with pytest.raises(error, match="replicas must"):
            AsyncRedisBackend(RedisClient(), replicas=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replica_timeout"):
        AsyncRedisBackend(RedisClient(), replicas=1, replica_timeout=0)
    cluster = ClusterClient.from_url(request.getfixturevalue("redis_cluster").url)
    try:
        with pytest.raises(ConfigError, match="replicas= needs a standalone or Sentinel"):
            AsyncRedisBackend(cluster, replicas=1)
        assert AsyncRedisBackend(cluster).replicas == 0
    finally:
        await cluster.aclose()
