"""Builders for the errors backends raise, with messages naming work ID, holder and token."""

from __future__ import annotations

from datetime import datetime

from ._models import Token
from .errors import (
    BackendError,
    FencedError,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLapsedError,
)

__all__ = [
    "closed",
    "commit_unknown",
    "fenced",
    "first_line",
    "held",
    "lease_expired",
    "lease_lapsed",
]


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none (for
    one-line reports: CLI errors, log lines, check findings)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def fenced(token: Token, operation: str) -> FencedError:
    return FencedError(
        f"{operation}: work ID {token.work_id!r}, holder {token.holder_id!r}, token "
        f"{token.fencing_token}: fenced (a newer token exists or the lease row is gone)",
        token=token,
    )


def lease_expired(token: Token, operation: str, why: str) -> LeaseExpiredError:
    return LeaseExpiredError(
        f"{operation}: work ID {token.work_id!r}, holder {token.holder_id!r}, token "
        f"{token.fencing_token}: {why}",
        token=token,
    )


def lease_lapsed(token: Token, operation: str) -> LeaseLapsedError:
    return LeaseLapsedError(
        f"{operation}: work ID {token.work_id!r}, holder {token.holder_id!r}, token "
        f"{token.fencing_token}: the lease lapsed before the commit",
        token=token,
    )


def commit_unknown(token: Token, cause: BaseException) -> BackendError:
    """A COMMIT whose outcome nobody knows (the connection went away during it): never
    transient, so nothing retries it blindly."""
    return BackendError(
        f"transaction: work ID {token.work_id!r}, token {token.fencing_token}: the connection "
        f"was lost during COMMIT, so whether the step committed is unknown ({cause}); read the "
        "checkpoint (or your rows) to find out before doing it again",
        transient=False,
    )


def held(work_id: str, holder_id: str | None, expires_at: datetime | None) -> LeaseHeldError:
    by = f" by {holder_id!r}" if holder_id is not None else ""
    until = f" until {expires_at.isoformat()}" if expires_at is not None else ""
    return LeaseHeldError(
        f"work ID {work_id!r} is held{by}{until}",
        work_id=work_id,
        holder_id=holder_id,
        expires_at=expires_at,
    )


def closed(operation: str) -> BackendError:
    """What every operation of a closed backend raises (no I/O happens: not transient)."""
    return BackendError(f"{operation}: the backend is closed")
