"""What a closed backend does: the same on every backend (issue 11, documented in the README).

After ``close()`` (idempotent) every operation raises ``BackendError`` (not transient: a
retry cannot help) without any I/O, and ``watch_releases`` returns ``None``. A PostgreSQL
backend never closes the caller's pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from worklease import (
    AsyncBackend,
    AsyncEtcdBackend,
    AsyncLease,
    AsyncMemoryBackend,
    AsyncPostgresBackend,
    AsyncRedisBackend,
    BackendError,
    ExitMode,
)


async def test_every_operation_of_a_closed_backend_is_refused(backend: AsyncBackend) -> None:
    assert isinstance(
        backend, AsyncMemoryBackend | AsyncPostgresBackend | AsyncEtcdBackend | AsyncRedisBackend
    )
    lease = AsyncLease(backend, holder_id="h", ttl=30)
    token = await lease.acquire("w1")
    await backend.close()
    await backend.close()  # idempotent
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("acquire", lambda: backend.acquire("w2", "h", 30.0)),
        ("read_checkpoint", lambda: backend.read_checkpoint(token)),
        ("checkpoint", lambda: backend.checkpoint(token, b"x", 30.0)),
        ("renew", lambda: backend.renew(token, 30.0)),
        ("release", lambda: backend.release(token, ExitMode.FINISHED)),
        ("forget", lambda: backend.forget(token)),
        ("sweep", lambda: backend.sweep(60.0, False)),
        ("lease.acquire", lambda: lease.acquire("w3")),
        ("lease.checkpoint", lambda: lease.checkpoint(token, b"x")),
    ]
    # the batch operations, where offered
    if callable(acquire_many := getattr(backend, "acquire_many", None)):
        calls.append(("acquire_many", lambda: acquire_many(["w4"], "h", 30.0)))
    if callable(find_available := getattr(backend, "find_available", None)):
        calls.append(("find_available", lambda: find_available(["w4"])))
    if callable(renew_many := getattr(backend, "renew_many", None)):
        calls.append(("renew_many", lambda: renew_many([token], 30.0)))
    for name, call in calls:
        with pytest.raises(BackendError) as caught:
            await call()
        assert not caught.value.transient, name
        assert "closed" in str(caught.value), name
    assert backend.watch_releases(["w1"]) is None
    if isinstance(backend, AsyncPostgresBackend):
        assert not backend.pool.closed  # the caller's pool is the caller's
    if isinstance(backend, AsyncRedisBackend):
        assert await backend._client.ping()  # the caller's client is the caller's
