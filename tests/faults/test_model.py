"""Stateful model test of the lease table (hypothesis ``RuleBasedStateMachine``).

A reference model of the lease table (per work ID: holder, token, expiry, checkpoint, exit,
previous exit and holder, insert and update times) predicts the result or the exception type
of every operation, following behaviour.md §2.11: strict expiry boundaries, revive by
checkpoint, fencing checked before expiry, release of a lapsed lease recording nothing,
read_checkpoint ignoring the holder, forget after the holder's own release, sweep with
retention and ``include_expired``. The machine drives the sync flavour (``Lease``, ``Vacuum``;
generated from the asyncio source) with three holders over one backend and three work IDs;
tokens live in a bundle, and a crash drops one (the holder stops using it).

* Memory backend: every expiry comes from a ``FakeClock`` that rules advance by amounts around
  the TTL or to exact boundaries (expiry, sweep retention, one microsecond either side), so
  the model predicts tokens, expiries and update times exactly.
* PostgreSQL (this module's private cluster): real time, TTL 30 s, so nothing lapses by
  itself during an example; a rule forces expiry by SQL. The model's clock ticks once per
  statement (the server's ``now()`` is strictly later for each statement). A trigger audit
  trail records every accepted change of a row, which the model predicts change by change.

Invariants after every step: tokens strictly increase with every grant, the store agrees with
the model (at most one live holder per work ID, that of the latest grant), every accepted
write came from the current grant (no write from a superseded token; on PostgreSQL also
``audit.stale_writes == 0``), and a successor reads the last acknowledged checkpoint and the
right previous exit (checked on every acquire and every read).

The ordinary suite runs a modest, derandomized number of examples (reproducible in CI);
``nox -s faults`` (``WORKLEASE_FAULTS_LONG=1``) runs many more with fresh randomness.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from psycopg_pool import ConnectionPool

from tests.faults import audit
from tests.faults.conftest import LONG, scaled
from worklease import (
    Backend,
    Checkpoint,
    ExitMode,
    FencedError,
    InvalidExitModeError,
    InvalidTokenError,
    Lease,
    LeaseExpiredError,
    LeaseHeldError,
    MemoryBackend,
    PostgresBackend,
    RetentionRequiredError,
    Token,
    Vacuum,
)
from worklease.testing import FakeClock

pytestmark = [pytest.mark.faults]

T = TypeVar("T")

HOLDERS = ("holder-a", "holder-b", "holder-c")
WORK_IDS = ("w1", "w2", "w3")
DECLARABLE = {str(m): m for m in (ExitMode.FINISHED, ExitMode.ABANDONED, ExitMode.RETIRED)}
VALID_MODES: list[ExitMode | str] = [
    ExitMode.FINISHED,
    ExitMode.ABANDONED,
    ExitMode.RETIRED,
    "retired",
]
INVALID_MODES: list[ExitMode | str] = [ExitMode.NONE, ExitMode.EXPIRED, "expired", "bogus"]
MODES = st.one_of(*[st.sampled_from(VALID_MODES)] * 3, st.sampled_from(INVALID_MODES))
"""Mostly modes release accepts (as the enum or its text), sometimes ones it refuses."""
STATES = st.one_of(
    st.none(),
    st.binary(max_size=3),
    st.binary(min_size=1, max_size=3).map(bytearray),
)
TOKEN_OPS = ["checkpoint", "renew", "release", "read_checkpoint", "forget"]

# Memory backend: model time is microseconds since T0 on the fake clock.
T0 = datetime(2030, 1, 1, tzinfo=UTC)
MEMORY_TTL = 5.0
MEMORY_TTL_US = 5_000_000
RETENTIONS_US = {"1us": 1, "1s": 1_000_000, "5s": 5_000_000, "1h": 3_600_000_000}
REFUSED_RETENTIONS = {"0s": 0.0, "-1s": -1.0}
ADVANCES_US = [
    1,
    1_000,
    1_000_000,
    2_500_000,
    MEMORY_TTL_US - 1,
    MEMORY_TTL_US,
    MEMORY_TTL_US + 1,
    2 * MEMORY_TTL_US,
    3_600_000_001,
]

# PostgreSQL: the model's clock ticks per statement; the real TTL outlasts any example.
PG_TTL = 30.0
PG_TICK = 1_000
PG_FOREVER = 10**18
PG_RETENTIONS = {"1us": (1e-6, 0), "1h": (3600.0, PG_FOREVER)}
"""Retention name -> (seconds passed to sweep, model units). A 1 µs retention covers every
row updated by an earlier statement (statements are far more than 1 µs apart)."""
PG_MAX_EXAMPLE_SECONDS = 15.0


# -- the reference model ----------------------------------------------------------------------


@dataclass
class Row:
    holder: str
    token: int
    expires: int
    checkpoint: bytes | None
    exit: ExitMode | None
    prev_exit: ExitMode
    prev_holder: str | None
    acquired: int
    updated: int


@dataclass(frozen=True)
class Change:
    """One accepted change of a row, as the audit trigger records it."""

    op: str
    work_id: str
    old_token: int | None
    new_token: int | None
    old_holder: str | None
    new_holder: str | None
    exit_mode: str | None
    checkpoint_md5: str | None
    housekeeping: bool = dataclasses.field(default=False, compare=False, repr=False)
    """Not a holder's write: a grant, a sweep, or the test expiring the lease."""


