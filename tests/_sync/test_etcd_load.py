# Generated from tests/_async/test_etcd_load.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""The etcd backend under load (issue 23): big batches of keepalives, and many callers sharing
one backend object.

- etcd's keepalive stream (one JSON line per lease through the gateway) can come back short:
  the gateway stops reading a request once it starts answering, so the lines it had not read
  are never applied and never answered. A lease without an answer is unknown, not gone: it is
  sent again, and a renewal that cannot get its answers is a transient error, never a loss.
  The cases read each lease's TTL back from etcd: a keepalive reported applied was applied.
- Callers beyond the backend's connections wait their turn for one, first come first served:
  the wait is nobody's failure (no member is blamed, nothing fails over) and renewals have
  connections of their own, so they go on while every other connection is busy. A call still
  waiting at its caller's deadline gives up unsent; callers waiting when the backend closes
  are told it is closed.

Cases that need the gateway to misbehave in a known way go through ``etcd.GatewayProxy``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import httpx
import pytest

from tests import etcd
from tests._compat import spawn_all
from worklease import BackendError, EtcdBackend, Lease, Token
from worklease._compat import Event, Worker, join_all, sleep, spawn
from worklease._deadline import bounded_by
from worklease._etcd import MAIN_CONNECTIONS
from worklease._sync import etcd as etcd_backend
from worklease._sync.etcd import _Lane

pytestmark = pytest.mark.etcd

MANY = 300
"""Separately acquired leases renewed in one call (the issue saw 96 of 300 reported lost)."""
CROWD = 300
"""Concurrent callers on one backend object (the issue saw every one of 300 fail)."""
TTL = 60.0
RUN_DOWN = 4.0
"""Seconds the leases' TTLs run down before a renewal, so a refreshed lease shows in its TTL
(read back well within this after the renewal)."""


def new_prefix() -> str:
    return f"load-{uuid.uuid4().hex}/"


def ids(count: int) -> list[str]:
    return [f"w{i:04d}" for i in range(count)]


@contextmanager
def proxied(
    cluster: etcd.EtcdCluster, prefix: str, timeout: float = 5.0
) -> Iterator[tuple[EtcdBackend, list[etcd.GatewayProxy]]]:
    """A backend reaching every member through a proxy of its own."""
    proxies = [etcd.GatewayProxy(member.client_url) for member in cluster.members]
    try:
        with EtcdBackend(
            [proxy.url for proxy in proxies], prefix=prefix, timeout=timeout
        ) as backend:
            yield backend, proxies
    finally:
        for proxy in proxies:
            proxy.close()


def not_refreshed(before: dict[int, int], after: dict[int, int]) -> list[int]:
    """The leases whose TTL did not go up between the two readings (time only lowers it)."""
    return [lease for lease, ttl in after.items() if ttl <= before[lease]]


def until(done: Callable[[], bool], what: str, within: float = 30.0) -> None:
    """Wait until ``done()`` (a generous bound: it fails only when it never happens)."""
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, what
        sleep(0.02)


def fill_the_calls_lane(
    backend: EtcdBackend, proxy: etcd.GatewayProxy, extra: int = 0
) -> tuple[Worker, list[Token | BaseException]]:
    """Busy every connection for ordinary calls: ``proxy`` (the preferred member's) holds its
    answers to lease grants, and as many acquires as there are connections wait for theirs
    (``extra`` more wait for a connection). Release the proxy, then join the worker."""
    proxy.hold("/v3/lease/grant")
    results: list[Token | BaseException] = []

    def acquire(i: int) -> Token:
        return backend.acquire(f"crowd{i:04d}", "h", TTL)

    def storm() -> None:
        results.extend(spawn_all(acquire, MAIN_CONNECTIONS + extra))

    worker = spawn(storm, name="test-storm")
    until(lambda: proxy.held == MAIN_CONNECTIONS, "the grants did not reach the member")
    until(lambda: len(backend._calls._queue) == extra, "the extra callers did not queue")
    return worker, results


# -- keepalives ----------------------------------------------------------------------------


