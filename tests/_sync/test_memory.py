# Generated from tests/_async/test_memory.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Memory-backend cases M1-M21 (behaviour.md section 4.3), driven by a fake clock.

These call the backend directly: tokens are plain values here, so stale or foreign ones are
built with ``dataclasses.replace``. "1 ns" in the Go cases is 1 us (datetime precision).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from tests._compat import spawn_all
from worklease import (
    ExitMode,
    FencedError,
    InvalidExitModeError,
    LeaseExpiredError,
    LeaseHeldError,
    MemoryBackend,
    Token,
)
from worklease.testing import FakeClock

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
US = timedelta(microseconds=1)
HOUR = 3600.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def backend(clock: FakeClock) -> MemoryBackend:
    return MemoryBackend(clock=clock)


def test_m1_first_token_is_one_and_held_error_returns_nothing(
    backend: MemoryBackend,
) -> None:
    """M1: a fresh instance issues token 1; a held acquire raises and changes nothing."""
    token = backend.acquire("w1", "holder-a", 5)
    assert token == Token("w1", "holder-a", 1, T0 + timedelta(seconds=5))
    before = backend.rows()
    with pytest.raises(LeaseHeldError) as caught:
        backend.acquire("w1", "holder-b", 5)
    assert caught.value.holder_id == "holder-a"
    assert caught.value.expires_at == T0 + timedelta(seconds=5)
    assert backend.rows() == before
    # the failed attempt consumed no token: the next grant (another work ID) gets 2
    assert (backend.acquire("w2", "holder-b", 5)).fencing_token == 2


def test_m1_same_holder_is_not_reentrant(backend: MemoryBackend) -> None:
    """M1: the holder of a live lease cannot acquire it again (not re-entrant)."""
    backend.acquire("w1", "holder-a", 5)
    with pytest.raises(LeaseHeldError):
        backend.acquire("w1", "holder-a", 5)


def test_m2_negative_ttl_gives_an_expired_lease(backend: MemoryBackend) -> None:
    """M2: a -1 s TTL yields token 1 already expired; re-acquiring gives token 2."""
    first = backend.acquire("w1", "holder-a", -1)
    assert first.fencing_token == 1
    assert first.expires_at < T0
    second = backend.acquire("w1", "holder-b", 5)
    assert second.fencing_token == 2
    assert second.holder_id == "holder-b"
    prior = backend.read_checkpoint(second)
    assert prior.prev_exit is ExitMode.EXPIRED
    assert prior.prev_holder_id == "holder-a"


def test_m2_zero_ttl_gives_an_expired_lease(backend: MemoryBackend) -> None:
    """M2: a zero TTL is non-positive too: the lease is acquirable at once."""
    backend.acquire("w1", "holder-a", 0)
    assert (backend.acquire("w1", "holder-b", 5)).fencing_token == 2


def test_m3_concurrent_acquires_grant_exactly_one(backend: MemoryBackend) -> None:
    """M3: ten concurrent acquires of one work ID: one token, nine LeaseHeldError."""

    def attempt(index: int) -> Token:
        return backend.acquire("contended", "holder-" + str(index), 5)

    results = spawn_all(attempt, 10)
    tokens = [r for r in results if isinstance(r, Token)]
    held = [r for r in results if isinstance(r, LeaseHeldError)]
    assert len(tokens) == 1
    assert len(held) == 9
    assert tokens[0].fencing_token == 1
    (row,) = backend.rows()
    assert row.holder_id == tokens[0].holder_id


def test_m4_instances_have_independent_counters(clock: FakeClock) -> None:
    """M4: two instances count tokens independently."""
    one = MemoryBackend(clock=clock)
    two = MemoryBackend(clock=clock)
    assert (one.acquire("w1", "a", 5)).fencing_token == 1
    assert (one.acquire("w2", "a", 5)).fencing_token == 2
    assert (two.acquire("w1", "a", 5)).fencing_token == 1


