# Generated from src/worklease/_async/listener.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""The PostgreSQL release listener: one connection LISTENing for released work IDs.

Release and forget statements NOTIFY ``RELEASE_CHANNEL`` with the work ID (see ``_pg``). The
listener of a backend receives them on one dedicated connection and publishes each work ID
to the backend's release hub, which wakes the watches waiting for it. Notifications only
shorten waits; while the listener is down or reconnecting, waiters poll as before.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import psycopg
from psycopg import ClientCursor, Connection, sql
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool, PoolTimeout

from .._compat import CancelGuard, Event, Worker, cancel_worker, join_all, spawn
from .._failures import first_line
from .._pg import RELEASE_CHANNEL, map_error
from .._window import Backoff, monotonic
from .watch import ReleaseHub

__all__ = ["ReleaseListener"]

_IS_SYNC = True

logger = logging.getLogger("worklease")

_LISTEN = sql.SQL("LISTEN {}").format(sql.Identifier(RELEASE_CHANNEL))


def _listen_only_at(pid: int) -> sql.Composed:
    """LISTEN, run only by the server session ``pid`` (a DO block: a session a pooler
    shares is never left listening)."""
    body = sql.SQL("BEGIN IF pg_backend_pid() = {} THEN EXECUTE {}; END IF; END").format(
        sql.Literal(pid), sql.Literal(_LISTEN.as_string())
    )
    return sql.SQL("DO {}").format(sql.Literal(body.as_string()))


_UNLISTEN = sql.SQL("UNLISTEN {}").format(sql.Identifier(RELEASE_CHANNEL))
_UNLISTEN_ATTEMPTS = 20
_SHARED = (
    "connections were served by shared server sessions: a transaction-pooling proxy (such as "
    "PgBouncer in transaction mode) is in between; give the backend a listen_dsn that reaches "
    "the server directly"
)
_PROBE_PREFIX = "worklease-probe:"
_STOP_TIMEOUT = 5.0


