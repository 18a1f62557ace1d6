# Generated from src/worklease/_async/conformance.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""The backend conformance suite: every backend must pass these tests.

Each test method checks one case of the backend contract (the numbered conformance cases of
the worklease behaviour specification, section 4.2) against a backend called directly, with
plain tokens and float-second TTLs. A method's docstring starts with its case number;
methods whose docstring starts with "Extra" check further documented rules (work ID and
state validation, exit-mode validation, large and mutable state buffers).

How to use it
-------------
The suite is a test-class base whose name does not start with ``Test``, so pytest does not
collect it by itself. Subclass it in a class named ``Test...`` and provide a fixture named
``backend`` (in the subclass or in a ``conftest.py``) that gives every test a fresh, empty
backend; the base class deliberately defines no such fixture. The fixture must be
function-scoped: the cases assume a backend with no rows (sweep counts of zero are asserted
exactly) and one test's rows must not be seen by another. See ``worklease.conformance`` for
an example.

The suite needs pytest (not a runtime dependency of worklease); the asyncio flavour also
needs pytest-asyncio with ``asyncio_mode = "auto"``.

Notes
-----
- Fencing tokens are compared only for order, never for absolute values: a backend may share
  one token sequence between work IDs, instances or tests (PostgreSQL does).
- The specification's "retention of 1 ns" becomes ``TINY_RETENTION`` (1 microsecond, the
  resolution of Python datetimes). Before every sweep that relies on it, the test first sleeps
  ``SWEEP_SETTLE`` seconds (2 ms) so the rows are strictly older than the retention on any
  backend clock, including a coarse one or a database server clock that is read at the start
  of a transaction; without the pause a fast backend could see an age of zero and keep the
  row, and a "nothing deleted" result would prove nothing.
- Cases 33 and 33a (operations under an already-cancelled Go context) do not apply to this
  port and are not part of the suite; cancellation is covered by the flavour-specific tests of
  the lease and of each backend.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from .._compat import sleep
from .._models import Checkpoint, ExitMode, Token
from .._validation import MAX_DURATION
from ..errors import (
    FencedError,
    InvalidExitModeError,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLapsedError,
    LeaseLostError,
)
from .backend import (
    AcquireMany,
    AcquireWithCheckpoint,
    Backend,
    Capabilities,
    FindAvailable,
    ReleaseMany,
    RenewMany,
    Survey,
)
from .watch import ReleaseWatching

__all__ = ["BackendConformance"]


