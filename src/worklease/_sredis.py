"""redis-py's blocking clients, for the sync flavour of the Redis backend (its asyncio twin:
``_aredis``)."""

from __future__ import annotations

try:
    from redis import ConnectionPool
    from redis import Redis as RedisClient
    from redis import exceptions as redis_errors
    from redis.cluster import RedisCluster as ClusterClient
    from redis.sentinel import Sentinel
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "the Redis backend needs redis-py: pip install redis (worklease's redis extra: "
        "pip install '.[redis]' from a checkout)",
        name=exc.name,
    ) from exc

__all__ = ["ClusterClient", "ConnectionPool", "RedisClient", "Sentinel", "redis_errors"]
