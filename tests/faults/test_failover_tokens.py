"""Fencing tokens across a failover under asynchronous replication (issue 13).

A primary and a streaming standby (two private clusters). Tokens are issued on the primary;
the standby then falls behind (stopped: the writes after that never reach it, as with
replication lag) while the primary issues more; the primary is killed with SIGKILL and the
standby promoted. Before ADR-0008 the promoted standby's sequence stood behind the tokens the
old primary had acknowledged and issued some of them a second time; now every token issued
after the promotion is greater than every token issued before it, for every work ID, lost
rows included.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests import pg
from worklease import (
    AsyncLease,
    AsyncPostgresBackend,
    BackendError,
    ExitMode,
    Lease,
    LeaseHeldError,
    PostgresBackend,
    check_postgres,
)
from worklease._pg import TOKEN_TIMELINE_SHIFT

from .conftest import LONG, scaled

pytestmark = [pytest.mark.postgres, pytest.mark.faults]

WORK_IDS = [f"failover-{i:02d}" for i in range(20)]


@pytest.fixture
def clusters() -> Iterator[tuple[pg.ThrowawayCluster, pg.ThrowawayCluster]]:
    bindir = pg.find_bindir()
    if bindir is None:
        pytest.fail("no PostgreSQL server binaries for the failover test", pytrace=False)
    primary, standby = pg.ThrowawayCluster(bindir), pg.ThrowawayCluster(bindir)
    try:
        primary.start()
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            PostgresBackend.apply_schema(conn)
        standby.start_as_standby(primary)
        yield primary, standby
    finally:
        standby.stop()
        primary.stop()


def _rounds(lease: Lease, rounds: int, issued: dict[str, list[int]]) -> None:
    for _ in range(rounds):
        for work_id in WORK_IDS:
            token = lease.acquire(work_id)
            lease.checkpoint(token, f"{token.fencing_token}".encode())
            lease.release(token, ExitMode.FINISHED)
            issued.setdefault(work_id, []).append(token.fencing_token)


def _caught_up(primary_dsn: str, standby_dsn: str) -> None:
    target = pg.execute(primary_dsn, "SELECT pg_current_wal_lsn()")[0][0]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        replayed = pg.execute(
            standby_dsn, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
        )[0][0]
        if replayed:
            return
        time.sleep(0.05)
    raise AssertionError("the standby did not catch up")


def _timeline(dsn: str) -> int:
    name = pg.execute(dsn, "SELECT pg_walfile_name(pg_current_wal_lsn())")[0][0]
    return int(str(name)[:8], 16)


def test_tokens_after_a_promotion_exceed_every_token_before_it(
    clusters: tuple[pg.ThrowawayCluster, pg.ThrowawayCluster],
) -> None:
    primary, standby = clusters
    issued: dict[str, list[int]] = {}
    lost: dict[str, list[int]] = {}
    with PostgresBackend.connect(primary.dsn, min_size=1, max_size=2, listen=False) as backend:
        lease = Lease(backend, holder_id="old-primary", ttl=30)
        _rounds(lease, scaled(3, 20), issued)
        _caught_up(primary.dsn, standby.dsn)
        standby.server_stop()  # from here on the standby misses every write
        _rounds(lease, scaled(3, 20), lost)
        assert _timeline(primary.dsn) == 1
        primary.kill()
    standby.server_start()
    standby.promote()
    assert _timeline(standby.dsn) == 2
    with PostgresBackend.connect(standby.dsn, min_size=1, max_size=2, listen=False) as backend:
        lease = Lease(backend, holder_id="new-primary", ttl=30)
        after: dict[str, int] = {}
        for work_id in WORK_IDS:
            try:
                token = lease.acquire(work_id)
            except LeaseHeldError:  # cannot happen: every lease was released
                raise
            after[work_id] = token.fencing_token
            prior = lease.read_checkpoint(token)
            # The standby has the replicated rounds, not the lost ones.
            assert prior.state == str(issued[work_id][-1]).encode()
    before = {w: max(issued[w] + lost[w]) for w in WORK_IDS}
    reissued = sum(1 for w in WORK_IDS if after[w] <= before[w])
    assert reissued == 0, {w: (before[w], after[w]) for w in WORK_IDS if after[w] <= before[w]}
    assert all(after[w] >> TOKEN_TIMELINE_SHIFT == 2 for w in WORK_IDS)
    # What the old scheme (a bare sequence) would have done: the promoted sequence lags the
    # tokens the old primary acknowledged.
    sequence_after = max(t & ((1 << TOKEN_TIMELINE_SHIFT) - 1) for t in after.values())
    assert sequence_after <= max(t & ((1 << TOKEN_TIMELINE_SHIFT) - 1) for t in before.values())


def test_check_warns_about_an_asynchronous_standby_and_not_a_synchronous_one(
    clusters: tuple[pg.ThrowawayCluster, pg.ThrowawayCluster],
) -> None:
    primary, _standby = clusters
    deadline = time.monotonic() + 30
    while not pg.execute(primary.dsn, "SELECT count(*) FROM pg_stat_replication")[0][0]:
        assert time.monotonic() < deadline, "the standby never connected"
        time.sleep(0.1)
    report = check_postgres(primary.dsn, probe_timeout=2.0)
    print("\n".join(f"{f.status:<5} {f.name:<18}  {f.detail}" for f in report.findings))
    assert report["replication"].status == "warn"
    assert "asynchronous" in report["replication"].detail
    assert report.ok  # a warning, not a failure
    pg.execute(primary.dsn, "ALTER SYSTEM SET synchronous_standby_names = '*'")
    pg.execute(primary.dsn, "SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    while pg.execute(primary.dsn, "SELECT sync_state FROM pg_stat_replication")[0][0] != "sync":
        assert time.monotonic() < deadline, "replication never became synchronous"
        time.sleep(0.1)
    assert check_postgres(primary.dsn, probe_timeout=2.0)["replication"].status == "ok"


# -- holders riding through a failover ------------------------------------------------------

HOLDERS = [f"held-{i}" for i in range(6)]
CHURNED = [f"churn-{i:02d}" for i in range(10)]
FAILOVER_TTL = 30.0


def _multi_host(primary: pg.ThrowawayCluster, standby: pg.ThrowawayCluster) -> str:
    """The documented multi-host DSN: libpq tries each host and keeps the writable one."""
    return (
        f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres "
        "dbname=postgres target_session_attrs=read-write connect_timeout=2"
    )


STEP_EVERY = 5
"""Every fifth write of a holder is a transactional step (the application pool's path)."""

UNKNOWN_COMMIT = "whether the step committed is unknown"


def _replayed(standby_dsn: str) -> None:
    """Wait until the standby has replayed all the WAL it has: what it then shows is what it
    starts with once promoted (the primary is dead, so nothing more arrives). Read before the
    promotion, while the holders keep trying to write, so that no write landing on the new
    primary can hide a lost checkpoint behind a newer value."""
    deadline = time.monotonic() + 30
    last, since = None, time.monotonic()
    while True:
        received, replayed, caught_up = pg.execute(
            standby_dsn,
            "SELECT pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn(), "
            "pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()",
        )[0]
        if received is not None and caught_up:
            return
        if received is None:  # restarted without its primary: replaying what it has
            if replayed != last:
                last, since = replayed, time.monotonic()
            elif time.monotonic() - since > 0.5:
                return
        assert time.monotonic() < deadline, "the standby did not finish replaying"
        time.sleep(0.02)


class _Record:
    """What one holder saw: every acknowledged value with its time, the failures it rode
    out, and how its hold ended."""

    def __init__(self, work_id: str) -> None:
        self.work_id = work_id
        self.acked: list[tuple[int, float]] = []
        self.token: int | None = None
        self.lost: BaseException | None = None
        self.failures = 0
        self.error: BaseException | None = None

    def acked_before(self, moment: float) -> int:
        return max((n for n, at in self.acked if at < moment), default=0)

    def first_ack_after(self, moment: float) -> float | None:
        return next((at for _, at in self.acked if at > moment), None)

    def rides_out(self, exc: BackendError | psycopg.OperationalError) -> bool:
        """A failure the holder retries: transient, a step whose COMMIT lost its connection
        (it writes its next value anyway; a real holder would read first), or the holder's
        own statement in a step losing its connection (psycopg's error, as for any
        statement of the application's)."""
        if isinstance(exc, psycopg.OperationalError):
            self.failures += 1
            return True
        if exc.transient or UNKNOWN_COMMIT in str(exc):
            self.failures += 1
            return True
        return False


class _Holder(threading.Thread):
    """Holds one work ID through ``hold()`` and writes a counter, a checkpoint or (every
    fifth) a transactional step, until stopped, failures or not."""

    def __init__(self, lease: Lease, work_id: str) -> None:
        super().__init__(name=f"holder-{work_id}", daemon=True)
        self.lease = lease
        self.record = _Record(work_id)
        self.stop = threading.Event()

    def run(self) -> None:
        record = self.record
        try:
            with self.lease.hold(record.work_id) as held:
                record.token = held.token.fencing_token
                n = 0
                while not self.stop.is_set():
                    n += 1
                    try:
                        if n % STEP_EVERY == 0:
                            with held.transaction() as tx:
                                tx.connection.execute(b"SELECT 1")
                                tx.checkpoint(str(n).encode())
                        else:
                            held.checkpoint(str(n).encode())
                    except (BackendError, psycopg.OperationalError) as exc:
                        if not record.rides_out(exc):
                            raise
                        time.sleep(0.05)
                        continue
                    record.acked.append((n, time.monotonic()))
                    time.sleep(0.02)
                record.lost = held.renewal.cause
        except BaseException as exc:
            record.error = exc


class _AsyncHolders(threading.Thread):
    """The same holders in the asyncio flavour: one event loop in a thread of its own, one
    task per work ID, all on one ``AsyncLease`` over a backend of their own."""

    def __init__(self, dsn: str, work_ids: list[str]) -> None:
        super().__init__(name="async-holders", daemon=True)
        self.dsn = dsn
        self.records = [_Record(work_id) for work_id in work_ids]
        self.stop = threading.Event()

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        backend = AsyncPostgresBackend.connect(self.dsn, min_size=1, max_size=10, listen=False)
        async with backend:
            lease = AsyncLease(backend, holder_id="holder", ttl=FAILOVER_TTL)
            await asyncio.gather(*(self._hold(lease, record) for record in self.records))

    async def _hold(self, lease: AsyncLease, record: _Record) -> None:
        try:
            async with lease.hold(record.work_id) as held:
                record.token = held.token.fencing_token
                n = 0
                while not self.stop.is_set():
                    n += 1
                    try:
                        if n % STEP_EVERY == 0:
                            async with held.transaction() as tx:
                                await tx.connection.execute(b"SELECT 1")
                                tx.checkpoint(str(n).encode())
                        else:
                            await held.checkpoint(str(n).encode())
                    except (BackendError, psycopg.OperationalError) as exc:
                        if not record.rides_out(exc):
                            raise
                        await asyncio.sleep(0.05)
                        continue
                    record.acked.append((n, time.monotonic()))
                    await asyncio.sleep(0.02)
                record.lost = held.renewal.cause
        except BaseException as exc:
            record.error = exc


def _wait_sync(primary: pg.ThrowawayCluster) -> None:
    pg.execute(primary.dsn, "ALTER SYSTEM SET synchronous_standby_names = '*'")
    pg.execute(primary.dsn, "SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    # The standby may not have connected yet: no row until it has.
    while pg.execute(primary.dsn, "SELECT sync_state FROM pg_stat_replication") != [("sync",)]:
        assert time.monotonic() < deadline, "replication never became synchronous"
        time.sleep(0.1)


def _failover_trial(replication: str, flavour: str) -> dict[str, float]:
    """One trial on fresh clusters: holders (of ``flavour``) writing through the multi-host
    DSN all along, churned acquires, (async: the standby falls behind), kill -9 of the
    primary, promotion. Returns the figures and asserts the guarantees."""
    bindir = pg.find_bindir()
    assert bindir is not None
    primary, standby = pg.ThrowawayCluster(bindir), pg.ThrowawayCluster(bindir)
    try:
        primary.start()
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            PostgresBackend.apply_schema(conn)
        standby.start_as_standby(primary)
        if replication == "sync":
            _wait_sync(primary)
        dsn = _multi_host(primary, standby)
        issued: dict[str, list[int]] = {}
        with PostgresBackend.connect(dsn, min_size=1, max_size=10, listen=False) as backend:
            stops: list[threading.Event]
            if flavour == "sync":
                lease = Lease(backend, holder_id="holder", ttl=FAILOVER_TTL)
                threads = [_Holder(lease, work_id) for work_id in HOLDERS]
                records = [thread.record for thread in threads]
                stops = [thread.stop for thread in threads]
                workers: list[threading.Thread] = list(threads)
            else:
                group = _AsyncHolders(dsn, HOLDERS)
                records, stops, workers = group.records, [group.stop], [group]
            for worker in workers:
                worker.start()
            deadline = time.monotonic() + 30
            while any(r.token is None or not r.acked for r in records):
                assert not any(r.error for r in records), [r.error for r in records]
                assert time.monotonic() < deadline, "the holders did not start writing"
                time.sleep(0.05)
            churn = Lease(backend, holder_id="churn", ttl=FAILOVER_TTL)
            for _ in range(3):
                for work_id in CHURNED:
                    token = churn.acquire(work_id)
                    churn.release(token, ExitMode.FINISHED)
                    issued.setdefault(work_id, []).append(token.fencing_token)
            if replication == "async":
                _caught_up(primary.dsn, standby.dsn)
                standby.server_stop()  # lag: from here on the standby misses every write
            for _ in range(3):  # tokens the promoted standby may never see (async)
                for work_id in CHURNED:
                    token = churn.acquire(work_id)
                    churn.release(token, ExitMode.FINISHED)
                    issued.setdefault(work_id, []).append(token.fencing_token)
            time.sleep(0.5)
            for record in records:
                issued.setdefault(record.work_id, []).append(record.token or 0)
            killed = time.monotonic()
            primary.kill()  # the holders keep writing: every write fails until promotion
            acked = {r.work_id: r.acked_before(killed) for r in records}
            if replication == "async":
                standby.server_start()
            # The holders keep trying to write all through the outage (psycopg_pool's
            # reconnect backoff grows meanwhile).
            time.sleep(max(0.0, killed + 1.5 - time.monotonic()))
            _replayed(standby.dsn)
            stored = {
                work_id: int(bytes(state).decode()) if state is not None else 0
                for work_id, state in pg.execute(
                    standby.dsn, "SELECT work_id, checkpoint FROM worklease_leases"
                )
                if work_id in acked
            }
            lost = sum(1 for w in HOLDERS if stored.get(w, 0) < acked[w])
            lost_values = sum(max(acked[w] - stored.get(w, 0), 0) for w in HOLDERS)
            standby.promote()
            promoted = time.monotonic()
            deadline = time.monotonic() + FAILOVER_TTL
            while any(r.first_ack_after(promoted) is None for r in records):
                assert time.monotonic() < deadline, "holders did not write again"
                assert not any(r.error for r in records), [r.error for r in records]
                time.sleep(0.05)
            resumed = max(r.first_ack_after(promoted) or 0.0 for r in records)
            for stop in stops:
                stop.set()
            for worker in workers:
                worker.join(30)
            after = {w: churn.acquire(w).fencing_token for w in CHURNED}
            for record in records:
                # Held through the failover: same token, never lost, released FINISHED.
                assert record.error is None, record.error
                assert record.lost is None
                after[record.work_id] = churn.acquire(record.work_id).fencing_token
        before = {w: max(tokens) for w, tokens in issued.items()}
        reissued = sum(1 for w in before if after[w] <= before[w])
        assert reissued == 0, {w: (before[w], after[w]) for w in before if after[w] <= before[w]}
        if replication == "sync":
            assert lost == 0, (acked, stored)
        return {
            "lost_work_ids": lost,
            "lost_checkpoints": lost_values,
            "reissued": reissued,
            "outage": promoted - killed,
            "resumed_after_promotion": resumed - promoted,
            "failures": sum(r.failures for r in records),
        }
    finally:
        standby.stop()
        primary.stop()


# Each replication mode and each flavour once in the ordinary suite; every pairing under
# nox -s faults.
_TRIALS = (
    [("async", "sync"), ("async", "async"), ("sync", "sync"), ("sync", "async")]
    if LONG
    else [("async", "sync"), ("sync", "async")]
)


@pytest.mark.parametrize(("replication", "flavour"), _TRIALS)
def test_holders_keep_their_leases_through_a_failover(replication: str, flavour: str) -> None:
    trials = [_failover_trial(replication, flavour) for _ in range(scaled(1, 10))]
    lines = [
        f"{replication} replication, {flavour} holders, trial {i + 1}: lost "
        f"{t['lost_checkpoints']:.0f} acknowledged checkpoint(s) on {t['lost_work_ids']:.0f} "
        f"work ID(s), {t['reissued']:.0f} tokens reissued, kill→promoted {t['outage']:.2f}s, "
        f"writes resumed {t['resumed_after_promotion']:.2f}s after promotion "
        f"({t['failures']:.0f} failed writes ridden out)"
        for i, t in enumerate(trials)
    ]
    print("\n" + "\n".join(lines))
