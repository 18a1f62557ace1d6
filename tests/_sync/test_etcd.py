# Generated from tests/_async/test_etcd.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""etcd backend cases that need more than the conformance suite's one backend object: its
constructor checks, failover between members, expiry by etcd's lease clock, the release
watch seen from another client, fencing tokens across clients, a member crash, ``rows()``
and a closed backend.

Every case builds its own etcd backend objects on a fresh prefix of the session's
3-member cluster (the crash case starts a private cluster). Real-time bounds are generous:
they tell "at once" from "never", not how fast etcd is.
"""

from __future__ import annotations

import socket
import ssl
import time
import uuid
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytest

from tests import etcd
from worklease import (
    BackendError,
    Checkpoint,
    ConfigError,
    EtcdBackend,
    ExitMode,
    FencedError,
    LeaseHeldError,
    Token,
)
from worklease._compat import sleep
from worklease._sync.watch import ReleaseWatch

pytestmark = pytest.mark.etcd

TTL = 30.0
"""A lease no case outlives unless it means to."""
PROMPT = 5.0
"""Upper bound for a wake-up that should come at the release (watches wait up to 10 s)."""


def new_prefix() -> str:
    return f"t-{uuid.uuid4().hex}/"


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed): connecting is refused."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
    finally:
        sock.close()


def silent_listener() -> socket.socket:
    """A loopback socket that listens but never accepts: connections are made and requests
    sent, but no answer ever comes (a member that stopped answering)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def url_of(sock: socket.socket) -> str:
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


def watching(backend: EtcdBackend, work_ids: Sequence[str]) -> ReleaseWatch:
    watch = backend.watch_releases(work_ids)
    assert watch is not None  # an open backend always watches
    return watch


def acquire_within(
    backend: EtcdBackend, work_id: str, holder_id: str, ttl: float, seconds: float
) -> Token:
    """Acquire, trying again while somebody holds the work ID, for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return backend.acquire(work_id, holder_id, ttl)
        except LeaseHeldError:
            if time.monotonic() > deadline:
                raise
        sleep(0.05)


def read_checkpoint_within(backend: EtcdBackend, token: Token, seconds: float) -> Checkpoint:
    """``read_checkpoint``, trying again on a transient ``BackendError`` (an election in
    progress) for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return backend.read_checkpoint(token)
        except BackendError as exc:
            if not exc.transient or time.monotonic() > deadline:
                raise
        sleep(0.2)


def watch_running(watcher: EtcdBackend, actor: EtcdBackend) -> None:
    """Until ``watcher``'s etcd watch stream is up: a release by ``actor`` of a probe work ID
    reaches a watch on it. (A watch opened before the stream exists may miss a release made
    meanwhile: see ``test_a_release_before_the_watch_stream_is_up_still_wakes_the_watch``.)"""
    probe_id = f"probe-{uuid.uuid4().hex}"
    deadline = time.monotonic() + 20.0
    with watching(watcher, [probe_id]) as probe:
        while time.monotonic() < deadline:
            token = actor.acquire(probe_id, "prober", TTL)
            actor.release(token, ExitMode.ABANDONED)
            if probe.wait(2.0):
                return
    pytest.fail("the release watch saw none of the probe's releases within 20 s")


# -- construction ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"username": "root"}, id="username-without-password"),
        pytest.param({"password": "secret"}, id="password-without-username"),
        pytest.param({"cert_file": "/nonexistent/client.pem"}, id="cert-without-key"),
        pytest.param({"key_file": "/nonexistent/client.key"}, id="key-without-cert"),
        pytest.param(
            {"ssl_context": ssl.create_default_context(), "ca_file": "/nonexistent/ca.pem"},
            id="ssl-context-and-ca-file",
        ),
        pytest.param(
            {
                "ssl_context": ssl.create_default_context(),
                "cert_file": "/nonexistent/client.pem",
                "key_file": "/nonexistent/client.key",
            },
            id="ssl-context-and-cert",
        ),
        pytest.param({"timeout": 0}, id="zero-timeout"),
        pytest.param({"timeout": -1.5}, id="negative-timeout"),
        pytest.param({"timeout": float("nan")}, id="nan-timeout"),
        pytest.param({"timeout": "soon"}, id="str-timeout"),
        pytest.param({"prefix": ""}, id="empty-prefix"),
        pytest.param({"prefix": "a\x00b"}, id="nul-prefix"),
    ],
)
def test_constructor_refuses_bad_options_before_any_io(kwargs: dict[str, Any]) -> None:
    # The endpoint refuses connections: any I/O would fail with BackendError instead.
    with pytest.raises(ConfigError):
        EtcdBackend(f"http://127.0.0.1:{closed_port()}", **kwargs)


