# Generated from src/worklease/_async/batch.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Releases that arrive together go out together: one ``release_many`` per burst.

A pool that stops (or hands many work IDs over) ends many holds at once, and each hold ends
with a release. Sent one by one that is one statement per work ID; through a batch, every
release that arrives while another burst is being sent waits for the next call, so a pool
holding 10,000 work IDs stops in a couple of statements. Each caller still gets its own
outcome (and its own observer event).
"""

from __future__ import annotations

from .._compat import BATCH_LINGER, Event, ThreadLock, Worker, sleep, spawn
from .._models import ExitMode, Token
from .._types import Releaser
from .lease import Lease

__all__ = ["ReleaseBatch"]


class _Burst:
    """The releases sent in one call; every caller waits on the same event."""

    __slots__ = ("done", "items", "outcomes")

    def __init__(self) -> None:
        self.items: list[tuple[Token, ExitMode]] = []
        self.outcomes: list[Exception | None] = []
        self.done = Event()


class ReleaseBatch:
    """Coalesces the releases of one lease object into ``release_many`` calls."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._lock = ThreadLock()
        self._burst: _Burst | None = None
        self._draining = False
        self._worker: Worker | None = None

    @property
    def release(self) -> Releaser:
        """``release(token, mode)``: like ``lease.release``, sent with whatever else is
        released meanwhile."""
        return self._release

    def _release(self, token: Token, mode: ExitMode) -> None:
        with self._lock:
            burst = self._burst
            if burst is None:
                burst = self._burst = _Burst()
            index = len(burst.items)
            burst.items.append((token, mode))
            start = not self._draining
            self._draining = True
        if start:
            # Its own worker: a caller given up on (a cleanup timeout) never strands the
            # releases queued behind it.
            try:
                self._worker = spawn(self._drain, name="worklease-releases")
            except BaseException:
                with self._lock:
                    self._draining = False
                    if self._burst is burst:
                        self._burst = None
                raise
        burst.done.wait()
        error = burst.outcomes[index]
        if error is not None:
            raise error

    def _drain(self) -> None:
        sleep(BATCH_LINGER)  # let the releases arriving together join
        while True:
            with self._lock:
                burst, self._burst = self._burst, None
                if burst is None:
                    self._draining = False
                    return
            try:
                burst.outcomes = self._send(burst.items)
            except BaseException as exc:  # cancelled (the loop shuts down)
                burst.outcomes = [RuntimeError(f"release batch ended: {exc!r}")] * len(burst.items)
                burst.done.set()
                with self._lock:
                    self._draining = False
                raise
            burst.done.set()

    def _send(self, items: list[tuple[Token, ExitMode]]) -> list[Exception | None]:
        """Release ``items``, one call per exit mode; each item's outcome, in order."""
        outcomes: list[Exception | None] = [None] * len(items)
        for mode in dict.fromkeys(mode for _, mode in items):
            indexes = [i for i, (_, item_mode) in enumerate(items) if item_mode is mode]
            try:
                results = self._lease._release_together([items[i][0] for i in indexes], mode)
            except Exception as exc:  # a bug: every caller hears of it
                results = [exc] * len(indexes)
            for i, result in zip(indexes, results, strict=True):
                outcomes[i] = result
        return outcomes
