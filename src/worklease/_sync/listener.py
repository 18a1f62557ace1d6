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
from psycopg import Connection, sql
from psycopg_pool import ConnectionPool

from .._acompat import Event, Worker, cancel_worker, join_all, spawn
from .._pg import RELEASE_CHANNEL, map_error
from .._window import Backoff, monotonic
from .watch import ReleaseHub

__all__ = ["ReleaseListener"]

_IS_SYNC = True

logger = logging.getLogger("worklease")

_LISTEN = sql.SQL("LISTEN {}").format(sql.Identifier(RELEASE_CHANNEL))
_PROBE_PREFIX = "worklease-probe:"
_STOP_TIMEOUT = 5.0


class ReleaseListener:
    """Publishes the work IDs announced on ``RELEASE_CHANNEL`` to ``hub``.

    Its connection comes from a private pool of one, built with the settings of the
    application's pool (conninfo, kwargs, connection class). After ``LISTEN`` it sends itself
    a probe notification: when LISTEN fails, or the probe does not come back within
    ``probe_timeout`` seconds on the first connection (as behind a transaction-pooling
    proxy), it logs one warning and stops for good, and waiters keep polling. A connection
    lost later is replaced with a backoff.
    """

    probe_timeout = 2.0
    """How long the probe notification may take to come back."""

    tick = 0.25
    """How often a listener thread checks whether it was stopped (a task is cancelled)."""

    backoff = Backoff(initial=0.5, maximum=30.0)
    """Pacing of reconnection attempts."""

    def __init__(self, pool: ConnectionPool[Any], hub: ReleaseHub) -> None:
        self._hub = hub
        self._pool: ConnectionPool[Any] = ConnectionPool(
            pool.conninfo,
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
        self._stop = Event()
        self._worker: Worker | None = None
        self._proven = False  # a probe came back once: the path delivers
        self._connected = False  # this connection got to listening
        self._listening = False
        self._fell_back = False

    @property
    def listening(self) -> bool:
        """Whether notifications are being received right now."""
        return self._listening

    @property
    def fell_back(self) -> bool:
        """Whether the listener gave up for good (waiters poll)."""
        return self._fell_back

    def start(self) -> None:
        self._worker = spawn(self._run, name="worklease-release-listener")

    def stop(self) -> None:
        """Stop listening and close the connection (idempotent)."""
        self._stop.set()
        worker = self._worker
        if worker is not None:
            cancel_worker(worker)
        self._pool.close()  # also fails a wait for a connection at once
        if worker is not None:
            join_all([worker], timeout=_STOP_TIMEOUT)

    def _run(self) -> None:
        base = self.backoff.initial
        announced = False
        while not self._stop.is_set():
            try:
                self._pool.open()
                if not self._session():
                    self._pool.close()  # gave up: hand the connection back for good
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
        with self._pool.connection() as conn:
            if not conn.autocommit:
                conn.set_autocommit(True)
            try:
                conn.execute(_LISTEN)
            except psycopg.Error as exc:
                if map_error(exc, "listen").transient:
                    raise
                self._fall_back(f"LISTEN failed: {_describe(exc)}")
                return False
            if not self._probe(conn):
                if self._proven:  # it worked before: treat as a connection problem
                    raise TimeoutError("the probe notification did not come back")
                self._fall_back(
                    f"a notification sent to {RELEASE_CHANNEL!r} did not come back within "
                    f"{self.probe_timeout:g}s (a transaction-pooling proxy in between?)"
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

    def _probe(self, conn: Connection[Any]) -> bool:
        """Whether a notification this connection sends itself comes back in time."""
        payload = _PROBE_PREFIX + uuid.uuid4().hex
        self._send_probe(conn, payload)
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
        conn.execute(query)

    def _deliver(self, channel: str, payload: str) -> None:
        if channel != RELEASE_CHANNEL or payload.startswith(_PROBE_PREFIX):
            return
        try:
            self._hub.publish(payload)
        except Exception:  # never let one waiter's trouble stop the listener
            logger.exception("worklease: waking the watches of %r failed", payload)

    def _fall_back(self, reason: str) -> None:
        self._fell_back = True
        logger.warning(
            "worklease: release notifications are unavailable (%s); waiting acquires, "
            "leaders and pools fall back to polling",
            reason,
        )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