def test_m4_counter_is_shared_by_work_ids(backend: MemoryBackend) -> None:
    """M4: one counter per instance, so one work ID's tokens skip when others are granted."""
    a = backend.acquire("a", "h", -1)
    backend.acquire("b", "h", 5)
    a2 = backend.acquire("a", "h", 5)
    assert (a.fencing_token, a2.fencing_token) == (1, 3)


def test_m5_renew_keeps_checkpoint(backend: MemoryBackend) -> None:
    """M5: renew keeps the checkpoint bytes intact."""
    token = backend.acquire("w1", "h", 5)
    backend.checkpoint(token, b"progress", 5)
    backend.renew(token, 5)
    assert (backend.read_checkpoint(token)).state == b"progress"


def test_m6_release_keeps_the_row(backend: MemoryBackend) -> None:
    """M6: release stores the mode without deleting the row; the successor sees it."""
    token = backend.acquire("w1", "holder-a", 5)
    backend.checkpoint(token, b"state", 5)
    backend.release(token, ExitMode.ABANDONED)
    (row,) = backend.rows()
    assert row.exit_mode is ExitMode.ABANDONED
    assert row.expires_at < T0
    assert (backend.read_checkpoint(token)).state == b"state"
    successor = backend.acquire("w1", "holder-b", 5)
    prior = backend.read_checkpoint(successor)
    assert prior.state == b"state"
    assert prior.prev_exit is ExitMode.ABANDONED
    assert prior.prev_holder_id == "holder-a"


def test_m7_reacquire_clears_retired_exit(backend: MemoryBackend) -> None:
    """M7: re-acquiring a RETIRED row clears the exit so the new holder can checkpoint."""
    token = backend.acquire("w1", "holder-a", 5)
    backend.release(token, ExitMode.RETIRED)
    successor = backend.acquire("w1", "holder-b", 5)
    assert backend.rows()[0].exit_mode is None
    backend.checkpoint(successor, b"new", 5)
    prior = backend.read_checkpoint(successor)
    assert prior.state == b"new"
    assert prior.prev_exit is ExitMode.RETIRED
    assert prior.prev_holder_id == "holder-a"


def test_m8_default_clock_is_real_time() -> None:
    """M8: without a clock the backend uses real time: a 10 s lease is held right after."""
    backend = MemoryBackend()
    before = datetime.now(UTC)
    token = backend.acquire("w1", "holder-a", 10)
    after = datetime.now(UTC)
    assert before + timedelta(seconds=10) <= token.expires_at <= after + timedelta(seconds=10)
    with pytest.raises(LeaseHeldError):
        backend.acquire("w1", "holder-b", 10)


def test_m9_fake_clock_expiry(backend: MemoryBackend, clock: FakeClock) -> None:
    """M9: TTL 5 s, advance 6 s: another holder acquires; tokens 1 then 2."""
    first = backend.acquire("w1", "h1", 5)
    clock.advance(6)
    second = backend.acquire("w1", "h2", 5)
    assert (first.fencing_token, second.fencing_token) == (1, 2)
    assert second.expires_at == T0 + timedelta(seconds=11)


def test_m10_crash_keeps_state(backend: MemoryBackend, clock: FakeClock) -> None:
    """M10: a crashed holder's checkpoint survives; the successor sees EXPIRED and h1."""
    token = backend.acquire("w1", "h1", 5)
    backend.checkpoint(token, b"crash-state", 5)
    clock.advance(6)
    successor = backend.acquire("w1", "h2", 5)
    assert successor.fencing_token == 2
    prior = backend.read_checkpoint(successor)
    assert prior.state == b"crash-state"
    assert prior.prev_exit is ExitMode.EXPIRED
    assert prior.prev_holder_id == "h1"