Outcome = type[Exception] | None
Key = tuple[str, str, int]


def key(token: Token) -> Key:
    return (token.work_id, token.holder_id, token.fencing_token)


def md5(data: bytes | None) -> str | None:
    return None if data is None else hashlib.md5(data).hexdigest()


def stored(state: bytes | bytearray | None) -> bytes | None:
    return bytes(state) if state else None


def declared(mode: ExitMode | str) -> ExitMode | None:
    return DECLARABLE.get(str(mode)) if isinstance(mode, str) else None


class Model:
    """The lease table as behaviour.md §2 and §6 describe it.

    Times are integers: microseconds on the memory backend, ticks on PostgreSQL (``tick`` is
    added before each statement). A row is held while ``now <= expires``.
    """

    def __init__(self, *, ttl: int, tick: int, release_offset: int) -> None:
        self.now = 0
        self.ttl = ttl
        self.tick = tick
        self.release_offset = release_offset
        self.rows: dict[str, Row] = {}
        self.grants: list[Key] = []
        self.latest: dict[str, Key] = {}
        self.changes: list[Change] = []

    def statement(self) -> None:
        self.now += self.tick

    def held(self, row: Row) -> bool:
        return self.now <= row.expires

    def _owned(self, k: Key) -> Row | None:
        row = self.rows.get(k[0])
        if row is None or row.token != k[2] or row.holder != k[1]:
            return None
        return row

    def _update(self, work_id: str, row: Row, old_token: int, old_holder: str) -> None:
        self.changes.append(
            Change(
                "UPDATE",
                work_id,
                old_token,
                row.token,
                old_holder,
                row.holder,
                None if row.exit is None else str(row.exit),
                md5(row.checkpoint),
            )
        )

    # acquire: predict, then grant with the token the backend issued
    def blocking_row(self, work_id: str) -> Row | None:
        row = self.rows.get(work_id)
        return row if row is not None and self.held(row) else None

    def grant(self, work_id: str, holder: str, token: int) -> None:
        row = self.rows.get(work_id)
        expires = self.now + self.ttl
        if row is None:
            self.rows[work_id] = Row(
                holder, token, expires, None, None, ExitMode.NONE, None, self.now, self.now
            )
            self.changes.append(
                Change("INSERT", work_id, None, token, None, holder, None, None, housekeeping=True)
            )
        else:
            old_token, old_holder = row.token, row.holder
            row.prev_exit = row.exit or ExitMode.EXPIRED
            row.prev_holder = row.holder
            row.holder = holder
            row.token = token
            row.expires = expires
            row.exit = None
            row.updated = self.now
            self._update(work_id, row, old_token, old_holder)
            self.changes[-1] = dataclasses.replace(self.changes[-1], housekeeping=True)
        k = (work_id, holder, token)
        self.grants.append(k)
        self.latest[work_id] = k

    def checkpoint(self, k: Key, state: bytes | None) -> Outcome:
        row = self._owned(k)
        if row is None:
            return FencedError
        if row.exit is not None:
            return LeaseExpiredError
        row.checkpoint = state
        row.expires = self.now + self.ttl  # no expiry check: revives a lapsed lease
        row.updated = self.now
        self._update(k[0], row, row.token, row.holder)
        return None

    def renew(self, k: Key) -> Outcome:
        row = self._owned(k)
        if row is None:
            return FencedError
        if not self.now < row.expires:
            return LeaseExpiredError
        row.expires = self.now + self.ttl
        row.updated = self.now
        self._update(k[0], row, row.token, row.holder)
        return None

    def release(self, k: Key, mode: ExitMode | str) -> Outcome:
        exit_mode = declared(mode)
        if exit_mode is None:
            return InvalidExitModeError
        row = self._owned(k)
        if row is None:
            return FencedError
        if not self.now < row.expires:
            return LeaseExpiredError  # lapsed or already released: nothing recorded
        row.exit = exit_mode
        row.expires = self.now - self.release_offset
        row.updated = self.now
        self._update(k[0], row, row.token, row.holder)
        return None

    def read(self, k: Key) -> Checkpoint | type[Exception]:
        row = self.rows.get(k[0])
        if row is None or row.token != k[2]:  # the holder is not checked
            return FencedError
        return Checkpoint(row.checkpoint, row.prev_exit, row.prev_holder)

    def forget(self, k: Key) -> Outcome:
        row = self._owned(k)
        if row is None:
            return FencedError
        del self.rows[k[0]]
        self.changes.append(Change("DELETE", k[0], row.token, None, row.holder, None, None, None))
        return None

    def sweep(self, retention: int, include_expired: bool) -> int:
        doomed = [
            work_id
            for work_id, row in self.rows.items()
            if self.now > row.expires
            and self.now - row.updated > retention
            and (row.exit is ExitMode.RETIRED or (include_expired and row.exit is None))
        ]
        for work_id in doomed:
            row = self.rows.pop(work_id)
            self.changes.append(
                Change("DELETE", work_id, row.token, None, row.holder, None, None, None, True)
            )
        return len(doomed)

    def force_expiry(self, work_id: str, offset: int) -> None:
        row = self.rows.get(work_id)
        if row is not None:
            row.expires = self.now - offset
            self._update(work_id, row, row.token, row.holder)
            self.changes[-1] = dataclasses.replace(self.changes[-1], housekeeping=True)


