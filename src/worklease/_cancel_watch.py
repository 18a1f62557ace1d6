"""Cancel statements still running at their deadline (both flavours).

A prepared statement is sent alone, so it cannot carry a ``SET LOCAL statement_timeout`` in
the same implicit transaction the way a simple-protocol query can. Calls with a deadline (a
waiting acquire's timeout, a thread's write inside its lease window, a renewal bounded by one
TTL) register with this watch instead; a statement still running at its deadline gets a
cancel request, the server ends it and rolls it back, and the call fails as a statement
timeout would (``QueryCanceled``, a transient ``BackendError``).

One daemon thread per process serves every backend. It runs only while calls are registered
(and a few seconds after), waking at the nearest deadline and at least every ``_TICK``
seconds: registering costs a dict insert under a lock and never wakes a thread, so a call
without a deadline problem pays next to nothing. The watch thread never waits on the network
itself: each cancel request goes from a short-lived thread of its own, so one server that
does not answer cannot delay the deadlines of other calls. A finished call's ``done()`` waits
until its request was taken by the server or given up; ``reusable`` then tells whether the
connection may serve anybody else (not while a request that may still arrive is in flight:
it would cancel the next user's statement).

A call that must hand control back by a moment (``watch_connection``: a thread's final
writes, see ``_compat.cleanup``) registers its connection instead: if it has not answered by
then, its socket is shut down (through a duplicate of the socket's descriptor taken at
registration, so it can only ever reach that socket), the driver's wait ends at once with a
connection error whatever the network does, and the connection is never used again
(``reusable`` is false, even when the call had answered just before the cut). The cancel
request for what it was running goes from a thread of its own, and nobody waits for it.
"""

from __future__ import annotations

import itertools
import logging
import os
import selectors
import socket
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.pq import PollingStatus

from ._window import monotonic

__all__ = ["CancelTicket", "watch_connection", "watch_statement"]

logger = logging.getLogger("worklease")

_TICK = 0.02
"""The longest the thread sleeps while calls are registered: a call registered while it
sleeps is looked at within this long."""
_LINGER = 5.0
"""How long the thread stays after the last call finished before it exits."""
NONBLOCKING_CANCEL = psycopg.capabilities.has_cancel_safe()
"""libpq 17 and later cancel without blocking: the request's thread then waits for the
server's answer in a selector (the GIL let go) and gives up after a while. An older libpq's
cancel request blocks, holding the GIL, until the server answers."""
_STATEMENT_CANCEL_WAIT = 2.0
"""How long a statement's cancel request waits for the server to take it (a server that does
not answer is left: the statement's own call ends when its connection does)."""
_CUT_CANCEL_WAIT = 10.0
"""The same for the cancel sent after a cut-off."""

_Sender = Callable[[], bool]
"""Sends one prepared cancel request; true when the server took it."""


