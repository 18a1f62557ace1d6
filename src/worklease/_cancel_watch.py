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

A call that must hand control back by a moment (``watch_connection``: a thread's final
writes, see ``_compat.cleanup``) registers its connection instead: if it has not answered by
then, its socket is shut down (through a duplicate of the socket's descriptor taken at
registration, so it can only ever reach that socket), the driver's wait ends at once with a
connection error whatever the network does, and the connection is discarded. The cancel
request for what it was running then goes from a short-lived thread of its own (the
connection has no next user to reach), so a server that does not answer never holds up the
watch.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import socket
import threading
from typing import Any

import psycopg
from psycopg.pq import PollingStatus

from ._window import monotonic

__all__ = ["CancelTicket", "watch_connection", "watch_statement"]

logger = logging.getLogger("worklease")

_TICK = 0.02
"""How often the thread looks for overdue statements (the cancel's resolution)."""
_LINGER = 5.0
"""How long the thread stays after the last call finished before it exits."""


class CancelTicket:
    """One registered statement (or, with ``socket_fd``, one connection to cut off):
    ``done()`` when it returned, ``fired`` when it was cancelled (cut off) for overrunning
    its deadline."""

    __slots__ = ("_conn", "_deadline", "_key", "_lock", "_socket", "_watch", "fired")

    def __init__(
        self,
        watch: _CancelWatch,
        key: int,
        conn: Any,
        deadline: float,
        socket_fd: int | None = None,
    ) -> None:
        self._watch = watch
        self._key = key
        self._conn: Any = conn
        self._deadline = deadline
        self._socket = socket_fd  # our own duplicate: closed by done() or after the cut
        self._lock = threading.Lock()
        self.fired = False

    def done(self) -> None:
        """The statement is over: from now on nothing is sent to its connection."""
        with self._lock:
            self._conn = None
            self._close_socket()
        self._watch.forget(self._key)

    def _close_socket(self) -> None:
        if self._socket is not None:
            os.close(self._socket)
            self._socket = None

    def _cancel_if_due(self, now: float) -> bool:
        if now < self._deadline:
            return False
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is None:
                return True
            self.fired = True
            if self._socket is not None:
                self._cut_off(conn)
                return True
            _cancel(conn, _STATEMENT_CANCEL_WAIT)
        return True

    def _cut_off(self, conn: Any) -> None:
        """Shut the connection's socket down (under the ticket's lock), then cancel what it
        ran from a thread of its own."""
        assert self._socket is not None
        request = None
        if NONBLOCKING_CANCEL:  # a classic cancel would hold the GIL while nobody answers
            try:
                # Made before the socket is shut (libpq copies what it needs): the caller
                # may close the connection as soon as its wait ends.
                request = conn.pgconn.cancel_conn()
            except Exception as exc:
                logger.debug("worklease: cancelling an overdue statement failed: %s", exc)
        try:
            with socket.socket(fileno=os.dup(self._socket)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError as exc:
            logger.debug("worklease: cutting off an overdue connection failed: %s", exc)
        self._close_socket()
        if request is not None:
            threading.Thread(
                target=_send_nonblocking,
                args=(request, _CUT_CANCEL_WAIT),
                name="worklease-cancel",
                daemon=True,
            ).start()


NONBLOCKING_CANCEL = psycopg.capabilities.has_cancel_safe()
"""libpq 17 and later cancel without blocking: the watch then waits for the server's answer
in ``select`` (the GIL let go) and gives up after a while. An older libpq's cancel request
blocks, holding the GIL, until the server answers."""
_STATEMENT_CANCEL_WAIT = 2.0
"""How long the watch waits for the server to take a cancel request (a server that does not
answer is left: the statement's own call ends when its connection does)."""
_CUT_CANCEL_WAIT = 10.0
"""The same for the cancel sent after a cut-off, from a thread of its own."""


def _cancel(conn: Any, wait: float) -> None:
    """Ask the server to cancel what ``conn`` runs, waiting at most ``wait`` seconds for it
    to take the request (with a libpq older than 17, as long as the request takes)."""
    try:
        if NONBLOCKING_CANCEL:
            _send_nonblocking(conn.pgconn.cancel_conn(), wait)
        else:
            conn.cancel()  # libpq's classic request: thread-safe, works for both flavours
    except Exception as exc:  # the call ends anyway once its connection answers
        logger.debug("worklease: cancelling an overdue statement failed: %s", exc)


def _send_nonblocking(request: Any, wait: float) -> None:
    """Drive libpq's non-blocking cancel connection ``request`` for at most ``wait``
    seconds."""
    end = monotonic() + wait
    try:
        request.start()
        while True:
            status = request.poll()
            if status == PollingStatus.OK:
                return
            left = end - monotonic()
            if status == PollingStatus.FAILED or left <= 0:
                logger.debug(
                    "worklease: cancelling an overdue statement failed: %s",
                    request.get_error_message() or "no answer",
                )
                return
            fileno = request.socket
            if status == PollingStatus.READING:
                select.select([fileno], [], [], left)
            else:
                select.select([], [fileno], [], left)
    except Exception as exc:
        logger.debug("worklease: cancelling an overdue statement failed: %s", exc)
    finally:
        request.finish()


class _CancelWatch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets: dict[int, CancelTicket] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._idle_since = monotonic()

    def register(self, conn: Any, deadline: float, socket_fd: int | None = None) -> CancelTicket:
        with self._lock:
            ticket = CancelTicket(self, next(self._keys), conn, deadline, socket_fd)
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


def watch_connection(conn: Any, seconds: float) -> CancelTicket:
    """Cut ``conn`` off (shut its socket down, after taking a cancel request for what it
    runs) if the call using it has not ended ``seconds`` from now; call ``done()`` on the
    ticket as soon as the call ended (before the connection is given back)."""
    return _WATCH.register(conn, monotonic() + max(seconds, 0.0), os.dup(conn.pgconn.socket))
