# Generated from tests/_async/test_etcd_limits.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""The etcd backend at etcd's limits: batches beyond ``--max-txn-ops`` and a checkpoint beyond
``--max-request-bytes`` (issue 17)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from worklease import BackendError, EtcdBackend, ExitMode, Vacuum
from worklease._compat import sleep

pytestmark = pytest.mark.etcd

MANY = 300
"""More work IDs than one etcd transaction may touch (128 operations by default)."""


@pytest.fixture
def backend(etcd_cluster: Any) -> Iterator[EtcdBackend]:
    with EtcdBackend(etcd_cluster.endpoints, prefix=f"limits-{uuid.uuid4().hex}/") as etcd:
        yield etcd


def test_batches_beyond_the_transaction_limit_are_cut_and_complete(
    backend: EtcdBackend,
) -> None:
    ids = [f"w{i:04d}" for i in range(MANY)]
    taken = backend.acquire("w0007", "other", 60.0)
    assert len(backend.find_available(ids)) == MANY - 1
    grants = backend.acquire_many(ids, "h", 60.0)
    assert [token.work_id for token, _ in grants] == [w for w in ids if w != "w0007"]
    fencing = [token.fencing_token for token, _ in grants]
    assert len(set(fencing)) == len(fencing)
    assert min(fencing) > taken.fencing_token
    tokens = [token for token, _ in grants]
    assert backend.renew_many(tokens, 60.0) == [None] * len(tokens)
    states = [(token, f"s{i}".encode()) for i, token in enumerate(tokens)]
    assert backend.checkpoint_many(states, 60.0) == [None] * len(tokens)
    assert (backend.read_checkpoint(tokens[-1])).state == f"s{len(tokens) - 1}".encode()
    survey = backend.survey(ids, "w00")
    assert dict(survey.held) == {"h": MANY - 1, "other": 1}
    assert backend.release_many(tokens, ExitMode.RETIRED) == [None] * len(tokens)
    assert len(backend.find_available(ids)) == MANY - 1
    sleep(0.01)
    assert Vacuum(backend).sweep(1e-6) == MANY - 1  # the vacuum, on etcd


def test_a_checkpoint_beyond_the_request_limit_is_refused_and_writes_nothing(
    backend: EtcdBackend,
) -> None:
    token = backend.acquire("big", "h", 60.0)
    backend.checkpoint(token, b"small", 60.0)
    with pytest.raises(BackendError) as caught:
        backend.checkpoint(token, b"x" * (2 * 1024 * 1024), 60.0)
    assert not caught.value.transient
    assert (backend.read_checkpoint(token)).state == b"small"
    backend.renew(token, 60.0)  # the lease is untouched


def test_checkpoints_grouped_past_the_request_limit_are_cut_by_size(
    backend: EtcdBackend,
) -> None:
    tokens = [backend.acquire(f"big-{i}", "h", 60.0) for i in range(3)]
    states = [(token, bytes([65 + i]) * 900_000) for i, token in enumerate(tokens)]
    assert backend.checkpoint_many(states, 60.0) == [None, None, None]
    for token, state in states:
        assert (backend.read_checkpoint(token)).state == state


def test_a_renewal_counts_as_an_update_for_sweep(backend: EtcdBackend) -> None:
    token = backend.acquire("renewed", "h", 60.0)
    backend.checkpoint(token, b"keep me", 60.0)
    (before,) = [row["updated_at"] for row in backend.rows()]
    sleep(1.2)
    backend.renew(token, 60.0)
    (after,) = [row["updated_at"] for row in backend.rows()]
    assert (after - before).total_seconds() >= 1.0
    backend.renew(token, -1.0)  # lapses now; the last update is this renewal
    assert backend.sweep(1.0, True) == 0  # updated far less than 1 s ago
    successor = backend.acquire("renewed", "h2", 60.0)
    assert (backend.read_checkpoint(successor)).state == b"keep me"


def test_an_application_under_a_longer_prefix_is_not_this_ones(etcd_cluster: Any) -> None:
    root = f"apps-{uuid.uuid4().hex}/"
    with (
        EtcdBackend(etcd_cluster.endpoints, prefix=root) as outer,
        EtcdBackend(etcd_cluster.endpoints, prefix=root + "sub/") as inner,
    ):
        token = inner.acquire("job", "h", 60.0)
        inner.release(token, ExitMode.RETIRED)
        assert outer.rows() == []
        assert outer.sweep(0.0, True) == 0
        assert (outer.survey([], "")).members == {}
        assert [row["work_id"] for row in inner.rows()] == ["job"]
        assert inner.sweep(0.0, False) == 1
