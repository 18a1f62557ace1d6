"""Test helpers, the thread half of the pairs (the asyncio half is ``tests._acompat``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from worklease._compat import sleep

__all__ = ["sleep", "spawn_all"]

T = TypeVar("T")


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
