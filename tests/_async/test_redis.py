"""The Redis backend on a private standalone Redis 7 (issue 27, first step): the public
conformance suite, the client check, and the status rows and sweep read off the server
(the scripts themselves: tests/test_redis_scripts.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from tests._acompat import asleep
from tests.redis_servers import RedisServer
from worklease import AsyncRedisBackend, ConfigError, ExitMode
from worklease._aredis import RedisClient
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
    """Every conformance case on standalone Redis; tokens are ordered per work ID (from the
    server clock), not across work IDs (ADR-0020)."""

    TOKENS_ORDERED_ACROSS_WORK_IDS = False


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
