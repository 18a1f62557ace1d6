"""Hostile input: work IDs, holder IDs, schema names and checkpoint states built to break SQL.

Every input either round-trips exactly or is refused with the documented error (``TypeError``
/ ``ValueError`` / ``ConfigError``) before any I/O. No driver exception (``psycopg.Error``) and
no ``BackendError`` wrapping a SQL error may surface, nothing is half-written, and afterwards
the lease table exists and holds exactly the expected rows. Both backends (PostgreSQL and
memory) for the sync flavour; a subset for the async flavour.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import worklease
from tests import pg
from tests.faults import audit
from worklease import (
    AsyncLease,
    AsyncPostgresBackend,
    Backend,
    BackendError,
    Checkpoint,
    ConfigError,
    ExitMode,
    FencedError,
    Lease,
    LeaseHeldError,
    MemoryBackend,
    PostgresBackend,
    Vacuum,
    WorkleaseError,
)
from worklease.testing import RecordingObserver

pytestmark = [pytest.mark.postgres, pytest.mark.faults]

_rng = random.Random(20240611)


def random_text(size_bytes: int, *, printable_ascii: bool = False) -> str:
    """Random text of exactly ``size_bytes`` UTF-8 bytes (no NUL, no surrogates)."""
    if printable_ascii:
        return "".join(_rng.choice([chr(c) for c in range(32, 127)]) for _ in range(size_bytes))
    pools = [(0x21, 0x7E), (0xA1, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFD), (0x10000, 0x1FFFF)]
    chars: list[str] = []
    left = size_bytes
    while left:
        low, high = _rng.choice(pools)
        char = chr(_rng.randint(low, high))
        size = len(char.encode("utf-8"))
        if size <= left:
            chars.append(char)
            left -= size
    text = "".join(chars)
    assert len(text.encode("utf-8")) == size_bytes
    return text


ROUND_TRIP_IDS = [
    "a'b",
    "'; DROP TABLE worklease_leases; --",
    '"; DROP TABLE worklease_leases; --',
    "x'); DELETE FROM worklease_leases; SELECT ('",
    "%s",
    "%(x)s",
    "%(work_id)s",
    "%%",
    "{table}",
    "$1",
    "\\",
    "\\x00",
    "E'\\\\'",
    "/* unterminated",
    "-- comment",
    "ünïcødé ✓ 🚀 👩‍👩‍👧 \u202e",
    " spaces ",
    "\t\n\r",
    "\x01\x7f",
    "a" * 1024,
    "é" * 512,
    random_text(1000),
    random_text(1024),
]
REJECTED_IDS: list[tuple[object, type[Exception]]] = [
    ("", ValueError),
    ("a\x00b", ValueError),
    ("\x00", ValueError),
    (random_text(5 * 1024, printable_ascii=True), ValueError),
    ("a" * 1025, ValueError),
    ("é" * 513, ValueError),
    ("\ud800", ValueError),
    (b"bytes", TypeError),
    (5, TypeError),
    (None, TypeError),
]
HOLDER_A = "a'; DROP TABLE worklease_leases; --"
HOLDER_B = '%(work_id)s %s ü🙂 "b"'
BIG = 64 * 1024 * 1024
INJECTION = b"'); DROP TABLE worklease_leases; --\\x00%s"


def leaks(error: BaseException) -> str | None:
    """Why ``error`` is not an acceptable outcome of hostile input, or None."""
    if isinstance(error, psycopg.Error) or type(error).__module__.startswith("psycopg"):
        return f"driver exception leaked: {error!r}"
    if isinstance(error, BackendError):
        return f"database error surfaced: {error!r}"
    if not isinstance(error, WorkleaseError | TypeError | ValueError):
        return f"undocumented exception: {error!r}"
    return None


def refused(call: Callable[[], object], expected: type[Exception]) -> Exception:
    with pytest.raises(Exception) as caught:
        call()
    problem = leaks(caught.value)
    assert problem is None, problem
    assert isinstance(caught.value, expected), repr(caught.value)
    return caught.value


def succeeds(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:
        problem = leaks(exc)
        raise AssertionError(problem or f"failed: {exc!r}") from exc


def table_rows(dsn: str, schema: str | None = None) -> dict[str, tuple[str, bytes | None]]:
    table = (
        sql.Identifier(schema, "worklease_leases") if schema else sql.Identifier("worklease_leases")
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            sql.SQL("SELECT work_id, holder_id, checkpoint FROM {}").format(table)
        ).fetchall()
    return {w: (h, bytes(c) if c is not None else None) for w, h, c in found}


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def dsn(kind: str, request: pytest.FixtureRequest) -> str | None:
    if kind == "memory":
        return None
    value: str = request.getfixturevalue("cluster_dsn")
    audit.install(value)
    return value


@pytest.fixture
def backend(kind: str, dsn: str | None) -> Iterator[Backend]:
    if dsn is None:
        yield MemoryBackend()
        return
    with PostgresBackend.connect(dsn, min_size=1, max_size=4) as backend:
        yield backend


def stored(backend: Backend, dsn: str | None) -> dict[str, tuple[str, bytes | None]]:
    """Every row as (holder, checkpoint) by work ID."""
    if dsn is not None:
        return table_rows(dsn)
    assert isinstance(backend, MemoryBackend)
    return {row.work_id: (row.holder_id, row.checkpoint) for row in backend.rows()}


# -- work IDs and holder IDs --------------------------------------------------------------------


def test_hostile_work_and_holder_ids_round_trip(backend: Backend, dsn: str | None) -> None:
    a = Lease(backend, holder_id=HOLDER_A, ttl=30.0)
    b = Lease(backend, holder_id=HOLDER_B, ttl=30.0)
    expected: dict[str, tuple[str, bytes | None]] = {}
    for work_id in ROUND_TRIP_IDS:
        state = ("state of " + work_id).encode("utf-8")
        token = succeeds(partial(a.acquire, work_id))
        assert token.work_id == work_id
        assert token.holder_id == HOLDER_A
        held = refused(partial(b.acquire, work_id), LeaseHeldError)
        assert isinstance(held, LeaseHeldError)
        assert held.work_id == work_id
        assert held.holder_id == HOLDER_A
        succeeds(partial(a.checkpoint, token, state))
        succeeds(partial(a.renew, token))
        with a.renewal(token, interval=0.01) as renewal:
            renewal.raise_if_lost()
        succeeds(partial(a.release, token, ExitMode.ABANDONED))
        with b.hold(work_id) as hold:
            assert hold.prior == Checkpoint(state, ExitMode.ABANDONED, HOLDER_A)
            assert hold.token.work_id == work_id
        expected[work_id] = (HOLDER_B, state)
    assert stored(backend, dsn) == expected
    if dsn is not None:
        assert audit.stale_writes(dsn) == 0


def test_bad_work_ids_refused_before_any_io(backend: Backend, dsn: str | None) -> None:
    observer = RecordingObserver()
    lease = Lease(backend, holder_id="holder", ttl=30.0, observer=observer)
    for work_id, error in REJECTED_IDS:
        bad: Any = work_id
        refused(partial(lease.acquire, bad), error)
        refused(partial(lease.acquire, bad, wait=True, timeout=1.0), error)
        refused(partial(lease.hold, bad), ConfigError)  # a builder: the argument rule
        refused(partial(backend.acquire, bad, "holder", 30.0), error)
    assert observer.events == []  # the lease never called the backend
    assert stored(backend, dsn) == {}


def test_bad_holder_ids_refused(backend: Backend) -> None:
    for holder, error in [
        ("", ConfigError),
        ("a\x00b", ConfigError),
        (5, ConfigError),
        ("\ud800", ConfigError),
        ("h" * 1025, ConfigError),
    ]:
        refused(partial(Lease, backend, holder_id=cast(Any, holder), ttl=30.0), error)


# -- checkpoint states --------------------------------------------------------------------------


def test_states_round_trip_exactly(backend: Backend, dsn: str | None) -> None:
    big = random.Random(7).randbytes(BIG)
    cases: list[tuple[object, bytes | None]] = [
        (b"", None),  # empty clears the checkpoint: reads as None by contract
        (b"\x00", b"\x00"),
        (b"\xff", b"\xff"),
        (bytes(range(256)) * 3, bytes(range(256)) * 3),
        (
            b"'; DROP TABLE worklease_leases; --\\x00%s",
            b"'; DROP TABLE worklease_leases; --\\x00%s",
        ),
        (bytearray(b"\x00\x01"), b"\x00\x01"),
        (memoryview(b"xyz\x00"), b"xyz\x00"),
        (None, None),
        (big, big),
    ]
    lease = Lease(backend, holder_id="writer", ttl=60.0)
    reader = Lease(backend, holder_id="reader", ttl=60.0)
    for index, (state, expected) in enumerate(cases):
        work_id = f"state-{index}"
        token = lease.acquire(work_id)
        lease.checkpoint(token, b"previous")
        succeeds(partial(lease.checkpoint, token, cast(Any, state)))
        assert lease.read_checkpoint(token).state == expected
        lease.release(token, ExitMode.FINISHED)
        successor = reader.acquire(work_id)
        got = reader.read_checkpoint(successor).state
        assert got == expected, f"case {index}: {len(got or b'')} bytes back"
        reader.release(successor, ExitMode.FINISHED)
    rows = stored(backend, dsn)
    assert len(rows) == len(cases)
    assert rows["state-8"][1] == big


def test_mutating_the_buffer_after_a_checkpoint_changes_nothing(backend: Backend) -> None:
    lease = Lease(backend, holder_id="writer", ttl=60.0)
    token = lease.acquire("copied")
    buffer = bytearray(b"original")
    lease.checkpoint(token, buffer)
    buffer[:] = b"mutated!"
    assert lease.read_checkpoint(token).state == b"original"
    lease.checkpoint(token, memoryview(buffer))
    buffer[:] = b"again..."
    assert lease.read_checkpoint(token).state == b"mutated!"


def test_bad_states_refused_before_any_io(backend: Backend, dsn: str | None) -> None:
    observer = RecordingObserver()
    lease = Lease(backend, holder_id="writer", ttl=60.0, observer=observer)
    token = lease.acquire("typed")
    lease.checkpoint(token, b"kept")
    observer.clear()
    for state in ["text", 5, [1, 2], {"a": 1}, 1.5, True]:
        refused(partial(lease.checkpoint, token, cast(Any, state)), TypeError)
    assert observer.events == []
    assert lease.read_checkpoint(token).state == b"kept"


def test_fenced_big_checkpoint_writes_nothing(backend: Backend, dsn: str | None) -> None:
    """A 64 MiB checkpoint with a superseded token: fenced, the stored state untouched."""
    stale_lease = Lease(backend, holder_id="stale", ttl=0.05)
    stale = stale_lease.acquire("big")
    stale_lease.checkpoint(stale, b"small")
    successor_lease = Lease(backend, holder_id="successor", ttl=60.0)
    successor = successor_lease.acquire("big", wait=True, timeout=10.0, poll_interval=0.02)
    refused(lambda: stale_lease.checkpoint(stale, os.urandom(BIG)), FencedError)
    assert successor_lease.read_checkpoint(successor).state == b"small"
    assert stored(backend, dsn) == {"big": ("successor", b"small")}


# -- schema names -------------------------------------------------------------------------------

ODD_SCHEMAS = [
    'we"ird',
    "Mixed Case",
    "a'b",
    "ünï 🙂",
    'x") DROP TABLE worklease_leases --',
    "semi;colon",
    "drop schema public; --",
    "line\n--break",
]
BAD_SCHEMAS: list[object] = ["%", "a%b", "%s", "", "a\x00b", 5]


@pytest.fixture
def pool(cluster_dsn: str) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(cluster_dsn, min_size=1, max_size=4, open=True) as pool:
        yield pool


@pytest.mark.parametrize("schema", ODD_SCHEMAS)
def test_schema_names_needing_quotes(
    pool: ConnectionPool[Any], cluster_dsn: str, schema: str
) -> None:
    PostgresBackend.apply_schema(pool, schema=schema)
    PostgresBackend.apply_schema(pool, schema=schema)  # idempotent
    with PostgresBackend(pool, schema=schema) as backend:
        assert backend.schema == schema
        lease = Lease(backend, holder_id="holder", ttl=5.0)
        token = lease.acquire("w'1")
        lease.checkpoint(token, b"in " + schema.encode())
        with lease.renewal(token, interval=0.02) as renewal:  # renewals use their own pool
            for _ in range(10):
                pg.execute(cluster_dsn, "SELECT pg_sleep(0.02)")
            renewal.raise_if_lost()
        lease.release(token, ExitMode.RETIRED)
        retired = Lease(backend, holder_id="next", ttl=5.0)
        second = retired.acquire("w'1")
        assert retired.read_checkpoint(second) == Checkpoint(
            b"in " + schema.encode(), ExitMode.RETIRED, "holder"
        )
        retired.release(second, ExitMode.RETIRED)
        third = retired.acquire("w'2")
        assert third.fencing_token > second.fencing_token  # the schema's own sequence
        assert table_rows(cluster_dsn, schema) == {
            "w'1": ("next", b"in " + schema.encode()),
            "w'2": ("next", None),
        }
        assert Vacuum(backend).sweep(0.001) == 1  # the retired row (released RETIRED)
    assert table_rows(cluster_dsn, schema).keys() == {"w'2"}
    assert table_rows(cluster_dsn) == {}  # the default schema's table is untouched


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
def test_bad_schema_names_are_config_errors(pool: ConnectionPool[Any], schema: object) -> None:
    refused(lambda: PostgresBackend(pool, schema=schema), ConfigError)  # type: ignore[arg-type]
    refused(lambda: PostgresBackend.apply_schema(pool, schema=schema), ConfigError)  # type: ignore[arg-type]
    refused(lambda: worklease.schema_sql(schema), ConfigError)  # type: ignore[arg-type]


# -- the async flavour (a subset) ---------------------------------------------------------------


async def test_async_hostile_input_round_trips(cluster_dsn: str) -> None:
    schema = "we\"ird'; -- 🙂"
    async with AsyncConnectionPool(cluster_dsn, min_size=1, max_size=4, open=False) as pool:
        await AsyncPostgresBackend.apply_schema(pool, schema=schema)
        async with AsyncPostgresBackend(pool, schema=schema) as backend:
            a = AsyncLease(backend, holder_id=HOLDER_A, ttl=30.0)
            b = AsyncLease(backend, holder_id=HOLDER_B, ttl=30.0)
            expected = {}
            for work_id in [*ROUND_TRIP_IDS[:8], ROUND_TRIP_IDS[15], ROUND_TRIP_IDS[-1]]:
                token = await a.acquire(work_id)
                await a.checkpoint(token, b"\x00" + work_id.encode())
                await a.release(token, ExitMode.FINISHED)
                successor = await b.acquire(work_id)
                assert await b.read_checkpoint(successor) == Checkpoint(
                    b"\x00" + work_id.encode(), ExitMode.FINISHED, HOLDER_A
                )
                await b.checkpoint(successor, b"")
                assert (await b.read_checkpoint(successor)).state is None
                expected[work_id] = (HOLDER_B, None)
            for bad, error in REJECTED_IDS:
                with pytest.raises(error):
                    await a.acquire(bad)  # type: ignore[arg-type]
            for bad_schema in BAD_SCHEMAS:
                with pytest.raises(ConfigError):
                    AsyncPostgresBackend(pool, schema=bad_schema)  # type: ignore[arg-type]
    assert table_rows(cluster_dsn, schema) == expected
    assert table_rows(cluster_dsn) == {}
