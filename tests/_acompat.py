"""Test helpers in async/sync pairs; the generator renames the async names to the sync ones."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from worklease._acompat import asleep, sleep

__all__ = ["asleep", "aspawn_all", "sleep", "spawn_all"]

T = TypeVar("T")


async def aspawn_all(fn: Callable[[int], Awaitable[T]], count: int) -> list[T | BaseException]:
    """Run ``fn(0) … fn(count - 1)`` concurrently as tasks; results or exceptions, in order."""
    results = await asyncio.gather(*(fn(i) for i in range(count)), return_exceptions=True)
    return list(results)


def spawn_all(fn: Callable[[int], T], count: int) -> list[T | BaseException]:
    """Run ``fn(0) … fn(count - 1)`` concurrently in threads released together by a barrier."""
    results: list[Any] = [None] * count
    barrier = threading.Barrier(count)

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = fn(index)
        except BaseException as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0))
        if thread.is_alive():
            raise TimeoutError("a spawned test thread did not finish within 60 s")
    return results