def test_renew_many_of_many_separate_leases_refreshes_every_one(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    prefix = new_prefix()
    with EtcdBackend(etcd_cluster.endpoints, prefix=prefix) as backend:
        tokens = [token for token, _ in backend.acquire_many(ids(MANY), "h", TTL)]
        leases = etcd.hold_leases(etcd_cluster, prefix)
        assert len(set(leases.values())) == MANY  # one etcd lease each
        sleep(RUN_DOWN)
        before = etcd.lease_ttls(etcd_cluster, list(leases.values()))
        assert backend.renew_many(tokens, TTL) == [None] * MANY
        after = etcd.lease_ttls(etcd_cluster, list(leases.values()))
        assert not_refreshed(before, after) == []
        for _ in range(2):
            assert backend.renew_many(tokens, TTL) == [None] * MANY
        assert etcd.hold_leases(etcd_cluster, prefix) == leases  # refreshed, never replaced


def test_keepalive_answers_that_come_back_short_are_sent_again(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    prefix = new_prefix()
    with proxied(etcd_cluster, prefix) as (backend, proxies):
        count = 40
        tokens = [token for token, _ in backend.acquire_many(ids(count), "h", TTL)]
        leases = etcd.hold_leases(etcd_cluster, prefix)
        sleep(RUN_DOWN)
        before = etcd.lease_ttls(etcd_cluster, list(leases.values()))
        for proxy in proxies:
            proxy.keepalive = "half"  # every stream of more than one line comes back short
        assert backend.renew_many(tokens, TTL) == [None] * count
        states = [(token, b"state") for token in tokens]
        assert backend.checkpoint_many(states, TTL) == [None] * count
        after = etcd.lease_ttls(etcd_cluster, list(leases.values()))
        assert not_refreshed(before, after) == []
        # Every hold is still on its own etcd lease: refreshed, not replaced by a new grant.
        assert etcd.hold_leases(etcd_cluster, prefix) == leases
        assert (backend.read_checkpoint(tokens[-1])).state == b"state"


def test_keepalives_nobody_answers_are_a_transient_error_not_a_loss(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    prefix = new_prefix()
    with proxied(etcd_cluster, prefix) as (backend, proxies):
        tokens = [token for token, _ in backend.acquire_many(ids(5), "h", TTL)]
        for proxy in proxies:
            proxy.keepalive = "none"
        with pytest.raises(BackendError) as caught:
            backend.renew_many(tokens, TTL)
        assert caught.value.transient
        with pytest.raises(BackendError) as single:
            backend.renew(tokens[0], TTL)
        assert single.value.transient
        with pytest.raises(BackendError) as written:
            backend.checkpoint(tokens[0], b"state", TTL)
        assert written.value.transient
        for proxy in proxies:
            proxy.keepalive = "all"
        assert backend.renew_many(tokens, TTL) == [None] * len(tokens)


def test_a_member_answering_no_keepalives_is_left_for_the_next(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    """Only the preferred member answers keepalives with nothing: the refresh moves on to
    another member, which answers them (no error, and every hold keeps its etcd lease)."""
    prefix = new_prefix()
    with proxied(etcd_cluster, prefix) as (backend, proxies):
        tokens = [token for token, _ in backend.acquire_many(ids(5), "h", TTL)]
        leases = etcd.hold_leases(etcd_cluster, prefix)
        assert proxies[0].requests
        assert not any(proxy.requests for proxy in proxies[1:])
        proxies[0].keepalive = "none"
        assert backend.renew_many(tokens, TTL) == [None] * len(tokens)
        backend.renew(tokens[0], TTL)
        backend.checkpoint(tokens[1], b"state", TTL)
        assert proxies[0].requests.get("/v3/lease/keepalive")
        assert any(proxy.requests.get("/v3/lease/keepalive") for proxy in proxies[1:])
        assert etcd.hold_leases(etcd_cluster, prefix) == leases  # refreshed, never replaced
        assert (backend.read_checkpoint(tokens[1])).state == b"state"


# -- many callers on one backend -----------------------------------------------------------


def test_many_concurrent_acquires_on_one_backend_all_succeed(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    # A short request timeout: waiting for a connection is not bounded by it.
    with EtcdBackend(etcd_cluster.endpoints, prefix=new_prefix(), timeout=1.0) as backend:

        def acquire(i: int) -> Token:
            return backend.acquire(f"w{i:04d}", "h", TTL)

        results = spawn_all(acquire, CROWD)
        assert [r for r in results if isinstance(r, BaseException)] == []
        tokens = [r for r in results if isinstance(r, Token)]
        assert len({token.fencing_token for token in tokens}) == CROWD
        assert backend.renew_many(tokens, TTL) == [None] * CROWD


def test_calls_wait_for_busy_connections_and_renewals_go_on(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    """Every connection for ordinary calls is busy: the first member holds its answers to
    lease grants for longer than the request timeout (a blank every 0.2 s keeps each read
    alive). Acquires beyond the connections wait their turn instead of failing, no call is
    sent to another member (a wait for this client's own connections is no member's fault),
    and a renewal goes through meanwhile."""
    crowd = 100
    with proxied(etcd_cluster, new_prefix(), timeout=1.0) as (backend, proxies):
        renewed = backend.acquire("renewed", "h", TTL)
        first, others = proxies[0], proxies[1:]
        assert first.requests
        assert not any(proxy.requests for proxy in others)
        first.hold("/v3/lease/grant")
        results: list[Token | BaseException] = []

        def acquire(i: int) -> Token:
            return backend.acquire(f"w{i:04d}", "h", TTL)

        def storm() -> None:
            results.extend(spawn_all(acquire, crowd))

        worker = spawn(storm, name="test-storm")
        try:
            deadline = time.monotonic() + 30.0
            while first.held == 0:
                assert time.monotonic() < deadline, "no grant reached the member"
                sleep(0.05)
            sleep(2.5)  # well past the request timeout, every grant still held
            assert first.held < crowd  # some acquires wait for a connection
            backend.renew(renewed, TTL)
            backend.renew(renewed, TTL)
        finally:
            first.release()
            assert join_all([worker], timeout=60.0)
        assert [r for r in results if isinstance(r, BaseException)] == []
        assert len(results) == crowd
        assert not any(proxy.requests for proxy in others)


def test_a_call_still_waiting_for_a_connection_at_its_deadline_is_never_sent(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    """Every connection for ordinary calls is busy. A call whose caller's deadline (the lease
    layer's: an acquire's timeout, a sync checkpoint or release inside a renewal's window)
    comes while it waits for one gives up then and is never sent: sent later, an acquire
    would be granted after its caller gave up, a checkpoint would write after the renewal
    reported the lease lost."""
    prefix = new_prefix()
    with proxied(etcd_cluster, prefix, timeout=1.0) as (backend, proxies):
        lease = Lease(backend, holder_id="late", ttl=TTL)
        worker, results = fill_the_calls_lane(backend, proxies[0])
        try:
            with bounded_by(time.monotonic() + 0.5), pytest.raises(BackendError) as waited:
                backend.acquire("late", "h", TTL)
            assert waited.value.transient
            assert "the caller's deadline came while it waited" in str(waited.value)
            assert "never sent: no etcd member was asked" in str(waited.value)
            with pytest.raises(TimeoutError):
                lease.acquire("late-too", wait=True, timeout=0.5)
            # Nothing is left waiting to be sent once a connection is free (a sync attempt
            # the lease abandoned runs on in a helper thread).
            until(lambda: not backend._calls._queue, "an abandoned call still waits", 10.0)
        finally:
            proxies[0].release()
            assert join_all([worker], timeout=60.0)
        assert [r for r in results if isinstance(r, BaseException)] == []
        assert not {"late", "late-too"} & etcd.work_ids(etcd_cluster, prefix)  # never granted
        # A deadline already passed: nothing is sent, even with connections free.
        with bounded_by(time.monotonic() - 1.0), pytest.raises(BackendError) as passed:
            backend.acquire("late", "h", TTL)
        assert passed.value.transient
        assert "the caller's deadline had passed" in str(passed.value)
        assert "late" not in etcd.work_ids(etcd_cluster, prefix)


def test_a_failover_attempt_past_the_callers_deadline_is_not_sent() -> None:
    """The first member got the read and answered nothing before the caller's deadline: the
    read is not sent on to the next member, and the error names what the first one did (a
    member was asked)."""
    asked: list[str] = []

    def nothing(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        sleep(0.3)  # past the caller's deadline
        raise httpx.ReadTimeout("timed out", request=request)

    backend = EtcdBackend(["http://m1:2379", "http://m2:2379"], prefix=new_prefix())
    backend._client.close()
    backend._client = httpx.Client(transport=httpx.MockTransport(nothing))
    try:
        token = Token("w", "h", 1000, datetime.now(UTC))
        with bounded_by(time.monotonic() + 0.1), pytest.raises(BackendError) as caught:
            backend.read_checkpoint(token)
    finally:
        backend.close()
    assert asked == ["http://m1:2379/v3/kv/range"]
    assert caught.value.transient
    assert "the caller's deadline had passed" in str(caught.value)
    assert "not sent again after etcd at http://m1:2379 failed (timed out)" in str(caught.value)
    assert isinstance(caught.value.__cause__, httpx.ReadTimeout)


def test_callers_waiting_for_a_connection_when_the_backend_closes_are_told_so(
    etcd_cluster: etcd.EtcdCluster,
) -> None:
    """Calls in flight and calls waiting for a connection when the backend closes raise what
    a closed backend raises, not httpx's error for its closed client."""
    extra = 4
    with proxied(etcd_cluster, new_prefix(), timeout=1.0) as (backend, proxies):
        worker, results = fill_the_calls_lane(backend, proxies[0], extra)
        try:
            backend.close()
            assert join_all([worker], timeout=60.0)
        finally:
            proxies[0].release()
    assert len(results) == MAIN_CONNECTIONS + extra
    for result in results:
        assert isinstance(result, BackendError), repr(result)
        assert str(result).startswith("acquire: the backend is closed"), str(result)


# -- connection lanes ------------------------------------------------------------------------


def test_callers_waiting_for_a_connection_get_it_in_the_order_they_came() -> None:
    lane = _Lane("calls", 1)
    assert lane.enter(1.0)
    order: list[int] = []

    def waiter(n: int) -> None:
        if lane.enter(30.0):
            order.append(n)
            lane.leave()

    workers: list[Worker] = []
    for n in range(4):
        workers.append(spawn(waiter, n, name=f"test-waiter-{n}"))
        until(lambda: len(lane._queue) == len(workers), "a waiter did not queue")
    lane.leave()
    assert join_all(workers, timeout=30.0)
    assert order == [0, 1, 2, 3]
    assert (lane._free, len(lane._queue)) == (1, 0)


def test_a_connection_handed_over_as_its_waiter_times_out_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connection comes just as the wait ends: the waiter has it (it is not lost)."""
    lane = _Lane("calls", 1)

    class HandedOverLate(Event):
        def wait(self, timeout: float | None = None) -> bool:
            lane.leave()  # handed to this waiter, the first in the queue...
            return False  # ...as its wait timed out

    assert lane.enter(1.0)
    monkeypatch.setattr(etcd_backend, "Event", HandedOverLate)
    assert lane.enter(1.0)
    assert (lane._free, len(lane._queue)) == (0, 0)
    lane.leave()
    assert lane._free == 1


def test_a_connection_handed_over_as_its_waiter_is_interrupted_is_passed_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connection comes just as the waiter is cancelled (interrupted, in a thread): it
    goes to the next caller, or back to the lane (it is not lost)."""
    lane = _Lane("calls", 1)

    class Interrupted(BaseException):
        pass

    class HandedOverInterrupted(Event):
        def wait(self, timeout: float | None = None) -> bool:
            lane.leave()  # handed to this waiter, the first in the queue...
            raise Interrupted  # ...as it is interrupted

    assert lane.enter(1.0)
    monkeypatch.setattr(etcd_backend, "Event", HandedOverInterrupted)
    with pytest.raises(Interrupted):
        lane.enter(1.0)
    assert (lane._free, len(lane._queue)) == (1, 0)


def test_a_waiter_that_times_out_leaves_the_queue() -> None:
    lane = _Lane("calls", 1)
    assert lane.enter(1.0)
    assert lane.enter(0.05) is False
    assert not lane._queue
    lane.leave()
    assert lane._free == 1