# -- the machine --------------------------------------------------------------------------------


def expect(expected: Outcome, call: Callable[[], T], what: str) -> T | Exception:
    """Run ``call``; its exception must be exactly ``expected`` (``None``: must succeed)."""
    want = "success" if expected is None else expected.__name__
    try:
        value = call()
    except Exception as exc:
        if expected is None or type(exc) is not expected:
            raise AssertionError(f"{what}: model expects {want}, library raised {exc!r}") from exc
        return exc
    if expected is not None:
        raise AssertionError(f"{what}: model expects {want}, library returned {value!r}")
    return value


class LeaseTableMachine(RuleBasedStateMachine):
    """Rules shared by both backends; subclasses add time (clock or forced expiry) and sweep."""

    tokens: Bundle[Token] = Bundle("tokens")

    def __init__(self, backend: Backend, model: Model, ttl: float) -> None:
        super().__init__()
        self.backend = backend
        self.model = model
        self.ttl = ttl
        self.leases = [Lease(backend, holder_id=holder, ttl=ttl) for holder in HOLDERS]
        self.vacuum = Vacuum(backend)

    # hooks ------------------------------------------------------------------------------------

    def check_granted(self, token: Token, work_id: str, holder: str) -> None:
        """A fresh token's fields (its fencing token strictly exceeds every earlier grant)."""
        assert (token.work_id, token.holder_id) == (work_id, holder), token
        if self.model.grants:
            last = self.model.grants[-1][2]
            assert token.fencing_token > last, f"token {token.fencing_token} after {last}"

    def check_held(self, error: LeaseHeldError, row: Row) -> None:
        assert error.holder_id == row.holder, (error.holder_id, row.holder)

    def check_store(self) -> None:
        raise NotImplementedError

    def check_changes(self, changes: list[Change]) -> None:
        """The step's accepted changes as the store saw them (nothing to see by default)."""

    # rules ------------------------------------------------------------------------------------

    @rule(target=tokens, who=st.integers(0, len(HOLDERS) - 1), work_id=st.sampled_from(WORK_IDS))
    def acquire(self, who: int, work_id: str) -> Token | MultipleResults[Token]:
        lease = self.leases[who]
        self.model.statement()
        blocking = self.model.blocking_row(work_id)
        expected = None if blocking is None else LeaseHeldError
        got = expect(expected, lambda: lease.acquire(work_id), f"acquire({work_id!r})")
        if isinstance(got, LeaseHeldError):
            assert blocking is not None
            self.check_held(got, blocking)
            return multiple()
        assert isinstance(got, Token)
        self.check_granted(got, work_id, lease.holder_id)
        self.model.grant(work_id, lease.holder_id, got.fencing_token)
        # The successor reads the last acknowledged checkpoint and how its predecessor left.
        self.model.statement()
        read = lease.read_checkpoint(got)
        want = self.model.read(key(got))
        assert read == want, f"successor of {got!r} read {read!r}, model {want!r}"
        return got

    @rule(token=tokens, via=st.integers(0, len(HOLDERS) - 1), state=STATES)
    def checkpoint(self, token: Token, via: int, state: bytes | bytearray | None) -> None:
        data = stored(state)
        self.model.statement()
        expected = self.model.checkpoint(key(token), data)
        expect(expected, lambda: self.leases[via].checkpoint(token, state), "checkpoint")
        if isinstance(state, bytearray) and state:
            state[0] ^= 0xFF  # must not reach the stored copy (the invariants compare it)

    @rule(token=tokens, via=st.integers(0, len(HOLDERS) - 1))
    def renew(self, token: Token, via: int) -> None:
        self.model.statement()
        expect(self.model.renew(key(token)), lambda: self.leases[via].renew(token), "renew")

    @rule(token=tokens, via=st.integers(0, len(HOLDERS) - 1), mode=MODES)
    def release(self, token: Token, via: int, mode: ExitMode | str) -> None:
        if declared(mode) is not None:
            self.model.statement()
        expected = self.model.release(key(token), mode)
        # MODES mixes in modes release refuses, on purpose: typed as any string.
        expect(
            expected,
            lambda: self.leases[via].release(token, mode),  # type: ignore[arg-type]
            f"release({mode!r})",
        )

    @rule(token=tokens, via=st.integers(0, len(HOLDERS) - 1))
    def read_checkpoint(self, token: Token, via: int) -> None:
        self.model.statement()
        want = self.model.read(key(token))
        if isinstance(want, Checkpoint):
            got = self.leases[via].read_checkpoint(token)
            assert got == want, f"read_checkpoint({token!r}) gave {got!r}, model {want!r}"
            assert got.state is None or type(got.state) is bytes
        else:
            expect(want, lambda: self.leases[via].read_checkpoint(token), "read_checkpoint")

    @rule(token=tokens, via=st.integers(0, len(HOLDERS) - 1))
    def forget(self, token: Token, via: int) -> None:
        self.model.statement()
        expect(self.model.forget(key(token)), lambda: self.leases[via].forget(token), "forget")

    @rule(token=consumes(tokens))
    def crash(self, token: Token) -> None:
        """The holder dies: it never uses this token again (nor renews it)."""

    @rule(
        token=tokens,
        via=st.integers(0, len(HOLDERS) - 1),
        op=st.sampled_from(TOKEN_OPS),
        mode=MODES,
    )
    def altered_token(self, token: Token, via: int, op: str, mode: ExitMode | str) -> None:
        """A token changed after acquire is refused by the lease before any I/O."""
        altered = dataclasses.replace(token, fencing_token=token.fencing_token + 1)
        lease = self.leases[via]
        calls: dict[str, Callable[[], object]] = {
            "checkpoint": lambda: lease.checkpoint(altered, b"x"),
            "renew": lambda: lease.renew(altered),
            "release": lambda: lease.release(altered, mode),  # type: ignore[arg-type]
            "read_checkpoint": lambda: lease.read_checkpoint(altered),
            "forget": lambda: lease.forget(altered),
        }
        expected: type[Exception] = InvalidTokenError
        if op == "release" and declared(mode) is None:
            expected = InvalidExitModeError  # the mode is checked first
        expect(expected, calls[op], f"{op} with an altered token")

    @rule(
        token=tokens,
        op=st.sampled_from(TOKEN_OPS),
        forgery=st.sampled_from(["holder", "token+1", "token-1"]),
        other=st.sampled_from(HOLDERS),
    )
    def forged_backend_call(self, token: Token, op: str, forgery: str, other: str) -> None:
        """A backend called directly with a forged record (another holder, another token;
        either may turn out to be a real grant, which the model then accepts)."""
        if forgery == "holder":
            forged = dataclasses.replace(token, holder_id=other)
        else:
            step = 1 if forgery == "token+1" else -1
            forged = dataclasses.replace(token, fencing_token=token.fencing_token + step)
        k = key(forged)
        self.model.statement()
        backend = self.backend
        what = f"backend {op} with {forged!r}"
        if op == "checkpoint":
            buffer = bytearray(b"forged")
            expect(
                self.model.checkpoint(k, b"forged"),
                lambda: backend.checkpoint(forged, buffer, self.ttl),
                what,
            )
            buffer[:] = b"caller reused its buffer"  # the backend must have kept a copy
        elif op == "renew":
            expect(self.model.renew(k), lambda: backend.renew(forged, self.ttl), what)
        elif op == "release":
            mode = ExitMode.ABANDONED
            expect(self.model.release(k, mode), lambda: backend.release(forged, mode), what)
        elif op == "forget":
            expect(self.model.forget(k), lambda: backend.forget(forged), what)
        else:
            want = self.model.read(k)
            if isinstance(want, Checkpoint):
                got = backend.read_checkpoint(forged)
                assert got == want, f"{what} gave {got!r}, model {want!r}"
            else:
                expect(want, lambda: backend.read_checkpoint(forged), what)

    def do_sweep(self, retention: float, units: int | None, include: bool) -> None:
        if units is None:  # not a positive retention: refused before any I/O
            expect(
                RetentionRequiredError,
                lambda: self.vacuum.sweep(retention, include_expired=include),
                f"sweep({retention})",
            )
            return
        self.model.statement()
        want = self.model.sweep(units, include)
        got = self.vacuum.sweep(retention, include_expired=include)
        assert got == want, f"sweep({retention}, {include}) deleted {got}, model {want}"

    # invariants -------------------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        model = self.model
        # Tokens strictly increase with every grant (one counter for all work IDs).
        tokens = [k[2] for k in model.grants]
        assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
        # No write accepted from a superseded token: every accepted holder write (and
        # deletion) came from the latest grant of its work ID.
        for change in model.changes:
            if not change.housekeeping:
                latest = model.latest[change.work_id]
                assert (change.old_holder, change.old_token) == latest[1:], (change, latest)
        # At most one live holder per work ID: the model's row, i.e. the latest grant.
        for work_id, row in model.rows.items():
            assert (work_id, row.holder, row.token) == model.latest[work_id]
        self.check_store()
        self.check_changes(model.changes)
        model.changes.clear()


