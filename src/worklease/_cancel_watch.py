"""Cancel statements still running at their deadline (both flavours).

A prepared statement is sent alone, so it cannot carry a ``SET LOCAL statement_timeout`` in
the same implicit transaction the way a simple-protocol query can. Calls with a deadline (a
waiting acquire's timeout, a thread's write inside its lease window, a renewal bounded by one
TTL) register with this watch instead; a statement still running at its deadline gets a
cancel request, the server ends it and rolls it back, and the call fails as a statement
timeout would (``QueryCanceled``, a transient ``BackendError``).

One daemon thread per process serves every backend. It runs only while calls are registered
(and a few seconds after), checking them every ``_TICK`` seconds: registering costs a dict
insert under a lock and never wakes a thread, so a call without a deadline problem pays
next to nothing. A cancel is sent under the ticket's lock and a finished call takes that
lock before it hands its connection back, so a late cancel never reaches the connection's
next user.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from typing import Any

from ._window import monotonic

__all__ = ["CancelTicket", "watch_statement"]

logger = logging.getLogger("worklease")

_TICK = 0.02
"""How often the thread looks for overdue statements (the cancel's resolution)."""
_LINGER = 5.0
"""How long the thread stays after the last call finished before it exits."""


class CancelTicket:
    """One registered statement: ``done()`` when it returned, ``fired`` when it was
    cancelled for overrunning its deadline."""

    __slots__ = ("_conn", "_deadline", "_key", "_lock", "_watch", "fired")

    def __init__(self, watch: _CancelWatch, key: int, conn: Any, deadline: float) -> None:
        self._watch = watch
        self._key = key
        self._conn: Any = conn
        self._deadline = deadline
        self._lock = threading.Lock()
        self.fired = False

    def done(self) -> None:
        """The statement is over: from now on nothing is sent to its connection."""
        with self._lock:
            self._conn = None
        self._watch.forget(self._key)

    def _cancel_if_due(self, now: float) -> bool:
        if now < self._deadline:
            return False
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is None:
                return True
            self.fired = True
            try:
                conn.cancel()  # libpq's cancel request: thread-safe, works for both flavours
            except Exception as exc:  # the call ends anyway once its connection answers
                logger.debug("worklease: cancelling an overdue statement failed: %s", exc)
        return True


class _CancelWatch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets: dict[int, CancelTicket] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._idle_since = monotonic()

    def register(self, conn: Any, deadline: float) -> CancelTicket:
        with self._lock:
            ticket = CancelTicket(self, next(self._keys), conn, deadline)
            self._tickets[ticket._key] = ticket
            if self._thread is None or self._pid != os.getpid():  # none yet, or forked
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._serve, name="worklease-cancel-watch", daemon=True
                )
                self._thread.start()
        return ticket

    def forget(self, key: int) -> None:
        with self._lock:
            self._tickets.pop(key, None)
            if not self._tickets:
                self._idle_since = monotonic()

    def _serve(self) -> None:
        event = threading.Event()  # never set: a sleep that is not patched by test clocks
        while True:
            event.wait(_TICK)
            now = monotonic()
            with self._lock:
                if not self._tickets and now - self._idle_since > _LINGER:
                    self._thread = None
                    return
                tickets = list(self._tickets.values())
            for ticket in tickets:
                if ticket._cancel_if_due(now):
                    self.forget(ticket._key)


_WATCH = _CancelWatch()


def watch_statement(conn: Any, seconds: float) -> CancelTicket:
    """Cancel the statement about to run on ``conn`` if it is still running ``seconds`` from
    now; call ``done()`` on the ticket as soon as it returned (before the connection is given
    back)."""
    return _WATCH.register(conn, monotonic() + max(seconds, 0.0))
