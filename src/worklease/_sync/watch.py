# Generated from src/worklease/_async/watch.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""Release watches: wake a waiter the moment a work ID it waits for is released.

A backend that can tell when leases are released (the memory backend directly, PostgreSQL
through LISTEN/NOTIFY) publishes each released work ID to its hub; the hub wakes every watch
on that ID. Watches only shorten waits: a waiter still re-checks by acquiring, and a watch
that is never woken simply times out, so a lost or late notification costs a poll interval,
never correctness.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from types import TracebackType
from typing import Protocol, runtime_checkable

from .._compat import Event, ThreadLock
from .._window import monotonic

__all__ = ["ReleaseHub", "ReleaseWatch", "ReleaseWatching", "open_release_watch"]

logger = logging.getLogger("worklease")


def open_release_watch(
    watching: ReleaseWatching | None, work_ids: Iterable[str]
) -> ReleaseWatch | None:
    """A watch on ``work_ids`` from a backend that can watch releases (see
    ``AsyncReleaseWatching``), or ``None`` when it cannot (then, and if opening one fails, waits
    simply run their full length: notifications only shorten them)."""
    if watching is None:
        return None
    try:
        return watching.watch_releases(work_ids)
    except Exception:
        logger.warning("worklease: watching for releases failed; polling", exc_info=True)
        return None


@runtime_checkable
class ReleaseWatching(Protocol):
    """A backend capability: wakes waiters when a work ID is released (``watch_releases``
    returns ``None`` when it cannot notify right now)."""

    def watch_releases(self, work_ids: Iterable[str]) -> ReleaseWatch | None: ...


ReleaseWatching.__module__ = "worklease"


class ReleaseHub:
    """Which watches wait for which work IDs; ``publish`` wakes those on one work ID.

    Safe to use from any task or thread. Registering a watch costs one set insertion per
    work ID and publishing a lookup, so a watch on thousands of work IDs is cheap.
    """

    def __init__(self) -> None:
        self._lock = ThreadLock()
        self._watches: dict[str, ReleaseWatch | set[ReleaseWatch]] = {}
        """Work ID -> its one watch, or a set when several watch it: a pool watches every
        work ID of its set alone, and a one-element set per work ID cost 216 bytes each."""

    def watch(self, work_ids: Iterable[str]) -> ReleaseWatch:
        """A watch on ``work_ids`` (an iterable of work IDs, not one string), registered
        at once: releases published from now on wake it."""
        if isinstance(work_ids, str | bytes):
            raise TypeError("work IDs must be given as an iterable of str, not one string")
        watch = ReleaseWatch(self, tuple(dict.fromkeys(work_ids)))
        with self._lock:
            for work_id in watch.work_ids:
                watchers = self._watches.get(work_id)
                if watchers is None:
                    self._watches[work_id] = watch
                elif isinstance(watchers, set):
                    watchers.add(watch)
                elif watchers is not watch:
                    self._watches[work_id] = {watchers, watch}
        return watch

    def _watchers(self, work_id: str) -> list[ReleaseWatch]:
        watchers = self._watches.get(work_id)
        if watchers is None:
            return []
        return list(watchers) if isinstance(watchers, set) else [watchers]

    def publish(self, work_id: str) -> None:
        """Wake every watch on ``work_id`` (a no-op when nobody watches it)."""
        with self._lock:
            woken = self._watchers(work_id)
        for watch in woken:
            watch._wake(released=True)

    def wake_all(self) -> None:
        """Wake every watch: releases may have gone unseen (a listener that just started or
        reconnected), so every waiter should look again."""
        with self._lock:
            woken = {watch for work_id in self._watches for watch in self._watchers(work_id)}
        for watch in woken:
            watch._wake(released=True)

    def watched(self) -> int:
        """How many distinct work IDs are watched right now."""
        with self._lock:
            return len(self._watches)

    def _unregister(self, watch: ReleaseWatch) -> None:
        with self._lock:
            for work_id in watch.work_ids:
                watchers = self._watches.get(work_id)
                if watchers is watch:
                    del self._watches[work_id]
                elif isinstance(watchers, set):
                    watchers.discard(watch)
                    if len(watchers) == 1:
                        self._watches[work_id] = next(iter(watchers))
                    elif not watchers:
                        del self._watches[work_id]


class ReleaseWatch:
    """Tells one waiter whether a work ID it watches was released (from ``hub.watch``).

    ``wait(timeout)`` returns True as soon as a release of one of the work IDs was published
    since the watch was created or since the previous ``wait`` returned, and False when
    ``timeout`` seconds pass first (or the watch is closed). One waiter at a time. Use it as a
    context manager (``with``) or call ``close()``, which unregisters it; closing also ends a
    pending ``wait`` at once (returning False), so another task or thread can interrupt it.
    """

    def __init__(self, hub: ReleaseHub, work_ids: tuple[str, ...]) -> None:
        self._hub = hub
        self._work_ids = work_ids
        self._lock = ThreadLock()
        self._event = Event()
        self._released = False
        self._closed = False

    @property
    def work_ids(self) -> tuple[str, ...]:
        """The watched work IDs (distinct, in the order given)."""
        return self._work_ids

    @property
    def closed(self) -> bool:
        return self._closed

    def _wake(self, *, released: bool) -> None:
        with self._lock:
            if self._closed and released:
                return
            if released:
                self._released = True
            # Under the lock, so ``wait`` never sees the flag without the event (or clears an
            # event set for a release it has not consumed).
            self._event.set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a release; return whether one was seen."""
        deadline = monotonic() + max(timeout, 0.0)
        while True:
            with self._lock:
                if self._released:
                    self._released = False
                    self._event.clear()
                    return True
                if self._closed:
                    return False
                # A set without a release is stale (handed over from another thread after
                # its release was already consumed): wait on.
                self._event.clear()
            left = deadline - monotonic()
            if left <= 0:
                return False
            self._event.wait(left)

    def wake(self) -> None:
        """End a pending (or the next) ``wait`` as if a release was seen: for a waiter that
        also has other reasons to look again."""
        self._wake(released=True)

    def close(self) -> None:
        """Unregister the watch and end a pending ``wait`` (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake(released=False)
        self._hub._unregister(self)

    def __enter__(self) -> ReleaseWatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {len(self._work_ids)} work ID(s) {state}>"