class MemoryMachine(LeaseTableMachine):
    """The memory backend on a fake clock: the model predicts every value exactly."""

    def __init__(self) -> None:
        self.clock = FakeClock(T0)
        super().__init__(
            MemoryBackend(clock=self.clock),
            Model(ttl=MEMORY_TTL_US, tick=0, release_offset=1_000),
            MEMORY_TTL,
        )

    @staticmethod
    def at(units: int) -> datetime:
        return T0 + timedelta(microseconds=units)

    def check_granted(self, token: Token, work_id: str, holder: str) -> None:
        super().check_granted(token, work_id, holder)
        last = self.model.grants[-1][2] if self.model.grants else 0
        assert token.fencing_token == last + 1, "memory tokens count successful grants"
        assert token.expires_at == self.at(self.model.now + self.model.ttl)

    def check_held(self, error: LeaseHeldError, row: Row) -> None:
        super().check_held(error, row)
        assert error.expires_at == self.at(row.expires)

    def check_store(self) -> None:
        assert self.clock.now() == self.at(self.model.now)
        backend = self.backend
        assert isinstance(backend, MemoryBackend)
        got = {
            r.work_id: (
                r.holder_id,
                r.fencing_token,
                r.expires_at,
                r.checkpoint,
                r.exit_mode,
                r.prev_exit,
                r.prev_holder_id,
                r.acquired_at,
                r.updated_at,
            )
            for r in backend.rows()
        }
        want = {
            work_id: (
                row.holder,
                row.token,
                self.at(row.expires),
                row.checkpoint,
                row.exit,
                row.prev_exit,
                row.prev_holder,
                self.at(row.acquired),
                self.at(row.updated),
            )
            for work_id, row in self.model.rows.items()
        }
        assert got == want, f"store {got!r}, model {want!r}"

    def _advance(self, units: int) -> None:
        self.clock.advance(timedelta(microseconds=units))
        self.model.now += units

    @rule(units=st.sampled_from(ADVANCES_US))
    def advance(self, units: int) -> None:
        self._advance(units)

    @rule(
        work_id=st.sampled_from(WORK_IDS),
        mark=st.sampled_from(["expiry", *RETENTIONS_US]),
        delta=st.sampled_from([-1, 0, 1]),
    )
    def advance_to_boundary(self, work_id: str, mark: str, delta: int) -> None:
        """Move the clock to a row's expiry or sweep boundary, or 1 µs either side."""
        row = self.model.rows.get(work_id)
        if row is None:
            return
        base = row.expires if mark == "expiry" else row.updated + RETENTIONS_US[mark]
        if base + delta > self.model.now:
            self._advance(base + delta - self.model.now)

    @rule(retention=st.sampled_from([*RETENTIONS_US, *REFUSED_RETENTIONS]), include=st.booleans())
    def sweep(self, retention: str, include: bool) -> None:
        if retention in REFUSED_RETENTIONS:
            self.do_sweep(REFUSED_RETENTIONS[retention], None, include)
        else:
            units = RETENTIONS_US[retention]
            self.do_sweep(units / 1_000_000, units, include)


