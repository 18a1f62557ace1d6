"""``current_renewal()``: the innermost active renewal of the current task or thread."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ._models import Token
    from .errors import LeaseLostError

__all__ = ["ActiveRenewal", "current_renewal"]


class ActiveRenewal(Protocol):
    """What code deep in a call stack can ask the renewal that guards it."""

    @property
    def token(self) -> Token: ...

    @property
    def cause(self) -> LeaseLostError | None: ...

    @property
    def lost(self) -> bool: ...

    @property
    def shed(self) -> bool: ...

    def remaining(self) -> float | None: ...

    def raise_if_lost(self) -> None: ...


_current: ContextVar[ActiveRenewal | None] = ContextVar("worklease_current_renewal", default=None)


def current_renewal() -> ActiveRenewal | None:
    """The innermost renewal block the current task or thread is running inside, or ``None``.

    Use it to ask ``remaining()`` (seconds of guaranteed lease left) before a long step, or to
    call ``raise_if_lost()`` between steps, without passing the renewal around.
    """
    return _current.get()
