"""The etcd backend at etcd's limits: batches beyond ``--max-txn-ops`` and a checkpoint beyond
``--max-request-bytes`` (issue 17)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from worklease import AsyncEtcdBackend, AsyncVacuum, BackendError, ExitMode
from worklease._acompat import asleep

pytestmark = pytest.mark.etcd

MANY = 300
"""More work IDs than one etcd transaction may touch (128 operations by default)."""


@pytest.fixture
async def backend(etcd_cluster: Any) -> AsyncIterator[AsyncEtcdBackend]:
    async with AsyncEtcdBackend(
        etcd_cluster.endpoints, prefix=f"limits-{uuid.uuid4().hex}/"
    ) as etcd:
        yield etcd


async def test_batches_beyond_the_transaction_limit_are_cut_and_complete(
    backend: AsyncEtcdBackend,
) -> None:
    ids = [f"w{i:04d}" for i in range(MANY)]
    taken = await backend.acquire("w0007", "other", 60.0)
    assert len(await backend.find_available(ids)) == MANY - 1
    grants = await backend.acquire_many(ids, "h", 60.0)
    assert [token.work_id for token, _ in grants] == [w for w in ids if w != "w0007"]
    fencing = [token.fencing_token for token, _ in grants]
    assert len(set(fencing)) == len(fencing)
    assert min(fencing) > taken.fencing_token
    tokens = [token for token, _ in grants]
    assert await backend.renew_many(tokens, 60.0) == [None] * len(tokens)
    states = [(token, f"s{i}".encode()) for i, token in enumerate(tokens)]
    assert await backend.checkpoint_many(states, 60.0) == [None] * len(tokens)
    assert (await backend.read_checkpoint(tokens[-1])).state == f"s{len(tokens) - 1}".encode()
    survey = await backend.survey(ids, "w00")
    assert dict(survey.held) == {"h": MANY - 1, "other": 1}
    assert await backend.release_many(tokens, ExitMode.RETIRED) == [None] * len(tokens)
    assert len(await backend.find_available(ids)) == MANY - 1
    await asleep(0.01)
    assert await AsyncVacuum(backend).sweep(1e-6) == MANY - 1  # the vacuum, on etcd


async def test_a_checkpoint_beyond_the_request_limit_is_refused_and_writes_nothing(
    backend: AsyncEtcdBackend,
) -> None:
    token = await backend.acquire("big", "h", 60.0)
    await backend.checkpoint(token, b"small", 60.0)
    with pytest.raises(BackendError) as caught:
        await backend.checkpoint(token, b"x" * (2 * 1024 * 1024), 60.0)
    assert not caught.value.transient
    assert (await backend.read_checkpoint(token)).state == b"small"
    await backend.renew(token, 60.0)  # the lease is untouched


async def test_checkpoints_grouped_past_the_request_limit_are_cut_by_size(
    backend: AsyncEtcdBackend,
) -> None:
    tokens = [await backend.acquire(f"big-{i}", "h", 60.0) for i in range(3)]
    states = [(token, bytes([65 + i]) * 900_000) for i, token in enumerate(tokens)]
    assert await backend.checkpoint_many(states, 60.0) == [None, None, None]
    for token, state in states:
        assert (await backend.read_checkpoint(token)).state == state


async def test_a_renewal_counts_as_an_update_for_sweep(backend: AsyncEtcdBackend) -> None:
    token = await backend.acquire("renewed", "h", 60.0)
    await backend.checkpoint(token, b"keep me", 60.0)
    (before,) = [row["updated_at"] for row in await backend.rows()]
    await asleep(1.2)
    await backend.renew(token, 60.0)
    (after,) = [row["updated_at"] for row in await backend.rows()]
    assert (after - before).total_seconds() >= 1.0
    await backend.renew(token, -1.0)  # lapses now; the last update is this renewal
    assert await backend.sweep(1.0, True) == 0  # updated far less than 1 s ago
    successor = await backend.acquire("renewed", "h2", 60.0)
    assert (await backend.read_checkpoint(successor)).state == b"keep me"


async def test_an_application_under_a_longer_prefix_is_not_this_ones(etcd_cluster: Any) -> None:
    root = f"apps-{uuid.uuid4().hex}/"
    async with (
        AsyncEtcdBackend(etcd_cluster.endpoints, prefix=root) as outer,
        AsyncEtcdBackend(etcd_cluster.endpoints, prefix=root + "sub/") as inner,
    ):
        token = await inner.acquire("job", "h", 60.0)
        await inner.release(token, ExitMode.RETIRED)
        assert await outer.rows() == []
        assert await outer.sweep(0.0, True) == 0
        assert (await outer.survey([], "")).members == {}
        assert [row["work_id"] for row in await inner.rows()] == ["job"]
        assert await inner.sweep(0.0, False) == 1
