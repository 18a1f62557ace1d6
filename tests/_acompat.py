"""Test helpers, the asyncio half of the pairs (the thread half is ``tests._compat``); the
generator renames these names, and this module's, to the sync ones."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from worklease._acompat import asleep

__all__ = ["asleep", "aspawn_all"]

T = TypeVar("T")


async def aspawn_all(fn: Callable[[int], Awaitable[T]], count: int) -> list[T | BaseException]:
    """Run ``fn(0) … fn(count - 1)`` concurrently as tasks; results or exceptions, in order."""
    results = await asyncio.gather(*(fn(i) for i in range(count)), return_exceptions=True)
    return list(results)
