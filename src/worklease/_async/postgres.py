"""The PostgreSQL backend (psycopg 3 + psycopg_pool)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from datetime import timedelta
from inspect import isawaitable
from types import TracebackType
from typing import Any

import psycopg
from psycopg import AsyncClientCursor, AsyncConnection, AsyncCursor, pq
from psycopg import errors as pg_errors
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from .._acompat import ACancelGuard, ThreadLock
from .._cancel_watch import CancelTicket, watch_connection, watch_statement
from .._deadline import cut_off, seconds_left
from .._failures import closed, commit_unknown, fenced, lease_lapsed
from .._fairshare import PoolSurvey
from .._migrations import (
    MIGRATE_LOCK,
    SchemaState,
    newer_error,
    older_warning,
    pending_statements,
    probe_statement,
)
from .._models import Checkpoint, ExitMode, Token
from .._pg import (
    CONNECTION_TRAITS,
    DIRECT_SLOTS,
    READ_ONLY_CAUSE,
    RENEWAL_POOL_SIZE,
    ConnectionTraits,
    PoolTrouble,
    Rows,
    Statements,
    check_conninfo,
    check_listen_dsn,
    check_prepare,
    check_schema_name,
    connection_error,
    known_traits,
    learn_traits,
    lost_connection,
    map_error,
    must_discard,
    prepares,
    read_only_error,
    renewal_bounds,
    single_statement,
    statement_timeout,
    tx_begin,
)
from .._validation import (
    backend_ttl,
    check_exit_mode,
    check_flag,
    check_work_id,
    distinct_work_ids,
    non_negative_seconds,
    normalize_state,
)
from .._window import monotonic
from ..errors import BackendError, BackendRequiredError, ConfigError, LeaseLostError
from .backend import StateLike
from .listener import AsyncReleaseListener
from .watch import AsyncReleaseHub, AsyncReleaseWatch

__all__ = ["AsyncPostgresBackend", "migrate_table", "probe_schema", "run_statement"]

logger = logging.getLogger("worklease")

_CURRENT_SCHEMA = b"SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SELECT current_schema()"

_BYPASS_AFTER = 0.25
"""How long a call waits for a pool before it may go around it (renewals always, others
while the pool is failing)."""
_DEFAULT_MIN_SIZE = 4
"""psycopg_pool's default ``min_size``."""
_TROUBLED_WAIT = 0.02
"""How long a call waits for a pool judged failing before it goes around it."""
_SLOT_WAIT = 0.1
"""How long a call waits for a failing pool while the direct slots are taken, or before a
direct attempt is tried again."""
_DIRECT_RETRY = 0.1
"""How soon a call tries a connection of its own again after a transient failure."""
_SPARE_IDLE = 5.0
"""How long a direct connection is kept for the next call going around a failing pool."""
_LOSS_READ_TIMEOUT = 5.0
"""How long a failed step waits for a connection to read why it failed."""


