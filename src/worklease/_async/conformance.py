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

from .._acompat import asleep
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
    AsyncAcquireMany,
    AsyncAcquireWithCheckpoint,
    AsyncBackend,
    AsyncCapabilities,
    AsyncFindAvailable,
    AsyncReleaseMany,
    AsyncRenewMany,
    AsyncSurvey,
)
from .watch import AsyncReleaseWatching

__all__ = ["AsyncBackendConformance"]


class AsyncBackendConformance:
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

    async def _sweep_old(self, backend: AsyncBackend, include_expired: bool) -> int:
        """Sweep with ``TINY_RETENTION`` after letting the rows age past it."""
        await asleep(self.SWEEP_SETTLE)
        return await backend.sweep(self.TINY_RETENTION, include_expired)

    async def _assert_fresh(self, backend: AsyncBackend, work_id: str, holder_id: str) -> Token:
        """Acquire ``work_id`` and check that it had no row before (nothing was stored)."""
        token = await backend.acquire(work_id, holder_id, self.NORMAL_TTL)
        assert token.work_id == work_id
        cp = await backend.read_checkpoint(token)
        assert cp.state is None
        assert cp.prev_exit is ExitMode.NONE
        assert cp.prev_holder_id is None
        return token

    # -- Acquire -------------------------------------------------------------------------------

    async def test_acquire_fresh_work_id(self, backend: AsyncBackend) -> None:
        """Case 1: acquiring a fresh work ID succeeds with a positive fencing token."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        assert token.fencing_token > 0
        assert token.work_id == "w1"
        assert token.holder_id == "h"
        assert token.expires_at.tzinfo is not None

    async def test_acquire_held_by_other_holder(self, backend: AsyncBackend) -> None:
        """Case 2: acquiring a lease another holder holds raises LeaseHeldError."""
        await backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h2", self.NORMAL_TTL)

    async def test_acquire_expired_lease_issues_greater_token(self, backend: AsyncBackend) -> None:
        """Case 3: an expired lease is acquirable and the new token is strictly greater."""
        first = await backend.acquire("w1", "h", self.EXPIRED_TTL)
        second = await backend.acquire("w1", "h2", self.NORMAL_TTL)
        assert second.holder_id == "h2"
        assert second.fencing_token > first.fencing_token

    async def test_tokens_increase_across_work_ids(self, backend: AsyncBackend) -> None:
        """Case 4: fencing tokens increase across work IDs, not only per work ID."""
        if not self.TOKENS_ORDERED_ACROSS_WORK_IDS:
            pytest.skip("tokens are ordered per work ID only (TOKENS_ORDERED_ACROSS_WORK_IDS)")
        a = await backend.acquire("work-a", "h", 60.0)
        b = await backend.acquire("work-b", "h", 60.0)
        assert b.fencing_token > a.fencing_token

    async def test_acquire_after_expiry_keeps_checkpoint(self, backend: AsyncBackend) -> None:
        """Case 5: the successor of an expired lease reads the state checkpointed before."""
        first = await backend.acquire("w1", "h", self.EXPIRED_TTL)
        await backend.checkpoint(first, b"data", self.EXPIRED_TTL)
        second = await backend.acquire("w1", "h2", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(second)
        assert cp.state == b"data"

    async def test_acquire_after_abandon_reports_previous_holder(
        self, backend: AsyncBackend
    ) -> None:
        """Case 6: after a release with ABANDONED the successor reads ABANDONED and holder."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.release(a, ExitMode.ABANDONED)
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.ABANDONED
        assert cp.prev_holder_id == "holder-a"

    # -- Checkpoint ----------------------------------------------------------------------------

    async def test_checkpoint_round_trips(self, backend: AsyncBackend) -> None:
        """Case 7: checkpointed state is read back unchanged."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        await backend.checkpoint(token, b"payload", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(token)
        assert cp.state == b"payload"

    async def test_checkpoint_stale_token_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 8: checkpoint with a stale token raises FencedError and writes nothing."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.checkpoint(self.stale(token), b"zombie", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(token)
        assert cp.state is None

    async def test_checkpoint_never_acquired_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 9: checkpoint for a work ID with no row raises FencedError."""
        with pytest.raises(FencedError):
            await backend.checkpoint(self.NEVER, b"x", self.NORMAL_TTL)

    async def test_checkpoint_keeps_previous_exit_fields(self, backend: AsyncBackend) -> None:
        """Case 10: a checkpoint changes the state but not the previous-holder fields."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.release(a, ExitMode.FINISHED)
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        await backend.checkpoint(b, b"x", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(b)
        assert cp.state == b"x"
        assert cp.prev_exit is ExitMode.FINISHED
        assert cp.prev_holder_id == "holder-a"

    async def test_checkpoint_after_release_is_expired(self, backend: AsyncBackend) -> None:
        """Case 11: a checkpoint after release raises LeaseExpiredError and writes nothing."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.checkpoint(a, b"final", self.NORMAL_TTL)
        await backend.release(a, ExitMode.FINISHED)
        with pytest.raises(LeaseExpiredError):
            await backend.checkpoint(a, b"late", self.NORMAL_TTL)
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(b)
        assert cp.state == b"final"
        assert cp.prev_exit is ExitMode.FINISHED
        assert cp.prev_holder_id == "holder-a"

    async def test_checkpoint_revives_lapsed_lease(self, backend: AsyncBackend) -> None:
        """Case 12: a checkpoint revives a lapsed, unsuperseded lease; it is held again."""
        token = await backend.acquire("w1", "h", self.EXPIRED_TTL)
        await backend.checkpoint(token, b"revived", self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h2", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(token)
        assert cp.state == b"revived"

    # -- Renew ---------------------------------------------------------------------------------

    async def test_renew_valid_lease(self, backend: AsyncBackend) -> None:
        """Case 13: renewing a live lease succeeds and it stays held."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        await backend.renew(token, self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h2", self.NORMAL_TTL)

    async def test_renew_stale_token_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 14: renew with a stale token raises FencedError."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.renew(self.stale(token), self.NORMAL_TTL)

    async def test_renew_never_acquired_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 15: renew for a work ID with no row raises FencedError."""
        with pytest.raises(FencedError):
            await backend.renew(self.NEVER, self.NORMAL_TTL)

    async def test_renew_lapsed_lease_is_expired(self, backend: AsyncBackend) -> None:
        """Case 16: renew of a lapsed lease raises LeaseExpiredError (renew cannot revive)."""
        token = await backend.acquire("w1", "h", self.EXPIRED_TTL)
        with pytest.raises(LeaseExpiredError):
            await backend.renew(token, self.NORMAL_TTL)
        b = await backend.acquire("w1", "h2", self.NORMAL_TTL)
        assert b.fencing_token > token.fencing_token

    # -- Release -------------------------------------------------------------------------------

    async def test_release_finished_reported_to_successor(self, backend: AsyncBackend) -> None:
        """Case 17: after a release with FINISHED the successor reads FINISHED and holder."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.release(a, ExitMode.FINISHED)
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.FINISHED
        assert cp.prev_holder_id == "holder-a"

    async def test_release_frees_lease_at_once(self, backend: AsyncBackend) -> None:
        """Case 18: a released lease is acquirable at once, without waiting for the TTL."""
        a = await backend.acquire("w1", "h", self.NORMAL_TTL)
        await backend.release(a, ExitMode.FINISHED)
        b = await backend.acquire("w1", "h2", self.NORMAL_TTL)
        assert b.fencing_token > a.fencing_token

    async def test_release_stale_token_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 19: release with a stale token raises FencedError; the lease stays held."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.release(self.stale(token), ExitMode.FINISHED)
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h2", self.NORMAL_TTL)

    async def test_release_lapsed_lease_records_nothing(self, backend: AsyncBackend) -> None:
        """Case 20: release of a lapsed lease raises LeaseExpiredError and records nothing."""
        for mode in (ExitMode.FINISHED, ExitMode.ABANDONED, ExitMode.RETIRED):
            work_id = "w-" + mode.value
            a = await backend.acquire(work_id, "holder-a", self.EXPIRED_TTL)
            with pytest.raises(LeaseExpiredError):
                await backend.release(a, mode)
            b = await backend.acquire(work_id, "holder-b", self.NORMAL_TTL)
            cp = await backend.read_checkpoint(b)
            assert cp.prev_exit is ExitMode.EXPIRED, mode
            assert cp.prev_holder_id == "holder-a", mode

    async def test_release_checks_fencing_before_expiry(self, backend: AsyncBackend) -> None:
        """Case 21: fencing is checked before expiry on release."""
        a = await backend.acquire("w1", "holder-a", self.EXPIRED_TTL)
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.release(a, ExitMode.FINISHED)
        cp = await backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.EXPIRED
        assert cp.prev_holder_id == "holder-a"

    async def test_release_rejects_undeclarable_modes(self, backend: AsyncBackend) -> None:
        """Case 22: release with NONE, EXPIRED or 99 raises InvalidExitModeError; still held."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        modes: list[object] = [ExitMode.NONE, ExitMode.EXPIRED, 99]
        for mode in modes:
            with pytest.raises(InvalidExitModeError):
                await backend.release(token, mode)  # type: ignore[arg-type]
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h2", self.NORMAL_TTL)

    async def test_second_release_is_expired(self, backend: AsyncBackend) -> None:
        """Case 23: a second release raises LeaseExpiredError; the first mode stands."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.release(a, ExitMode.RETIRED)
        with pytest.raises(LeaseExpiredError):
            await backend.release(a, ExitMode.ABANDONED)
        with pytest.raises(LeaseExpiredError):
            await backend.release(a, ExitMode.RETIRED)  # the same mode again, too
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.RETIRED
        assert cp.prev_holder_id == "holder-a"

    # -- ReadCheckpoint ------------------------------------------------------------------------

    async def test_read_first_acquisition(self, backend: AsyncBackend) -> None:
        """Case 24: the first holder reads no state, prev_exit NONE and no previous holder."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(token)
        assert cp.state is None
        assert cp.prev_exit is ExitMode.NONE
        assert cp.prev_holder_id is None

    async def test_read_after_crash(self, backend: AsyncBackend) -> None:
        """Case 25: after a lapse without release the successor reads EXPIRED and the state."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.checkpoint(a, b"partial", self.EXPIRED_TTL)
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(b)
        assert cp.state == b"partial"
        assert cp.prev_exit is ExitMode.EXPIRED
        assert cp.prev_holder_id == "holder-a"

    async def test_read_previous_fields_are_stable(self, backend: AsyncBackend) -> None:
        """Case 26: the previous-holder fields stay the same for the whole lease."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.release(a, ExitMode.RETIRED)
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        before = await backend.read_checkpoint(b)
        await backend.renew(b, self.NORMAL_TTL)
        after = await backend.read_checkpoint(b)
        assert before.prev_exit is ExitMode.RETIRED
        assert before.prev_holder_id == "holder-a"
        assert after.prev_exit is before.prev_exit
        assert after.prev_holder_id == before.prev_holder_id

    async def test_read_never_acquired_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 27: read for a work ID with no row raises FencedError."""
        with pytest.raises(FencedError):
            await backend.read_checkpoint(self.NEVER)

    async def test_read_after_forget_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 28: read with a forgotten token raises FencedError."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        await backend.forget(token)
        with pytest.raises(FencedError):
            await backend.read_checkpoint(token)

    async def test_read_after_sweep_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 29: read with the token of a swept row raises FencedError."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        await backend.release(token, ExitMode.RETIRED)
        assert await self._sweep_old(backend, False) >= 1
        with pytest.raises(FencedError):
            await backend.read_checkpoint(token)

    async def test_acquire_after_forget_starts_fresh(self, backend: AsyncBackend) -> None:
        """Case 30: after forget the next holder reads prev_exit NONE and no previous holder."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.checkpoint(a, b"gone", self.NORMAL_TTL)
        await backend.forget(a)
        b = await self._assert_fresh(backend, "w1", "holder-b")
        assert b.fencing_token > a.fencing_token

    async def test_read_without_checkpoint(self, backend: AsyncBackend) -> None:
        """Case 31: with no checkpoint written the state is absent."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        await backend.renew(token, self.NORMAL_TTL)
        cp = await backend.read_checkpoint(token)
        assert cp.state is None

    async def test_read_stale_token_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 32: read with a stale token raises FencedError."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.read_checkpoint(self.stale(token))

    async def test_checkpoint_absent_or_empty_reads_absent(self, backend: AsyncBackend) -> None:
        """Case 32a: a checkpoint of None or of empty bytes reads back as absent."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        empties: list[bytes | bytearray | memoryview | None] = [
            None,
            b"",
            bytearray(),
            memoryview(b""),
        ]
        for empty in empties:
            await backend.checkpoint(token, b"something", self.NORMAL_TTL)
            await backend.checkpoint(token, empty, self.NORMAL_TTL)
            cp = await backend.read_checkpoint(token)
            assert cp.state is None, empty

    # -- Holder mismatch -----------------------------------------------------------------------

    async def test_holder_mismatch_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 34: writes with the right token but another holder ID raise FencedError."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        await backend.checkpoint(token, b"before", self.NORMAL_TTL)
        forged = dataclasses.replace(token, holder_id="h-other")
        with pytest.raises(FencedError):
            await backend.checkpoint(forged, b"forged", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.renew(forged, self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.release(forged, ExitMode.FINISHED)
        with pytest.raises(FencedError):
            await backend.forget(forged)
        cp = await backend.read_checkpoint(token)
        assert cp.state == b"before"
        assert cp.prev_exit is ExitMode.NONE
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h-third", self.NORMAL_TTL)
        await backend.renew(token, self.NORMAL_TTL)

    async def test_read_checks_token_not_holder(self, backend: AsyncBackend) -> None:
        """Case 34 (read side): read checks the fencing token only, not the holder ID."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        await backend.checkpoint(token, b"state", self.NORMAL_TTL)
        forged = dataclasses.replace(token, holder_id="h-other")
        cp = await backend.read_checkpoint(forged)
        assert cp.state == b"state"

    # -- Byte ownership ------------------------------------------------------------------------

    async def test_read_returns_independent_state(self, backend: AsyncBackend) -> None:
        """Case 35: the state read is immutable bytes; changing a copy changes nothing stored."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        await backend.checkpoint(token, b"abc", self.NORMAL_TTL)
        first = await backend.read_checkpoint(token)
        assert type(first.state) is bytes
        buffer = bytearray(first.state)
        buffer[0:3] = b"xyz"
        second = await backend.read_checkpoint(token)
        assert second.state == b"abc"

    async def test_checkpoint_copies_mutable_buffers(self, backend: AsyncBackend) -> None:
        """Case 36: a checkpoint copies bytearray and memoryview input; later edits are unseen."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        buffer = bytearray(b"abc")
        await backend.checkpoint(token, buffer, self.NORMAL_TTL)
        buffer[0:3] = b"xyz"
        cp = await backend.read_checkpoint(token)
        assert cp.state == b"abc"
        assert type(cp.state) is bytes

        backing = bytearray(b"def")
        await backend.checkpoint(token, memoryview(backing), self.NORMAL_TTL)
        backing[0:3] = b"uvw"
        cp = await backend.read_checkpoint(token)
        assert cp.state == b"def"
        assert type(cp.state) is bytes

    async def test_checkpoint_round_trips_large_state(self, backend: AsyncBackend) -> None:
        """Extra: a state larger than 1 MiB, holding every byte value, round-trips exactly."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        state = bytes(range(256)) * 4096 + b"\x00tail\xff"
        assert len(state) > 1024 * 1024
        await backend.checkpoint(token, state, self.NORMAL_TTL)
        cp = await backend.read_checkpoint(token)
        assert cp.state == state

    # -- Forget --------------------------------------------------------------------------------

    async def test_forget_then_reacquire(self, backend: AsyncBackend) -> None:
        """Case 37: after forget the same holder acquires again with a greater token."""
        first = await backend.acquire("forget-1", "h", self.NORMAL_TTL)
        await backend.forget(first)
        second = await backend.acquire("forget-1", "h", self.NORMAL_TTL)
        assert second.fencing_token > first.fencing_token

    async def test_forget_stale_token_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 38: forget with a stale token raises FencedError and the row survives."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.forget(self.stale(token))
        await backend.checkpoint(token, b"still here", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(token)
        assert cp.state == b"still here"

    async def test_forget_never_acquired_is_fenced(self, backend: AsyncBackend) -> None:
        """Case 39: forget for a work ID with no row raises FencedError."""
        with pytest.raises(FencedError):
            await backend.forget(self.NEVER)

    async def test_forget_after_release(self, backend: AsyncBackend) -> None:
        """Case 40: the holder can forget its own released row; the successor starts fresh."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.release(a, ExitMode.RETIRED)
        await backend.forget(a)
        await self._assert_fresh(backend, "w1", "holder-b")

    # -- Sweep ---------------------------------------------------------------------------------

    async def test_sweep_deletes_retired_row(self, backend: AsyncBackend) -> None:
        """Case 41: sweep deletes an old retired row; the next holder starts fresh."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.release(a, ExitMode.RETIRED)
        assert await self._sweep_old(backend, False) >= 1
        b = await self._assert_fresh(backend, "w1", "holder-b")
        assert b.fencing_token > a.fencing_token

    async def test_sweep_keeps_finished_and_abandoned(self, backend: AsyncBackend) -> None:
        """Case 42: sweep never deletes rows released FINISHED or ABANDONED."""
        fin = await backend.acquire("w-finished", "holder-a", self.NORMAL_TTL)
        await backend.release(fin, ExitMode.FINISHED)
        aband = await backend.acquire("w-abandoned", "holder-a", self.NORMAL_TTL)
        await backend.release(aband, ExitMode.ABANDONED)
        assert await self._sweep_old(backend, True) == 0
        for work_id, mode in (
            ("w-finished", ExitMode.FINISHED),
            ("w-abandoned", ExitMode.ABANDONED),
        ):
            token = await backend.acquire(work_id, "holder-b", self.NORMAL_TTL)
            cp = await backend.read_checkpoint(token)
            assert cp.prev_exit is mode
            assert cp.prev_holder_id == "holder-a"

    async def test_sweep_expired_only_when_included(self, backend: AsyncBackend) -> None:
        """Case 43: a lapsed row without exit is swept only with include_expired."""
        await backend.acquire("w1", "holder-a", self.EXPIRED_TTL)
        assert await self._sweep_old(backend, False) == 0
        assert await self._sweep_old(backend, True) >= 1
        await self._assert_fresh(backend, "w1", "holder-b")

    async def test_sweep_respects_retention(self, backend: AsyncBackend) -> None:
        """Case 44: sweep keeps a retired row updated less than the retention ago."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.release(a, ExitMode.RETIRED)
        assert await backend.sweep(3600.0, False) == 0
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.RETIRED
        assert cp.prev_holder_id == "holder-a"

    async def test_sweep_keeps_held_row(self, backend: AsyncBackend) -> None:
        """Case 45: sweep never deletes a held row."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        assert await self._sweep_old(backend, True) == 0
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h2", self.NORMAL_TTL)
        await backend.renew(token, self.NORMAL_TTL)

    # -- Three holders -------------------------------------------------------------------------

    async def _finished_then_crashed(self, backend: AsyncBackend) -> None:
        """A checkpoints and releases FINISHED, then B acquires with an expired TTL."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.checkpoint(a, b"a-state", self.NORMAL_TTL)
        await backend.release(a, ExitMode.FINISHED)
        await backend.acquire("w1", "holder-b", self.EXPIRED_TTL)

    async def test_crash_after_finished_is_expired(self, backend: AsyncBackend) -> None:
        """Case 46: a crashed holder after a FINISHED one leaves EXPIRED for the third."""
        await self._finished_then_crashed(backend)
        assert await self._sweep_old(backend, False) == 0
        c = await backend.acquire("w1", "holder-c", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(c)
        assert cp.prev_exit is ExitMode.EXPIRED
        assert cp.prev_holder_id == "holder-b"
        assert cp.state == b"a-state"

    async def test_crash_after_finished_is_swept_as_expired(self, backend: AsyncBackend) -> None:
        """Case 47: a crashed holder's row is swept only with include_expired."""
        await self._finished_then_crashed(backend)
        assert await self._sweep_old(backend, False) == 0
        assert await self._sweep_old(backend, True) >= 1
        await self._assert_fresh(backend, "w1", "holder-c")

    async def test_abandon_after_crash_is_kept(self, backend: AsyncBackend) -> None:
        """Case 48: a row released ABANDONED after a crash is not swept as expired."""
        await backend.acquire("w1", "holder-a", self.EXPIRED_TTL)
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.EXPIRED
        assert cp.prev_holder_id == "holder-a"
        await backend.release(b, ExitMode.ABANDONED)
        assert await self._sweep_old(backend, True) == 0
        c = await backend.acquire("w1", "holder-c", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(c)
        assert cp.prev_exit is ExitMode.ABANDONED
        assert cp.prev_holder_id == "holder-b"

    async def test_finish_after_retire_is_kept(self, backend: AsyncBackend) -> None:
        """Case 49: a retired work ID run again and released FINISHED is not swept."""
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.release(a, ExitMode.RETIRED)
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(b)
        assert cp.prev_exit is ExitMode.RETIRED
        assert cp.prev_holder_id == "holder-a"
        await backend.release(b, ExitMode.FINISHED)
        assert await self._sweep_old(backend, False) == 0
        c = await backend.acquire("w1", "holder-c", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(c)
        assert cp.prev_exit is ExitMode.FINISHED
        assert cp.prev_holder_id == "holder-b"

    # -- Implied by the interface --------------------------------------------------------------

    async def test_acquire_does_not_wait(self, backend: AsyncBackend) -> None:
        """Case 50: acquire of a held row raises LeaseHeldError promptly, without waiting."""
        await backend.acquire("w1", "h", self.NORMAL_TTL)
        started = time.monotonic()
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h2", self.NORMAL_TTL)
        assert time.monotonic() - started < self.PROMPT

    async def test_acquire_is_not_reentrant(self, backend: AsyncBackend) -> None:
        """Case 51: the same holder acquiring its own held lease raises LeaseHeldError."""
        await backend.acquire("w1", "h", self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h", self.NORMAL_TTL)

    # -- Extra: the optional acquire_with_checkpoint ------------------------------------------

    @staticmethod
    def combined(backend: AsyncBackend) -> Any:
        """The backend's optional ``acquire_with_checkpoint``, or skip the test."""
        capable = AsyncCapabilities.of(backend).acquire_with_checkpoint
        if capable is None:
            pytest.skip("the backend has no acquire_with_checkpoint (optional)")
        return capable.acquire_with_checkpoint

    async def test_acquire_with_checkpoint_on_first_acquisition(
        self, backend: AsyncBackend
    ) -> None:
        """Extra: the combined acquire returns a token and the empty first checkpoint."""
        combined = self.combined(backend)
        token, prior = await combined("w1", "holder-a", self.NORMAL_TTL)
        assert (token.work_id, token.holder_id) == ("w1", "holder-a")
        assert prior == Checkpoint(None, ExitMode.NONE, None)
        assert await backend.read_checkpoint(token) == prior

    async def test_acquire_with_checkpoint_after_handoff(self, backend: AsyncBackend) -> None:
        """Extra: the combined acquire returns exactly what a read right after would."""
        combined = self.combined(backend)
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.checkpoint(a, b"final", self.NORMAL_TTL)
        await backend.release(a, ExitMode.FINISHED)
        token, prior = await combined("w1", "holder-b", self.NORMAL_TTL)
        assert token.fencing_token > a.fencing_token
        assert prior == Checkpoint(b"final", ExitMode.FINISHED, "holder-a")
        assert await backend.read_checkpoint(token) == prior

    async def test_acquire_with_checkpoint_when_held(self, backend: AsyncBackend) -> None:
        """Extra: the combined acquire of a held lease raises LeaseHeldError and changes
        nothing."""
        combined = self.combined(backend)
        a = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.checkpoint(a, b"mine", self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            await combined("w1", "holder-b", self.NORMAL_TTL)
        assert await backend.read_checkpoint(a) == Checkpoint(b"mine", ExitMode.NONE, None)

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
    def optional(backend: AsyncBackend, name: str) -> Any:
        """The backend's optional method ``name``, or skip the test."""
        capable = getattr(AsyncCapabilities.of(backend), name)
        if capable is None:
            pytest.skip(f"the backend has no {name} (optional)")
        return getattr(capable, name)

    async def test_acquire_many_grants_free_leaves_held_out(self, backend: AsyncBackend) -> None:
        """Extra: acquire_many grants the free work IDs and leaves held ones (by anybody,
        the caller included) out and untouched."""
        acquire_many = self.optional(backend, "acquire_many")
        other = await backend.acquire("w-held", "holder-a", self.NORMAL_TTL)
        own = await backend.acquire("w-own", "holder-b", self.NORMAL_TTL)
        await backend.checkpoint(other, b"theirs", self.NORMAL_TTL)
        grants = await acquire_many(["w1", "w-held", "w-own", "w2"], "holder-b", self.NORMAL_TTL)
        assert [token.work_id for token, _ in grants] == ["w1", "w2"]
        for token, prior in grants:
            assert token.holder_id == "holder-b"
            assert token.fencing_token > 0
            assert token.expires_at.tzinfo is not None
            assert prior == Checkpoint(None, ExitMode.NONE, None)
            assert await backend.read_checkpoint(token) == prior
            with pytest.raises(LeaseHeldError):
                await backend.acquire(token.work_id, "holder-c", self.NORMAL_TTL)
            await backend.renew(token, self.NORMAL_TTL)
        assert await backend.read_checkpoint(other) == Checkpoint(b"theirs", ExitMode.NONE, None)
        await backend.renew(other, self.NORMAL_TTL)
        await backend.renew(own, self.NORMAL_TTL)
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w-held", "holder-c", self.NORMAL_TTL)

    async def test_acquire_many_hands_over_like_acquire(self, backend: AsyncBackend) -> None:
        """Extra: acquire_many grants expired and released work IDs, returning the kept
        checkpoint, how the previous holder left and who it was; the old tokens are fenced."""
        acquire_many = self.optional(backend, "acquire_many")
        lapsed = await backend.acquire("w-expired", "holder-a", self.EXPIRED_TTL)
        await backend.checkpoint(lapsed, b"partial", self.EXPIRED_TTL)
        released = await backend.acquire("w-released", "holder-b", self.NORMAL_TTL)
        await backend.checkpoint(released, b"final", self.NORMAL_TTL)
        await backend.release(released, ExitMode.ABANDONED)
        retired = await backend.acquire("w-retired", "holder-a", self.NORMAL_TTL)
        await backend.release(retired, ExitMode.RETIRED)
        grants = await acquire_many(
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
            assert await backend.read_checkpoint(token) == prior
        with pytest.raises(FencedError):
            await backend.renew(lapsed, self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.checkpoint(lapsed, b"zombie", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.read_checkpoint(released)

    async def test_acquire_many_issues_greater_tokens(self, backend: AsyncBackend) -> None:
        """Extra: the token acquire_many issues for a work ID is greater than any issued for
        it before; where tokens are ordered across work IDs, every token it issues is
        greater than any issued before it, and distinct, and later tokens greater still."""
        acquire_many = self.optional(backend, "acquire_many")
        earlier = [
            await backend.acquire("w-other", "h", self.NORMAL_TTL),
            await backend.acquire("w2", "h", self.EXPIRED_TTL),
        ]
        grants = await acquire_many(["w3", "w2", "w1"], "h2", self.NORMAL_TTL)
        issued = [token.fencing_token for token, _ in grants]
        assert [token.work_id for token, _ in grants] == ["w3", "w2", "w1"]
        assert issued[1] > earlier[1].fencing_token
        if not self.TOKENS_ORDERED_ACROSS_WORK_IDS:
            return
        assert len(set(issued)) == 3
        assert min(issued) > max(token.fencing_token for token in earlier)
        later = await backend.acquire("w-later", "h", self.NORMAL_TTL)
        assert later.fencing_token > max(issued)

    async def test_acquire_many_keeps_input_order(self, backend: AsyncBackend) -> None:
        """Extra: acquire_many returns its grants in input order, whatever the work IDs."""
        acquire_many = self.optional(backend, "acquire_many")
        await backend.acquire("held", "holder-a", self.NORMAL_TTL)
        ids = list(self.AWKWARD_IDS)
        ids.insert(3, "held")
        grants = await acquire_many(ids, "holder-b", self.NORMAL_TTL)
        assert [token.work_id for token, _ in grants] == list(self.AWKWARD_IDS)
        again = list(reversed(self.AWKWARD_IDS))
        for token, _ in grants:
            await backend.release(token, ExitMode.FINISHED)
        regrants = await acquire_many(again, "holder-c", self.NORMAL_TTL)
        assert [token.work_id for token, _ in regrants] == again
        assert all(
            prior == Checkpoint(None, ExitMode.FINISHED, "holder-b") for _, prior in regrants
        )

    async def test_acquire_many_rejects_bad_input(self, backend: AsyncBackend) -> None:
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
                await acquire_many(work_ids, "h", self.NORMAL_TTL)
        assert await acquire_many([], "h", self.NORMAL_TTL) == []
        await self._assert_fresh(backend, "w1", "h2")
        await self._assert_fresh(backend, "w2", "h2")

    async def test_find_available(self, backend: AsyncBackend) -> None:
        """Extra: find_available lists, in input order, the work IDs with no row, expired or
        released, never a held one; an empty list finds nothing."""
        find_available = self.optional(backend, "find_available")
        await backend.acquire("w-held", "holder-a", self.NORMAL_TTL)
        await backend.acquire("w-expired", "holder-a", self.EXPIRED_TTL)
        released = await backend.acquire("w-released", "holder-a", self.NORMAL_TTL)
        await backend.release(released, ExitMode.FINISHED)
        ids = ["w-released", "w-held", "w-new", "w-expired"]
        assert await find_available(ids) == ["w-released", "w-new", "w-expired"]
        assert await find_available(list(reversed(ids))) == ["w-expired", "w-new", "w-released"]
        assert await find_available(["w-held"]) == []
        assert await find_available([]) == []
        assert await find_available(list(self.AWKWARD_IDS)) == list(self.AWKWARD_IDS)

    async def test_find_available_writes_nothing(self, backend: AsyncBackend) -> None:
        """Extra: find_available changes no lease: holders keep theirs, lapsed leases stay
        lapsed, absent rows stay absent and successors read the same previous holder."""
        find_available = self.optional(backend, "find_available")
        held = await backend.acquire("w-held", "holder-a", self.NORMAL_TTL)
        lapsed = await backend.acquire("w-expired", "holder-a", self.EXPIRED_TTL)
        released = await backend.acquire("w-released", "holder-a", self.NORMAL_TTL)
        await backend.release(released, ExitMode.FINISHED)
        ids = ["w-held", "w-expired", "w-released", "w-new"]
        await find_available(ids)
        await backend.renew(held, self.NORMAL_TTL)
        with pytest.raises(LeaseExpiredError):
            await backend.renew(lapsed, self.NORMAL_TTL)
        with pytest.raises(LeaseExpiredError):
            await backend.release(released, ExitMode.ABANDONED)
        await self._assert_fresh(backend, "w-new", "holder-b")
        for work_id, mode in (("w-expired", ExitMode.EXPIRED), ("w-released", ExitMode.FINISHED)):
            token = await backend.acquire(work_id, "holder-b", self.NORMAL_TTL)
            assert await backend.read_checkpoint(token) == Checkpoint(None, mode, "holder-a")

    async def test_renew_many_renews_every_token(self, backend: AsyncBackend) -> None:
        """Extra: renew_many renews every live token (all outcomes None) and extends each
        expiry to now + ttl; an empty list renews nothing."""
        renew_many = self.optional(backend, "renew_many")
        tokens = [
            await backend.acquire(work_id, "h", self.NORMAL_TTL)
            for work_id in ("w2", "w1", "w3", *self.AWKWARD_IDS)
        ]
        assert await renew_many(tokens, self.NORMAL_TTL) == [None] * len(tokens)
        assert await renew_many([], self.NORMAL_TTL) == []
        for token in tokens:
            with pytest.raises(LeaseHeldError):
                await backend.acquire(token.work_id, "h2", self.NORMAL_TTL)
        # Each expiry moves to now + ttl: a non-positive ttl makes every one lapse at once
        # (no sleeping, so a slow machine cannot outlive a short TTL by accident).
        assert await renew_many(tokens, self.EXPIRED_TTL) == [None] * len(tokens)
        for token in tokens:
            after = await backend.acquire(token.work_id, "h2", self.NORMAL_TTL)
            assert after.fencing_token > token.fencing_token

    async def test_renew_many_reports_each_failure(self, backend: AsyncBackend) -> None:
        """Extra: renew_many gives, per token, the error renew would raise (fenced for a
        superseded, forged or never-acquired token, expired for a lapsed or released one)
        and renews the others; the failed leases are left as they were."""
        renew_many = self.optional(backend, "renew_many")
        superseded = await backend.acquire("w-superseded", "holder-a", self.EXPIRED_TTL)
        successor = await backend.acquire("w-superseded", "holder-b", self.NORMAL_TTL)
        lapsed = await backend.acquire("w-lapsed", "holder-a", self.EXPIRED_TTL)
        released = await backend.acquire("w-released", "holder-a", self.NORMAL_TTL)
        await backend.release(released, ExitMode.FINISHED)
        real = await backend.acquire("w-forged", "holder-c", self.NORMAL_TTL)
        forged = dataclasses.replace(real, holder_id="holder-a")
        good = await backend.acquire("w-good", "holder-a", self.NORMAL_TTL)
        last = await backend.acquire("w-good-2", "holder-a", self.NORMAL_TTL)
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
        outcomes = await renew_many(tokens, self.NORMAL_TTL)
        assert len(outcomes) == len(tokens)
        for token, outcome, kind in zip(tokens, outcomes, expected, strict=True):
            if kind is None:
                assert outcome is None, (token, outcome)
                continue
            assert isinstance(outcome, kind), (token, outcome)
            assert outcome.work_id in (None, token.work_id)
        for token in (good, last):
            with pytest.raises(LeaseHeldError):
                await backend.acquire(token.work_id, "holder-d", self.NORMAL_TTL)
        await backend.renew(successor, self.NORMAL_TTL)
        await backend.renew(real, self.NORMAL_TTL)
        for token, mode in ((lapsed, ExitMode.EXPIRED), (released, ExitMode.FINISHED)):
            after = await backend.acquire(token.work_id, "holder-d", self.NORMAL_TTL)
            assert await backend.read_checkpoint(after) == Checkpoint(None, mode, "holder-a")

    async def test_renew_many_rejects_repeated_work_ids(self, backend: AsyncBackend) -> None:
        """Extra: renew_many with a work ID listed twice raises ValueError."""
        renew_many = self.optional(backend, "renew_many")
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        other = await backend.acquire("w2", "h", self.NORMAL_TTL)
        with pytest.raises(ValueError):
            await renew_many([token, other, token], self.NORMAL_TTL)
        with pytest.raises(ValueError):
            await renew_many([token, self.stale(token)], self.NORMAL_TTL)
        await backend.renew(token, self.NORMAL_TTL)
        await backend.renew(other, self.NORMAL_TTL)

    async def test_checkpoint_many_writes_every_state(self, backend: AsyncBackend) -> None:
        """Extra: checkpoint_many writes each item's own state (empty clears it) and extends
        each lease, reviving a lapsed one nobody took, as checkpoint does; an empty list
        writes nothing."""
        checkpoint_many = self.optional(backend, "checkpoint_many")
        ids = ["w2", "w1", "w3", *self.AWKWARD_IDS]
        tokens = [await backend.acquire(work_id, "h", self.NORMAL_TTL) for work_id in ids]
        lapsed = await backend.acquire("w-lapsed", "h", self.EXPIRED_TTL)
        for token in tokens:
            await backend.checkpoint(token, b"before", self.NORMAL_TTL)
        states: list[bytes | None] = [f"state {i}".encode() for i in range(len(tokens))]
        states[1] = b""  # clears
        states[2] = None
        items = [*zip(tokens, states, strict=True), (lapsed, bytearray(b"revived"))]
        assert await checkpoint_many(items, self.NORMAL_TTL) == [None] * len(items)
        assert await checkpoint_many([], self.NORMAL_TTL) == []
        for token, state in zip(tokens, states, strict=True):
            assert (await backend.read_checkpoint(token)).state == (state or None)
        assert (await backend.read_checkpoint(lapsed)).state == b"revived"
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w-lapsed", "h2", self.NORMAL_TTL)
        await backend.renew(lapsed, self.NORMAL_TTL)

    async def test_checkpoint_many_reports_each_failure(self, backend: AsyncBackend) -> None:
        """Extra: checkpoint_many gives, per item, the error checkpoint would raise (fenced
        for a superseded, forged or never-acquired token, expired for a released one) and
        writes the others; nothing is written for a failed item."""
        checkpoint_many = self.optional(backend, "checkpoint_many")
        superseded = await backend.acquire("w-superseded", "holder-a", self.EXPIRED_TTL)
        successor = await backend.acquire("w-superseded", "holder-b", self.NORMAL_TTL)
        await backend.checkpoint(successor, b"successor", self.NORMAL_TTL)
        released = await backend.acquire("w-released", "holder-a", self.NORMAL_TTL)
        await backend.checkpoint(released, b"final", self.NORMAL_TTL)
        await backend.release(released, ExitMode.FINISHED)
        real = await backend.acquire("w-forged", "holder-c", self.NORMAL_TTL)
        forged = dataclasses.replace(real, holder_id="holder-a")
        good = await backend.acquire("w-good", "holder-a", self.NORMAL_TTL)
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
        outcomes = await checkpoint_many(items, self.NORMAL_TTL)
        assert len(outcomes) == len(items)
        for (token, _), outcome, kind in zip(items, outcomes, expected, strict=True):
            if kind is None:
                assert outcome is None, (token, outcome)
                continue
            assert isinstance(outcome, kind), (token, outcome)
            assert outcome.work_id in (None, token.work_id)
        assert (await backend.read_checkpoint(good)).state == b"good"
        assert (await backend.read_checkpoint(successor)).state == b"successor"
        assert (await backend.read_checkpoint(real)).state is None
        after = await backend.acquire("w-released", "holder-d", self.NORMAL_TTL)
        assert await backend.read_checkpoint(after) == Checkpoint(
            b"final", ExitMode.FINISHED, "holder-a"
        )

    async def test_checkpoint_many_rejects_bad_input(self, backend: AsyncBackend) -> None:
        """Extra: checkpoint_many with a work ID listed twice raises ValueError, with a state
        that is not bytes-like TypeError; either way nothing is written."""
        checkpoint_many = self.optional(backend, "checkpoint_many")
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        other = await backend.acquire("w2", "h", self.NORMAL_TTL)
        with pytest.raises(ValueError):
            await checkpoint_many([(token, b"a"), (other, b"b"), (token, b"c")], self.NORMAL_TTL)
        with pytest.raises(TypeError):
            await checkpoint_many([(token, b"a"), (other, "text")], self.NORMAL_TTL)
        assert (await backend.read_checkpoint(token)).state is None
        assert (await backend.read_checkpoint(other)).state is None

    # -- Extra: fencing order, exit modes and input validation --------------------------------

    async def test_renew_and_checkpoint_check_fencing_before_expiry(
        self, backend: AsyncBackend
    ) -> None:
        """Extra: a superseded lapsed lease is fenced on renew and checkpoint (no revival)."""
        a = await backend.acquire("w1", "holder-a", self.EXPIRED_TTL)
        b = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.renew(a, self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.checkpoint(a, b"zombie", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(b)
        assert cp.state is None
        await backend.renew(b, self.NORMAL_TTL)

    async def test_release_checks_mode_first(self, backend: AsyncBackend) -> None:
        """Extra: invalid modes raise InvalidExitModeError before any other check."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        lapsed = await backend.acquire("w2", "h", self.EXPIRED_TTL)
        modes: list[object] = [None, "", "none", "expired", "bogus", 99]
        for mode in modes:
            for target in (token, self.stale(token), self.NEVER, lapsed):
                with pytest.raises(InvalidExitModeError):
                    await backend.release(target, mode)  # type: ignore[arg-type]
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h2", self.NORMAL_TTL)
        await backend.release(token, ExitMode.ABANDONED)
        successor = await backend.acquire("w1", "h2", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(successor)
        assert cp.prev_exit is ExitMode.ABANDONED
        later = await backend.acquire("w2", "h2", self.NORMAL_TTL)
        cp = await backend.read_checkpoint(later)
        assert cp.prev_exit is ExitMode.EXPIRED

    async def test_acquire_rejects_empty_work_id(self, backend: AsyncBackend) -> None:
        """Extra: an empty work ID raises ValueError and stores nothing."""
        with pytest.raises(ValueError):
            await backend.acquire("", "h", self.NORMAL_TTL)
        with pytest.raises(ValueError):
            await backend.acquire("", "h2", self.NORMAL_TTL)

    async def test_acquire_rejects_nul_in_work_id(self, backend: AsyncBackend) -> None:
        """Extra: a work ID containing NUL raises ValueError and stores nothing."""
        with pytest.raises(ValueError):
            await backend.acquire("a\x00b", "h", self.NORMAL_TTL)
        await self._assert_fresh(backend, "a", "h2")
        await self._assert_fresh(backend, "ab", "h2")

    async def test_acquire_rejects_work_id_over_1024_bytes(self, backend: AsyncBackend) -> None:
        """Extra: a work ID of 1025 ASCII bytes raises ValueError and stores nothing."""
        with pytest.raises(ValueError):
            await backend.acquire("x" * 1025, "h", self.NORMAL_TTL)
        await self._assert_fresh(backend, "x" * 1024, "h2")

    async def test_acquire_accepts_1024_byte_multibyte_work_id(self, backend: AsyncBackend) -> None:
        """Extra: work IDs of exactly 1024 UTF-8 bytes in multi-byte characters are accepted."""
        for work_id in ("\u00e9" * 512, "\U0001f600" * 256, "\u20ac" * 341 + "x"):
            assert len(work_id.encode("utf-8")) == 1024
            token = await self._assert_fresh(backend, work_id, "h")
            await backend.checkpoint(token, b"kept", self.NORMAL_TTL)
            cp = await backend.read_checkpoint(token)
            assert cp.state == b"kept"
            with pytest.raises(LeaseHeldError):
                await backend.acquire(work_id, "h2", self.NORMAL_TTL)

    async def test_acquire_rejects_1025_byte_multibyte_work_id(self, backend: AsyncBackend) -> None:
        """Extra: a work ID over 1024 UTF-8 bytes (but fewer characters) raises ValueError."""
        for work_id, prefix in (
            ("\u00e9" * 512 + "x", "\u00e9" * 512),
            ("\U0001f600" * 256 + "x", "\U0001f600" * 256),
        ):
            assert len(work_id.encode("utf-8")) == 1025
            assert len(work_id) < 1024
            with pytest.raises(ValueError):
                await backend.acquire(work_id, "h", self.NORMAL_TTL)
            await self._assert_fresh(backend, prefix, "h2")

    async def test_acquire_rejects_non_str_work_id(self, backend: AsyncBackend) -> None:
        """Extra: a work ID that is not a str raises TypeError and stores nothing."""
        bad: list[object] = [123, b"w1", None]
        for work_id in bad:
            with pytest.raises(TypeError):
                await backend.acquire(work_id, "h", self.NORMAL_TTL)  # type: ignore[arg-type]
        for text in ("123", "w1", "None"):
            await self._assert_fresh(backend, text, "h2")

    async def test_checkpoint_rejects_non_bytes_state(self, backend: AsyncBackend) -> None:
        """Extra: state that is not bytes-like raises TypeError and changes nothing."""
        token = await backend.acquire("w1", "h", self.NORMAL_TTL)
        await backend.checkpoint(token, b"good", self.NORMAL_TTL)
        bad: list[object] = ["text", 123, [1, 2, 3]]
        for state in bad:
            with pytest.raises(TypeError):
                await backend.checkpoint(token, state, self.NORMAL_TTL)  # type: ignore[arg-type]
        cp = await backend.read_checkpoint(token)
        assert cp.state == b"good"

    # -- Extra: release_many and survey (fair-share pools) --------------------------------------

    async def test_release_many_releases_each_token_like_release(
        self, backend: AsyncBackend
    ) -> None:
        """Extra: release_many gives, per token, what release would (None when released,
        fenced for a superseded or forged token, expired for a lapsed or released one);
        the released ones are free at once with their checkpoints and the declared exit,
        the others are left as they were."""
        release_many = self.optional(backend, "release_many")
        first = await backend.acquire("r-first", "holder-a", self.NORMAL_TTL)
        await backend.checkpoint(first, b"kept", self.NORMAL_TTL)
        second = await backend.acquire("r-second", "holder-a", self.NORMAL_TTL)
        superseded = await backend.acquire("r-superseded", "holder-a", self.EXPIRED_TTL)
        successor = await backend.acquire("r-superseded", "holder-b", self.NORMAL_TTL)
        lapsed = await backend.acquire("r-lapsed", "holder-a", self.EXPIRED_TTL)
        released = await backend.acquire("r-released", "holder-a", self.NORMAL_TTL)
        await backend.release(released, ExitMode.FINISHED)
        real = await backend.acquire("r-forged", "holder-c", self.NORMAL_TTL)
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
        outcomes = await release_many(tokens, ExitMode.ABANDONED)
        assert len(outcomes) == len(tokens)
        for token, outcome, kind in zip(tokens, outcomes, expected, strict=True):
            if kind is None:
                assert outcome is None, (token, outcome)
            else:
                assert isinstance(outcome, kind), (token, outcome)
        for token, state in ((first, b"kept"), (second, None)):
            after = await backend.acquire(token.work_id, "holder-d", self.NORMAL_TTL)
            assert await backend.read_checkpoint(after) == Checkpoint(
                state, ExitMode.ABANDONED, "holder-a"
            )
        await backend.renew(successor, self.NORMAL_TTL)  # untouched
        await backend.renew(real, self.NORMAL_TTL)
        after = await backend.acquire("r-released", "holder-d", self.NORMAL_TTL)
        assert (await backend.read_checkpoint(after)).prev_exit is ExitMode.FINISHED

    async def test_release_many_checks_mode_and_batch_first(self, backend: AsyncBackend) -> None:
        """Extra: an undeclarable mode raises InvalidExitModeError and a repeated work ID
        ValueError, before anything is released; an empty batch gives []."""
        release_many = self.optional(backend, "release_many")
        token = await backend.acquire("r1", "holder-a", self.NORMAL_TTL)
        for mode in (ExitMode.EXPIRED, ExitMode.NONE, "bogus"):
            with pytest.raises(InvalidExitModeError):
                await release_many([token], mode)
        with pytest.raises(ValueError):
            await release_many([token, token], ExitMode.FINISHED)
        assert await release_many([], ExitMode.FINISHED) == []
        with pytest.raises(LeaseHeldError):
            await backend.acquire("r1", "holder-b", self.NORMAL_TTL)

    async def test_expire_fences_the_holder_and_hands_over(self, backend: AsyncBackend) -> None:
        """Extra (an operator's action, where offered): expire ends a held lease now; the
        holder's every write is fenced (a checkpoint does not revive it); the next acquire
        gets a greater token and reads the previous exit EXPIRED by that holder, with its
        checkpoint; a work ID not held is left alone (False)."""
        expire = getattr(backend, "expire", None)
        if not callable(expire):
            pytest.skip("the backend has no expire (optional)")
        token = await backend.acquire("w1", "holder-a", self.NORMAL_TTL)
        await backend.checkpoint(token, b"progress", self.NORMAL_TTL)
        assert await expire("w1") is True
        with pytest.raises(FencedError):
            await backend.checkpoint(token, b"zombie", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.renew(token, self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await backend.release(token, ExitMode.FINISHED)
        assert await expire("w1") is False  # expired already: nothing held
        successor = await backend.acquire("w1", "holder-b", self.NORMAL_TTL)
        assert successor.fencing_token > token.fencing_token
        assert await backend.read_checkpoint(successor) == Checkpoint(
            b"progress", ExitMode.EXPIRED, "holder-a"
        )
        await backend.release(successor, ExitMode.RETIRED)
        assert await expire("w1") is False  # released: nothing held
        assert await expire("never-acquired") is False
        lapsed = await backend.acquire("w2", "holder-a", self.EXPIRED_TTL)
        assert await expire("w2") is False
        await backend.checkpoint(lapsed, b"revived", self.NORMAL_TTL)  # untouched by expire

    async def test_survey_counts_holders_and_finds_members(self, backend: AsyncBackend) -> None:
        """Extra: survey gives the free work IDs in input order (never acquired, lapsed or
        released), how many each holder holds, and the held leases under the prefix with
        their checkpoints (a lapsed one, or one under another prefix, is no member); it
        writes nothing."""
        survey = self.optional(backend, "survey")
        for work_id in ("s-a1", "s-a2"):
            await backend.acquire(work_id, "holder-a", self.NORMAL_TTL)
        await backend.acquire("s-b1", "holder-b", self.NORMAL_TTL)
        await backend.acquire("s-lapsed", "holder-b", self.EXPIRED_TTL)
        released = await backend.acquire("s-released", "holder-a", self.NORMAL_TTL)
        await backend.release(released, ExitMode.FINISHED)
        member_a = await backend.acquire("grp/a", "holder-a", self.NORMAL_TTL)
        await backend.checkpoint(member_a, b'{"cap":3}', self.NORMAL_TTL)
        await backend.acquire("grp/b", "holder-b", self.NORMAL_TTL)
        await backend.acquire("grp/gone", "holder-c", self.EXPIRED_TTL)
        await backend.acquire("grpx/d", "holder-d", self.NORMAL_TTL)
        ids = ["s-never", "s-a1", "s-lapsed", "s-b1", "s-released", "s-a2"]
        result = await survey(ids, "grp/")
        assert result.free == ("s-never", "s-lapsed", "s-released")
        assert dict(result.held) == {"holder-a": 2, "holder-b": 1}
        assert dict(result.members) == {"holder-a": b'{"cap":3}', "holder-b": None}
        again = await survey(ids, "grp/")
        assert again == result
        assert (await survey([], "nothing/")).free == ()
        fresh = await backend.acquire("s-never", "holder-e", self.NORMAL_TTL)
        assert (await backend.read_checkpoint(fresh)).prev_exit is ExitMode.NONE

    # -- Extra: the optional transactional steps -----------------------------------------------

    async def _commit_step(
        self, backend: AsyncBackend, token: Token, state: bytes | None, write: bool = True
    ) -> None:
        step = self.optional(backend, "transaction")(token)
        await step.begin(self.NORMAL_TTL)
        await step.commit(state, write, self.NORMAL_TTL)

    async def test_transaction_commits_the_staged_checkpoint_and_extends(
        self, backend: AsyncBackend
    ) -> None:
        """Extra: a step's commit writes its checkpoint and extends the lease; without a
        staged checkpoint it keeps the stored one; a lease revived by nothing stays held."""
        token = await backend.acquire("t1", "h", self.NORMAL_TTL)
        await self._commit_step(backend, token, b"step 1")
        assert (await backend.read_checkpoint(token)).state == b"step 1"
        await self._commit_step(backend, token, None, write=False)
        assert (await backend.read_checkpoint(token)).state == b"step 1"
        await self._commit_step(backend, token, None)  # staged None clears it
        assert (await backend.read_checkpoint(token)).state is None
        with pytest.raises(LeaseHeldError):
            await backend.acquire("t1", "h2", self.NORMAL_TTL)

    async def test_transaction_rollback_writes_nothing(self, backend: AsyncBackend) -> None:
        """Extra: a step rolled back leaves the checkpoint as it was."""
        token = await backend.acquire("t1", "h", self.NORMAL_TTL)
        await backend.checkpoint(token, b"before", self.NORMAL_TTL)
        step = self.optional(backend, "transaction")(token)
        await step.begin(self.NORMAL_TTL)
        await step.rollback()
        await step.rollback()  # idempotent
        assert (await backend.read_checkpoint(token)).state == b"before"

    async def test_transaction_of_a_stale_token_is_fenced(self, backend: AsyncBackend) -> None:
        """Extra: a step of a superseded token raises FencedError and writes nothing."""
        token = await backend.acquire("t1", "h", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await self._commit_step(backend, self.stale(token), b"zombie")
        with pytest.raises(FencedError):
            await self._commit_step(backend, self.NEVER, b"zombie")
        assert (await backend.read_checkpoint(token)).state is None

    async def test_transaction_of_a_lapsed_lease_fails_and_revives_nothing(
        self, backend: AsyncBackend
    ) -> None:
        """Extra: unlike ``checkpoint``, a step never revives a lapsed lease: it raises
        LeaseLapsedError (a LeaseExpiredError), writes nothing, and anybody may take over."""
        token = await backend.acquire("t1", "h", self.EXPIRED_TTL)
        with pytest.raises(LeaseLapsedError):
            await self._commit_step(backend, token, b"late")
        successor = await backend.acquire("t1", "h2", self.NORMAL_TTL)
        assert (await backend.read_checkpoint(successor)).state is None

    async def test_transaction_after_release_is_expired(self, backend: AsyncBackend) -> None:
        """Extra: a step after its holder released raises LeaseExpiredError, not a lapse."""
        token = await backend.acquire("t1", "h", self.NORMAL_TTL)
        await backend.checkpoint(token, b"final", self.NORMAL_TTL)
        await backend.release(token, ExitMode.FINISHED)
        with pytest.raises(LeaseExpiredError) as caught:
            await self._commit_step(backend, token, b"after")
        assert not isinstance(caught.value, LeaseLapsedError)
        assert (await backend.read_checkpoint(token)).state == b"final"

    async def test_transaction_superseded_while_open_does_not_commit(
        self, backend: AsyncBackend
    ) -> None:
        """Extra: a successor granted the work ID while a step of the old token is open
        keeps its own checkpoint; the old step's commit raises FencedError."""
        token = await backend.acquire("t1", "h", self.EXPIRED_TTL)
        step = self.optional(backend, "transaction")(token)
        await step.begin(self.NORMAL_TTL)
        successor = await backend.acquire("t1", "h2", self.NORMAL_TTL)
        await backend.checkpoint(successor, b"successor", self.NORMAL_TTL)
        with pytest.raises(FencedError):
            await step.commit(b"zombie", True, self.NORMAL_TTL)
        assert (await backend.read_checkpoint(successor)).state == b"successor"

    # -- Extra: durations, flags and the optional capabilities ----------------------------------

    BAD_TTLS: ClassVar[tuple[float, ...]] = (math.inf, -math.inf, math.nan, 1e12, MAX_DURATION * 2)
    """TTLs no backend may write: an expiry it could not read back (or no number at all)."""

    async def test_ttl_beyond_the_maximum_is_refused_before_any_io(
        self, backend: AsyncBackend
    ) -> None:
        """Extra: a TTL that is not finite or longer than 100 years raises ValueError before
        any I/O, for every write that takes one; nothing is stored or changed (a row expiring
        in the year 33715 could be read back by nobody)."""
        for ttl in self.BAD_TTLS:
            with pytest.raises(ValueError):
                await backend.acquire("w1", "h", ttl)
        token = await self._assert_fresh(backend, "w1", "h2")
        await backend.checkpoint(token, b"kept", self.NORMAL_TTL)
        for ttl in self.BAD_TTLS:
            with pytest.raises(ValueError):
                await backend.checkpoint(token, b"lost", ttl)
            with pytest.raises(ValueError):
                await backend.renew(token, ttl)
        assert (await backend.read_checkpoint(token)).state == b"kept"
        await backend.renew(token, MAX_DURATION)  # the maximum itself is fine
        with pytest.raises(LeaseHeldError):
            await backend.acquire("w1", "h3", self.NORMAL_TTL)

    async def test_sweep_flag_must_be_a_bool(self, backend: AsyncBackend) -> None:
        """Extra: ``include_expired`` that is not a bool raises TypeError before any I/O (a
        destructive flag is never read by truthiness); the lapsed row stays."""
        await backend.acquire("lapsed", "h", self.EXPIRED_TTL)
        await asleep(self.SWEEP_SETTLE)
        for flag in ("false", "true", 0, 1, None):
            with pytest.raises(TypeError):
                await backend.sweep(self.TINY_RETENTION, flag)  # type: ignore[arg-type]
        assert await self._sweep_old(backend, True) == 1

    CAPABILITIES: ClassVar[tuple[tuple[str, type], ...]] = (
        ("acquire_with_checkpoint", AsyncAcquireWithCheckpoint),
        ("renew_many", AsyncRenewMany),
        ("find_available", AsyncFindAvailable),
        ("acquire_many", AsyncAcquireMany),
        ("watch_releases", AsyncReleaseWatching),
        ("release_many", AsyncReleaseMany),
        ("survey", AsyncSurvey),
    )

    async def test_optional_methods_match_their_protocols(self, backend: AsyncBackend) -> None:
        """Extra: the backend has the required methods, and every optional method it has
        matches its capability protocol: found by the library (``AsyncCapabilities``),
        callable with the protocol's positional parameters, of the flavour's kind (awaitable
        with asyncio, except ``watch_releases``, which never waits)."""
        for name in ("acquire", "read_checkpoint", "checkpoint", "renew", "release", "forget"):
            assert callable(getattr(backend, name, None)), f"required method {name} missing"
        capabilities = AsyncCapabilities.of(backend)
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