def test_m11_release_then_immediate_reacquire(backend: MemoryBackend) -> None:
    """M11: after a release the work ID is acquirable at once (no clock advance)."""
    token = backend.acquire("w1", "h1", 5)
    backend.checkpoint(token, b"done", 5)
    backend.release(token, ExitMode.FINISHED)
    successor = backend.acquire("w1", "h2", 5)
    prior = backend.read_checkpoint(successor)
    assert prior.prev_exit is ExitMode.FINISHED
    assert prior.prev_holder_id == "h1"
    assert prior.state == b"done"


def test_m12_renew_extends_from_now(backend: MemoryBackend, clock: FakeClock) -> None:
    """M12: renew at T+2 with TTL 5 moves expiry to T+7; another holder gets it at T+8."""
    first = backend.acquire("w1", "h1", 5)
    clock.advance(2)
    backend.renew(first, 5)
    assert backend.rows()[0].expires_at == T0 + timedelta(seconds=7)
    clock.advance(4.5)  # T+6.5: past the original expiry, inside the renewed one
    with pytest.raises(LeaseHeldError):
        backend.acquire("w1", "h2", 5)
    clock.advance(1.5)  # T+8
    assert (backend.acquire("w1", "h2", 5)).holder_id == "h2"


def test_m13_renew_with_unknown_token_is_fenced(backend: MemoryBackend) -> None:
    """M13: renew with token 999 raises FencedError."""
    token = backend.acquire("w1", "h1", 5)
    with pytest.raises(FencedError):
        backend.renew(dataclasses.replace(token, fencing_token=999), 5)


def test_m14_renew_exactly_at_expiry(backend: MemoryBackend, clock: FakeClock) -> None:
    """M14: renew exactly at the expiry instant raises LeaseExpiredError."""
    token = backend.acquire("w1", "h1", 5)
    clock.advance(5)
    with pytest.raises(LeaseExpiredError):
        backend.renew(token, 5)
    # the boundary is still held for acquire, and checkpoint (no expiry check) still works
    with pytest.raises(LeaseHeldError):
        backend.acquire("w1", "h2", 5)
    backend.checkpoint(token, b"x", 5)


def test_m15_sweep_retention_is_strict(backend: MemoryBackend, clock: FakeClock) -> None:
    """M15: a RETIRED row is swept only once strictly older than the retention."""
    token = backend.acquire("w1", "h1", 5)
    backend.release(token, ExitMode.RETIRED)
    clock.advance(HOUR)
    assert backend.sweep(HOUR, False) == 0
    clock.advance(US)
    assert backend.sweep(HOUR, False) == 1
    assert backend.rows() == []


def test_m16_sweep_keeps_finished_and_abandoned(backend: MemoryBackend, clock: FakeClock) -> None:
    """M16: sweep deletes only the RETIRED row; FINISHED and ABANDONED rows stay."""
    for work_id, mode in (
        ("retired", ExitMode.RETIRED),
        ("finished", ExitMode.FINISHED),
        ("abandoned", ExitMode.ABANDONED),
    ):
        token = backend.acquire(work_id, "holder-a", 5)
        backend.release(token, mode)
    clock.advance(2 * HOUR)
    assert backend.sweep(HOUR, True) == 1
    expected = {
        "retired": ExitMode.NONE,
        "finished": ExitMode.FINISHED,
        "abandoned": ExitMode.ABANDONED,
    }
    for work_id, prev in expected.items():
        successor = backend.acquire(work_id, "holder-b", 5)
        assert (backend.read_checkpoint(successor)).prev_exit is prev, work_id


def test_m16_include_expired_sweeps_lapsed_rows(backend: MemoryBackend, clock: FakeClock) -> None:
    """M16: a lapsed undeclared row goes only with include_expired; a held row never."""
    backend.acquire("lapsed", "h1", 5)
    clock.advance(2 * HOUR)
    backend.acquire("held", "h1", 10 * HOUR)
    assert backend.sweep(HOUR, False) == 0
    assert backend.sweep(HOUR, True) == 1
    assert [row.work_id for row in backend.rows()] == ["held"]