class AsyncPostgresBackend:
    """Lease rows in a PostgreSQL table, shared by every process (and both flavours).

    Takes the application's connection pool (it is never closed by the backend), or build one
    with :meth:`connect`, which the backend then owns and closes. ``schema`` names the
    PostgreSQL schema holding the tables (default: the connection's ``search_path``). Create
    the tables first with :meth:`apply_schema` or ``worklease migrate``.

    Every operation is a single statement sent in one round trip in autocommit mode and runs
    READ COMMITTED; expiry is decided by the database clock. Statements use server-side
    parameters. With ``prepare=None`` (the default) their plans are prepared once per
    connection only where the connection reaches PostgreSQL directly; behind a proxy (a
    pooler such as PgBouncer, told by the server process answering differing from the one in
    the connection's cancel key, asked once per connection) they go unprepared, which is safe
    where the pooler lends server sessions to other clients, and one warning per route says
    so. ``prepare=True`` prepares on every route: for poolers that keep prepared statements
    per client (PgBouncer 1.21 or later with ``max_prepared_statements > 0``) or pool whole
    sessions. A connection whose ``prepare_threshold`` is ``None`` is honoured in both. A
    connection whose default isolation is not READ COMMITTED gets the statement as a simple
    query pinned to READ COMMITTED instead; ``prepare=False`` sends every statement that
    way. Renewals, and a pool's surveys,
    batched acquires and batched releases, use a small private pool (up to four connections,
    built from the application pool's conninfo and kwargs, on the schema the application's
    connections resolve) so they keep working when the application exhausts its own pool;
    each renewal statement is bounded by a ``statement_timeout`` of one TTL. Driver errors are
    raised as ``BackendError`` (with ``transient`` set for connection loss, restarts,
    timeouts, serialization failures and pool timeouts), chained to the driver's exception.

    Releases and forgets NOTIFY the channel ``worklease_release`` with the work ID. With
    ``listen`` (the default) the backend LISTENs on one more dedicated connection (built like
    the renewal pool's, opened at the first waiting acquire, leader or pool), so their waits
    end the moment a holder in any process releases, instead of at their next poll. A lost
    connection is replaced with a backoff; when notifications cannot work (LISTEN refused, or
    a test notification does not come back, as behind a transaction-pooling proxy such as
    PgBouncer in transaction mode) one warning is logged and waits fall back to polling.
    ``listen_dsn`` gives the listener its own route to the server (a conninfo string, for
    example straight to PostgreSQL past a transaction pooler), keeping handoff instant behind
    one. ``listen=False`` never listens.
    """

    __module__ = "worklease"

    @property
    def _worklease_self_bounded(self) -> bool:
        # A call inside a cut-off (worklease._deadline.SELF_BOUNDED) hands control back by
        # it: its pool checkout is bounded, and its connection is shut down if it has not
        # answered (_cancel_watch.watch_connection). A thread then makes a hold's final
        # writes itself. Not when the pool checks each connection it hands out with a check
        # of its own: that round trip, made inside the checkout, cannot be cut off.
        return getattr(self._pool, "_check", None) in (None, check_within_cut_off)

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        schema: str | None = None,
        listen: bool = True,
        listen_dsn: str | None = None,
        prepare: bool | None = None,
    ) -> None:
        if pool is None:
            raise BackendRequiredError("a connection pool is required")
        if not isinstance(pool, AsyncConnectionPool):
            raise ConfigError(
                f"expected a psycopg_pool pool of this flavour, not {type(pool).__name__}"
            )
        self._pool = pool
        self._statements = Statements(check_schema_name(schema))
        self._owns_pool = False
        self._renewal_pool: AsyncConnectionPool[Any] | None = None
        self._renewal_statements: Statements | None = None
        self._schema_checked = False  # the table's schema version, read at first use
        self._lock = ThreadLock()
        self._detour = _Detour()  # around the application's pool
        self._renewal_detour = _Detour()  # around the private one
        self._closed = False
        try:
            self._listen = check_flag(listen, "listen")
        except TypeError as exc:
            raise ConfigError(str(exc)) from None
        self._listen_dsn = check_listen_dsn(listen_dsn, self._listen)
        self._prepare = check_prepare(prepare)
        self._hub = AsyncReleaseHub()
        self._listener: AsyncReleaseListener | None = None

    @property
    def write_lanes(self) -> int:
        """How many writes this backend runs at once: the application pool's ``max_size``.
        A lease's concurrent checkpoints go alone while fewer are in flight; only callers
        beyond it are grouped into one statement (group commit)."""
        return self._pool.max_size

    @classmethod
    def connect(
        cls,
        conninfo: str = "",
        *,
        schema: str | None = None,
        listen: bool = True,
        listen_dsn: str | None = None,
        prepare: bool | None = None,
        **pool_kwargs: Any,
    ) -> AsyncPostgresBackend:
        """A backend that owns a new pool built from ``conninfo`` (libpq settings and the
        standard ``PG*`` environment variables apply). ``pool_kwargs`` go to the pool; the pool
        opens on first use (or on entering the backend's context) and closes with the backend.
        A ``max_size`` below psycopg_pool's default ``min_size`` (4) lowers ``min_size`` with
        it. A ``conninfo`` libpq cannot parse is a ``ConfigError`` here; wrong credentials or
        an unknown database surface at the first call, as a permanent ``BackendError``.
        """
        check_conninfo(conninfo)
        kwargs = dict(pool_kwargs.pop("kwargs", None) or {})
        kwargs["autocommit"] = True
        pool_kwargs.setdefault("check", check_within_cut_off)
        max_size = pool_kwargs.get("max_size")
        if "min_size" not in pool_kwargs and isinstance(max_size, int) and max_size >= 1:
            # psycopg_pool's min_size defaults to 4: a smaller max_size alone must not fail
            pool_kwargs["min_size"] = min(max_size, _DEFAULT_MIN_SIZE)
        pool_kwargs.setdefault("name", "worklease")
        try:
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                conninfo, open=False, kwargs=kwargs, **pool_kwargs
            )
        except (TypeError, ValueError) as exc:  # a builder: the argument-error rule
            raise ConfigError(f"connect: {exc}") from None
        backend = cls(pool, schema=schema, listen=listen, listen_dsn=listen_dsn, prepare=prepare)
        backend._owns_pool = True
        return backend

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        """The pool lease operations (other than renewals) use."""
        return self._pool

    @property
    def prepare(self) -> bool | None:
        """How statements are sent: ``None`` decides per connection, ``True`` always
        prepares, ``False`` sends simple queries (see the class docs)."""
        return self._prepare

    @property
    def schema(self) -> str | None:
        """The PostgreSQL schema holding the tables, or ``None`` for the search path."""
        return self._statements.schema

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the pool this backend owns (a no-op for a pool passed in).

        ``BackendError`` once the backend was closed: a closed backend does no more I/O.
        """
        if self._closed:
            raise closed("open")
        if self._owns_pool and self._pool.closed:
            await self._pool.open()

    async def close(self) -> None:
        """Close what this backend created (its own pool, its renewal pool, its listener),
        never the caller's pool. Idempotent. Afterwards every operation raises
        ``BackendError`` without any I/O and ``watch_releases`` returns ``None``."""
        self._closed = True
        with self._lock:
            renewal_pool, self._renewal_pool = self._renewal_pool, None
            listener, self._listener = self._listener, None
        if listener is not None:
            await listener.stop()
        await self._detour.close()
        await self._renewal_detour.close()
        if renewal_pool is not None:
            await renewal_pool.close()
        if self._owns_pool:
            await self._pool.close()

    async def __aenter__(self) -> AsyncPostgresBackend:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} schema={self.schema!r} pool={self._pool.name!r}>"

    @staticmethod
    async def apply_schema(
        conn_or_pool: AsyncConnection[Any] | AsyncConnectionPool[Any],
        *,
        schema: str | None = None,
    ) -> int:
        """Bring the worklease schema to the current version: create the table, sequence,
        index and fence function if missing, or run the steps an older table lacks, then
        record the version on the table (idempotent; no step drops data).

        Runs in one transaction under an advisory lock, so concurrent migrations do not race.
        Returns the version the table was at before (0: there was none). A table recording a
        version newer than this worklease knows is left untouched (``BackendError``), as are
        driver errors (raised as ``BackendError``).
        """
        name = check_schema_name(schema)
        try:
            if isinstance(conn_or_pool, AsyncConnectionPool):
                guard = ACancelGuard()
                async with conn_or_pool.connection() as conn:
                    guard.check()
                    return (await migrate_table(conn, name, "apply_schema")).version
            return (await migrate_table(conn_or_pool, name, "apply_schema")).version
        except psycopg.Error as exc:
            raise map_error(exc, "apply_schema") from exc

    # -- plumbing -----------------------------------------------------------------------------

    async def _ensure_renewal_pool(self) -> AsyncConnectionPool[Any]:
        with self._lock:
            if self._closed:
                raise closed("renew")
            pool = self._renewal_pool
            if pool is None:
                # Same settings as the application's pool (conninfo and kwargs may be
                # callables; they are passed through as they are).
                pool = AsyncConnectionPool(
                    self._pool.conninfo,
                    kwargs=self._pool.kwargs,
                    connection_class=self._pool.connection_class,
                    min_size=1,
                    max_size=RENEWAL_POOL_SIZE,
                    open=False,
                    # No check on checkout: psycopg_pool sleeps a second or more after a
                    # failed check, which can exceed a short lease window. A renewal whose
                    # connection died fails fast, the connection is discarded (see _run) and
                    # the renewal loop retries on a fresh one within its backoff.
                    check=None,
                    name="worklease-renewal",
                )
                self._renewal_pool = pool
        if pool.closed:
            await pool.open()
        return pool

    def _learn_schema(self, schema: str | None) -> None:
        """Fix the table renewals use to the schema the application's connections resolve.

        The renewal pool copies the application pool's conninfo and kwargs but not its
        ``configure`` callback, so an unqualified table name could resolve elsewhere through
        another ``search_path``. The acquire statement reports ``current_schema()``.
        """
        if self._statements.schema is not None or not schema:
            self._renewal_statements = self._statements
        else:
            self._renewal_statements = Statements(schema)

    async def _renewal_target(self) -> Statements:
        statements = self._renewal_statements
        if statements is None:  # a renewal before any acquire through this backend
            rows, _ = await self._run("renew", _CURRENT_SCHEMA, {})
            self._learn_schema(Statements.current_schema(rows))
            statements = self._renewal_statements
            assert statements is not None
        return statements

    async def _run(
        self,
        operation: str,
        statement: bytes,
        params: dict[str, Any],
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        timeout: float | None = None,
        bound: float | None = None,
        deadline_bound: bool = False,
        bypass: bool = False,
    ) -> tuple[Rows, int]:
        """Execute one statement on a pooled connection; return the rows and row count of
        its last result. ``timeout`` bounds the wait for a connection; ``bound`` (seconds)
        the statement itself; with ``deadline_bound`` the statement is bounded by what is
        left of the caller's deadline once the connection is there (so a slow checkout does
        not leave the statement more time than its caller). With ``bypass`` (renewals), or
        when the pool is failing, a pool that has no connection to give within
        ``_BYPASS_AFTER`` seconds is gone around: the statement runs on a connection of its
        own, opened with the pool's settings (see :meth:`_checkout`)."""
        if self._closed:
            raise closed(operation)
        if pool is None:
            pool = self._pool
            if self._owns_pool and pool.closed:
                await self.open()
        left = seconds_left() if deadline_bound else None
        if left is not None:
            timeout = max(left, 0.001) if timeout is None else min(timeout, max(left, 0.001))
        single = single_statement(statement) if self._prepare is not False else None
        if left is not None or bound is not None:
            statement = self._statements.bounded(statement)
        # A thread's final writes must hand control back by this moment (_compat.cleanup):
        # the connection is cut off if it has not answered by then, and no connection of its
        # own is opened meanwhile (libpq's connect timeout counts in whole seconds).
        cut = cut_off()
        try:
            conn, direct = await self._checkout(
                pool, timeout, bypass, operation, may_detour=cut is None
            )
            cutter: CancelTicket | None = None
            try:
                if cut is not None:
                    cutter = watch_connection(conn, cut - monotonic())
                if not self._schema_checked:
                    await self._check_schema(conn, operation)
                if left is not None:
                    # What is left once the connection is there: a slow checkout never
                    # leaves the statement more time than its caller.
                    bound = seconds_left() or 0.0
                # On a connection used once, a prepared plan is wasted: a simple query.
                return await run_statement(
                    conn,
                    operation,
                    statement,
                    params,
                    bound,
                    None if direct else single,
                    self._prepare,
                    watched=cutter is not None,
                )
            except psycopg.Error as exc:
                if lost_connection(exc):
                    self._detour_of(pool).trouble.connection_lost()
                raise
            finally:
                if cutter is not None:
                    cutter.done()  # before the connection can go back to anybody
                    if not cutter.reusable:  # cut off, perhaps just after it answered
                        conn.pgconn.finish()
                await self._checkin(pool, conn, direct)
        except psycopg.Error as exc:
            raise map_error(exc, operation) from exc

    async def _check_schema(self, conn: AsyncConnection[Any], operation: str) -> None:
        """Read the table's schema version on this backend's first call (the calls that
        start before it answers ask too): a table newer than this worklease is refused
        (``BackendError``), an older one logged once as a warning. A missing table is left to
        the call's own statement (its error names the fix) and asked about again next time.
        Once answered, the backend does not ask again: a later migration by a newer release
        is met by the processes started after it."""
        schema = self._statements.schema
        autocommit = conn.autocommit
        if not autocommit:  # one statement, no transaction block (as every lease call)
            await conn.set_autocommit(True)
        try:
            state = await probe_schema(conn, schema)
        finally:
            if not autocommit:
                await conn.set_autocommit(False)
        if state.newer:
            raise newer_error(state, schema or state.namespace, operation)
        if state.exists:
            with self._lock:  # calls that began together probed together: one warning
                first, self._schema_checked = not self._schema_checked, True
            if first and not state.current:
                logger.warning(older_warning(state, schema or state.namespace))

    def _detour_of(self, pool: AsyncConnectionPool[Any]) -> _Detour:
        return self._renewal_detour if pool is self._renewal_pool else self._detour

    async def _checkout(
        self,
        pool: AsyncConnectionPool[Any],
        timeout: float | None,
        bypass: bool,
        operation: str,
        *,
        may_detour: bool = True,
    ) -> tuple[AsyncConnection[Any], bool]:
        """A connection of ``pool`` within ``timeout`` seconds (the pool's own timeout by
        default), or one of its own (``True`` beside it: give it back with
        :meth:`_checkin`). The pool is gone around (``_Detour``) when it has none to give
        within ``_BYPASS_AFTER`` seconds and ``bypass`` is set (renewals) or the pool is
        failing (``PoolTrouble``): after a failover psycopg_pool reconnects on a backoff that
        starts at 1 s and doubles; with wrong credentials it never connects, and the direct
        attempt says why at once (a permanent error is raised then). A transient direct
        failure ends a renewal at once (its loop retries); any other call tries again every
        ``_DIRECT_RETRY`` seconds while it waits for the pool, and at the end the last one is
        raised, naming why. A pool that is only busy is
        waited for, in its queue. Without ``may_detour`` the pool is only waited for."""
        guard = ACancelGuard()
        detour = self._detour_of(pool)
        trouble = detour.trouble
        now = monotonic()
        end = now + (pool.timeout if timeout is None else timeout)
        wait = _TROUBLED_WAIT if trouble.suspected() else _BYPASS_AFTER
        failure: BackendError | None = None
        retry_at = now
        while True:
            rest = end - monotonic()
            last = rest <= wait
            try:
                conn = await pool.getconn(max(rest, 0.001) if last else wait)
            except PoolTimeout:
                if last:
                    if failure is not None:
                        raise failure from None
                    raise
            else:
                try:
                    guard.check()  # a cancellation the checkout lost is raised here
                except BaseException:
                    await pool.putconn(conn)
                    raise
                now = monotonic()
                if trouble.serve(now):
                    trouble.baseline(pool.get_stats(), now)
                    if detour.has_spares:  # the pool serves again: spares idle too long go
                        await detour.prune(now)
                return conn, False
            now = monotonic()
            rest = end - now
            if not may_detour or not (bypass or trouble.judge(pool.get_stats())):
                wait = rest  # busy, not failing: wait for it as any caller of it would
                continue
            if now >= retry_at and detour.take_slot():
                try:
                    return await detour.connection(pool, rest, operation), True
                except BackendError as exc:
                    # Renewals fail at once, as before: their loop paces the retries and
                    # reports each attempt.
                    if not exc.transient or bypass:
                        raise
                    failure = exc  # the server may be back soon: the pool, or a retry
                    retry_at = monotonic() + _DIRECT_RETRY
            wait = _SLOT_WAIT

    async def _checkin(
        self,
        pool: AsyncConnectionPool[Any],
        conn: AsyncConnection[Any],
        direct: bool,
        *,
        keep: bool = True,
    ) -> None:
        """Give back what :meth:`_checkout` gave; a direct connection is kept as a spare
        (``keep``: not after a transactional step, whose statements may have changed the
        session)."""
        if direct:
            await self._detour_of(pool).give(conn, keep=keep and not self._closed)
        else:
            await pool.putconn(conn)

    # -- the backend protocol -----------------------------------------------------------------

    async def acquire(self, work_id: str, holder_id: str, ttl: float) -> Token:
        token, _ = await self._acquire(work_id, holder_id, ttl, reading=False)
        return token

    async def acquire_with_checkpoint(
        self, work_id: str, holder_id: str, ttl: float
    ) -> tuple[Token, Checkpoint]:
        """Acquire and return the new holder's checkpoint in the same statement (optional
        method of the backend protocol; the runner and ``hold()`` use it)."""
        token, prior = await self._acquire(work_id, holder_id, ttl, reading=True)
        assert prior is not None
        return token, prior

    async def _acquire(
        self, work_id: str, holder_id: str, ttl: float, *, reading: bool
    ) -> tuple[Token, Checkpoint | None]:
        check_work_id(work_id)
        statements = self._statements
        params: dict[str, Any] = {
            "work_id": work_id,
            "holder_id": holder_id,
            "ttl": statements.ttl(backend_ttl(ttl)),
        }
        # Bounded by the caller's deadline (a waiting acquire's timeout): the server ends a
        # statement stuck on a locked row in time, and it rolls back.
        statement = statements.acquire_statement(reading=reading)
        for _ in range(2):  # once more if the work ID was free again by the read below
            rows, _ = await self._run("acquire", statement, params, deadline_bound=True)
            grant = statements.acquired(rows, work_id, holder_id, reading=reading)
            if grant is not None:
                if self._renewal_statements is None:
                    self._learn_schema(grant.schema)  # free: the acquire statement reports it
                return grant.token, grant.prior
            # Refused: who holds it (a second statement, on this path only).
            rows, _ = await self._run(
                "acquire", statements.holder, {"work_id": work_id}, deadline_bound=True
            )
            refusal = statements.held_by(rows, work_id)
            if refusal is not None:
                raise refusal
        raise statements.held_meanwhile(work_id)

    async def acquire_many(
        self, work_ids: Sequence[str], holder_id: str, ttl: float
    ) -> list[tuple[Token, Checkpoint]]:
        """Acquire every free work ID of ``work_ids`` in one statement and return the grants
        with the new holder's checkpoints, in input order; held ones are left out (optional
        method of the backend protocol)."""
        ids = distinct_work_ids(work_ids)
        interval = Statements.ttl(backend_ttl(ttl))
        if not ids:
            return []
        # Coordination traffic goes through the private pool, as renewals do: a pool's work
        # functions keeping the application's pool busy must not hold up its scan.
        statements = await self._renewal_target()
        rows, _ = await self._run(
            "acquire_many",
            statements.acquire_many,
            {"work_ids": ids, "holder_id": holder_id, "ttl": interval},
            pool=await self._ensure_renewal_pool(),
        )
        grants, _ = statements.granted_many(rows, holder_id)
        return grants

    async def find_available(self, work_ids: Sequence[str]) -> list[str]:
        """The work IDs of ``work_ids`` that ``acquire`` would grant now, in input order; writes
        nothing (optional method of the backend protocol)."""
        ids = distinct_work_ids(work_ids)
        if not ids:
            return []
        rows, _ = await self._run(
            "find_available", self._statements.find_available, {"work_ids": ids}
        )
        return [row[0] for row in rows]

    def watch_releases(self, work_ids: Iterable[str]) -> AsyncReleaseWatch | None:
        """A watch woken when one of ``work_ids`` is released or forgotten through any backend
        on this database (optional method of the backend protocol); ``None`` with
        ``listen=False``, once closed, or once the listener found that notifications cannot
        work on this route (see the class docs). The first call starts listening."""
        if not self._listen or self._closed:
            return None
        with self._lock:
            listener = self._listener
            if self._closed or (listener is not None and listener.fell_back):
                return None
            start = listener is None
            if listener is None:
                listener = self._listener = AsyncReleaseListener(
                    self._pool, self._hub, self._listen_dsn
                )
        watch = self._hub.watch(work_ids)
        if start:
            listener.start()
        return watch

    def transaction(self, token: Token) -> AsyncPostgresTransaction:
        """A transactional step on a connection of the application's pool (optional method
        of the backend protocol; ``lease.transaction(token)`` is the way to use it)."""
        if self._closed:
            raise closed("transaction")
        return AsyncPostgresTransaction(self, token)

    async def read_checkpoint(self, token: Token) -> Checkpoint:
        rows, _ = await self._run(
            "read_checkpoint", self._statements.read_checkpoint, {"work_id": token.work_id}
        )
        return self._statements.checkpoint_row(rows, token)

    async def checkpoint(self, token: Token, state: StateLike | None, ttl: float) -> None:
        statements = self._statements
        params = statements.owned(token)
        params["state"] = normalize_state(state)
        params["ttl"] = statements.ttl(backend_ttl(ttl))
        rows, _ = await self._run("checkpoint", statements.checkpoint, params, deadline_bound=True)
        if not statements.written(rows):
            raise await self._not_written(statements, token, "checkpoint")

    async def checkpoint_many(
        self, items: Sequence[tuple[Token, StateLike | None]], ttl: float
    ) -> list[LeaseLostError | None]:
        """Checkpoint every ``(token, state)`` in one statement; per item ``None`` or the
        error ``checkpoint`` would raise (optional method of the backend protocol)."""
        distinct_work_ids([token.work_id for token, _ in items])
        states = [normalize_state(state) for _, state in items]
        interval = Statements.ttl(backend_ttl(ttl))
        if not items:
            return []
        statements = self._statements
        tokens = [token for token, _ in items]
        params = statements.batch_params(tokens)
        params["states"] = states
        params["ttl"] = interval
        rows, _ = await self._run(
            "checkpoint_many", statements.checkpoint_many, params, deadline_bound=True
        )
        return statements.renewed_many(rows, tokens, "checkpoint")

    async def renew(self, token: Token, ttl: float) -> None:
        seconds = backend_ttl(ttl)
        statements = await self._renewal_target()
        params = statements.owned(token)
        params["ttl"] = statements.ttl(seconds)
        pool = await self._ensure_renewal_pool()
        timeout, bound = renewal_bounds(seconds)
        rows, _ = await self._run(
            "renew",
            statements.renew,
            params,
            pool=pool,
            timeout=timeout,
            bound=bound,
            bypass=True,
        )
        if not statements.written(rows):
            raise await self._not_written(statements, token, "renew", pool, seconds)

    async def renew_many(self, tokens: Sequence[Token], ttl: float) -> list[LeaseLostError | None]:
        """Renew every token in one statement on the renewal pool; per token ``None`` or the
        error ``renew`` would raise (optional method of the backend protocol)."""
        distinct_work_ids([token.work_id for token in tokens])
        seconds = backend_ttl(ttl)
        if not tokens:
            return []
        statements = await self._renewal_target()
        params = statements.batch_params(tokens)
        params["ttl"] = statements.ttl(seconds)
        pool = await self._ensure_renewal_pool()
        timeout, bound = renewal_bounds(seconds)
        rows, _ = await self._run(
            "renew_many",
            statements.renew_many,
            params,
            pool=pool,
            timeout=timeout,
            bound=bound,
            bypass=True,
        )
        return statements.renewed_many(rows, tokens)

    async def release(self, token: Token, mode: ExitMode) -> None:
        declared = check_exit_mode(mode)
        statements = self._statements
        params = statements.owned(token)
        params["mode"] = str(declared)
        rows, _ = await self._run("release", statements.release, params, deadline_bound=True)
        if not statements.written(rows):
            raise await self._not_written(statements, token, "release")

    async def _not_written(
        self,
        statements: Statements,
        token: Token,
        operation: str,
        pool: AsyncConnectionPool[Any] | None = None,
        within: float | None = None,
    ) -> LeaseLostError:
        """Why an owned write changed nothing (one more read, only on this path; a
        renewal's within its TTL)."""
        rows, _ = await self._run(
            operation,
            statements.owned_row,
            statements.owned(token),
            pool=pool,
            timeout=None if within is None else max(within, 0.001),
            bound=within,
            deadline_bound=within is None,  # within the caller's deadline, if any
        )
        return statements.not_written(rows, token, operation)

    async def release_many(
        self, tokens: Sequence[Token], mode: ExitMode
    ) -> list[LeaseLostError | None]:
        """Release every token with ``mode`` in one statement; per token ``None`` or the error
        ``release`` would raise (optional method of the backend protocol)."""
        declared = check_exit_mode(mode)
        distinct_work_ids([token.work_id for token in tokens])
        if not tokens:
            return []
        statements = await self._renewal_target()
        params = statements.batch_params(tokens)
        params["mode"] = str(declared)
        rows, _ = await self._run(
            "release_many",
            statements.release_many,
            params,
            pool=await self._ensure_renewal_pool(),
            deadline_bound=True,  # as release: a round is bounded by its callers' deadlines
        )
        return statements.renewed_many(rows, tokens, "release")

    async def survey(self, work_ids: Sequence[str], prefix: str) -> PoolSurvey:
        """Which of ``work_ids`` are free, how many each holder holds, and the live leases
        under ``prefix`` with their checkpoints, in one read (optional method of the backend
        protocol; fair-share pools use it)."""
        ids = distinct_work_ids(work_ids)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        statements = await self._renewal_target()
        rows, _ = await self._run(
            "survey",
            statements.survey_statement(prefix),
            {"work_ids": ids, "prefix": prefix},
            pool=await self._ensure_renewal_pool(),
        )
        return Statements.surveyed(rows)

    async def forget(self, token: Token) -> None:
        rows, _ = await self._run("forget", self._statements.forget, Statements.owned(token))
        if not rows:
            raise fenced(token, "forget")

    async def expire(self, work_id: str) -> bool:
        """End the current grant of ``work_id`` now (an operator's action, optional method):
        its token is replaced by a greater one nobody holds, so the holder's next write is
        fenced, and the next acquire reads the previous exit ``expired``. ``False`` when the
        work ID is not held (nothing changes)."""
        check_work_id(work_id)
        rows, _ = await self._run("expire", self._statements.expire, {"work_id": work_id})
        return bool(rows)

    async def rows(self) -> list[dict[str, Any]]:
        """Every lease row, as a plain dict per work ID (the keys of the etcd and Redis
        backends' ``rows()``, for tools and the operator console): holder, token, held, the
        TTL left in seconds (the server's clock), checkpoint size, exit fields and the last
        write's time."""
        rows, _ = await self._run(
            "status", self._statements.status, {"pattern": None, "state": None}
        )
        found = []
        for record in Statements.status_rows(rows):
            held = record.state == "held"
            found.append(
                {
                    "work_id": record.work_id,
                    "holder_id": record.holder_id,
                    "fencing_token": record.fencing_token,
                    "held": held,
                    "ttl_left": max(float(record.expires_in), 0.0) if held else None,
                    "checkpoint_bytes": record.checkpoint_size,
                    "exit_mode": record.exit_mode,
                    "prev_exit": record.prev_exit,
                    "prev_holder_id": record.prev_holder_id,
                    "updated_at": record.updated_at,
                }
            )
        return found

    async def sweep(self, retention: float, include_expired: bool) -> int:
        params = {
            "retention": timedelta(seconds=non_negative_seconds(retention, "retention")),
            "include_expired": check_flag(include_expired, "include_expired"),
        }
        # In batches, each its own autocommit statement: a batch's locks last one batch,
        # and the rows an acquire is locking are skipped (see Statements.sweep).
        statements = self._statements
        deleted = 0
        after: str | None = statements.SWEEP_START
        while after is not None:
            window = statements.sweep_window(after)
            rows, _ = await self._run("sweep", statements.sweep, {**params, **window})
            count, after = statements.swept(rows)
            deleted += count
        return deleted


