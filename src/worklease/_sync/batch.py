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

from .._acompat import BATCH_LINGER, Event, ThreadLock, sleep, spawn
from .._models import ExitMode, Token
from .._types import Releaser
from .lease import Lease

__all__ = ["ReleaseBatch"]


class _Pending:
    __slots__ = ("done", "error", "mode", "token")

    def __init__(self, token: Token, mode: ExitMode) -> None:
        self.token = token
        self.mode = mode
        self.done = Event()
        self.error: Exception | None = None


class ReleaseBatch:
    """Coalesces the releases of one lease object into ``release_many`` calls."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._lock = ThreadLock()
        self._queue: list[_Pending] = []
        self._draining = False

    @property
    def release(self) -> Releaser:
        """``release(token, mode)``: like ``lease.release``, sent with whatever else is
        released meanwhile."""
        return self._release

    def _release(self, token: Token, mode: ExitMode) -> None:
        pending = _Pending(token, mode)
        with self._lock:
            self._queue.append(pending)
            start = not self._draining
            self._draining = True
        if start:
            # Its own worker: a caller given up on (a cleanup timeout) never strands the
            # releases queued behind it.
            spawn(self._drain, name="worklease-releases")
        pending.done.wait()
        if pending.error is not None:
            raise pending.error

    def _drain(self) -> None:
        sleep(BATCH_LINGER)  # let the releases arriving together join
        while True:
            with self._lock:
                burst, self._queue = self._queue, []
                if not burst:
                    self._draining = False
                    return
            for mode in dict.fromkeys(pending.mode for pending in burst):
                group = [pending for pending in burst if pending.mode is mode]
                try:
                    outcomes = self._lease._release_together(
                        [pending.token for pending in group], mode
                    )
                except Exception as exc:  # a bug: every caller hears of it
                    outcomes = [exc] * len(group)
                except BaseException as exc:  # cancelled (the loop shuts down)
                    for pending in burst:
                        pending.error = RuntimeError(f"release batch ended: {exc!r}")
                        pending.done.set()
                    with self._lock:
                        self._draining = False
                    raise
                for pending, outcome in zip(group, outcomes, strict=True):
                    pending.error = outcome
                    pending.done.set()
