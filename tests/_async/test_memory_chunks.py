"""The memory backend's batches, run in chunks of the store's lock (``CHUNK_SIZE`` items per
hold), through this flavour's methods: split into chunks of 1 or 3 they answer exactly as in
one chunk, and a release in a later chunk still wakes its watch. (The bound per hold at
100,000 leases and the comparison with single operations: ``tests/unit/test_memory_chunks.py``.)
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from worklease import AsyncMemoryBackend, ExitMode, _memory
from worklease._fairshare import member_prefix, member_work_id
from worklease.testing import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HUGE = 10**9


def plain(value: object) -> object:
    """Exceptions as (type, message): they have no equality of their own."""
    if isinstance(value, BaseException):
        return (type(value), str(value))
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


async def every_batch(backend: AsyncMemoryBackend, clock: FakeClock) -> list[object]:
    """One scenario over every batch method; what each answered, and the rows after."""
    ids = [f"w{index}" for index in range(10)]
    tokens = [await backend.acquire(work_id, "A", 30) for work_id in ids[:8]]
    for holder in ("A", "B"):
        await backend.acquire(member_work_id("g", holder), holder, 30)
    await backend.release(tokens[2], ExitMode.FINISHED)
    await backend.acquire(ids[2], "B", 30)
    short = await backend.acquire(ids[8], "C", 1)
    clock.advance(2)
    answers: list[object] = [
        await backend.survey(ids, member_prefix("g")),
        await backend.survey(ids, "w"),
        await backend.find_available(ids),
        await backend.renew_many([*tokens, short], 30),
        await backend.checkpoint_many(
            [(token, bytearray(f"s{token.fencing_token}".encode())) for token in tokens], 30
        ),
        await backend.acquire_many(ids, "D", 30),
        await backend.release_many(tokens[::-1], ExitMode.RETIRED),
        backend.rows(),
    ]
    clock.advance(60)
    answers.append(await backend.sweep(1, True))
    answers.append(backend.rows())
    return [plain(answer) for answer in answers]


@pytest.mark.parametrize("size", [1, 3])
async def test_batches_in_small_chunks_answer_as_in_one(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_memory, "CHUNK_SIZE", HUGE)
    clock = FakeClock(T0)
    expected = await every_batch(AsyncMemoryBackend(clock=clock), clock)

    monkeypatch.setattr(_memory, "CHUNK_SIZE", size)
    clock = FakeClock(T0)
    assert await every_batch(AsyncMemoryBackend(clock=clock), clock) == expected


async def test_a_release_in_a_later_chunk_wakes_its_watch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_memory, "CHUNK_SIZE", 3)
    async with AsyncMemoryBackend() as backend:
        tokens = [await backend.acquire(f"w{index}", "A", 30) for index in range(8)]
        watch = backend.watch_releases(["w7"])
        assert watch is not None
        with watch:
            assert await backend.release_many(tokens, ExitMode.FINISHED) == [None] * 8
            assert await watch.wait(0) is True  # published already: no waiting
