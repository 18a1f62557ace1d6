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

from contextvars import ContextVar, Token

from ._window import monotonic

__all__ = ["bounded_by", "seconds_left"]

_deadline: ContextVar[float | None] = ContextVar("worklease_call_deadline", default=None)


class bounded_by:  # a function's name: used as ``with bounded_by(deadline):``
    """Run the block's backend calls with ``deadline`` (monotonic; ``None``: none).

    A class rather than a generator context manager: it guards every checkpoint and
    release, and a block that changes nothing (no deadline inside none) sets nothing."""

    __slots__ = ("_deadline", "_entered", "_reset")

    def __init__(self, deadline: float | None) -> None:
        self._deadline = deadline
        self._reset: Token[float | None] | None = None
        self._entered = False

    def __enter__(self) -> None:
        if self._entered:  # its one reset slot would be overwritten
            raise RuntimeError("bounded_by() guards one block: make a new one for another")
        self._entered = True
        if self._deadline is not None or _deadline.get() is not None:
            self._reset = _deadline.set(self._deadline)

    def __exit__(self, *_: object) -> None:
        if self._reset is not None:
            _deadline.reset(self._reset)
            self._reset = None


def seconds_left() -> float | None:
    """Seconds until the deadline of the current call (``None``: unbounded; may be <= 0)."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - monotonic()
