# Generated from tests/_async/test_redis.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""The Redis backend on a private standalone Redis 7 (issue 27, first step): the public
conformance suite, the client check, and the status rows and sweep read off the server
(the scripts themselves: tests/test_redis_scripts.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests._compat import sleep
from tests.redis_servers import RedisServer
from worklease import ConfigError, ExitMode, RedisBackend
from worklease._sredis import RedisClient
from worklease.conformance import BackendConformance

pytestmark = pytest.mark.redis


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[RedisClient]:
    redis = RedisClient.from_url(redis_server.url)
    try:
        yield redis
    finally:
        redis.close()


@pytest.fixture
def backend(client: RedisClient) -> Iterator[RedisBackend]:
    with RedisBackend(client, prefix=f"test-{uuid.uuid4().hex[:12]}:") as redis:
        yield redis


class TestRedisConformance(BackendConformance):
    """Every conformance case on standalone Redis; tokens are ordered per work ID (from the
    server clock), not across work IDs (ADR-0020)."""

    TOKENS_ORDERED_ACROSS_WORK_IDS = False


def test_a_client_that_decodes_responses_is_refused(redis_server: RedisServer) -> None:
    decoding = RedisClient.from_url(redis_server.url, decode_responses=True)
    try:
        with pytest.raises(ConfigError, match="decode_responses=False"):
            RedisBackend(decoding)
    finally:
        decoding.close()
    with pytest.raises(ConfigError, match="redis-py client of this flavour"):
        RedisBackend(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="prefix must be a non-empty string"):
        RedisBackend(RedisClient(), prefix="")


def test_rows_and_sweep_read_the_server_state(backend: RedisBackend, client: RedisClient) -> None:
    held = backend.acquire("held", "w1", 30)
    backend.checkpoint(held, b"12345", 30)
    retired = backend.acquire("retired", "w1", 30)
    backend.release(retired, ExitMode.RETIRED)
    rows = {row["work_id"]: row for row in backend.rows()}
    assert set(rows) == {"held", "retired"}
    assert rows["held"]["held"] is True
    assert rows["held"]["checkpoint_bytes"] == 5
    assert 0 < rows["held"]["ttl_left"] <= 30
    assert rows["held"]["fencing_token"] == held.fencing_token
    assert (rows["retired"]["held"], rows["retired"]["exit_mode"]) == (False, "retired")
    # another application's key under a longer prefix is not a lease row of this one
    client.set(backend.prefix + "not-a-hash", b"x")
    sleep(0.02)  # the server clock moves past the retired row's last write
    assert backend.sweep(0, include_expired=True) == 1  # the retired row only
    assert [row["work_id"] for row in backend.rows()] == ["held"]
    assert client.exists(backend.prefix + "not-a-hash") == 1