class PostgresMachine(LeaseTableMachine):
    """PostgreSQL with real time: leases last 30 s; a rule expires them by SQL."""

    def __init__(self, backend: PostgresBackend, conn: psycopg.Connection[Any], dsn: str) -> None:
        super().__init__(backend, Model(ttl=PG_FOREVER, tick=PG_TICK, release_offset=1), PG_TTL)
        self.conn = conn
        self.dsn = dsn
        conn.execute("TRUNCATE worklease_leases, worklease_audit")
        self.audit_seen = 0
        self.started = time.monotonic()

    def check_store(self) -> None:
        elapsed = time.monotonic() - self.started
        assert elapsed < PG_MAX_EXAMPLE_SECONDS, (
            f"example ran {elapsed:.1f}s: leases could lapse by themselves (TTL {PG_TTL}s)"
        )
        found = self.conn.execute(
            "SELECT work_id, holder_id, fencing_token, checkpoint, exit_mode, prev_exit_mode,"
            " prev_holder_id, expires_at >= now(), acquired_at, updated_at"
            " FROM worklease_leases ORDER BY work_id"
        ).fetchall()
        got = {r[0]: (r[1], r[2], None if r[3] is None else bytes(r[3]), *r[4:8]) for r in found}
        want = {
            work_id: (
                row.holder,
                row.token,
                row.checkpoint,
                None if row.exit is None else str(row.exit),
                str(row.prev_exit),
                row.prev_holder,
                self.model.held(row),
            )
            for work_id, row in self.model.rows.items()
        }
        assert got == want, f"store {got!r}, model {want!r}"
        # acquired_at / updated_at move exactly when the model's insert / update times do.
        times: list[tuple[int, datetime]] = []
        for r in found:
            row = self.model.rows[r[0]]
            times += [(row.acquired, r[8]), (row.updated, r[9])]
        for model_a, real_a in times:
            for model_b, real_b in times:
                assert (model_a < model_b) == (real_a < real_b), (times, self.model.rows)

    def check_changes(self, changes: list[Change]) -> None:
        found = self.conn.execute(
            "SELECT id, op, work_id, old_token, new_token, old_holder, new_holder, exit_mode,"
            " checkpoint_md5 FROM worklease_audit WHERE id > %s ORDER BY id",
            (self.audit_seen,),
        ).fetchall()
        got = sorted((Change(*r[1:]) for r in found), key=repr)
        want = sorted(changes, key=repr)
        assert got == want, f"audit trail {got!r}, model {want!r}"
        if found:
            self.audit_seen = found[-1][0]

    def teardown(self) -> None:
        assert audit.stale_writes(self.dsn) == 0

    @rule(work_id=st.sampled_from(WORK_IDS))
    def force_expiry(self, work_id: str) -> None:
        """The holder's lease lapses (as after a crash): expiry set one second in the past."""
        self.model.statement()
        self.conn.execute(
            "UPDATE worklease_leases SET expires_at = now() - interval '1 second'"
            " WHERE work_id = %s",
            (work_id,),
        )
        self.model.force_expiry(work_id, PG_TICK)

    @rule(retention=st.sampled_from([*PG_RETENTIONS, *REFUSED_RETENTIONS]), include=st.booleans())
    def sweep(self, retention: str, include: bool) -> None:
        if retention in REFUSED_RETENTIONS:
            self.do_sweep(REFUSED_RETENTIONS[retention], None, include)
        else:
            seconds, units = PG_RETENTIONS[retention]
            self.do_sweep(seconds, units, include)