class AsyncPostgresTransaction:
    """One transactional step: a connection checked out of the application's pool for the
    duration, an explicit READ COMMITTED transaction, the guard and COMMIT at the end."""

    def __init__(self, backend: AsyncPostgresBackend, token: Token) -> None:
        self._backend = backend
        self._token = token
        self._statements = backend._statements
        self._pool = backend.pool
        self._conn: AsyncConnection[Any] | None = None
        self._restore_autocommit = False
        self._restore_threshold: int | None = None
        self._direct = False

    @property
    def connection(self) -> AsyncConnection[Any]:
        if self._conn is None:
            raise RuntimeError("the transaction is not open")
        return self._conn

    async def begin(self, limit: float | None) -> None:
        backend = self._backend
        if backend._closed:
            raise closed("transaction")
        await backend.open()
        try:
            # Around a failing pool as a single statement goes (the step holds the slot).
            conn, self._direct = await backend._checkout(self._pool, None, False, "transaction")
            self._conn = conn
            if not conn.autocommit:  # BEGIN and COMMIT are sent explicitly
                await conn.set_autocommit(True)
                self._restore_autocommit = True
            # 0 = no bound (no renewal window to respect)
            bound = statement_timeout(limit) if limit is not None else "0"
            if backend.prepare is not False:
                # asked before BEGIN (once per connection), for the guard and for this:
                traits = await _traits(conn)
                if (
                    backend.prepare is None
                    and traits.proxied
                    and conn.prepare_threshold is not None
                ):
                    # Behind a pooler the user's own statements in the step must not be
                    # prepared either (a later step's may run on another server session):
                    # off for the step, as it was afterwards.
                    self._restore_threshold = conn.prepare_threshold
                    conn.prepare_threshold = None
            # Several statements in one simple query: never prepared.
            await AsyncCursor(conn).execute(tx_begin(bound), prepare=False)
        except BaseException as exc:
            await self._finish(discard=True)
            if isinstance(exc, psycopg.Error):
                raise map_error(exc, "transaction") from exc
            raise

    async def commit(self, state: bytes | None, write: bool, ttl: float) -> None:
        conn = self.connection
        params = self._statements.owned(self._token)
        params.update(write=write, state=state, ttl=Statements.ttl(backend_ttl(ttl)))
        mode = self._backend.prepare
        try:
            if mode is not False:
                prepared = prepares(mode, await _traits(conn), conn)
                cursor: AsyncCursor[Any] = AsyncCursor(conn)
                await cursor.execute(self._statements.tx_guard, params, prepare=prepared)
            else:
                cursor = AsyncClientCursor(conn)
                await cursor.execute(self._statements.tx_guard, params)
            guarded = cursor.rowcount == 1
        except BaseException as exc:
            await self.rollback(discard=not isinstance(exc, Exception))
            if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
                refused = await self._read_only_refusal()
                if refused is not None:  # a primary, read-only by its settings: for good
                    raise refused from exc
            if isinstance(exc, psycopg.Error):
                # Nothing was committed. Often the lease is why (the server ended a step that
                # outlived the TTL): say so, rather than the driver's words.
                loss = await self._loss()
                if loss is not None:
                    raise loss from exc
                raise map_error(exc, "transaction") from exc
            raise
        if not guarded:
            await self.rollback()
            raise await self._loss() or lease_lapsed(self._token, "transaction")
        try:
            await conn.commit()  # the driver's own COMMIT: no cursor to build
        except BaseException as exc:
            if isinstance(exc, psycopg.Error) and not (conn.closed or conn.broken):
                await self._finish(discard=False)  # the server refused: rolled back
                raise map_error(exc, "transaction") from exc
            # Lost, or interrupted, during COMMIT: the server may have committed.
            await self._finish(discard=True)
            if isinstance(exc, psycopg.Error):
                raise commit_unknown(self._token, exc) from exc
            exc.add_note(
                f"worklease: interrupted during the COMMIT of a step of {self._token.work_id!r}"
                ": whether it committed is unknown"
            )
            raise
        await self._finish(discard=False)

    async def _read_only_refusal(self) -> BackendError | None:
        """Why the guard was refused as read-only, asked on another connection (``None``: a
        standby, or it cannot be asked)."""
        try:
            rows, _ = await self._backend._run(
                "transaction", READ_ONLY_CAUSE, {}, timeout=_LOSS_READ_TIMEOUT
            )
        except BackendError:
            return None
        return read_only_error("transaction", rows)

    async def _loss(self) -> LeaseLostError | None:
        """Why the token can no longer commit, read on another connection (``None`` when it
        still could, or when that cannot be read either)."""
        try:
            rows, _ = await self._backend._run(
                "transaction",
                self._statements.tx_status,
                self._statements.owned(self._token),
                timeout=_LOSS_READ_TIMEOUT,
            )
        except BackendError:
            return None
        return Statements.step_loss(rows, self._token)

    async def rollback(self, *, discard: bool = False) -> None:
        """Undo the step and give the connection back (always, even when interrupted).
        ``discard``: drop the connection instead of sending ROLLBACK (the server aborts the
        transaction when the session ends): for an interrupted step, where waiting for an
        answer could hang."""
        conn = self._conn
        if conn is None:
            return
        drop = True
        try:
            if not discard and not conn.closed and not conn.broken:
                await AsyncClientCursor(conn).execute(b"ROLLBACK")
                drop = False
        except psycopg.Error:
            pass
        finally:
            await self._finish(discard=drop)

    async def _finish(self, *, discard: bool) -> None:
        """Give the connection back once: clean (autocommit as it was), or dropped so the pool
        replaces it (the socket is closed here; ``conn.close()`` would itself return the
        connection on a pool with ``close_returns``)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if discard or conn.closed or conn.broken:
                conn.pgconn.finish()
            else:
                if self._restore_threshold is not None:
                    conn.prepare_threshold = self._restore_threshold
                if self._restore_autocommit:
                    await conn.set_autocommit(False)
        except BaseException:
            conn.pgconn.finish()
            raise
        finally:
            await self._backend._checkin(self._pool, conn, self._direct, keep=False)


class _Detour:
    """Connections of their own for the calls a failing pool cannot serve (one per pool of a
    backend): at most ``DIRECT_SLOTS`` at once, each kept after its call for the next one
    while idle for less than ``_SPARE_IDLE`` seconds, so a pool in trouble costs a few
    connections, not one per call."""

    def __init__(self) -> None:
        self.trouble = PoolTrouble()
        self._lock = ThreadLock()
        self._in_use = 0
        self._spares: list[tuple[AsyncConnection[Any], float]] = []
        self._closed = False

    def take_slot(self) -> bool:
        with self._lock:
            if self._in_use >= DIRECT_SLOTS:
                return False
            self._in_use += 1
            return True

    async def connection(
        self, pool: AsyncConnectionPool[Any], timeout: float, operation: str
    ) -> AsyncConnection[Any]:
        """A spare connection or a new one, for the slot the caller took (given back here
        when this raises)."""
        try:
            now = monotonic()
            stale: list[AsyncConnection[Any]] = []
            spare: AsyncConnection[Any] | None = None
            with self._lock:
                while self._spares and spare is None:
                    conn, since = self._spares.pop()
                    if now - since > _SPARE_IDLE or conn.closed:
                        stale.append(conn)
                    else:
                        spare = conn
            for conn in stale:
                await conn.close()
            if spare is not None:
                return spare
            return await _connect_direct(pool, timeout, operation)
        except BaseException:
            self._release()
            raise

    async def give(self, conn: AsyncConnection[Any], *, keep: bool) -> None:
        """The slot back; ``conn`` kept as a spare when it is idle and healthy (``keep``)."""
        idle = not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE
        with self._lock:
            if keep and idle and not self._closed and len(self._spares) < DIRECT_SLOTS:
                self._spares.append((conn, monotonic()))
                self._in_use -= 1
                return
        try:
            await conn.close()
        finally:
            self._release()

    @property
    def has_spares(self) -> bool:
        return bool(self._spares)

    async def prune(self, now: float) -> None:
        """Close the spares idle for longer than ``_SPARE_IDLE``."""
        with self._lock:
            stale = [c for c, since in self._spares if now - since > _SPARE_IDLE]
            self._spares = [(c, t) for c, t in self._spares if now - t <= _SPARE_IDLE]
        for conn in stale:
            await conn.close()

    def _release(self) -> None:
        with self._lock:
            self._in_use -= 1

    async def close(self) -> None:
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
        for conn, _ in spares:
            await conn.close()


async def _connect_direct(
    pool: AsyncConnectionPool[Any], timeout: float | None, operation: str
) -> AsyncConnection[Any]:
    """A new connection built like ``pool``'s (conninfo, kwargs, connection class and its
    ``configure`` callback, which may set the ``search_path`` worklease's unqualified
    statements and a step's own rely on), in autocommit; a failed attempt as
    ``connection_error`` (permanent when it can never work)."""
    conninfo: Any = pool.conninfo
    kwargs: Any = pool.kwargs or {}
    # psycopg_pool 3.3 accepts callables for both (resolved per connection)
    if callable(conninfo):
        conninfo = conninfo()
        if isawaitable(conninfo):
            conninfo = await conninfo
    if callable(kwargs):
        kwargs = kwargs()
        if isawaitable(kwargs):
            kwargs = await kwargs
    kwargs = dict(kwargs)
    if timeout is not None:  # whole seconds, and libpq waits at least 2
        kwargs["connect_timeout"] = max(math.ceil(timeout), 2)
    try:
        conn: AsyncConnection[Any] = await pool.connection_class.connect(conninfo or "", **kwargs)
    except psycopg.Error as exc:
        raise connection_error(exc, operation) from exc
    try:
        # psycopg_pool keeps the callback as a private attribute; it is what its own
        # connections get before they are handed out.
        configure = getattr(pool, "_configure", None)
        if configure is not None:
            await configure(conn)
        if not conn.autocommit:
            await conn.set_autocommit(True)
    except BaseException:
        await conn.close()
        raise
    return conn


async def check_within_cut_off(conn: AsyncConnection[Any]) -> None:
    """psycopg_pool's connection check (``check_connection``: an empty query), as the pools
    of ``connect()`` run it before handing a connection out, bounded by the calling thread's
    cut-off (``worklease._deadline.cut_off``): a check still waiting then is cut off with its
    connection, which the pool discards; past the cut-off the check is left out (the call's
    own statement meets the cut at once)."""
    cut = cut_off()
    if cut is None:
        await AsyncConnectionPool.check_connection(conn)
        return
    left = cut - monotonic()
    if left <= 0:
        return
    cutter = watch_connection(conn, left)
    try:
        await AsyncConnectionPool.check_connection(conn)
    finally:
        cutter.done()
        if not cutter.reusable:
            conn.pgconn.finish()


async def run_statement(
    conn: AsyncConnection[Any],
    operation: str,
    statement: bytes,
    params: dict[str, Any],
    bound: float | None = None,
    single: bytes | None = None,
    prepare: bool | None = None,
    *,
    watched: bool = False,
) -> tuple[Rows, int]:
    """Execute one worklease statement on ``conn`` in autocommit; return the rows and row
    count of its last result. ``single`` (the statement without its isolation pin) goes
    alone through the extended protocol when the connection reads committed by default and
    its session has no shorter ``statement_timeout`` than ``bound``, bounded by a cancel
    request after ``bound`` seconds (unless ``watched``: the connection is cut off at its
    caller's moment, ``watch_connection``, which cancels what it runs then); it is
    prepared as ``prepares(prepare, ...)`` decides (``None``: only where the connection
    reaches the server directly); otherwise
    ``statement`` goes as a simple query (parameters bound client-side; with ``bound`` it is
    the bounded text and gets its ``statement_timeout``). A connection left in an unknown
    state is closed; driver errors are raised as they are (``map_error``), a statement
    cancelled at its bound as a transient ``BackendError``."""
    restore = not conn.autocommit
    ticket: CancelTicket | None = None
    try:
        if restore:
            await conn.set_autocommit(True)
        traits = None
        if single is not None:
            # Asked once per connection: known from then on, without a call to wait for.
            traits = known_traits(conn) or await _traits(conn)
        if single is not None and traits is not None and traits.extended(bound):
            cursor: AsyncCursor[Any] = AsyncCursor(conn, row_factory=tuple_row)
            if bound is not None and not watched:
                ticket = watch_statement(conn, bound)
            await cursor.execute(single, params, prepare=prepares(prepare, traits, conn))
            if ticket is not None:
                ticket.done()
        else:
            if bound is not None:
                params["statement_timeout"] = statement_timeout(bound)
            cursor = AsyncClientCursor(conn, row_factory=tuple_row)
            await cursor.execute(statement, params)
            while cursor.nextset():
                pass
        result = cursor.pgresult
        rows = await cursor.fetchall() if result and result.ntuples else []
        if ticket is not None and not ticket.reusable:
            conn.pgconn.finish()  # a cancel that lost the race may still reach it
        return rows, cursor.rowcount
    except BaseException as exc:
        if ticket is not None:
            ticket.done()  # before the connection can go back to anybody
            if not ticket.reusable and not conn.closed:
                conn.pgconn.finish()
        if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
            refused = await _read_only_refusal(conn, operation)
            if refused is not None:  # a primary, read-only by its settings: for good
                raise refused from exc
        if must_discard(exc):
            # Never hand back a connection in an unknown state; closing the socket (not
            # conn.close(), which a pool with close_returns would take back) lets the pool
            # see it is gone.
            conn.pgconn.finish()
        if ticket is not None and ticket.fired and isinstance(exc, pg_errors.QueryCanceled):
            raise BackendError(
                f"{operation}: cancelled by worklease: still running {bound:.3g} s after it "
                "started, the bound of its call",
                transient=True,
            ) from exc
        raise
    finally:
        if restore and not conn.closed:
            await conn.set_autocommit(False)


async def _read_only_refusal(conn: AsyncConnection[Any], operation: str) -> BackendError | None:
    """Why a write was refused as read-only, asked on the same connection: ``None`` on a
    standby (a failover: transient, the connection goes) or when that cannot be asked."""
    if conn.closed or conn.broken:
        return None
    try:
        cursor = AsyncClientCursor(conn, row_factory=tuple_row)
        await cursor.execute(READ_ONLY_CAUSE)
        return read_only_error(operation, await cursor.fetchall())
    except psycopg.Error:
        return None


async def _traits(conn: AsyncConnection[Any]) -> ConnectionTraits:
    """What the prepared path needs to know of ``conn`` (asked once per connection)."""
    known = known_traits(conn)
    if known is None:
        cursor = AsyncClientCursor(conn, row_factory=tuple_row)
        await cursor.execute(CONNECTION_TRAITS)
        known = learn_traits(conn, await cursor.fetchall())
    return known


async def probe_schema(conn: AsyncConnection[Any], schema: str | None) -> SchemaState:
    """What the table reachable through ``conn`` has (see ``SchemaState``): one query."""
    cursor = AsyncClientCursor(conn, row_factory=tuple_row)
    await cursor.execute(probe_statement(schema))
    return SchemaState.from_row(await cursor.fetchone())


async def migrate_table(
    conn: AsyncConnection[Any], schema: str | None, operation: str
) -> SchemaState:
    """Run the steps the table lacks and record the version, in one transaction that holds
    the migration lock; what the table had before. Without ``schema`` an existing table is
    upgraded where the search path found it (its missing objects go beside it); a new one
    goes into the search path's first schema."""
    async with conn.transaction():
        await conn.execute(MIGRATE_LOCK)
        state = await probe_schema(conn, schema)  # under the lock: no migration in between
        if state.newer:
            raise newer_error(state, schema or state.namespace, operation)
        for statement in pending_statements(state.version, schema or state.namespace):
            await conn.execute(statement.encode())
    return state
