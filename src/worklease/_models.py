"""Flavour-neutral value types: ExitMode, Operation, Token, Checkpoint."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

__all__ = ["Checkpoint", "DeclaredExit", "ExitMode", "Operation", "Token"]


class ExitMode(enum.StrEnum):
    """How a holder left a lease, as its successor reads it in ``Checkpoint.prev_exit``.

    Only FINISHED, ABANDONED and RETIRED may be declared with ``release``. Treat any mode your
    code does not recognise as EXPIRED: later releases may add modes.
    """

    __module__ = "worklease"

    NONE = "none"
    """No previous holder: never acquired, or the row was removed. Start fresh."""
    EXPIRED = "expired"
    """The lease lapsed with no declared exit (crash, partition, lost renewal)."""
    FINISHED = "finished"
    """The previous run completed; the checkpoint is its final state."""
    ABANDONED = "abandoned"
    """The previous holder stopped deliberately without completing; the checkpoint is partial."""
    RETIRED = "retired"
    """The work ID is done for good."""

    @property
    def declarable(self) -> bool:
        """Whether ``release`` accepts this mode."""
        return self in _DECLARABLE

    @classmethod
    def from_stored(cls, value: object) -> ExitMode:
        """Map a stored value to a mode; anything unknown reads as EXPIRED."""
        if value is None:
            return cls.NONE
        # A dict lookup: the enum's own lookup by value costs more than the rest of a
        # checkpoint read's parsing.
        return _STORED.get(str(value), cls.EXPIRED)


DeclaredExit = Literal["finished", "abandoned", "retired"]
"""The exit modes ``release`` accepts as strings (or pass ``ExitMode.FINISHED`` and so on):
typed, so a type checker catches a misspelt mode before it runs."""

_DECLARABLE = frozenset({ExitMode.FINISHED, ExitMode.ABANDONED, ExitMode.RETIRED})
_STORED: dict[str, ExitMode] = {mode.value: mode for mode in ExitMode}


class Operation(enum.StrEnum):
    """The write operation a ``FencedEvent`` reports."""

    __module__ = "worklease"

    CHECKPOINT = "checkpoint"
    RENEW = "renew"
    RELEASE = "release"
    FORGET = "forget"


@dataclass(frozen=True, slots=True)
class Token:
    """Proof of holding a lease, produced by ``acquire``.

    ``fencing_token`` strictly increases with every grant of a work ID; pass it to downstream
    systems to fence their writes. ``expires_at`` is the expiry the backend reported at
    acquisition and never moves (renewals extend the lease, not this value).

    Backends build tokens; ``acquire`` seals each token it hands out with the backend object it
    came through. Every lease over that same backend object accepts the token (a holder
    mismatch is the backend's ``FencedError``); a token built or altered by hand, or acquired
    through another backend object, is refused with ``InvalidTokenError`` before any I/O.
    """

    __module__ = "worklease"

    work_id: str
    holder_id: str
    fencing_token: int
    expires_at: datetime
    _seal: object | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __repr__(self) -> str:
        return (
            f"Token(work_id={self.work_id!r}, holder_id={self.holder_id!r}, "
            f"fencing_token={self.fencing_token}, expires_at={_rfc3339(self.expires_at)})"
        )


def _rfc3339(value: datetime) -> str:
    text = value.isoformat(timespec="seconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a holder reads at the start of its lease.

    ``state`` is the last checkpoint written (``None`` when nothing was written, or after a
    checkpoint of ``None`` or empty bytes). ``prev_exit`` and ``prev_holder_id`` say how the
    previous holder left and who it was (``None`` when ``prev_exit`` is NONE); they are fixed
    at acquisition.
    """

    __module__ = "worklease"

    state: bytes | None = None
    prev_exit: ExitMode = ExitMode.NONE
    prev_holder_id: str | None = None
