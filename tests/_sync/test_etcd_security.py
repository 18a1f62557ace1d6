# Generated from tests/_async/test_etcd_security.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""The etcd backend with TLS (client certificates) and with etcd authentication, on private
single-member clusters (issue 17)."""

from __future__ import annotations

import base64
import os
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import etcd
from worklease import BackendError, EtcdBackend, ExitMode, LeaseHeldError
from worklease._compat import sleep
from worklease._etcd import prefix_end

pytestmark = pytest.mark.etcd

PREFIX = "secure/"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _started(**kwargs: Any) -> etcd.EtcdCluster:
    try:
        return etcd.start_cluster(1, **kwargs)
    except etcd.Unavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: etcd unavailable: {exc}", pytrace=False)
        pytest.skip(f"etcd unavailable: {exc}")


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[etcd.EtcdCluster]:
    cluster = _started(tls=etcd.make_tls(tmp_path / "tls"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def auth_cluster() -> Iterator[etcd.EtcdCluster]:
    # Simple auth tokens expire after 1 s unused here, so a test sees one expire.
    cluster = _started(extra_args=("--auth-token-ttl", "1"))
    try:
        with cluster.http() as client:
            base = cluster.endpoints[0] + "/v3/auth"

            def call(path: str, body: dict[str, object]) -> None:
                answer = client.post(base + path, json=body)
                assert answer.status_code == 200, answer.text

            key = (PREFIX + "\x00").encode()
            call("/role/add", {"name": "root"})
            call("/user/add", {"name": "root", "password": "root-secret"})
            call("/user/grant", {"user": "root", "role": "root"})
            call("/role/add", {"name": "app"})
            permission = {
                "permType": "READWRITE",
                "key": _b64(key),
                "range_end": _b64(prefix_end(key)),
            }
            call("/role/grant", {"name": "app", "perm": permission})
            call("/user/add", {"name": "app", "password": "app-secret"})
            call("/user/grant", {"user": "app", "role": "app"})
            call("/enable", {})
        yield cluster
    finally:
        cluster.stop()


def _round_trip(backend: EtcdBackend) -> None:
    work_id = f"w-{uuid.uuid4().hex[:6]}"
    token = backend.acquire(work_id, "h", 30.0)
    backend.checkpoint(token, b"secret state", 30.0)
    backend.renew(token, 30.0)
    assert (backend.read_checkpoint(token)).state == b"secret state"
    with pytest.raises(LeaseHeldError):
        backend.acquire(work_id, "h2", 30.0)
    backend.release(token, ExitMode.FINISHED)
    successor = backend.acquire(work_id, "h2", 30.0)
    assert (backend.read_checkpoint(successor)).prev_holder_id == "h"


def test_tls_with_a_client_certificate(tls_cluster: etcd.EtcdCluster) -> None:
    files = tls_cluster.tls
    assert files is not None
    assert tls_cluster.endpoints[0].startswith("https://")
    with EtcdBackend(
        tls_cluster.endpoints,
        prefix=PREFIX,
        ca_file=str(files.ca),
        cert_file=str(files.client_cert),
        key_file=str(files.client_key),
    ) as backend:
        _round_trip(backend)
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(str(files.client_cert), str(files.client_key))
    with EtcdBackend(tls_cluster.endpoints, prefix=PREFIX, ssl_context=context) as b:
        _round_trip(b)


def test_tls_without_the_client_certificate_is_refused(
    tls_cluster: etcd.EtcdCluster,
) -> None:
    files = tls_cluster.tls
    assert files is not None
    with EtcdBackend(
        tls_cluster.endpoints, prefix=PREFIX, ca_file=str(files.ca), timeout=2.0
    ) as backend:
        # The server refuses during or right after the handshake: the client sees the TLS
        # alert, or (depending on the transport's timing) only the connection closing.
        with pytest.raises(BackendError) as caught:
            backend.acquire("w", "h", 30.0)
        assert "TLS" in str(caught.value) or "ReadError" in str(caught.value)
        assert caught.value.transient == ("TLS" not in str(caught.value))
    with EtcdBackend(tls_cluster.endpoints, prefix=PREFIX, timeout=2.0) as untrusted:
        with pytest.raises(BackendError) as caught:  # the test CA is not a system CA
            untrusted.acquire("w", "h", 30.0)
        assert not caught.value.transient
        assert "TLS" in str(caught.value)


def test_authentication_and_an_expired_token(auth_cluster: etcd.EtcdCluster) -> None:
    with EtcdBackend(
        auth_cluster.endpoints, prefix=PREFIX, username="app", password="app-secret"
    ) as backend:
        _round_trip(backend)
        sleep(2.5)  # the token expired: the next call authenticates again
        _round_trip(backend)
        with backend.watch_releases(["watched"]) as watch:  # type: ignore[union-attr]
            for _ in range(100):
                if backend.watching:
                    break
                sleep(0.05)
            assert backend.watching
            watch.wait(0.0)  # consume the wake-up of the watch being set up
            token = backend.acquire("watched", "h", 30.0)
            backend.release(token, ExitMode.FINISHED)
            assert watch.wait(10.0)


def test_wrong_credentials_and_foreign_keys_are_refused(
    auth_cluster: etcd.EtcdCluster,
) -> None:
    with EtcdBackend(
        auth_cluster.endpoints, prefix=PREFIX, username="app", password="wrong"
    ) as backend:
        with pytest.raises(BackendError) as caught:
            backend.acquire("w", "h", 30.0)
        assert not caught.value.transient
        assert "authentication failed" in str(caught.value)
    with EtcdBackend(
        auth_cluster.endpoints, prefix="elsewhere/", username="app", password="app-secret"
    ) as outside:
        with pytest.raises(BackendError) as caught:
            outside.acquire("w", "h", 30.0)
        assert not caught.value.transient
        assert "permission denied" in str(caught.value)
