"""The deadline of the backend call in progress, for backends that bound their own calls.

A waiting acquire with a ``timeout`` bounds each attempt by what is left of it. The lease
abandons an attempt that overruns (cancelling it with asyncio, leaving it in a helper thread
otherwise); a backend that can do better reads :func:`seconds_left` and bounds its own work
itself (the PostgreSQL backend cancels a statement still running at the deadline, or sets its
``statement_timeout`` when it sends a simple query, and bounds the pool checkout by it), so
a statement waiting on a locked row ends on time and rolls back instead of committing after
its caller gave up.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ._window import monotonic

__all__ = ["bounded_by", "seconds_left"]

_deadline: ContextVar[float | None] = ContextVar("worklease_call_deadline", default=None)


@contextmanager
def bounded_by(deadline: float | None) -> Iterator[None]:
    """Run the block's backend calls with ``deadline`` (monotonic; ``None``: none)."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


def seconds_left() -> float | None:
    """Seconds until the deadline of the current call (``None``: unbounded; may be <= 0)."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - monotonic()