@pytest.mark.parametrize(
    "endpoints",
    [
        pytest.param("", id="empty"),
        pytest.param([], id="none"),
        pytest.param("ftp://127.0.0.1:2379", id="ftp"),
        pytest.param("http://127.0.0.1:2379/v3", id="path"),
        pytest.param(["http://127.0.0.1:2379", "127.0.0.1:2379"], id="duplicate"),
        pytest.param(2379, id="int"),
    ],
)
def test_constructor_refuses_bad_endpoints(endpoints: Any) -> None:
    with pytest.raises(ConfigError):
        EtcdBackend(endpoints)


def test_construction_does_no_io() -> None:
    """Building a backend on a dead endpoint succeeds; the first operation finds it dead."""
    port = closed_port()
    backend = EtcdBackend(f"127.0.0.1:{port}", prefix=new_prefix(), timeout=2.0)
    try:
        assert backend.endpoints == (f"http://127.0.0.1:{port}",)
        with pytest.raises(BackendError) as caught:
            backend.acquire("w", "holder", TTL)
        assert caught.value.transient is True
    finally:
        backend.close()


# -- failover --------------------------------------------------------------------------------


def test_a_refused_first_endpoint_is_left_for_the_next(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    prefix = new_prefix()
    endpoints = [f"http://127.0.0.1:{closed_port()}", *etcd_cluster.endpoints]
    first = EtcdBackend(endpoints, prefix=prefix)
    second = EtcdBackend([endpoints[0], *reversed(etcd_cluster.endpoints)], prefix=prefix)
    try:
        token = first.acquire("w", "holder-1", TTL)
        first.checkpoint(token, b"step one", TTL)
        assert first.read_checkpoint(token) == Checkpoint(b"step one")
        first.renew(token, TTL)
        first.release(token, ExitMode.FINISHED)

        # The second client starts on the refused endpoint too and sees all of it.
        successor, view = second.acquire_with_checkpoint("w", "holder-2", TTL)
        assert view == Checkpoint(b"step one", ExitMode.FINISHED, "holder-1")
        assert successor.fencing_token > token.fencing_token
        second.release(successor, ExitMode.ABANDONED)
    finally:
        first.close()
        second.close()


@pytest.mark.slow
def test_a_silent_first_member_is_left_for_the_next_by_reads(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    """A member that takes the request and never answers: reads (writing nothing) go on to
    the next member, as the class documents."""
    prefix = new_prefix()
    silent = silent_listener()
    try:
        with EtcdBackend(
            [url_of(silent), *etcd_cluster.endpoints], prefix=prefix, timeout=1.0
        ) as backend:
            assert backend.find_available(["w", "v"]) == ["w", "v"]
    finally:
        silent.close()


def test_a_silent_first_member_is_left_for_the_next_by_range_reads(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    prefix = new_prefix()
    silent = silent_listener()
    try:
        with EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as writer:
            token = writer.acquire("w", "holder", TTL)
            writer.checkpoint(token, b"state", TTL)
            with EtcdBackend(
                [url_of(silent), *etcd_cluster.endpoints], prefix=prefix, timeout=1.0
            ) as reader:
                assert reader.read_checkpoint(token) == Checkpoint(b"state")
            writer.release(token, ExitMode.FINISHED)
    finally:
        silent.close()


# -- expiry ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_expiry_is_decided_by_etcd(etcd_cluster: etcd.EtcdCluster) -> None:
    prefix = new_prefix()
    with (
        EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as first,
        EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as second,
    ):
        started = time.monotonic()
        gone = first.acquire("w", "holder-a", 1.0)
        with pytest.raises(LeaseHeldError) as caught:
            second.acquire("w", "holder-b", TTL)
        assert caught.value.holder_id == "holder-a"

        successor = acquire_within(second, "w", "holder-b", TTL, 15.0)
        waited = time.monotonic() - started
        assert waited >= 1.0  # a lease is never shorter than asked
        assert successor.fencing_token > gone.fencing_token

        view = second.read_checkpoint(successor)
        assert view.prev_exit is ExitMode.EXPIRED
        assert view.prev_holder_id == "holder-a"
        assert view.state is None

        # The lapsed holder is fenced out everywhere it tries to write.
        with pytest.raises(FencedError):
            first.renew(gone, 1.0)
        with pytest.raises(FencedError):
            first.checkpoint(gone, b"late", 1.0)
        second.release(successor, ExitMode.FINISHED)


# -- release watch ---------------------------------------------------------------------------


def test_the_release_watch_is_instant_and_cross_client(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    prefix = new_prefix()
    with (
        EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as watcher,
        EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as holder,
    ):
        watch_running(watcher, holder)
        with watching(watcher, ["w"]) as watch, watching(watcher, ["unrelated"]) as other:
            token = holder.acquire("w", "holder-b", TTL)
            assert watch.wait(0.5) is False  # an acquire is no release
            released = time.monotonic()
            holder.release(token, ExitMode.FINISHED)
            assert watch.wait(10.0) is True
            assert time.monotonic() - released < PROMPT
            assert other.wait(0.5) is False
            assert watch.wait(0.1) is False  # reported once


@pytest.mark.slow
def test_a_lapse_wakes_a_release_watch(etcd_cluster: etcd.EtcdCluster) -> None:
    prefix = new_prefix()
    with (
        EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as watcher,
        EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as holder,
    ):
        watch_running(watcher, holder)
        with watching(watcher, ["lapse"]) as watch:
            started = time.monotonic()
            holder.acquire("lapse", "holder-b", 1.0)  # never renewed
            assert watch.wait(15.0) is True
            assert time.monotonic() - started >= 1.0  # woken by the lapse, not before it
            # etcd deleted the hold before it reported the deletion: the work ID is free
            token = watcher.acquire("lapse", "holder-a", TTL)
            watcher.release(token, ExitMode.FINISHED)


@pytest.mark.slow
def test_a_release_before_the_watch_stream_is_up_still_wakes_the_watch(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    """The watcher's first member never answers, so its watch stream comes up on the next
    member only after the release: the release happened after the watch was opened and
    must still wake it (or the watch must be woken to look again)."""
    prefix = new_prefix()
    silent = silent_listener()
    try:
        with (
            EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as holder,
            EtcdBackend(
                [url_of(silent), *etcd_cluster.endpoints], prefix=prefix, timeout=1.0
            ) as watcher,
        ):
            token = holder.acquire("w", "holder-b", TTL)
            with watching(watcher, ["w"]) as watch:
                holder.release(token, ExitMode.FINISHED)
                # A read through the watcher leaves the silent member for the next one.
                rows = watcher.rows()
                assert [row["held"] for row in rows] == [False]
                assert watch.wait(10.0) is True
    finally:
        silent.close()


# -- fencing tokens --------------------------------------------------------------------------


def test_tokens_strictly_increase_across_instances(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    prefix = new_prefix()
    with (
        EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as first,
        EtcdBackend(list(reversed(etcd_cluster.endpoints)), prefix=prefix) as second,
    ):
        tokens: list[int] = []
        previous: str | None = None
        for round_ in range(5):
            backend = (first, second)[round_ % 2]
            holder_id = f"holder-{round_}"
            token, view = backend.acquire_with_checkpoint("w", holder_id, TTL)
            assert view.prev_holder_id == previous
            assert view.prev_exit is (ExitMode.NONE if previous is None else ExitMode.FINISHED)
            tokens.append(token.fencing_token)
            backend.release(token, ExitMode.FINISHED)
            previous = holder_id
        assert all(a < b for a, b in pairwise(tokens)), tokens
        assert len(set(tokens)) == 5


# -- a member crash --------------------------------------------------------------------------


@pytest.mark.slow
def test_the_checkpoint_survives_the_leader_crashing() -> None:
    prefix = new_prefix()
    with etcd.cluster(3) as cluster:
        with EtcdBackend(cluster.endpoints, prefix=prefix) as backend:
            token = backend.acquire("w", "holder", 60.0)
            backend.checkpoint(token, b"before the crash", 60.0)
            leader = cluster.leader()
            cluster.kill(leader)
            try:
                view = read_checkpoint_within(backend, token, 20.0)
                assert view == Checkpoint(b"before the crash")
            finally:
                cluster.restart(leader)
        # The restarted member alone serves the same checkpoint from its own data.
        with EtcdBackend([leader.client_url], prefix=prefix) as alone:
            view = read_checkpoint_within(alone, token, 20.0)
            assert view == Checkpoint(b"before the crash")


# -- rows ------------------------------------------------------------------------------------


def test_rows_lists_every_work_id(etcd_cluster: etcd.EtcdCluster) -> None:
    prefix = new_prefix()
    with EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as backend:
        assert backend.rows() == []
        held = backend.acquire("b-held", "holder-1", TTL)
        backend.checkpoint(held, b"12345", TTL)
        done = backend.acquire("a-done", "holder-2", TTL)
        backend.release(done, ExitMode.FINISHED)

        rows = backend.rows()
        assert [row["work_id"] for row in rows] == ["a-done", "b-held"]
        first, second = rows
        assert first["holder_id"] == "holder-2"
        assert first["fencing_token"] == done.fencing_token
        assert first["held"] is False
        assert first["ttl_left"] is None
        assert first["exit_mode"] is ExitMode.FINISHED
        assert first["checkpoint_bytes"] is None

        assert second["holder_id"] == "holder-1"
        assert second["fencing_token"] == held.fencing_token
        assert second["held"] is True
        assert 1 <= second["ttl_left"] <= TTL
        assert second["exit_mode"] is None
        assert second["checkpoint_bytes"] == 5
        assert second["updated_at"] is not None
        backend.release(held, ExitMode.FINISHED)


# -- closed ----------------------------------------------------------------------------------


def test_a_closed_backend_refuses_everything(etcd_cluster: etcd.EtcdCluster) -> None:
    prefix = new_prefix()
    backend = EtcdBackend(etcd_cluster.endpoints, prefix=prefix)
    try:
        token = backend.acquire("w", "holder", TTL)
    finally:
        backend.close()
    backend.close()  # idempotent
    assert backend.watch_releases(["w"]) is None
    with pytest.raises(BackendError, match="closed"):
        backend.acquire("v", "holder", TTL)
    with pytest.raises(BackendError, match="closed"):
        backend.read_checkpoint(token)
    with pytest.raises(BackendError, match="closed"):
        backend.checkpoint(token, b"state", TTL)
    with pytest.raises(BackendError, match="closed"):
        backend.renew(token, TTL)
    with pytest.raises(BackendError, match="closed"):
        backend.release(token, ExitMode.FINISHED)
    with pytest.raises(BackendError, match="closed"):
        backend.rows()
    with pytest.raises(BackendError, match="closed"):
        backend.find_available(["w"])
    with pytest.raises(BackendError, match="closed"):
        backend.sweep(60.0, False)
    # The lease it left stays in etcd until it expires: another client still sees it held.
    with EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as other:
        with pytest.raises(LeaseHeldError):
            other.acquire("w", "someone", TTL)
