"""How many work IDs one batch statement carries. Shared by both flavours; no I/O.

A pool at 100,000 work IDs renews, checkpoints, acquires and releases tens of thousands of
leases at once. One statement for all of them runs for seconds (renewing 25,000 rows on
PostgreSQL: about 0.6 s; checkpointing 50,000: about 3 s), holds its row locks that long,
and a timeout loses the whole batch. The lease object therefore splits every batch into
chunks of at most ``BATCH_CHUNK`` work IDs, sent one after another: each chunk is a short
statement (tens of milliseconds) that commits on its own, so a slow machine slows a batch
down but never turns it into "nothing done".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

__all__ = ["BATCH_CHUNK", "chunks", "write_lanes"]

BATCH_CHUNK = 1_000
"""Work IDs per batch statement: about 25 ms of server time per chunk on PostgreSQL for a
renewal, and a request well inside etcd's transaction limits."""

_T = TypeVar("_T")


def chunks(items: Sequence[_T], size: int | None = None) -> Iterator[Sequence[_T]]:
    """``items`` in consecutive slices of at most ``size`` (default ``BATCH_CHUNK``; one
    slice when it fits)."""
    if size is None:
        size = BATCH_CHUNK
    if size < 1:
        raise ValueError("size must be at least 1")
    if len(items) <= size:
        if items:
            yield items
        return
    for start in range(0, len(items), size):
        yield items[start : start + size]


def write_lanes(backend: object) -> int | None:
    """How many writes ``backend`` runs at once, when it says (its ``write_lanes``: the
    PostgreSQL backend's application pool size); ``None`` otherwise."""
    lanes = getattr(backend, "write_lanes", None)
    if isinstance(lanes, int) and not isinstance(lanes, bool) and lanes >= 1:
        return lanes
    return None
