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
from time import monotonic  # the clock of _window.monotonic (this module comes before it)

__all__ = [
    "SELF_BOUNDED",
    "bounded_by",
    "current_deadline",
    "cut_off",
    "cutting_off_at",
    "earliest",
    "seconds_left",
    "self_bounded",
]

_deadline: ContextVar[float | None] = ContextVar("worklease_call_deadline", default=None)
_cut_off: ContextVar[float | None] = ContextVar("worklease_call_cut_off", default=None)

SELF_BOUNDED = "_worklease_self_bounded"
"""A backend class that sets this attribute (or a property) to true in its own body promises:
a call made within ``cutting_off_at(moment)`` returns (or raises) by ``moment`` (give or take
the cancel watch's tick), whatever the network does, so a thread may make its final writes
itself instead of in a helper thread it can leave behind. Not inherited: a subclass that
overrides a call (with a wait of its own, say) makes no such promise unless it declares it
again."""


class Bounding:
    """Sets the call deadline for one ``with`` block (see :func:`bounded_by`)."""

    __slots__ = ("_deadline", "_entered", "_reset")

    def __init__(self, deadline: float | None) -> None:
        self._deadline = deadline
        self._reset: Token[float | None] | None = None
        self._entered = False

    def __enter__(self) -> None:
        if self._entered:  # its one reset slot would be overwritten
            raise RuntimeError("bounded_by() guards one block: make a new one for another")
        self._entered = True
        self._reset = _deadline.set(self._deadline)

    def __exit__(self, *_: object) -> None:
        if self._reset is not None:
            _deadline.reset(self._reset)
            self._reset = None


class _Unchanged:
    """A block whose deadline is the one already in force: nothing to set or restore."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


_UNCHANGED = _Unchanged()


def bounded_by(deadline: float | None) -> Bounding | _Unchanged:
    """Run the block's backend calls with ``deadline`` (monotonic; ``None``: none), as in
    ``with bounded_by(deadline):``.

    Not a generator context manager: it guards every checkpoint and release, and a block
    whose deadline is the one already in force (none inside none, the same one again) gets a
    shared object that sets nothing. That is decided when it is called: call it in the
    ``with`` statement that uses it, in the same thread or task."""
    if deadline == _deadline.get():
        return _UNCHANGED
    return Bounding(deadline)


def seconds_left() -> float | None:
    """Seconds until the deadline of the current call (``None``: unbounded; may be <= 0)."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - monotonic()


def current_deadline() -> float | None:
    """The deadline of the current call (monotonic; ``None``: unbounded)."""
    return _deadline.get()


def earliest(first: float | None, second: float | None) -> float | None:
    """The sooner of two deadlines (``None`` is no deadline)."""
    if first is None:
        return second
    if second is None:
        return first
    return min(first, second)


def self_bounded(backend: object) -> bool:
    """Whether ``backend``'s class declares ``SELF_BOUNDED`` in its own body (an attribute,
    or a property that decides per instance) and it is true for ``backend``."""
    return SELF_BOUNDED in type(backend).__dict__ and getattr(backend, SELF_BOUNDED) is True


class cutting_off_at:  # a function's name: used as ``with cutting_off_at(moment):``
    """Inside the block, a self-bounded backend hands control back by ``moment``
    (monotonic), cutting a connection that has not answered by then."""

    __slots__ = ("_moment", "_reset")

    def __init__(self, moment: float) -> None:
        self._moment = moment
        self._reset: Token[float | None] | None = None

    def __enter__(self) -> None:
        self._reset = _cut_off.set(self._moment)

    def __exit__(self, *_: object) -> None:
        if self._reset is not None:
            _cut_off.reset(self._reset)
            self._reset = None


def cut_off() -> float | None:
    """When the current call must have handed control back (monotonic; ``None``: no
    promise asked)."""
    return _cut_off.get()