class BackendConformance:
    """Conformance tests for a backend; subclass in a ``Test...`` class (see the module doc).

    Every test receives the backend under test through a fixture named ``backend``, which
    this class does not define: the subclass or a ``conftest.py`` must provide it, and it must
    return a fresh, empty backend for each test.
    """

    NORMAL_TTL: ClassVar[float] = 30.0
    """A TTL long enough that a lease never lapses during a test."""

    EXPIRED_TTL: ClassVar[float] = -1.0
    """A non-positive TTL: the backend must produce an already-expired lease."""

    TINY_RETENTION: ClassVar[float] = 1e-6
    """The smallest retention (1 microsecond) used by the sweep cases."""

    SWEEP_SETTLE: ClassVar[float] = 0.002
    """Seconds to wait before a sweep with ``TINY_RETENTION`` (see the module doc)."""

    TOKENS_ORDERED_ACROSS_WORK_IDS: ClassVar[bool] = True
    """Whether a later acquire of another work ID gets a greater token (case 4). Fencing
    needs tokens ordered per work ID only; a backend without one global counter sets this to
    ``False`` (Redis: tokens come from the server clock per work ID, so two first grants in
    one millisecond tie, and on a Cluster a script may touch one hash slot; ADR-0020)."""

    PROMPT: ClassVar[float] = 10.0
    """Upper bound in seconds for an acquire that must not wait (a third of ``NORMAL_TTL``)."""

    SHORT_TTL: ClassVar[float] = 0.5
    """A TTL that a test outlives on purpose (by sleeping), to see whether expiry moved."""

    NEVER: ClassVar[Token] = Token(
        "never-acquired", "h", 1, datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    )
    """A token for a work ID that no test ever acquires."""

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def stale(token: Token) -> Token:
        """The same token with a fencing token one higher (never issued for that row)."""
        return dataclasses.replace(token, fencing_token=token.fencing_token + 1)

    def _sweep_old(self, backend: Backend, include_expired: bool) -> int:
        """Sweep with ``TINY_RETENTION`` after letting the rows age past it."""
        sleep(self.SWEEP_SETTLE)
        return backend.sweep(self.TINY_RETENTION, include_expired)

    def _assert_fresh(self, backend: Backend, work_id: str, holder_id: str) -> Token:
        """Acquire ``work_id`` and check that it had no row before (nothing was stored)."""
        token = backend.acquire(work_id, holder_id, self.NORMAL_TTL)
        assert token.work_id == work_id
        cp = backend.read_checkpoint(token)
        assert cp.state is None
        assert cp.prev_exit is ExitMode.NONE
        assert cp.prev_holder_id is None
        return token

    # -- Acquire -------------------------------------------------------------------------------

    def test_acquire_fresh_work_id(self, backend: Backend) -> None:
        """Case 1: acquiring a fresh work ID succeeds with a positive fencing token."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        assert token.fencing_token > 0
        assert token.work_id == "w1"
        assert token.holder_id == "h"
        assert token.expires_at.tzinfo is not None

    def test_acquire_held_by_other_holder(self, backend: Backend) -> None:
        """Case 2: acquiring a lease another holder holds raises LeaseHeldError."""
        backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h2", self.NORMAL_TTL)

    def test_acquire_expired_lease_issues_greater_token(self, backend: Backend) -> None:
        """Case 3: an expired lease is acquirable and the new token is strictly greater."""
        first = backend.acquire("w1", "h", self.EXPIRED_TTL)
        second = backend.acquire("w1", "h2", self.NORMAL_TTL)
        assert second.holder_id == "h2"
        assert second.fencing_token > first.fencing_token

    def test_tokens_increase_across_work_ids(self, backend: Backend) -> None:
        """Case 4: fencing tokens increase across work IDs, not only per work ID."""
        if not self.TOKENS_ORDERED_ACROSS_WORK_IDS:
            pytest.skip("tokens are ordered per work ID only (TOKENS_ORDERED_ACROSS_WORK_IDS)")
        a = backend.acquire("work-a", "h", 60.0)
        b = backend.acquire("work-b", "h", 60.0)
        assert b.fencing_token > a.fencing_token

    def test_acquire_after_expiry_keeps_checkpoint(self, backend: Backend) -> None:
        """Case 5: the successor of an expired lease reads the state checkpointed before."""
        first = backend.acquire("w1", "h", self.EXPIRED_TTL)
        backend.checkpoint(first, b"data", self.EXPIRED_TTL)
        second = backend.acquire("w1", "h2", self.NORMAL_TTL)
        cp = backend.read_checkpoint(second)
        assert cp.state == b"data"

    def test_acquire_after_abandon_reports_previous_holder(self, backend: Backend) -> None:
        """Case 6: after a release with ABANDONED the successor reads ABANDONED and holder."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.release(a, ExitMode.ABANDONED)
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.ABANDONED
        assert cp.prev_holder_id == "holder-a"

    # -- Checkpoint ----------------------------------------------------------------------------

    def test_checkpoint_round_trips(self, backend: Backend) -> None:
        """Case 7: checkpointed state is read back unchanged."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        backend.checkpoint(token, b"payload", self.NORMAL_TTL)
        cp = backend.read_checkpoint(token)
        assert cp.state == b"payload"

    def test_checkpoint_stale_token_is_fenced(self, backend: Backend) -> None:
        """Case 8: checkpoint with a stale token raises FencedError and writes nothing."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.checkpoint(self.stale(token), b"zombie", self.NORMAL_TTL)
        cp = backend.read_checkpoint(token)
        assert cp.state is None

    def test_checkpoint_never_acquired_is_fenced(self, backend: Backend) -> None:
        """Case 9: checkpoint for a work ID with no row raises FencedError."""
        with pytest.raises(FencedError):
            backend.checkpoint(self.NEVER, b"x", self.NORMAL_TTL)

    def test_checkpoint_keeps_previous_exit_fields(self, backend: Backend) -> None:
        """Case 10: a checkpoint changes the state but not the previous-holder fields."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.release(a, ExitMode.FINISHED)
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        backend.checkpoint(b, b"x", self.NORMAL_TTL)
        cp = backend.read_checkpoint(b)
        assert cp.state == b"x"
        assert cp.prev_exit is ExitMode.FINISHED
        assert cp.prev_holder_id == "holder-a"

    def test_checkpoint_after_release_is_expired(self, backend: Backend) -> None:
        """Case 11: a checkpoint after release raises LeaseExpiredError and writes nothing."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.checkpoint(a, b"final", self.NORMAL_TTL)
        backend.release(a, ExitMode.FINISHED)
        with pytest.raises(LeaseExpiredError):
            backend.checkpoint(a, b"late", self.NORMAL_TTL)
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = backend.read_checkpoint(b)
        assert cp.state == b"final"
        assert cp.prev_exit is ExitMode.FINISHED
        assert cp.prev_holder_id == "holder-a"

    def test_checkpoint_revives_lapsed_lease(self, backend: Backend) -> None:
        """Case 12: a checkpoint revives a lapsed, unsuperseded lease; it is held again."""
        token = backend.acquire("w1", "h", self.EXPIRED_TTL)
        backend.checkpoint(token, b"revived", self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h2", self.NORMAL_TTL)
        cp = backend.read_checkpoint(token)
        assert cp.state == b"revived"

    # -- Renew ---------------------------------------------------------------------------------

    def test_renew_valid_lease(self, backend: Backend) -> None:
        """Case 13: renewing a live lease succeeds and it stays held."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        backend.renew(token, self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h2", self.NORMAL_TTL)

    def test_renew_stale_token_is_fenced(self, backend: Backend) -> None:
        """Case 14: renew with a stale token raises FencedError."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.renew(self.stale(token), self.NORMAL_TTL)

    def test_renew_never_acquired_is_fenced(self, backend: Backend) -> None:
        """Case 15: renew for a work ID with no row raises FencedError."""
        with pytest.raises(FencedError):
            backend.renew(self.NEVER, self.NORMAL_TTL)

    def test_renew_lapsed_lease_is_expired(self, backend: Backend) -> None:
        """Case 16: renew of a lapsed lease raises LeaseExpiredError (renew cannot revive)."""
        token = backend.acquire("w1", "h", self.EXPIRED_TTL)
        with pytest.raises(LeaseExpiredError):
            backend.renew(token, self.NORMAL_TTL)
        b = backend.acquire("w1", "h2", self.NORMAL_TTL)
        assert b.fencing_token > token.fencing_token

    # -- Release -------------------------------------------------------------------------------

    def test_release_finished_reported_to_successor(self, backend: Backend) -> None:
        """Case 17: after a release with FINISHED the successor reads FINISHED and holder."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.release(a, ExitMode.FINISHED)
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.FINISHED
        assert cp.prev_holder_id == "holder-a"

    def test_release_frees_lease_at_once(self, backend: Backend) -> None:
        """Case 18: a released lease is acquirable at once, without waiting for the TTL."""
        a = backend.acquire("w1", "h", self.NORMAL_TTL)
        backend.release(a, ExitMode.FINISHED)
        b = backend.acquire("w1", "h2", self.NORMAL_TTL)
        assert b.fencing_token > a.fencing_token

    def test_release_stale_token_is_fenced(self, backend: Backend) -> None:
        """Case 19: release with a stale token raises FencedError; the lease stays held."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.release(self.stale(token), ExitMode.FINISHED)
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h2", self.NORMAL_TTL)

    def test_release_lapsed_lease_records_nothing(self, backend: Backend) -> None:
        """Case 20: release of a lapsed lease raises LeaseExpiredError and records nothing."""
        for mode in (ExitMode.FINISHED, ExitMode.ABANDONED, ExitMode.RETIRED):
            work_id = "w-" + mode.value
            a = backend.acquire(work_id, "holder-a", self.EXPIRED_TTL)
            with pytest.raises(LeaseExpiredError):
                backend.release(a, mode)
            b = backend.acquire(work_id, "holder-b", self.NORMAL_TTL)
            cp = backend.read_checkpoint(b)
            assert cp.prev_exit is ExitMode.EXPIRED, mode
            assert cp.prev_holder_id == "holder-a", mode

    def test_release_checks_fencing_before_expiry(self, backend: Backend) -> None:
        """Case 21: fencing is checked before expiry on release."""
        a = backend.acquire("w1", "holder-a", self.EXPIRED_TTL)
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.release(a, ExitMode.FINISHED)
        cp = backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.EXPIRED
        assert cp.prev_holder_id == "holder-a"

    def test_release_rejects_undeclarable_modes(self, backend: Backend) -> None:
        """Case 22: release with NONE, EXPIRED or 99 raises InvalidExitModeError; still held."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        modes: list[object] = [ExitMode.NONE, ExitMode.EXPIRED, 99]
        for mode in modes:
            with pytest.raises(InvalidExitModeError):
                backend.release(token, mode)  # type: ignore[arg-type]
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h2", self.NORMAL_TTL)

    def test_second_release_is_expired(self, backend: Backend) -> None:
        """Case 23: a second release raises LeaseExpiredError; the first mode stands."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.release(a, ExitMode.RETIRED)
        with pytest.raises(LeaseExpiredError):
            backend.release(a, ExitMode.ABANDONED)
        with pytest.raises(LeaseExpiredError):
            backend.release(a, ExitMode.RETIRED)  # the same mode again, too
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.RETIRED
        assert cp.prev_holder_id == "holder-a"

    # -- ReadCheckpoint ------------------------------------------------------------------------

    def test_read_first_acquisition(self, backend: Backend) -> None:
        """Case 24: the first holder reads no state, prev_exit NONE and no previous holder."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        cp = backend.read_checkpoint(token)
        assert cp.state is None
        assert cp.prev_exit is ExitMode.NONE
        assert cp.prev_holder_id is None

    def test_read_after_crash(self, backend: Backend) -> None:
        """Case 25: after a lapse without release the successor reads EXPIRED and the state."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.checkpoint(a, b"partial", self.EXPIRED_TTL)
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = backend.read_checkpoint(b)
        assert cp.state == b"partial"
        assert cp.prev_exit is ExitMode.EXPIRED
        assert cp.prev_holder_id == "holder-a"

    def test_read_previous_fields_are_stable(self, backend: Backend) -> None:
        """Case 26: the previous-holder fields stay the same for the whole lease."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.release(a, ExitMode.RETIRED)
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        before = backend.read_checkpoint(b)
        backend.renew(b, self.NORMAL_TTL)
        after = backend.read_checkpoint(b)
        assert before.prev_exit is ExitMode.RETIRED
        assert before.prev_holder_id == "holder-a"
        assert after.prev_exit is before.prev_exit
        assert after.prev_holder_id == before.prev_holder_id

    def test_read_never_acquired_is_fenced(self, backend: Backend) -> None:
        """Case 27: read for a work ID with no row raises FencedError."""
        with pytest.raises(FencedError):
            backend.read_checkpoint(self.NEVER)

    def test_read_after_forget_is_fenced(self, backend: Backend) -> None:
        """Case 28: read with a forgotten token raises FencedError."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        backend.forget(token)
        with pytest.raises(FencedError):
            backend.read_checkpoint(token)

    def test_read_after_sweep_is_fenced(self, backend: Backend) -> None:
        """Case 29: read with the token of a swept row raises FencedError."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        backend.release(token, ExitMode.RETIRED)
        assert self._sweep_old(backend, False) >= 1
        with pytest.raises(FencedError):
            backend.read_checkpoint(token)

    def test_acquire_after_forget_starts_fresh(self, backend: Backend) -> None:
        """Case 30: after forget the next holder reads prev_exit NONE and no previous holder."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.checkpoint(a, b"gone", self.NORMAL_TTL)
        backend.forget(a)
        b = self._assert_fresh(backend, "w1", "holder-b")
        assert b.fencing_token > a.fencing_token

    def test_read_without_checkpoint(self, backend: Backend) -> None:
        """Case 31: with no checkpoint written the state is absent."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        backend.renew(token, self.NORMAL_TTL)
        cp = backend.read_checkpoint(token)
        assert cp.state is None

    def test_read_stale_token_is_fenced(self, backend: Backend) -> None:
        """Case 32: read with a stale token raises FencedError."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.read_checkpoint(self.stale(token))

    def test_checkpoint_absent_or_empty_reads_absent(self, backend: Backend) -> None:
        """Case 32a: a checkpoint of None or of empty bytes reads back as absent."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        empties: list[bytes | bytearray | memoryview | None] = [
            None,
            b"",
            bytearray(),
            memoryview(b""),
        ]
        for empty in empties:
            backend.checkpoint(token, b"something", self.NORMAL_TTL)
            backend.checkpoint(token, empty, self.NORMAL_TTL)
            cp = backend.read_checkpoint(token)
            assert cp.state is None, empty

    # -- Holder mismatch -----------------------------------------------------------------------

    def test_holder_mismatch_is_fenced(self, backend: Backend) -> None:
        """Case 34: writes with the right token but another holder ID raise FencedError."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        backend.checkpoint(token, b"before", self.NORMAL_TTL)
        forged = dataclasses.replace(token, holder_id="h-other")
        with pytest.raises(FencedError):
            backend.checkpoint(forged, b"forged", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.renew(forged, self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.release(forged, ExitMode.FINISHED)
        with pytest.raises(FencedError):
            backend.forget(forged)
        cp = backend.read_checkpoint(token)
        assert cp.state == b"before"
        assert cp.prev_exit is ExitMode.NONE
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h-third", self.NORMAL_TTL)
        backend.renew(token, self.NORMAL_TTL)

    def test_read_checks_token_not_holder(self, backend: Backend) -> None:
        """Case 34 (read side): read checks the fencing token only, not the holder ID."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        backend.checkpoint(token, b"state", self.NORMAL_TTL)
        forged = dataclasses.replace(token, holder_id="h-other")
        cp = backend.read_checkpoint(forged)
        assert cp.state == b"state"

    # -- Byte ownership ------------------------------------------------------------------------

    def test_read_returns_independent_state(self, backend: Backend) -> None:
        """Case 35: the state read is immutable bytes; changing a copy changes nothing stored."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        backend.checkpoint(token, b"abc", self.NORMAL_TTL)
        first = backend.read_checkpoint(token)
        assert type(first.state) is bytes
        buffer = bytearray(first.state)
        buffer[0:3] = b"xyz"
        second = backend.read_checkpoint(token)
        assert second.state == b"abc"

    def test_checkpoint_copies_mutable_buffers(self, backend: Backend) -> None:
        """Case 36: a checkpoint copies bytearray and memoryview input; later edits are unseen."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        buffer = bytearray(b"abc")
        backend.checkpoint(token, buffer, self.NORMAL_TTL)
        buffer[0:3] = b"xyz"
        cp = backend.read_checkpoint(token)
        assert cp.state == b"abc"
        assert type(cp.state) is bytes

        backing = bytearray(b"def")
        backend.checkpoint(token, memoryview(backing), self.NORMAL_TTL)
        backing[0:3] = b"uvw"
        cp = backend.read_checkpoint(token)
        assert cp.state == b"def"
        assert type(cp.state) is bytes

    def test_checkpoint_round_trips_large_state(self, backend: Backend) -> None:
        """Extra: a state larger than 1 MiB, holding every byte value, round-trips exactly."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        state = bytes(range(256)) * 4096 + b"\x00tail\xff"
        assert len(state) > 1024 * 1024
        backend.checkpoint(token, state, self.NORMAL_TTL)
        cp = backend.read_checkpoint(token)
        assert cp.state == state

    # -- Forget --------------------------------------------------------------------------------

    def test_forget_then_reacquire(self, backend: Backend) -> None:
        """Case 37: after forget the same holder acquires again with a greater token."""
        first = backend.acquire("forget-1", "h", self.NORMAL_TTL)
        backend.forget(first)
        second = backend.acquire("forget-1", "h", self.NORMAL_TTL)
        assert second.fencing_token > first.fencing_token

    def test_forget_stale_token_is_fenced(self, backend: Backend) -> None:
        """Case 38: forget with a stale token raises FencedError and the row survives."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.forget(self.stale(token))
        backend.checkpoint(token, b"still here", self.NORMAL_TTL)
        cp = backend.read_checkpoint(token)
        assert cp.state == b"still here"

    def test_forget_never_acquired_is_fenced(self, backend: Backend) -> None:
        """Case 39: forget for a work ID with no row raises FencedError."""
        with pytest.raises(FencedError):
            backend.forget(self.NEVER)

    def test_forget_after_release(self, backend: Backend) -> None:
        """Case 40: the holder can forget its own released row; the successor starts fresh."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.release(a, ExitMode.RETIRED)
        backend.forget(a)
        self._assert_fresh(backend, "w1", "holder-b")

    # -- Sweep ---------------------------------------------------------------------------------

    def test_sweep_deletes_retired_row(self, backend: Backend) -> None:
        """Case 41: sweep deletes an old retired row; the next holder starts fresh."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.release(a, ExitMode.RETIRED)
        assert self._sweep_old(backend, False) >= 1
        b = self._assert_fresh(backend, "w1", "holder-b")
        assert b.fencing_token > a.fencing_token

    def test_sweep_keeps_finished_and_abandoned(self, backend: Backend) -> None:
        """Case 42: sweep never deletes rows released FINISHED or ABANDONED."""
        fin = backend.acquire("w-finished", "holder-a", self.NORMAL_TTL)
        backend.release(fin, ExitMode.FINISHED)
        aband = backend.acquire("w-abandoned", "holder-a", self.NORMAL_TTL)
        backend.release(aband, ExitMode.ABANDONED)
        assert self._sweep_old(backend, True) == 0
        for work_id, mode in (
            ("w-finished", ExitMode.FINISHED),
            ("w-abandoned", ExitMode.ABANDONED),
        ):
            token = backend.acquire(work_id, "holder-b", self.NORMAL_TTL)
            cp = backend.read_checkpoint(token)
            assert cp.prev_exit is mode
            assert cp.prev_holder_id == "holder-a"

    def test_sweep_expired_only_when_included(self, backend: Backend) -> None:
        """Case 43: a lapsed row without exit is swept only with include_expired."""
        backend.acquire("w1", "holder-a", self.EXPIRED_TTL)
        assert self._sweep_old(backend, False) == 0
        assert self._sweep_old(backend, True) >= 1
        self._assert_fresh(backend, "w1", "holder-b")

    def test_sweep_respects_retention(self, backend: Backend) -> None:
        """Case 44: sweep keeps a retired row updated less than the retention ago."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.release(a, ExitMode.RETIRED)
        assert backend.sweep(3600.0, False) == 0
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.RETIRED
        assert cp.prev_holder_id == "holder-a"

    def test_sweep_keeps_held_row(self, backend: Backend) -> None:
        """Case 45: sweep never deletes a held row."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        assert self._sweep_old(backend, True) == 0
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h2", self.NORMAL_TTL)
        backend.renew(token, self.NORMAL_TTL)

    # -- Three holders -------------------------------------------------------------------------

    def _finished_then_crashed(self, backend: Backend) -> None:
        """A checkpoints and releases FINISHED, then B acquires with an expired TTL."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.checkpoint(a, b"a-state", self.NORMAL_TTL)
        backend.release(a, ExitMode.FINISHED)
        backend.acquire("w1", "holder-b", self.EXPIRED_TTL)

    def test_crash_after_finished_is_expired(self, backend: Backend) -> None:
        """Case 46: a crashed holder after a FINISHED one leaves EXPIRED for the third."""
        self._finished_then_crashed(backend)
        assert self._sweep_old(backend, False) == 0
        c = backend.acquire("w1", "holder-c", self.NORMAL_TTL)
        cp = backend.read_checkpoint(c)
        assert cp.prev_exit is ExitMode.EXPIRED
        assert cp.prev_holder_id == "holder-b"
        assert cp.state == b"a-state"

    def test_crash_after_finished_is_swept_as_expired(self, backend: Backend) -> None:
        """Case 47: a crashed holder's row is swept only with include_expired."""
        self._finished_then_crashed(backend)
        assert self._sweep_old(backend, False) == 0
        assert self._sweep_old(backend, True) >= 1
        self._assert_fresh(backend, "w1", "holder-c")

    def test_abandon_after_crash_is_kept(self, backend: Backend) -> None:
        """Case 48: a row released ABANDONED after a crash is not swept as expired."""
        backend.acquire("w1", "holder-a", self.EXPIRED_TTL)
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.EXPIRED
        assert cp.prev_holder_id == "holder-a"
        backend.release(b, ExitMode.ABANDONED)
        assert self._sweep_old(backend, True) == 0
        c = backend.acquire("w1", "holder-c", self.NORMAL_TTL)
        cp = backend.read_checkpoint(c)
        assert cp.prev_exit is ExitMode.ABANDONED
        assert cp.prev_holder_id == "holder-b"

    def test_finish_after_retire_is_kept(self, backend: Backend) -> None:
        """Case 49: a retired work ID run again and released FINISHED is not swept."""
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.release(a, ExitMode.RETIRED)
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.RETIRED
        assert cp.prev_holder_id == "holder-a"
        backend.release(b, ExitMode.FINISHED)
        assert self._sweep_old(backend, False) == 0
        c = backend.acquire("w1", "holder-c", self.NORMAL_TTL)
        cp = backend.read_checkpoint(c)
        assert cp.prev_exit is ExitMode.FINISHED
        assert cp.prev_holder_id == "holder-b"

    # -- Implied by the interface --------------------------------------------------------------

    def test_acquire_does_not_wait(self, backend: Backend) -> None:
        """Case 50: acquire of a held row raises LeaseHeldError promptly, without waiting."""
        backend.acquire("w1", "h", self.NORMAL_TTL)
        started = time.monotonic()
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h2", self.NORMAL_TTL)
        assert time.monotonic() - started < self.PROMPT

    def test_acquire_is_not_reentrant(self, backend: Backend) -> None:
        """Case 51: the same holder acquiring its own held lease raises LeaseHeldError."""
        backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h", self.NORMAL_TTL)

    # -- Extra: the optional acquire_with_checkpoint ------------------------------------------

    @staticmethod
    def combined(backend: Backend) -> Any:
        """The backend's optional ``acquire_with_checkpoint``, or skip the test."""
        capable = Capabilities.of(backend).acquire_with_checkpoint
        if capable is None:
            pytest.skip("the backend has no acquire_with_checkpoint (optional)")
        return capable.acquire_with_checkpoint

    def test_acquire_with_checkpoint_on_first_acquisition(self, backend: Backend) -> None:
        """Extra: the combined acquire returns a token and the empty first checkpoint."""
        combined = self.combined(backend)
        token, prior = combined("w1", "holder-a", self.NORMAL_TTL)
        assert (token.work_id, token.holder_id) == ("w1", "holder-a")
        assert prior == Checkpoint(None, ExitMode.NONE, None)
        assert backend.read_checkpoint(token) == prior

    def test_acquire_with_checkpoint_after_handoff(self, backend: Backend) -> None:
        """Extra: the combined acquire returns exactly what a read right after would."""
        combined = self.combined(backend)
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.checkpoint(a, b"final", self.NORMAL_TTL)
        backend.release(a, ExitMode.FINISHED)
        token, prior = combined("w1", "holder-b", self.NORMAL_TTL)
        assert token.fencing_token > a.fencing_token
        assert prior == Checkpoint(b"final", ExitMode.FINISHED, "holder-a")
        assert backend.read_checkpoint(token) == prior

    def test_acquire_with_checkpoint_when_held(self, backend: Backend) -> None:
        """Extra: the combined acquire of a held lease raises LeaseHeldError and changes
        nothing."""
        combined = self.combined(backend)
        a = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.checkpoint(a, b"mine", self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            combined("w1", "holder-b", self.NORMAL_TTL)
        assert backend.read_checkpoint(a) == Checkpoint(b"mine", ExitMode.NONE, None)

    # -- Extra: the optional batch methods ----------------------------------------------------

    AWKWARD_IDS: ClassVar[tuple[str, ...]] = (
        "zeta",
        "NULL",
        "a,b",
        "{x}",
        'q"u',
        "back\\slash",
        "o'k",
        " sp ",
        "\u00e9",
        "alpha",
    )
    """Valid work IDs, not in sorted order, with characters that need quoting in lists."""

    @staticmethod
    def optional(backend: Backend, name: str) -> Any:
        """The backend's optional method ``name``, or skip the test."""
        capable = getattr(Capabilities.of(backend), name)
        if capable is None:
            pytest.skip(f"the backend has no {name} (optional)")
        return getattr(capable, name)

    def test_acquire_many_grants_free_leaves_held_out(self, backend: Backend) -> None:
        """Extra: acquire_many grants the free work IDs and leaves held ones (by anybody,
        the caller included) out and untouched."""
        acquire_many = self.optional(backend, "acquire_many")
        other = backend.acquire("w-held", "holder-a", self.NORMAL_TTL)
        own = backend.acquire("w-own", "holder-b", self.NORMAL_TTL)
        backend.checkpoint(other, b"theirs", self.NORMAL_TTL)
        grants = acquire_many(["w1", "w-held", "w-own", "w2"], "holder-b", self.NORMAL_TTL)
        assert [token.work_id for token, _ in grants] == ["w1", "w2"]
        for token, prior in grants:
            assert token.holder_id == "holder-b"
            assert token.fencing_token > 0
            assert token.expires_at.tzinfo is not None
            assert prior == Checkpoint(None, ExitMode.NONE, None)
            assert backend.read_checkpoint(token) == prior
            with pytest.raises(LeaseHeldError):
                backend.acquire(token.work_id, "holder-c", self.NORMAL_TTL)
            backend.renew(token, self.NORMAL_TTL)
        assert backend.read_checkpoint(other) == Checkpoint(b"theirs", ExitMode.NONE, None)
        backend.renew(other, self.NORMAL_TTL)
        backend.renew(own, self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            backend.acquire("w-held", "holder-c", self.NORMAL_TTL)

    def test_acquire_many_hands_over_like_acquire(self, backend: Backend) -> None:
        """Extra: acquire_many grants expired and released work IDs, returning the kept
        checkpoint, how the previous holder left and who it was; the old tokens are fenced."""
        acquire_many = self.optional(backend, "acquire_many")
        lapsed = backend.acquire("w-expired", "holder-a", self.EXPIRED_TTL)
        backend.checkpoint(lapsed, b"partial", self.EXPIRED_TTL)
        released = backend.acquire("w-released", "holder-b", self.NORMAL_TTL)
        backend.checkpoint(released, b"final", self.NORMAL_TTL)
        backend.release(released, ExitMode.ABANDONED)
        retired = backend.acquire("w-retired", "holder-a", self.NORMAL_TTL)
        backend.release(retired, ExitMode.RETIRED)
        grants = acquire_many(
            ["w-released", "w-expired", "w-retired", "w-new"], "holder-c", self.NORMAL_TTL
        )
        assert [(token.work_id, prior) for token, prior in grants] == [
            ("w-released", Checkpoint(b"final", ExitMode.ABANDONED, "holder-b")),
            ("w-expired", Checkpoint(b"partial", ExitMode.EXPIRED, "holder-a")),
            ("w-retired", Checkpoint(None, ExitMode.RETIRED, "holder-a")),
            ("w-new", Checkpoint(None, ExitMode.NONE, None)),
        ]
        for token, prior in grants:
            assert token.holder_id == "holder-c"
            assert backend.read_checkpoint(token) == prior
        with pytest.raises(FencedError):
            backend.renew(lapsed, self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.checkpoint(lapsed, b"zombie", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.read_checkpoint(released)

    def test_acquire_many_issues_greater_tokens(self, backend: Backend) -> None:
        """Extra: the token acquire_many issues for a work ID is greater than any issued for
        it before; where tokens are ordered across work IDs, every token it issues is
        greater than any issued before it, and distinct, and later tokens greater still."""
        acquire_many = self.optional(backend, "acquire_many")
        earlier = [
            backend.acquire("w-other", "h", self.NORMAL_TTL),
            backend.acquire("w2", "h", self.EXPIRED_TTL),
        ]
        grants = acquire_many(["w3", "w2", "w1"], "h2", self.NORMAL_TTL)
        issued = [token.fencing_token for token, _ in grants]
        assert [token.work_id for token, _ in grants] == ["w3", "w2", "w1"]
        assert issued[1] > earlier[1].fencing_token
        if not self.TOKENS_ORDERED_ACROSS_WORK_IDS:
            return
        assert len(set(issued)) == 3
        assert min(issued) > max(token.fencing_token for token in earlier)
        later = backend.acquire("w-later", "h", self.NORMAL_TTL)
        assert later.fencing_token > max(issued)

    def test_acquire_many_keeps_input_order(self, backend: Backend) -> None:
        """Extra: acquire_many returns its grants in input order, whatever the work IDs."""
        acquire_many = self.optional(backend, "acquire_many")
        backend.acquire("held", "holder-a", self.NORMAL_TTL)
        ids = list(self.AWKWARD_IDS)
        ids.insert(3, "held")
        grants = acquire_many(ids, "holder-b", self.NORMAL_TTL)
        assert [token.work_id for token, _ in grants] == list(self.AWKWARD_IDS)
        again = list(reversed(self.AWKWARD_IDS))
        for token, _ in grants:
            backend.release(token, ExitMode.FINISHED)
        regrants = acquire_many(again, "holder-c", self.NORMAL_TTL)
        assert [token.work_id for token, _ in regrants] == again
        assert all(
            prior == Checkpoint(None, ExitMode.FINISHED, "holder-b") for _, prior in regrants
        )

    def test_acquire_many_rejects_bad_input(self, backend: Backend) -> None:
        """Extra: acquire_many with repeated or invalid work IDs raises ValueError or
        TypeError and stores nothing; an empty list grants nothing."""
        acquire_many = self.optional(backend, "acquire_many")
        cases: list[tuple[object, type[Exception]]] = [
            (["w1", "w2", "w1"], ValueError),
            (["w1", "w2", ""], ValueError),
            (["w1", "w2", "a\x00b"], ValueError),
            (["w1", "w2", "x" * 1025], ValueError),
            (["w1", "w2", 123], TypeError),
            (["w1", "w2", None], TypeError),
            ("w1", TypeError),
        ]
        for work_ids, error in cases:
            with pytest.raises(error):
                acquire_many(work_ids, "h", self.NORMAL_TTL)
        assert acquire_many([], "h", self.NORMAL_TTL) == []
        self._assert_fresh(backend, "w1", "h2")
        self._assert_fresh(backend, "w2", "h2")

    def test_find_available(self, backend: Backend) -> None:
        """Extra: find_available lists, in input order, the work IDs with no row, expired or
        released, never a held one; an empty list finds nothing."""
        find_available = self.optional(backend, "find_available")
        backend.acquire("w-held", "holder-a", self.NORMAL_TTL)
        backend.acquire("w-expired", "holder-a", self.EXPIRED_TTL)
        released = backend.acquire("w-released", "holder-a", self.NORMAL_TTL)
        backend.release(released, ExitMode.FINISHED)
        ids = ["w-released", "w-held", "w-new", "w-expired"]
        assert find_available(ids) == ["w-released", "w-new", "w-expired"]
        assert find_available(list(reversed(ids))) == ["w-expired", "w-new", "w-released"]
        assert find_available(["w-held"]) == []
        assert find_available([]) == []
        assert find_available(list(self.AWKWARD_IDS)) == list(self.AWKWARD_IDS)

    def test_find_available_writes_nothing(self, backend: Backend) -> None:
        """Extra: find_available changes no lease: holders keep theirs, lapsed leases stay
        lapsed, absent rows stay absent and successors read the same previous holder."""
        find_available = self.optional(backend, "find_available")
        held = backend.acquire("w-held", "holder-a", self.NORMAL_TTL)
        lapsed = backend.acquire("w-expired", "holder-a", self.EXPIRED_TTL)
        released = backend.acquire("w-released", "holder-a", self.NORMAL_TTL)
        backend.release(released, ExitMode.FINISHED)
        ids = ["w-held", "w-expired", "w-released", "w-new"]
        find_available(ids)
        backend.renew(held, self.NORMAL_TTL)
        with pytest.raises(LeaseExpiredError):
            backend.renew(lapsed, self.NORMAL_TTL)
        with pytest.raises(LeaseExpiredError):
            backend.release(released, ExitMode.ABANDONED)
        self._assert_fresh(backend, "w-new", "holder-b")
        for work_id, mode in (("w-expired", ExitMode.EXPIRED), ("w-released", ExitMode.FINISHED)):
            token = backend.acquire(work_id, "holder-b", self.NORMAL_TTL)
            assert backend.read_checkpoint(token) == Checkpoint(None, mode, "holder-a")

    def test_renew_many_renews_every_token(self, backend: Backend) -> None:
        """Extra: renew_many renews every live token (all outcomes None) and extends each
        expiry to now + ttl; an empty list renews nothing."""
        renew_many = self.optional(backend, "renew_many")
        tokens = [
            backend.acquire(work_id, "h", self.NORMAL_TTL)
            for work_id in ("w2", "w1", "w3", *self.AWKWARD_IDS)
        ]
        assert renew_many(tokens, self.NORMAL_TTL) == [None] * len(tokens)
        assert renew_many([], self.NORMAL_TTL) == []
        for token in tokens:
            with pytest.raises(LeaseHeldError):
                backend.acquire(token.work_id, "h2", self.NORMAL_TTL)
        # Each expiry moves to now + ttl: a non-positive ttl makes every one lapse at once
        # (no sleeping, so a slow machine cannot outlive a short TTL by accident).
        assert renew_many(tokens, self.EXPIRED_TTL) == [None] * len(tokens)
        for token in tokens:
            after = backend.acquire(token.work_id, "h2", self.NORMAL_TTL)
            assert after.fencing_token > token.fencing_token

    def test_renew_many_reports_each_failure(self, backend: Backend) -> None:
        """Extra: renew_many gives, per token, the error renew would raise (fenced for a
        superseded, forged or never-acquired token, expired for a lapsed or released one)
        and renews the others; the failed leases are left as they were."""
        renew_many = self.optional(backend, "renew_many")
        superseded = backend.acquire("w-superseded", "holder-a", self.EXPIRED_TTL)
        successor = backend.acquire("w-superseded", "holder-b", self.NORMAL_TTL)
        lapsed = backend.acquire("w-lapsed", "holder-a", self.EXPIRED_TTL)
        released = backend.acquire("w-released", "holder-a", self.NORMAL_TTL)
        backend.release(released, ExitMode.FINISHED)
        real = backend.acquire("w-forged", "holder-c", self.NORMAL_TTL)
        forged = dataclasses.replace(real, holder_id="holder-a")
        good = backend.acquire("w-good", "holder-a", self.NORMAL_TTL)
        last = backend.acquire("w-good-2", "holder-a", self.NORMAL_TTL)
        tokens = [good, superseded, lapsed, self.NEVER, released, forged, last]
        expected: list[type[LeaseLostError] | None] = [
            None,
            FencedError,
            LeaseExpiredError,
            FencedError,
            LeaseExpiredError,
            FencedError,
            None,
        ]
        outcomes = renew_many(tokens, self.NORMAL_TTL)
        assert len(outcomes) == len(tokens)
        for token, outcome, kind in zip(tokens, outcomes, expected, strict=True):
            if kind is None:
                assert outcome is None, (token, outcome)
                continue
            assert isinstance(outcome, kind), (token, outcome)
            assert outcome.work_id in (None, token.work_id)
        for token in (good, last):
            with pytest.raises(LeaseHeldError):
                backend.acquire(token.work_id, "holder-d", self.NORMAL_TTL)
        backend.renew(successor, self.NORMAL_TTL)
        backend.renew(real, self.NORMAL_TTL)
        for token, mode in ((lapsed, ExitMode.EXPIRED), (released, ExitMode.FINISHED)):
            after = backend.acquire(token.work_id, "holder-d", self.NORMAL_TTL)
            assert backend.read_checkpoint(after) == Checkpoint(None, mode, "holder-a")

    def test_renew_many_rejects_repeated_work_ids(self, backend: Backend) -> None:
        """Extra: renew_many with a work ID listed twice raises ValueError."""
        renew_many = self.optional(backend, "renew_many")
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        other = backend.acquire("w2", "h", self.NORMAL_TTL)
        with pytest.raises(ValueError):
            renew_many([token, other, token], self.NORMAL_TTL)
        with pytest.raises(ValueError):
            renew_many([token, self.stale(token)], self.NORMAL_TTL)
        backend.renew(token, self.NORMAL_TTL)
        backend.renew(other, self.NORMAL_TTL)

    def test_checkpoint_many_writes_every_state(self, backend: Backend) -> None:
        """Extra: checkpoint_many writes each item's own state (empty clears it) and extends
        each lease, reviving a lapsed one nobody took, as checkpoint does; an empty list
        writes nothing."""
        checkpoint_many = self.optional(backend, "checkpoint_many")
        ids = ["w2", "w1", "w3", *self.AWKWARD_IDS]
        tokens = [backend.acquire(work_id, "h", self.NORMAL_TTL) for work_id in ids]
        lapsed = backend.acquire("w-lapsed", "h", self.EXPIRED_TTL)
        for token in tokens:
            backend.checkpoint(token, b"before", self.NORMAL_TTL)
        states: list[bytes | None] = [f"state {i}".encode() for i in range(len(tokens))]
        states[1] = b""  # clears
        states[2] = None
        items = [*zip(tokens, states, strict=True), (lapsed, bytearray(b"revived"))]
        assert checkpoint_many(items, self.NORMAL_TTL) == [None] * len(items)
        assert checkpoint_many([], self.NORMAL_TTL) == []
        for token, state in zip(tokens, states, strict=True):
            assert (backend.read_checkpoint(token)).state == (state or None)
        assert (backend.read_checkpoint(lapsed)).state == b"revived"
        with pytest.raises(LeaseHeldError):
            backend.acquire("w-lapsed", "h2", self.NORMAL_TTL)
        backend.renew(lapsed, self.NORMAL_TTL)

    def test_checkpoint_many_reports_each_failure(self, backend: Backend) -> None:
        """Extra: checkpoint_many gives, per item, the error checkpoint would raise (fenced
        for a superseded, forged or never-acquired token, expired for a released one) and
        writes the others; nothing is written for a failed item."""
        checkpoint_many = self.optional(backend, "checkpoint_many")
        superseded = backend.acquire("w-superseded", "holder-a", self.EXPIRED_TTL)
        successor = backend.acquire("w-superseded", "holder-b", self.NORMAL_TTL)
        backend.checkpoint(successor, b"successor", self.NORMAL_TTL)
        released = backend.acquire("w-released", "holder-a", self.NORMAL_TTL)
        backend.checkpoint(released, b"final", self.NORMAL_TTL)
        backend.release(released, ExitMode.FINISHED)
        real = backend.acquire("w-forged", "holder-c", self.NORMAL_TTL)
        forged = dataclasses.replace(real, holder_id="holder-a")
        good = backend.acquire("w-good", "holder-a", self.NORMAL_TTL)
        items = [
            (good, b"good"),
            (superseded, b"zombie"),
            (self.NEVER, b"never"),
            (released, b"late"),
            (forged, b"forged"),
        ]
        expected: list[type[LeaseLostError] | None] = [
            None,
            FencedError,
            FencedError,
            LeaseExpiredError,
            FencedError,
        ]
        outcomes = checkpoint_many(items, self.NORMAL_TTL)
        assert len(outcomes) == len(items)
        for (token, _), outcome, kind in zip(items, outcomes, expected, strict=True):
            if kind is None:
                assert outcome is None, (token, outcome)
                continue
            assert isinstance(outcome, kind), (token, outcome)
            assert outcome.work_id in (None, token.work_id)
        assert (backend.read_checkpoint(good)).state == b"good"
        assert (backend.read_checkpoint(successor)).state == b"successor"
        assert (backend.read_checkpoint(real)).state is None
        after = backend.acquire("w-released", "holder-d", self.NORMAL_TTL)
        assert backend.read_checkpoint(after) == Checkpoint(b"final", ExitMode.FINISHED, "holder-a")

    def test_checkpoint_many_rejects_bad_input(self, backend: Backend) -> None:
        """Extra: checkpoint_many with a work ID listed twice raises ValueError, with a state
        that is not bytes-like TypeError; either way nothing is written."""
        checkpoint_many = self.optional(backend, "checkpoint_many")
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        other = backend.acquire("w2", "h", self.NORMAL_TTL)
        with pytest.raises(ValueError):
            checkpoint_many([(token, b"a"), (other, b"b"), (token, b"c")], self.NORMAL_TTL)
        with pytest.raises(TypeError):
            checkpoint_many([(token, b"a"), (other, "text")], self.NORMAL_TTL)
        assert (backend.read_checkpoint(token)).state is None
        assert (backend.read_checkpoint(other)).state is None

    # -- Extra: fencing order, exit modes and input validation --------------------------------

    def test_renew_and_checkpoint_check_fencing_before_expiry(self, backend: Backend) -> None:
        """Extra: a superseded lapsed lease is fenced on renew and checkpoint (no revival)."""
        a = backend.acquire("w1", "holder-a", self.EXPIRED_TTL)
        b = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.renew(a, self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.checkpoint(a, b"zombie", self.NORMAL_TTL)
        cp = backend.read_checkpoint(b)
        assert cp.state is None
        backend.renew(b, self.NORMAL_TTL)

    def test_release_checks_mode_first(self, backend: Backend) -> None:
        """Extra: invalid modes raise InvalidExitModeError before any other check."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        lapsed = backend.acquire("w2", "h", self.EXPIRED_TTL)
        modes: list[object] = [None, "", "none", "expired", "bogus", 99]
        for mode in modes:
            for target in (token, self.stale(token), self.NEVER, lapsed):
                with pytest.raises(InvalidExitModeError):
                    backend.release(target, mode)  # type: ignore[arg-type]
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h2", self.NORMAL_TTL)
        backend.release(token, ExitMode.ABANDONED)
        successor = backend.acquire("w1", "h2", self.NORMAL_TTL)
        cp = backend.read_checkpoint(successor)
        assert cp.prev_exit is ExitMode.ABANDONED
        later = backend.acquire("w2", "h2", self.NORMAL_TTL)
        cp = backend.read_checkpoint(later)
        assert cp.prev_exit is ExitMode.EXPIRED

    def test_acquire_rejects_empty_work_id(self, backend: Backend) -> None:
        """Extra: an empty work ID raises ValueError and stores nothing."""
        with pytest.raises(ValueError):
            backend.acquire("", "h", self.NORMAL_TTL)
        with pytest.raises(ValueError):
            backend.acquire("", "h2", self.NORMAL_TTL)

    def test_acquire_rejects_nul_in_work_id(self, backend: Backend) -> None:
        """Extra: a work ID containing NUL raises ValueError and stores nothing."""
        with pytest.raises(ValueError):
            backend.acquire("a\x00b", "h", self.NORMAL_TTL)
        self._assert_fresh(backend, "a", "h2")
        self._assert_fresh(backend, "ab", "h2")

    def test_acquire_rejects_work_id_over_1024_bytes(self, backend: Backend) -> None:
        """Extra: a work ID of 1025 ASCII bytes raises ValueError and stores nothing."""
        with pytest.raises(ValueError):
            backend.acquire("x" * 1025, "h", self.NORMAL_TTL)
        self._assert_fresh(backend, "x" * 1024, "h2")

    def test_acquire_accepts_1024_byte_multibyte_work_id(self, backend: Backend) -> None:
        """Extra: work IDs of exactly 1024 UTF-8 bytes in multi-byte characters are accepted."""
        for work_id in ("\u00e9" * 512, "\U0001f600" * 256, "\u20ac" * 341 + "x"):
            assert len(work_id.encode("utf-8")) == 1024
            token = self._assert_fresh(backend, work_id, "h")
            backend.checkpoint(token, b"kept", self.NORMAL_TTL)
            cp = backend.read_checkpoint(token)
            assert cp.state == b"kept"
            with pytest.raises(LeaseHeldError):
                backend.acquire(work_id, "h2", self.NORMAL_TTL)

    def test_acquire_rejects_1025_byte_multibyte_work_id(self, backend: Backend) -> None:
        """Extra: a work ID over 1024 UTF-8 bytes (but fewer characters) raises ValueError."""
        for work_id, prefix in (
            ("\u00e9" * 512 + "x", "\u00e9" * 512),
            ("\U0001f600" * 256 + "x", "\U0001f600" * 256),
        ):
            assert len(work_id.encode("utf-8")) == 1025
            assert len(work_id) < 1024
            with pytest.raises(ValueError):
                backend.acquire(work_id, "h", self.NORMAL_TTL)
            self._assert_fresh(backend, prefix, "h2")

    def test_acquire_rejects_non_str_work_id(self, backend: Backend) -> None:
        """Extra: a work ID that is not a str raises TypeError and stores nothing."""
        bad: list[object] = [123, b"w1", None]
        for work_id in bad:
            with pytest.raises(TypeError):
                backend.acquire(work_id, "h", self.NORMAL_TTL)  # type: ignore[arg-type]
        for text in ("123", "w1", "None"):
            self._assert_fresh(backend, text, "h2")

    def test_checkpoint_rejects_non_bytes_state(self, backend: Backend) -> None:
        """Extra: state that is not bytes-like raises TypeError and changes nothing."""
        token = backend.acquire("w1", "h", self.NORMAL_TTL)
        backend.checkpoint(token, b"good", self.NORMAL_TTL)
        bad: list[object] = ["text", 123, [1, 2, 3]]
        for state in bad:
            with pytest.raises(TypeError):
                backend.checkpoint(token, state, self.NORMAL_TTL)  # type: ignore[arg-type]
        cp = backend.read_checkpoint(token)
        assert cp.state == b"good"

    # -- Extra: release_many and survey (fair-share pools) --------------------------------------

    def test_release_many_releases_each_token_like_release(self, backend: Backend) -> None:
        """Extra: release_many gives, per token, what release would (None when released,
        fenced for a superseded or forged token, expired for a lapsed or released one);
        the released ones are free at once with their checkpoints and the declared exit,
        the others are left as they were."""
        release_many = self.optional(backend, "release_many")
        first = backend.acquire("r-first", "holder-a", self.NORMAL_TTL)
        backend.checkpoint(first, b"kept", self.NORMAL_TTL)
        second = backend.acquire("r-second", "holder-a", self.NORMAL_TTL)
        superseded = backend.acquire("r-superseded", "holder-a", self.EXPIRED_TTL)
        successor = backend.acquire("r-superseded", "holder-b", self.NORMAL_TTL)
        lapsed = backend.acquire("r-lapsed", "holder-a", self.EXPIRED_TTL)
        released = backend.acquire("r-released", "holder-a", self.NORMAL_TTL)
        backend.release(released, ExitMode.FINISHED)
        real = backend.acquire("r-forged", "holder-c", self.NORMAL_TTL)
        forged = dataclasses.replace(real, holder_id="holder-a")
        tokens = [first, superseded, lapsed, released, forged, self.NEVER, second]
        expected: list[type[LeaseLostError] | None] = [
            None,
            FencedError,
            LeaseExpiredError,
            LeaseExpiredError,
            FencedError,
            FencedError,
            None,
        ]
        outcomes = release_many(tokens, ExitMode.ABANDONED)
        assert len(outcomes) == len(tokens)
        for token, outcome, kind in zip(tokens, outcomes, expected, strict=True):
            if kind is None:
                assert outcome is None, (token, outcome)
            else:
                assert isinstance(outcome, kind), (token, outcome)
        for token, state in ((first, b"kept"), (second, None)):
            after = backend.acquire(token.work_id, "holder-d", self.NORMAL_TTL)
            assert backend.read_checkpoint(after) == Checkpoint(
                state, ExitMode.ABANDONED, "holder-a"
            )
        backend.renew(successor, self.NORMAL_TTL)  # untouched
        backend.renew(real, self.NORMAL_TTL)
        after = backend.acquire("r-released", "holder-d", self.NORMAL_TTL)
        assert (backend.read_checkpoint(after)).prev_exit is ExitMode.FINISHED

    def test_release_many_checks_mode_and_batch_first(self, backend: Backend) -> None:
        """Extra: an undeclarable mode raises InvalidExitModeError and a repeated work ID
        ValueError, before anything is released; an empty batch gives []."""
        release_many = self.optional(backend, "release_many")
        token = backend.acquire("r1", "holder-a", self.NORMAL_TTL)
        for mode in (ExitMode.EXPIRED, ExitMode.NONE, "bogus"):
            with pytest.raises(InvalidExitModeError):
                release_many([token], mode)
        with pytest.raises(ValueError):
            release_many([token, token], ExitMode.FINISHED)
        assert release_many([], ExitMode.FINISHED) == []
        with pytest.raises(LeaseHeldError):
            backend.acquire("r1", "holder-b", self.NORMAL_TTL)

    def test_expire_fences_the_holder_and_hands_over(self, backend: Backend) -> None:
        """Extra (an operator's action, where offered): expire ends a held lease now; the
        holder's every write is fenced (a checkpoint does not revive it); the next acquire
        gets a greater token and reads the previous exit EXPIRED by that holder, with its
        checkpoint; a work ID not held is left alone (False)."""
        expire = getattr(backend, "expire", None)
        if not callable(expire):
            pytest.skip("the backend has no expire (optional)")
        token = backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        backend.checkpoint(token, b"progress", self.NORMAL_TTL)
        assert expire("w1") is True
        with pytest.raises(FencedError):
            backend.checkpoint(token, b"zombie", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.renew(token, self.NORMAL_TTL)
        with pytest.raises(FencedError):
            backend.release(token, ExitMode.FINISHED)
        assert expire("w1") is False  # expired already: nothing held
        successor = backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        assert successor.fencing_token > token.fencing_token
        assert backend.read_checkpoint(successor) == Checkpoint(
            b"progress", ExitMode.EXPIRED, "holder-a"
        )
        backend.release(successor, ExitMode.RETIRED)
        assert expire("w1") is False  # released: nothing held
        assert expire("never-acquired") is False
        lapsed = backend.acquire("w2", "holder-a", self.EXPIRED_TTL)
        assert expire("w2") is False
        backend.checkpoint(lapsed, b"revived", self.NORMAL_TTL)  # untouched by expire

    def test_survey_counts_holders_and_finds_members(self, backend: Backend) -> None:
        """Extra: survey gives the free work IDs in input order (never acquired, lapsed or
        released), how many each holder holds, and the held leases under the prefix with
        their checkpoints (a lapsed one, or one under another prefix, is no member); it
        writes nothing."""
        survey = self.optional(backend, "survey")
        for work_id in ("s-a1", "s-a2"):
            backend.acquire(work_id, "holder-a", self.NORMAL_TTL)
        backend.acquire("s-b1", "holder-b", self.NORMAL_TTL)
        backend.acquire("s-lapsed", "holder-b", self.EXPIRED_TTL)
        released = backend.acquire("s-released", "holder-a", self.NORMAL_TTL)
        backend.release(released, ExitMode.FINISHED)
        member_a = backend.acquire("grp/a", "holder-a", self.NORMAL_TTL)
        backend.checkpoint(member_a, b'{"cap":3}', self.NORMAL_TTL)
        backend.acquire("grp/b", "holder-b", self.NORMAL_TTL)
        backend.acquire("grp/gone", "holder-c", self.EXPIRED_TTL)
        backend.acquire("grpx/d", "holder-d", self.NORMAL_TTL)
        ids = ["s-never", "s-a1", "s-lapsed", "s-b1", "s-released", "s-a2"]
        result = survey(ids, "grp/")
        assert result.free == ("s-never", "s-lapsed", "s-released")
        assert dict(result.held) == {"holder-a": 2, "holder-b": 1}
        assert dict(result.members) == {"holder-a": b'{"cap":3}', "holder-b": None}
        again = survey(ids, "grp/")
        assert again == result
        assert (survey([], "nothing/")).free == ()
        fresh = backend.acquire("s-never", "holder-e", self.NORMAL_TTL)
        assert (backend.read_checkpoint(fresh)).prev_exit is ExitMode.NONE

    # -- Extra: the optional transactional steps -----------------------------------------------

    def _commit_step(
        self, backend: Backend, token: Token, state: bytes | None, write: bool = True
    ) -> None:
        step = self.optional(backend, "transaction")(token)
        step.begin(self.NORMAL_TTL)
        step.commit(state, write, self.NORMAL_TTL)

    def test_transaction_commits_the_staged_checkpoint_and_extends(self, backend: Backend) -> None:
        """Extra: a step's commit writes its checkpoint and extends the lease; without a
        staged checkpoint it keeps the stored one; a lease revived by nothing stays held."""
        token = backend.acquire("t1", "h", self.NORMAL_TTL)
        self._commit_step(backend, token, b"step 1")
        assert (backend.read_checkpoint(token)).state == b"step 1"
        self._commit_step(backend, token, None, write=False)
        assert (backend.read_checkpoint(token)).state == b"step 1"
        self._commit_step(backend, token, None)  # staged None clears it
        assert (backend.read_checkpoint(token)).state is None
        with pytest.raises(LeaseHeldError):
            backend.acquire("t1", "h2", self.NORMAL_TTL)

    def test_transaction_rollback_writes_nothing(self, backend: Backend) -> None:
        """Extra: a step rolled back leaves the checkpoint as it was."""
        token = backend.acquire("t1", "h", self.NORMAL_TTL)
        backend.checkpoint(token, b"before", self.NORMAL_TTL)
        step = self.optional(backend, "transaction")(token)
        step.begin(self.NORMAL_TTL)
        step.rollback()
        step.rollback()  # idempotent
        assert (backend.read_checkpoint(token)).state == b"before"

    def test_transaction_of_a_stale_token_is_fenced(self, backend: Backend) -> None:
        """Extra: a step of a superseded token raises FencedError and writes nothing."""
        token = backend.acquire("t1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            self._commit_step(backend, self.stale(token), b"zombie")
        with pytest.raises(FencedError):
            self._commit_step(backend, self.NEVER, b"zombie")
        assert (backend.read_checkpoint(token)).state is None

    def test_transaction_of_a_lapsed_lease_fails_and_revives_nothing(
        self, backend: Backend
    ) -> None:
        """Extra: unlike ``checkpoint``, a step never revives a lapsed lease: it raises
        LeaseLapsedError (a LeaseExpiredError), writes nothing, and anybody may take over."""
        token = backend.acquire("t1", "h", self.EXPIRED_TTL)
        with pytest.raises(LeaseLapsedError):
            self._commit_step(backend, token, b"late")
        successor = backend.acquire("t1", "h2", self.NORMAL_TTL)
        assert (backend.read_checkpoint(successor)).state is None

    def test_transaction_after_release_is_expired(self, backend: Backend) -> None:
        """Extra: a step after its holder released raises LeaseExpiredError, not a lapse."""
        token = backend.acquire("t1", "h", self.NORMAL_TTL)
        backend.checkpoint(token, b"final", self.NORMAL_TTL)
        backend.release(token, ExitMode.FINISHED)
        with pytest.raises(LeaseExpiredError) as caught:
            self._commit_step(backend, token, b"after")
        assert not isinstance(caught.value, LeaseLapsedError)
        assert (backend.read_checkpoint(token)).state == b"final"

    def test_transaction_superseded_while_open_does_not_commit(self, backend: Backend) -> None:
        """Extra: a successor granted the work ID while a step of the old token is open
        keeps its own checkpoint; the old step's commit raises FencedError."""
        token = backend.acquire("t1", "h", self.EXPIRED_TTL)
        step = self.optional(backend, "transaction")(token)
        step.begin(self.NORMAL_TTL)
        successor = backend.acquire("t1", "h2", self.NORMAL_TTL)
        backend.checkpoint(successor, b"successor", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            step.commit(b"zombie", True, self.NORMAL_TTL)
        assert (backend.read_checkpoint(successor)).state == b"successor"

    # -- Extra: durations, flags and the optional capabilities ----------------------------------

    BAD_TTLS: ClassVar[tuple[float, ...]] = (math.inf, -math.inf, math.nan, 1e12, MAX_DURATION * 2)
    """TTLs no backend may write: an expiry it could not read back (or no number at all)."""

    def test_ttl_beyond_the_maximum_is_refused_before_any_io(self, backend: Backend) -> None:
        """Extra: a TTL that is not finite or longer than 100 years raises ValueError before
        any I/O, for every write that takes one; nothing is stored or changed (a row expiring
        in the year 33715 could be read back by nobody)."""
        for ttl in self.BAD_TTLS:
            with pytest.raises(ValueError):
                backend.acquire("w1", "h", ttl)
        token = self._assert_fresh(backend, "w1", "h2")
        backend.checkpoint(token, b"kept", self.NORMAL_TTL)
        for ttl in self.BAD_TTLS:
            with pytest.raises(ValueError):
                backend.checkpoint(token, b"lost", ttl)
            with pytest.raises(ValueError):
                backend.renew(token, ttl)
        assert (backend.read_checkpoint(token)).state == b"kept"
        backend.renew(token, MAX_DURATION)  # the maximum itself is fine
        with pytest.raises(LeaseHeldError):
            backend.acquire("w1", "h3", self.NORMAL_TTL)

    def test_sweep_flag_must_be_a_bool(self, backend: Backend) -> None:
        """Extra: ``include_expired`` that is not a bool raises TypeError before any I/O (a
        destructive flag is never read by truthiness); the lapsed row stays."""
        backend.acquire("lapsed", "h", self.EXPIRED_TTL)
        sleep(self.SWEEP_SETTLE)
        for flag in ("false", "true", 0, 1, None):
            with pytest.raises(TypeError):
                backend.sweep(self.TINY_RETENTION, flag)  # type: ignore[arg-type]
        assert self._sweep_old(backend, True) == 1

    CAPABILITIES: ClassVar[tuple[tuple[str, type], ...]] = (
        ("acquire_with_checkpoint", AcquireWithCheckpoint),
        ("renew_many", RenewMany),
        ("find_available", FindAvailable),
        ("acquire_many", AcquireMany),
        ("watch_releases", ReleaseWatching),
        ("release_many", ReleaseMany),
        ("survey", Survey),
    )

    def test_optional_methods_match_their_protocols(self, backend: Backend) -> None:
        """Extra: the backend has the required methods, and every optional method it has
        matches its capability protocol: found by the library (``AsyncCapabilities``),
        callable with the protocol's positional parameters, of the flavour's kind (awaitable
        with asyncio, except ``watch_releases``, which never waits)."""
        for name in ("acquire", "read_checkpoint", "checkpoint", "renew", "release", "forget"):
            assert callable(getattr(backend, name, None)), f"required method {name} missing"
        capabilities = Capabilities.of(backend)
        for name, protocol in self.CAPABILITIES:
            method = getattr(backend, name, None)
            if method is None:
                assert getattr(capabilities, name) is None
                continue
            assert getattr(capabilities, name) is backend, name
            assert callable(method)
            expected = len(inspect.signature(getattr(protocol, name)).parameters) - 1
            positional = [
                parameter
                for parameter in inspect.signature(method).parameters.values()
                if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
            ]
            assert len(positional) == expected, f"{name} takes {expected} arguments"
            awaited = inspect.iscoroutinefunction(getattr(protocol, name))
            assert inspect.iscoroutinefunction(method) == awaited, name
