"""Fault tests run against their own throwaway PostgreSQL cluster, never a shared server.

``cluster`` is one cluster per test module (so restarts and role settings stay contained);
``cluster_dsn`` is a fresh database in it with the worklease schema. ``WORKLEASE_FAULTS_LONG=1``
(set by ``nox -s faults``) asks the tests for their long variants.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests import pg

LONG = os.environ.get("WORKLEASE_FAULTS_LONG", "") == "1"


def scaled(short: int, long: int) -> int:
    """An iteration count: ``short`` in the ordinary suite, ``long`` under ``nox -s faults``."""
    return long if LONG else short


@pytest.fixture(scope="module")
def cluster() -> Iterator[pg.ThrowawayCluster]:
    bindir = pg.find_bindir()
    if bindir is None:
        reason = "no PostgreSQL server binaries to start a private cluster for fault tests"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    cluster = pg.ThrowawayCluster(bindir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_dsn(cluster: pg.ThrowawayCluster) -> Iterator[str]:
    with pg.fresh_database(cluster.dsn) as dsn:
        yield dsn
