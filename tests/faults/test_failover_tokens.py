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

import time
from collections.abc import Iterator

import psycopg
import pytest

from tests import pg
from worklease import ExitMode, Lease, LeaseHeldError, PostgresBackend, check_postgres
from worklease._pg import TOKEN_TIMELINE_SHIFT

from .conftest import scaled

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
