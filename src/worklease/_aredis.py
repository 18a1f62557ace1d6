"""redis-py's asyncio clients, for the asyncio flavour of the Redis backend (its twin for
threads: ``_sredis``; the generator maps one name to the other)."""

from __future__ import annotations

try:
    from redis import exceptions as redis_errors
    from redis.asyncio import ConnectionPool
    from redis.asyncio import Redis as RedisClient
    from redis.asyncio.cluster import RedisCluster as ClusterClient
    from redis.asyncio.sentinel import Sentinel
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "the Redis backend needs redis-py: pip install redis (worklease's redis extra: "
        "pip install '.[redis]' from a checkout)",
        name=exc.name,
    ) from exc

__all__ = ["ClusterClient", "ConnectionPool", "RedisClient", "Sentinel", "redis_errors"]