def test_m17_release_boundary(clock: FakeClock) -> None:
    """M17: release at expiry fails; 1 us before succeeds; 1 us after fails."""
    for offset, ok in ((-US, True), (timedelta(0), False), (US, False)):
        clock.set(T0)
        backend = MemoryBackend(clock=clock)
        token = backend.acquire("w1", "h1", 5)
        clock.set(T0 + timedelta(seconds=5) + offset)
        if ok:
            backend.release(token, ExitMode.FINISHED)
            assert backend.rows()[0].exit_mode is ExitMode.FINISHED
        else:
            with pytest.raises(LeaseExpiredError):
                backend.release(token, ExitMode.FINISHED)
            assert backend.rows()[0].exit_mode is None


@pytest.mark.parametrize("mode", [ExitMode.NONE, ExitMode.EXPIRED, "bogus", 99, None])
def test_m18_release_checks_mode_first(backend: MemoryBackend, mode: object) -> None:
    """M18: an undeclarable mode is refused before any other check (even a missing row)."""
    ghost = Token("never-acquired", "h1", 7, T0)
    with pytest.raises(InvalidExitModeError):
        backend.release(ghost, mode)  # type: ignore[arg-type]
    token = backend.acquire("w1", "h1", 5)
    with pytest.raises(InvalidExitModeError):
        backend.release(token, mode)  # type: ignore[arg-type]
    assert backend.rows()[0].exit_mode is None
    with pytest.raises(LeaseHeldError):
        backend.acquire("w1", "h2", 5)


def test_m19_checkpoint_after_retire(backend: MemoryBackend) -> None:
    """M19: a late checkpoint after RETIRED raises LeaseExpiredError and writes nothing."""
    token = backend.acquire("w1", "holder-a", 5)
    backend.release(token, ExitMode.RETIRED)
    with pytest.raises(LeaseExpiredError):
        backend.checkpoint(token, b"late", 5)
    (row,) = backend.rows()
    assert row.exit_mode is ExitMode.RETIRED
    assert row.expires_at < T0
    successor = backend.acquire("w1", "holder-b", 5)
    prior = backend.read_checkpoint(successor)
    assert prior.prev_exit is ExitMode.RETIRED
    assert prior.prev_holder_id == "holder-a"
    assert prior.state is None


def test_m19_renew_and_release_after_release(backend: MemoryBackend) -> None:
    """M19: renew or a second release after release raise LeaseExpiredError; mode stands."""
    token = backend.acquire("w1", "h1", 5)
    backend.release(token, ExitMode.FINISHED)
    with pytest.raises(LeaseExpiredError):
        backend.renew(token, 5)
    with pytest.raises(LeaseExpiredError):
        backend.release(token, ExitMode.ABANDONED)
    assert backend.rows()[0].exit_mode is ExitMode.FINISHED
    backend.forget(token)  # forget still works after the holder's own release
    assert backend.rows() == []


def test_m20_checkpoint_revives_lapsed_lease(backend: MemoryBackend, clock: FakeClock) -> None:
    """M20: a lapsed undeclared lease is revived by checkpoint; then it is held again."""
    token = backend.acquire("w1", "h1", 5)
    clock.advance(6)
    with pytest.raises(LeaseExpiredError):
        backend.renew(token, 5)  # renew cannot revive
    backend.checkpoint(token, b"revived", 5)
    assert backend.rows()[0].expires_at == T0 + timedelta(seconds=11)
    with pytest.raises(LeaseHeldError):
        backend.acquire("w1", "h2", 5)
    assert (backend.read_checkpoint(token)).state == b"revived"


def test_m21_state_is_copied_in_and_out(backend: MemoryBackend) -> None:
    """M21: the backend never aliases caller buffers; reads return immutable copies."""
    token = backend.acquire("w1", "h1", 5)
    buffer = bytearray(b"original")
    backend.checkpoint(token, buffer, 5)
    buffer[:] = b"mutated!"
    first = (backend.read_checkpoint(token)).state
    assert first == b"original"
    assert type(first) is bytes
    view_source = bytearray(b"view-data")
    backend.checkpoint(token, memoryview(view_source), 5)
    view_source[0:4] = b"XXXX"
    assert (backend.read_checkpoint(token)).state == b"view-data"