class CancelTicket:
    """One registered statement (or, with ``socket_fd``, one connection to cut off):
    ``done()`` when it returned; then ``fired`` tells it was cancelled (cut off) for
    overrunning its deadline and ``reusable`` whether its connection may serve another
    call."""

    __slots__ = (
        "_conn",
        "_cutting",
        "_deadline",
        "_key",
        "_lock",
        "_settled",
        "_socket",
        "_watch",
        "delivered",
        "fired",
    )

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
        self._cutting = socket_fd is not None
        self._lock = threading.Lock()
        self._settled: threading.Event | None = None  # set once a statement's cancel is
        self.fired = False
        self.delivered = False  # the server took the statement's cancel request

    @property
    def reusable(self) -> bool:
        """Whether the connection may serve another call: not cut off, and no cancel request
        of this call can still reach it."""
        return not self.fired or (not self._cutting and self.delivered)

    def done(self) -> None:
        """The call is over: from now on nothing is sent to its connection. After a statement
        cancel, waits (a bounded time) until the server took the request or it was given
        up."""
        with self._lock:
            self._conn = None
            self._close_socket()
            settled = self._settled
        self._watch.forget(self._key)
        if settled is not None:
            settled.wait(_STATEMENT_CANCEL_WAIT + 1.0)

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
            if self._cutting:
                self._cut_off(conn)
                return True
            self._settled = threading.Event()
            try:
                _send_in_thread(_request(conn, _STATEMENT_CANCEL_WAIT, blocking_too=True), self)
            except BaseException:
                self._settle(False)  # done() must not wait for a request never sent
                raise
        return True

    def _cut_off(self, conn: Any) -> None:
        """Shut the connection's socket down (under the ticket's lock), then cancel what it
        ran from a thread of its own."""
        # Made before the socket is shut (libpq copies what it needs): the caller may close
        # the connection as soon as its wait ends. A classic request would hold the GIL
        # while nobody answers: with an old libpq the cut goes alone.
        sender = _request(conn, _CUT_CANCEL_WAIT, blocking_too=False)
        if self._socket is not None:
            try:
                with socket.socket(fileno=os.dup(self._socket)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError as exc:
                logger.debug("worklease: cutting off an overdue connection failed: %s", exc)
            self._close_socket()
        _send_in_thread(sender, None)

    def _settle(self, delivered: bool) -> None:
        self.delivered = delivered
        if self._settled is not None:
            self._settled.set()


def _request(conn: Any, wait: float, *, blocking_too: bool) -> _Sender | None:
    """A sender for a cancel request for what ``conn`` runs (made now, sent by the caller's
    choice of thread); ``None`` when none can be made. With ``blocking_too``, an old libpq's
    classic request (thread-safe, but it holds the GIL until the server answers)."""
    if NONBLOCKING_CANCEL:
        try:
            request = conn.pgconn.cancel_conn()
        except Exception as exc:
            logger.debug("worklease: cancelling an overdue statement failed: %s", exc)
            return None
        return lambda: _send_nonblocking(request, wait)
    if blocking_too:
        return lambda: _send_classic(conn)
    return None


def _send_in_thread(sender: _Sender | None, ticket: CancelTicket | None) -> None:
    """Run ``sender`` in a daemon thread of its own and settle ``ticket`` with its outcome."""

    def send() -> None:
        delivered = False
        try:
            delivered = sender is not None and sender()
        finally:
            if ticket is not None:
                ticket._settle(delivered)

    if sender is None:
        if ticket is not None:
            ticket._settle(False)
        return
    try:
        threading.Thread(target=send, name="worklease-cancel", daemon=True).start()
    except RuntimeError as exc:  # no thread to be had: the request is not sent
        logger.warning("worklease: cannot send a cancel request: %s", exc)
        if ticket is not None:
            ticket._settle(False)


def _send_classic(conn: Any) -> bool:
    try:
        conn.cancel()  # libpq's classic request: thread-safe, works for both flavours
    except Exception as exc:  # the call ends anyway once its connection answers
        logger.debug("worklease: cancelling an overdue statement failed: %s", exc)
        return False
    return True


def _send_nonblocking(request: Any, wait: float) -> bool:
    """Drive libpq's non-blocking cancel connection ``request`` for at most ``wait``
    seconds; true when the server took the request."""
    end = monotonic() + wait
    try:
        request.start()
        with selectors.DefaultSelector() as selector:  # any descriptor number, unlike select()
            registered: int | None = None
            while True:
                status = request.poll()
                if status == PollingStatus.OK:
                    return True
                left = end - monotonic()
                if status == PollingStatus.FAILED or left <= 0:
                    logger.debug(
                        "worklease: cancelling an overdue statement failed: %s",
                        request.get_error_message() or "no answer",
                    )
                    return False
                events = (
                    selectors.EVENT_READ
                    if status == PollingStatus.READING
                    else selectors.EVENT_WRITE
                )
                fileno = request.socket
                if registered is None:
                    selector.register(fileno, events)
                elif registered != fileno:  # libpq may move to another address's socket
                    selector.unregister(registered)
                    selector.register(fileno, events)
                else:
                    selector.modify(fileno, events)
                registered = fileno
                selector.select(left)
    except Exception as exc:
        logger.debug("worklease: cancelling an overdue statement failed: %s", exc)
        return False
    finally:
        request.finish()


class _CancelWatch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets: dict[int, CancelTicket] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._idle_since = monotonic()

    def register(self, conn: Any, deadline: float, socket_fd: int | None = None) -> CancelTicket:
        with self._lock:
            ticket = CancelTicket(self, next(self._keys), conn, deadline, socket_fd)
            self._tickets[ticket._key] = ticket
            # The thread clears this itself when it ends (lingered out, or an error), and a
            # forked child clears it: no need to ask the thread at every call.
            if self._thread is None:
                thread = threading.Thread(
                    target=self._serve, name="worklease-cancel-watch", daemon=True
                )
                thread.start()
                self._thread = thread
        return ticket

    def forget(self, key: int) -> None:
        with self._lock:
            self._tickets.pop(key, None)
            if not self._tickets:
                self._idle_since = monotonic()

    def after_fork_in_child(self) -> None:
        """A forked child has no watch thread and must never act on the parent's calls
        (its copies of their descriptors reach the same sockets): forget them."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        for ticket in self._tickets.values():
            ticket._conn = None
            if ticket._socket is not None:
                try:
                    os.close(ticket._socket)
                except OSError:
                    pass
                ticket._socket = None
        self._tickets.clear()
        self._thread = None

    def _serve(self) -> None:
        try:
            self._loop()
        finally:  # ended by an error: the next registration starts another thread
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _loop(self) -> None:
        sleep = threading.Event()  # never set: a sleep that is not patched by test clocks
        while True:
            with self._lock:
                now = monotonic()
                tickets = list(self._tickets.values())
                if not tickets and now - self._idle_since > _LINGER:
                    self._thread = None
                    return
            nearest = now + _TICK
            for ticket in tickets:
                try:
                    due = ticket._cancel_if_due(now)
                except Exception as exc:  # never the end of the watch for everybody else
                    logger.warning("worklease: the cancel watch failed on a call: %r", exc)
                    due = True
                if due:
                    self.forget(ticket._key)
                else:
                    nearest = min(nearest, ticket._deadline)
            sleep.wait(max(nearest - monotonic(), 0.0))


_WATCH = _CancelWatch()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCH.after_fork_in_child)


def watch_statement(conn: Any, seconds: float) -> CancelTicket:
    """Cancel the statement about to run on ``conn`` if it is still running ``seconds`` from
    now; call ``done()`` on the ticket as soon as it returned (before the connection is given
    back), and give the connection back only if the ticket is ``reusable``."""
    return _WATCH.register(conn, monotonic() + max(seconds, 0.0))


def watch_connection(conn: Any, seconds: float) -> CancelTicket:
    """Cut ``conn`` off (shut its socket down, after taking a cancel request for what it
    runs) if the call using it has not ended ``seconds`` from now; call ``done()`` on the
    ticket as soon as the call ended and discard the connection unless the ticket is
    ``reusable``. A descriptor that cannot be duplicated is a connection error
    (``psycopg.OperationalError``)."""
    try:
        socket_fd = os.dup(conn.pgconn.socket)
    except (OSError, psycopg.Error) as exc:
        raise psycopg.OperationalError(f"cannot watch the connection: {exc}") from exc
    try:
        return _WATCH.register(conn, monotonic() + max(seconds, 0.0), socket_fd)
    except BaseException:
        os.close(socket_fd)
        raise