class ReleaseListener:
    """Publishes the work IDs announced on ``RELEASE_CHANNEL`` to ``hub``.

    Its connection comes from a private pool of one, built with the settings of the
    application's pool (conninfo, kwargs, connection class), or on ``conninfo`` when given (a
    direct route to the server past a transaction-pooling proxy). The checks run from a second
    connection, opened the way the application's releases travel (the application pool's
    settings), so they see what a release sees:

    1. both connections report their server process; the same one means a proxy shares server
       sessions between clients (PgBouncer in transaction mode), where a LISTEN would stay
       behind on a pooled server connection: give up before listening;
    2. after ``LISTEN`` the second connection sends a probe notification; when it does not
       come back within ``probe_timeout`` seconds on the first connection, the listener
       UNLISTENs and gives up.

    Giving up (also when LISTEN is refused) logs one warning and stops for good; waiters keep
    polling. A connection lost later is replaced with a backoff.
    """

    probe_timeout = 2.0
    """How long the probe notification may take to come back."""

    tick = 0.25
    """How often a listener thread checks whether it was stopped (a task is cancelled)."""

    backoff = Backoff(initial=0.5, maximum=30.0)
    """Pacing of reconnection attempts."""

    def __init__(
        self, pool: ConnectionPool[Any], hub: ReleaseHub, conninfo: str | None = None
    ) -> None:
        self._hub = hub
        self._pool: ConnectionPool[Any] = ConnectionPool(
            pool.conninfo if conninfo is None else conninfo,
            kwargs=pool.kwargs,
            connection_class=pool.connection_class,
            min_size=1,
            max_size=1,
            open=False,
            # No check on checkout (it sleeps after a failure): a dead connection fails the
            # LISTEN or the wait for notifications, and the loop reconnects with its backoff.
            check=None,
            name="worklease-listener",
        )
        # The second connection of the checks, opened on demand and closed after idling.
        self._probe_pool: ConnectionPool[Any] = ConnectionPool(
            pool.conninfo,
            kwargs=pool.kwargs,
            connection_class=pool.connection_class,
            min_size=0,
            max_size=1,
            max_idle=60.0,
            open=False,
            check=None,
            name="worklease-listener-probe",
        )
        self._stop = Event()
        self._worker: Worker | None = None
        self._proven = False  # a probe came back once: the path delivers
        self._connected = False  # this connection got to listening
        self._listening = False
        self._fell_back = False
        self._fallback_reason: str | None = None

    @property
    def listening(self) -> bool:
        """Whether notifications are being received right now."""
        return self._listening

    @property
    def fell_back(self) -> bool:
        """Whether the listener gave up for good (waiters poll)."""
        return self._fell_back

    @property
    def fallback_reason(self) -> str | None:
        """Why the listener gave up, once it has."""
        return self._fallback_reason

    def start(self) -> None:
        self._worker = spawn(self._run, name="worklease-release-listener")

    def stop(self) -> None:
        """Stop listening and close the connection (idempotent)."""
        self._stop.set()
        worker = self._worker
        if worker is not None:
            cancel_worker(worker)
        self._pool.close()  # also fails a wait for a connection at once
        self._probe_pool.close()
        if worker is not None:
            join_all([worker], timeout=_STOP_TIMEOUT)

    def _run(self) -> None:
        base = self.backoff.initial
        announced = False
        while not self._stop.is_set():
            try:
                self._pool.open()
                self._probe_pool.open()
                if not self._session():
                    # gave up: hand the connections back for good
                    self._pool.close()
                    self._probe_pool.close()
                    return
            except Exception as exc:
                if self._stop.is_set():
                    return
                if self._connected:  # a working connection was lost: retry soon
                    base, announced = self.backoff.initial, False
                if not announced:
                    logger.info(
                        "worklease: release listener disconnected (%s); reconnecting, "
                        "waiting acquires poll meanwhile",
                        _describe(exc),
                    )
                    announced = True
            self._connected = False
            self._stop.wait(self.backoff.delay(base))
            base = self.backoff.next_base(base)

    def _session(self) -> bool:
        """Listen on one connection until it fails (raises), the listener stops (returns
        True) or gives up (returns False)."""
        guard = CancelGuard()
        with self._pool.connection() as conn:
            guard.check()  # a cancellation the checkout lost (a stop) is raised here
            if not conn.autocommit:
                conn.set_autocommit(True)
            mine = _backend_pid(conn)
            if self._shares_server(conn, mine):
                self._fall_back(_SHARED)
                return False
            try:
                # One message: LISTEN only on the server session checked above (behind a
                # pooler this client may reach another one, which must not be left
                # listening), and the pid says which session ran it.
                listening_at = _run_reporting_pid(conn, _listen_only_at(mine))
            except psycopg.Error as exc:
                if map_error(exc, "listen").transient:
                    raise
                self._fall_back(f"LISTEN failed: {_describe(exc)}")
                return False
            if listening_at != mine:  # the proxy moved this client: nothing was listened
                self._fall_back(_SHARED)
                return False
            try:
                delivered = self._probe(conn)
            except BaseException:
                # Stopped (cancelled) or failed while the probe was out: the LISTEN is on a
                # session nobody proved private, so take it back before leaving.
                self._unlisten(conn, listening_at)
                raise
            if not delivered:
                self._unlisten(conn, listening_at)
                if self._proven:  # it worked before: treat as a connection problem
                    raise TimeoutError("the probe notification did not come back")
                self._fall_back(
                    f"a notification sent to {RELEASE_CHANNEL!r} from another connection did "
                    f"not come back within {self.probe_timeout:g}s (a transaction-pooling proxy "
                    "in between? give the backend a listen_dsn that reaches the server directly)"
                )
                return False
            self._proven = self._connected = self._listening = True
            # Listening (since the LISTEN; the probe proved delivery). A release before the
            # LISTEN (since the first watch was opened, or while disconnected) went unseen:
            # every waiter looks again once.
            self._hub.wake_all()
            try:
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=self.tick if _IS_SYNC else None):
                        self._deliver(note.channel, note.payload)
            finally:
                self._listening = False
        return True

    def _shares_server(self, conn: Connection[Any], mine: int) -> bool:
        """Whether a pooler serves ``conn`` (server process ``mine``) from shared server
        sessions: its process changes between statements, or a second connection gets it.
        Two direct connections never share a process; a pooler in transaction mode hands
        an idle server session to the next client (PgBouncer: last in, first out), and a
        busy one moves clients between sessions."""
        for _ in range(3):
            with self._probe_pool.connection(timeout=self.probe_timeout) as other:
                theirs = _backend_pid(other)
            if theirs == mine or _backend_pid(conn) != mine:
                return True
        return False

    def _unlisten(self, conn: Connection[Any], listening_at: int) -> None:
        """Take the LISTEN back from the server session that took it. Behind a pooler this
        client may reach another session, and again the same one (PgBouncer hands out the
        session released last): each miss keeps the session it reached busy in an open
        transaction of a connection of its own, so the next try reaches another."""
        pins: ConnectionPool[Any] = ConnectionPool(
            self._probe_pool.conninfo,
            kwargs=self._probe_pool.kwargs,
            connection_class=self._probe_pool.connection_class,
            min_size=0,
            max_size=_UNLISTEN_ATTEMPTS,
            open=False,
            check=None,
            name="worklease-listener-unlisten",
        )
        held: list[Connection[Any]] = []
        try:
            for _ in range(_UNLISTEN_ATTEMPTS):
                try:
                    if _run_reporting_pid(conn, _UNLISTEN) == listening_at:
                        return
                    if pins.closed:
                        pins.open()
                    pin = pins.getconn(timeout=self.probe_timeout)
                    held.append(pin)
                    if pin.autocommit:
                        pin.set_autocommit(False)
                    pin.execute("SELECT 1")  # takes a session and keeps it: no commit
                except (psycopg.Error, PoolTimeout) as exc:
                    logger.debug("worklease: UNLISTEN failed: %s", _describe(exc))
                    return
        finally:
            for pin in held:
                pins.putconn(pin)  # rolled back: the session goes back to the pooler
            pins.close(timeout=1.0)
        logger.info(
            "worklease: could not reach the server session holding the listener's LISTEN; "
            "it ends with that session"
        )

    def _probe(self, conn: Connection[Any]) -> bool:
        """Whether a notification the second connection sends comes back to ``conn`` in
        time."""
        payload = _PROBE_PREFIX + uuid.uuid4().hex
        with self._probe_pool.connection(timeout=self.probe_timeout) as other:
            self._send_probe(other, payload)
        deadline = monotonic() + self.probe_timeout
        seen = False
        while not seen:
            left = deadline - monotonic()
            if left <= 0:
                return False
            # stop_after ends the generator by itself: never leave one suspended (it holds
            # the connection's lock).
            for note in conn.notifies(timeout=left, stop_after=1):
                if note.channel == RELEASE_CHANNEL and note.payload == payload:
                    seen = True
                else:
                    self._deliver(note.channel, note.payload)
        return True

    def _send_probe(self, conn: Connection[Any], payload: str) -> None:
        query = sql.SQL("SELECT pg_notify({}, {})").format(
            sql.Literal(RELEASE_CHANNEL), sql.Literal(payload)
        )
        if not conn.autocommit:
            conn.set_autocommit(True)
        conn.execute(query)

    def _deliver(self, channel: str, payload: str) -> None:
        if channel != RELEASE_CHANNEL or payload.startswith(_PROBE_PREFIX):
            return
        try:
            self._hub.publish(payload)
        except Exception:  # never let one waiter's trouble stop the listener
            logger.exception("worklease: waking the watches of %r failed", payload)

    def _fall_back(self, reason: str) -> None:
        self._fallback_reason = reason
        self._fell_back = True
        logger.warning(
            "worklease: release notifications are unavailable (%s); waiting acquires, "
            "leaders and pools fall back to polling",
            reason,
        )
        # Waiters look again once and find no watch to wait on (the backend returns None).
        self._hub.wake_all()


def _run_reporting_pid(conn: Connection[Any], statement: sql.Composed) -> int:
    """Run ``statement`` and ``SELECT pg_backend_pid()`` in one simple-protocol message (one
    server session runs both, even behind a pooler); the pid."""
    if not conn.autocommit:
        conn.set_autocommit(True)
    cursor = ClientCursor(conn, row_factory=tuple_row)
    cursor.execute(statement + sql.SQL("; SELECT pg_backend_pid()"))
    while cursor.nextset():
        pass
    rows = cursor.fetchall()
    return int(rows[0][0])


def _backend_pid(conn: Connection[Any]) -> int:
    if not conn.autocommit:
        conn.set_autocommit(True)
    # a client-side cursor (never prepared: PgBouncer) with tuples, whatever the pool's
    # row factory
    cursor = ClientCursor(conn, row_factory=tuple_row)
    cursor.execute(b"SELECT pg_backend_pid()")
    rows = cursor.fetchall()
    return int(rows[0][0])


def _describe(exc: BaseException) -> str:
    line = first_line(exc)
    return line if line == type(exc).__name__ else f"{type(exc).__name__}: {line}"