@pytest.mark.parametrize("empty", [None, b"", bytearray(), memoryview(b"")])
def test_m21_empty_state_reads_as_none(
    backend: MemoryBackend, empty: bytes | bytearray | memoryview | None
) -> None:
    """M21: a checkpoint of None or empty bytes clears the state (reads back as None)."""
    token = backend.acquire("w1", "h1", 5)
    backend.checkpoint(token, b"something", 5)
    backend.checkpoint(token, empty, 5)
    assert (backend.read_checkpoint(token)).state is None


def test_m21_state_type_checked(backend: MemoryBackend) -> None:
    """M21: state that is not bytes-like raises TypeError and writes nothing."""
    token = backend.acquire("w1", "h1", 5)
    backend.checkpoint(token, b"kept", 5)
    for bad in ("text", 42):
        with pytest.raises(TypeError):
            backend.checkpoint(token, bad, 5)  # type: ignore[arg-type]
    assert (backend.read_checkpoint(token)).state == b"kept"


def test_read_checkpoint_checks_token_not_holder(backend: MemoryBackend) -> None:
    """Backend: read is token-only (holder unchecked); writes check holder and token."""
    token = backend.acquire("w1", "h1", 5)
    forged = dataclasses.replace(token, holder_id="impostor")
    assert (backend.read_checkpoint(forged)).prev_exit is ExitMode.NONE
    with pytest.raises(FencedError):
        backend.checkpoint(forged, b"x", 5)
    with pytest.raises(FencedError):
        backend.renew(forged, 5)
    with pytest.raises(FencedError):
        backend.release(forged, ExitMode.FINISHED)
    with pytest.raises(FencedError):
        backend.forget(forged)
    with pytest.raises(FencedError):
        backend.read_checkpoint(dataclasses.replace(token, fencing_token=2))


def test_forget_then_reacquire_starts_fresh(backend: MemoryBackend) -> None:
    """Backend: forget deletes the row; the next holder sees NONE and a greater token."""
    token = backend.acquire("w1", "h1", 5)
    backend.checkpoint(token, b"x", 5)
    backend.forget(token)
    with pytest.raises(FencedError):
        backend.read_checkpoint(token)
    with pytest.raises(FencedError):
        backend.renew(token, 5)
    with pytest.raises(FencedError):
        backend.checkpoint(token, b"y", 5)
    with pytest.raises(FencedError):
        backend.release(token, ExitMode.FINISHED)
    with pytest.raises(FencedError):
        backend.forget(token)
    successor = backend.acquire("w1", "h2", 5)
    assert successor.fencing_token > token.fencing_token
    prior = backend.read_checkpoint(successor)
    assert (prior.state, prior.prev_exit, prior.prev_holder_id) == (None, ExitMode.NONE, None)


@pytest.mark.parametrize(
    ("work_id", "error"),
    [
        ("", ValueError),
        ("a\x00b", ValueError),
        ("x" * 1025, ValueError),
        ("\u00e9" * 513, ValueError),  # 1026 bytes in UTF-8
        (42, TypeError),
        (None, TypeError),
    ],
)
def test_backend_validates_work_id(
    backend: MemoryBackend, work_id: object, error: type[Exception]
) -> None:
    """Backend: the backend validates work IDs like the PostgreSQL backend does."""
    with pytest.raises(error):
        backend.acquire(work_id, "h1", 5)  # type: ignore[arg-type]
    assert backend.rows() == []


def test_backend_accepts_work_id_of_1024_bytes(backend: MemoryBackend) -> None:
    """Backend: exactly 1024 UTF-8 bytes is accepted."""
    token = backend.acquire("\u00e9" * 512, "h1", 5)
    assert token.fencing_token == 1
