"""Type aliases that differ between the flavours, written as hand-made pairs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from ._models import Checkpoint, ExitMode, Token

__all__ = [
    "AsyncReleaser",
    "AsyncRenewTogether",
    "AsyncTokenCallback",
    "AsyncWorkFn",
    "AsyncWriteMany",
    "AsyncWriteOne",
    "Releaser",
    "RenewTogether",
    "TokenCallback",
    "WorkFn",
    "WriteMany",
    "WriteOne",
]

AsyncWorkFn = Callable[[Token, Checkpoint], Awaitable[bytes | None] | bytes | None]
"""An asyncio work function ``work(token, prior)`` (a plain function works too)."""

WorkFn = Callable[[Token, Checkpoint], bytes | None]
"""A work function ``work(token, prior)`` returning the final state or ``None``."""

AsyncTokenCallback = Callable[[Token], Awaitable[object] | object]
"""An asyncio callable taking a token (leader functions and callbacks; plain ones work too)."""

TokenCallback = Callable[[Token], object]
"""A callable taking a token (leader functions and callbacks)."""

AsyncRenewTogether = Callable[[list[Token], list[int], float], Awaitable[list[Exception | None]]]
"""Renews tokens in one backend call: ``renew(tokens, attempts, timeout)`` returns each
token's outcome (``None``: renewed), each already reported to the observer."""

RenewTogether = Callable[[list[Token], list[int], float], list[Exception | None]]
"""The same for threads."""

AsyncReleaser = Callable[[Token, ExitMode], Coroutine[Any, Any, None]]
"""Releases one lease (``lease.release``, or a pool's batched release)."""

Releaser = Callable[[Token, ExitMode], None]
"""The same for threads."""

_Item = TypeVar("_Item")

AsyncWriteOne = Callable[[_Item], Awaitable[None]]
"""Group commit: write one item alone."""

WriteOne = Callable[[_Item], None]
"""Group commit: write one item alone."""

AsyncWriteMany = Callable[[list[_Item]], Awaitable[Sequence[BaseException | None]]]
"""Group commit: write a round of items; each one's error or ``None``."""

WriteMany = Callable[[list[_Item]], Sequence[BaseException | None]]
"""Group commit: write a round of items; each one's error or ``None``."""