def machine_settings(examples: tuple[int, int], steps: tuple[int, int]) -> settings:
    """CI: derandomized (the same examples every run); long runs: fresh randomness."""
    return settings(
        max_examples=scaled(*examples),
        stateful_step_count=scaled(*steps),
        deadline=None,
        derandomize=not LONG,
        database=None,
        print_blob=LONG,
        suppress_health_check=[HealthCheck.too_slow],
    )


def test_model_memory() -> None:
    run_state_machine_as_test(
        MemoryMachine, settings=machine_settings(examples=(600, 10000), steps=(50, 100))
    )


@pytest.fixture
def pg_machine_env(cluster_dsn: str) -> Iterator[tuple[PostgresBackend, psycopg.Connection[Any]]]:
    audit.install(cluster_dsn)
    with (
        ConnectionPool(cluster_dsn, min_size=1, max_size=2, open=False) as pool,
        PostgresBackend(pool) as backend,
        psycopg.connect(cluster_dsn, autocommit=True) as conn,
    ):
        yield backend, conn


@pytest.mark.lengthy
@pytest.mark.postgres
def test_model_postgres(
    pg_machine_env: tuple[PostgresBackend, psycopg.Connection[Any]], cluster_dsn: str
) -> None:
    backend, conn = pg_machine_env

    class Machine(PostgresMachine):
        def __init__(self) -> None:
            super().__init__(backend, conn, cluster_dsn)

    run_state_machine_as_test(
        Machine, settings=machine_settings(examples=(200, 3000), steps=(50, 100))
    )
