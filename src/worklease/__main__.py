"""The ``worklease`` command line (also ``python -m worklease``).

Commands: ``demo`` (the quick start on the in-memory backend), ``schema`` (print the schema
SQL), ``migrate`` (apply it to a database), ``status`` (list leases), ``sweep`` (delete
retired or lapsed rows) and ``check`` (is this PostgreSQL deployment fit for worklease).
Expected failures print one line to stderr and exit with status 1; usage errors exit with
status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row

from . import __version__
from ._check import DEFAULT_POOL_SIZE
from ._compat import sleep
from ._duration import format_duration, glob_to_regex, parse_duration
from ._failures import first_line
from ._migrations import CURRENT_VERSION, SchemaState, newer_error, pending_sql, steps
from ._models import Checkpoint, Token
from ._pg import (
    TABLE,
    Rows,
    Statements,
    check_schema_name,
    connections_per_backend,
    map_error,
    schema_sql,
)
from ._sync.check import check_postgres
from ._sync.lease import Lease
from ._sync.memory import MemoryBackend
from ._sync.postgres import PostgresBackend, migrate_table, probe_schema, run_statement
from ._sync.runner import Runner
from .errors import LeaseLostError, WorkleaseError

DSN_VARIABLES = ("WORKLEASE_DSN", "DATABASE_URL")
"""Where a command finds its DSN without ``--dsn``, in this order; then libpq's own ``PG*``
variables (PGHOST, PGDATABASE, ...) and defaults apply."""
DSN_HELP = (
    "libpq connection string or URI (default: $WORKLEASE_DSN, else $DATABASE_URL, else "
    "libpq's PG* variables)"
)

__all__ = ["main"]


class CommandError(Exception):
    """An expected failure: reported as one line, no traceback."""


def _demo(_: argparse.Namespace) -> None:
    def work(token: Token, prior: Checkpoint) -> bytes:
        saved = (prior.state or b"").decode()
        print(f'previous exit: {prior.prev_exit}, saved state: "{saved}"')
        return b"step 1 done"

    runner = Runner(Lease(MemoryBackend(), holder_id="worker-1", ttl=30), work)
    for _round in range(2):
        runner.run("billing-run-2026-10")


def _schema(args: argparse.Namespace) -> None:
    sys.stdout.write(schema_sql(args.schema))


def _table_exists(conn: psycopg.Connection[tuple[object, ...]], schema: str | None) -> bool:
    return _exists(conn, schema, TABLE)


def _exists(conn: psycopg.Connection[tuple[object, ...]], schema: str | None, name: str) -> bool:
    """Whether the relation ``name`` exists (in ``schema``, else on the search path)."""
    relation = sql.Identifier(schema, name) if schema else sql.Identifier(name)
    row = conn.execute(
        sql.SQL("SELECT to_regclass({})").format(sql.Literal(relation.as_string(conn)))
    ).fetchone()
    return row is not None and row[0] is not None


def resolve_dsn(given: str | None) -> str:
    """The DSN a command uses: ``--dsn``, else the first of ``DSN_VARIABLES`` set, else ""
    (libpq's ``PG*`` variables and defaults)."""
    if given:
        return given
    for name in DSN_VARIABLES:
        value = os.environ.get(name)
        if value:
            return value
    return ""


def describe_target(dsn: str) -> str:
    """Which database ``dsn`` names (host, port, database, user; libpq's variables fill in
    what it leaves out), for error messages; never the password."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an invalid DSN"
    for key, variable in (
        ("host", "PGHOST"),
        ("port", "PGPORT"),
        ("dbname", "PGDATABASE"),
        ("user", "PGUSER"),
    ):
        if not parts.get(key) and os.environ.get(variable):
            parts[key] = os.environ[variable]
    shown = " ".join(
        f"{key}={parts[key]}" for key in ("host", "port", "dbname", "user") if parts.get(key)
    )
    return shown or "libpq's default database"


def reached(conn: psycopg.Connection[Any]) -> str:
    """The database a connection reached, for error messages."""
    info = conn.info
    return f"database {info.dbname!r} on {info.host}:{info.port}"


def _migrate(args: argparse.Namespace) -> None:
    schema = args.schema
    if args.sql and args.json:
        raise CommandError("--sql prints SQL: it does not go with --json")
    if args.sql and args.from_version is not None:  # offline: no database needed
        sys.stdout.write(pending_sql(args.from_version, schema))
        return

    def where_(state: SchemaState) -> str:
        found = schema or state.namespace
        return f"schema {found!r}" if found else "the search path's first schema"

    try:
        with psycopg.connect(args.dsn, autocommit=True, connect_timeout=10) as conn:
            if args.check or args.sql:
                state = probe_schema(conn, schema)
                if state.newer:
                    raise newer_error(state, schema or state.namespace, "migrate")
                if args.sql:
                    sys.stdout.write(pending_sql(state.version, schema or state.namespace))
                    return
                report = {
                    "schema": schema or state.namespace,
                    "exists": state.exists,
                    "version": state.version,
                    "current_version": CURRENT_VERSION,
                    "current": state.current,
                }
                if state.current:
                    text = f"the worklease schema in {where_(state)} is at {state.describe()}"
                elif not state.exists:
                    text = f"no {TABLE} table in {where_(state)}: `worklease migrate` creates it"
                else:
                    text = (
                        f"the worklease schema in {where_(state)} is behind: "
                        f"{state.describe()}; run `worklease migrate`"
                    )
                _print_result(args, report, text)
                if state.current:
                    return
                raise _Quiet
            before = migrate_table(conn, schema, "migrate")
    except psycopg.Error as exc:
        raise CommandError(
            f"migrate failed on {describe_target(args.dsn)}: {first_line(exc)}"
        ) from exc
    where = where_(before)
    ran = [] if before.current or not before.exists else steps()[before.version :]
    if before.current:
        text = f"the worklease schema in {where} is at {before.describe()}; nothing to do"
    elif not before.exists:
        text = f"created the worklease schema (version {CURRENT_VERSION}) in {where}"
    elif before.version == CURRENT_VERSION:
        text = f"recorded schema version {CURRENT_VERSION} on the table in {where}"
    else:
        done = ", ".join(f"step {s.version} ({s.title})" for s in ran)
        text = (
            f"upgraded the worklease schema in {where} from version {before.version} "
            f"to {CURRENT_VERSION}: {done}"
        )
    report = {
        "schema": schema or before.namespace,
        "created": not before.exists,
        "from_version": before.version if before.exists else None,
        "version": CURRENT_VERSION,
        "steps": [{"version": step.version, "title": step.title} for step in ran],
        "changed": not before.current,
    }
    _print_result(args, report, text)


def _connect(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10, row_factory=tuple_row)
    except psycopg.Error as exc:
        raise CommandError(f"cannot connect to {describe_target(dsn)}: {first_line(exc)}") from exc


def _query(
    conn: psycopg.Connection[tuple[Any, ...]],
    operation: str,
    statement: bytes,
    params: dict[str, Any],
) -> tuple[Rows, int]:
    """Run one backend statement the way the backend runs it (its statement runner)."""
    try:
        return run_statement(conn, operation, statement, params)
    except psycopg.Error as exc:
        raise CommandError(f"{map_error(exc, operation)} (on {reached(conn)})") from exc


STATUS_COLUMNS = (
    "work_id",
    "holder_id",
    "fencing_token",
    "state",
    "exit_mode",
    "prev_exit",
    "prev_holder_id",
    "expires_at",
    "checkpoint_size",
    "updated_at",
)


def _iso(value: datetime | None, timespec: str = "auto") -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


CLEAR_SCREEN = "\x1b[H\x1b[2J"
"""ANSI: cursor home, clear the screen (``status --watch`` redraws in place)."""


def _status(args: argparse.Namespace) -> None:
    watch = args.watch
    if watch is None:
        _status_once(args)
        return
    if args.json:
        raise CommandError("--watch redraws a table: it does not go with --json")
    interval = parse_duration(watch)
    if interval <= 0:
        raise CommandError(f"--watch interval must be positive, got {watch!r}")
    try:
        while True:
            if sys.stdout.isatty():  # redrawn in place on a terminal; plain frames otherwise
                sys.stdout.write(CLEAR_SCREEN)
            stamp = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
            print(f"every {watch}, {stamp} (Ctrl-C to stop)\n")
            _status_once(args)
            sys.stdout.flush()
            sleep(interval)
    except KeyboardInterrupt:
        print()


ETCD_HELP = (
    "read leases from etcd instead: the members' client URLs, comma-separated "
    "(http://host:2379,...); the key prefix comes from --etcd-prefix"
)


REDIS_HELP = (
    "read leases from Redis instead: redis://[user:password@]host:port/db (rediss:// for "
    "TLS), redis+cluster://host:port for a Cluster, or "
    "redis+sentinel://host:26379[,host:26379...]/MASTER for Sentinel's primary; the key "
    "prefix comes from --redis-prefix"
)


def _etcd_backend(args: argparse.Namespace) -> Any:
    from ._sync.etcd import EtcdBackend  # httpx: the etcd extra

    return EtcdBackend(args.etcd, prefix=args.etcd_prefix or "worklease/", timeout=5.0)


def _store_backend(args: argparse.Namespace) -> Any:
    """The etcd or Redis backend the command names (``--etcd`` / ``--redis``)."""
    if args.etcd:
        return _etcd_backend(args)
    from ._sync.redis import RedisBackend  # redis-py: the redis extra

    return RedisBackend.from_url(args.redis, prefix=args.redis_prefix or "worklease:")


def _store_name(args: argparse.Namespace) -> str:
    return "--etcd" if args.etcd else "--redis"


def _print_table(table: Sequence[Sequence[str]], numeric: set[int]) -> None:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for index, row in enumerate(table):
        cells = [
            cell.rjust(widths[i]) if i in numeric and index else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        print("  ".join(cells).rstrip())


def _store_status(args: argparse.Namespace, pattern: str | None) -> None:
    """``status`` on etcd or Redis: the same columns; the expiry is the TTL left (the etcd
    lease's, or by the Redis server's clock)."""
    if args.by_holder:
        raise CommandError(f"--by-holder reads PostgreSQL only; use it without {_store_name(args)}")
    with _store_backend(args) as backend:
        rows = backend.rows()
    matcher = re.compile(pattern) if pattern is not None else None
    listed = []
    for row in rows:
        state = "held" if row["held"] else ("released" if row["exit_mode"] else "expired")
        if matcher is not None and not matcher.search(row["work_id"]):
            continue
        if args.state is not None and state != args.state:
            continue
        listed.append((row, state))
    if args.json:
        document = [
            {
                "work_id": row["work_id"],
                "holder_id": row["holder_id"],
                "fencing_token": row["fencing_token"],
                "state": state,
                "exit_mode": row["exit_mode"],
                "prev_exit": row["prev_exit"],
                "prev_holder_id": row["prev_holder_id"],
                "expires_in": row["ttl_left"],
                "checkpoint_size": row["checkpoint_bytes"],
                "updated_at": _iso(row["updated_at"]),
            }
            for row, state in listed
        ]
        json.dump(document, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    if not listed:
        print("no leases" + (" match" if pattern or args.state else ""))
        return
    table: list[tuple[str, ...]] = [
        ("WORK ID", "HOLDER", "TOKEN", "STATE", "EXIT", "PREV EXIT", "EXPIRES", "CHECKPOINT",
         "UPDATED"),
    ]  # fmt: skip
    for row, state in listed:
        prev = str(row["prev_exit"])
        if row["prev_holder_id"] is not None:
            prev = f"{prev} ({row['prev_holder_id']})"
        left = row["ttl_left"]
        table.append(
            (
                row["work_id"],
                str(row["holder_id"]),
                str(row["fencing_token"]),
                state,
                str(row["exit_mode"] or "-"),
                prev,
                f"in {format_duration(float(left))}" if left is not None else "-",
                "-" if row["checkpoint_bytes"] is None else f"{row['checkpoint_bytes']} B",
                _iso(row["updated_at"], "seconds") or "-",
            )
        )
    _print_table(table, {2})


def _status_once(args: argparse.Namespace) -> None:
    pattern = glob_to_regex(args.work_id) if args.work_id is not None else None
    if args.etcd or args.redis:
        _store_status(args, pattern)
        return
    statements = Statements(args.schema)
    if args.by_holder:
        _status_by_holder(args, statements, pattern)
        return
    with _connect(args.dsn) as conn:
        rows, _ = _query(
            conn, "status", statements.status, {"pattern": pattern, "state": args.state}
        )
    records = statements.status_rows(rows)
    if args.json:
        document = [
            {
                **{key: getattr(record, key) for key in STATUS_COLUMNS},
                "expires_at": _iso(record.expires_at),
                "updated_at": _iso(record.updated_at),
            }
            for record in records
        ]
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if not records:
        print("no leases" + (" match" if pattern or args.state else ""))
        return
    header = (
        "WORK ID", "HOLDER", "TOKEN", "STATE", "EXIT", "PREV EXIT",
        "EXPIRES", "CHECKPOINT", "UPDATED",
    )  # fmt: skip
    table = [header]
    for record in records:
        left = float(record.expires_in)
        expires = f"in {format_duration(left)}" if left >= 0 else f"{format_duration(left)} ago"
        size = record.checkpoint_size
        prev = record.prev_exit
        if record.prev_holder_id is not None:
            prev = f"{prev} ({record.prev_holder_id})"
        table.append(
            (
                record.work_id,
                record.holder_id,
                str(record.fencing_token),
                record.state,
                record.exit_mode or "-",
                prev,
                expires,
                "-" if size is None else f"{size} B",
                _iso(record.updated_at, "seconds") or "-",
            )
        )
    _print_table(table, {2})


def _status_by_holder(
    args: argparse.Namespace, statements: Statements, pattern: str | None
) -> None:
    """Held leases per holder: how many work IDs each holds, and in how many pool groups it
    is a member (how evenly fair-share pools spread their work)."""
    if args.state not in (None, "held"):
        raise CommandError("--by-holder counts held leases: --state must be held or absent")
    with _connect(args.dsn) as conn:
        rows, _ = _query(conn, "status", statements.status_by_holder, {"pattern": pattern})
    counts = [(str(holder), int(held), int(groups)) for holder, held, groups in rows]
    if args.json:
        document = [{"holder_id": h, "held": n, "pool_groups": g} for h, n, g in counts]
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if not counts:
        print("no leases held" + (" match" if pattern else ""))
        return
    table = [("HOLDER", "HELD", "POOL GROUPS")] + [(h, str(n), str(g)) for h, n, g in counts]
    _print_table(table, {1, 2})
    total = sum(n for _, n, _ in counts)
    print(f"{total} work ID(s) held by {len(counts)} holder(s)")


def _sweep(args: argparse.Namespace) -> None:
    retention = parse_duration(args.retention)
    kinds = "retired and lapsed" if args.include_expired else "retired"
    if args.etcd or args.redis:
        if args.dry_run:
            raise CommandError(
                f"--dry-run counts on PostgreSQL only; use it without {_store_name(args)}"
            )
        with _store_backend(args) as backend:
            count = backend.sweep(retention, bool(args.include_expired))
        _print_result(
            args,
            {
                "deleted": count,
                "retention": args.retention,
                "include_expired": args.include_expired,
            },
            f"deleted {count} {kinds} work ID(s) not updated for {args.retention}",
        )
        return
    statements = Statements(args.schema)
    params = {
        "retention": timedelta(seconds=retention),
        "include_expired": bool(args.include_expired),
    }
    with _connect(args.dsn) as conn:
        if args.dry_run:
            rows, _ = _query(conn, "sweep", statements.count_sweepable, params)
            count = int(rows[0][0]) if rows else 0
            _print_result(
                args,
                {"would_delete": count, "retention": args.retention,
                 "include_expired": args.include_expired},
                f"would delete {count} {kinds} row(s) not updated for {args.retention}",
            )  # fmt: skip
        else:
            # In batches, as the backend sweeps (each its own autocommit statement).
            count = 0
            after: str | None = statements.SWEEP_START
            while after is not None:
                window = statements.sweep_window(after)
                rows, _ = _query(conn, "sweep", statements.sweep, {**params, **window})
                deleted, after = statements.swept(rows)
                count += deleted
            _print_result(
                args,
                {
                    "deleted": count,
                    "retention": args.retention,
                    "include_expired": args.include_expired,
                },
                f"deleted {count} {kinds} row(s) not updated for {args.retention}",
            )


def _check(args: argparse.Namespace) -> None:
    if args.redis:
        from ._sync.redis_check import check_redis  # redis-py: the redis extra

        for name in ("schema", "listen_dsn"):
            if getattr(args, name) is not None:
                raise CommandError(
                    f"--{name.replace('_', '-')} checks PostgreSQL; not with --redis"
                )
        report = check_redis(
            args.redis,
            prefix=args.redis_prefix or "worklease:",
            ttl=parse_duration(args.ttl),
            replicas=args.replicas,
        )
    else:
        if args.replicas:
            raise CommandError("--replicas checks Redis; use it with --redis")
        report = check_postgres(
            args.dsn,
            schema=args.schema,
            listen_dsn=args.listen_dsn,
            ttl=parse_duration(args.ttl),
            pool_size=args.pool_size,
            processes=args.processes,
        )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        width = max(len(f.name) for f in report.findings)
        for finding in report.findings:
            print(f"{finding.status:<5} {finding.name:<{width}}  {finding.detail}")
    failed = not report.ok or (args.strict and not report.clean)
    if failed:
        raise _Quiet()


class _Quiet(Exception):
    """Exit with status 1 without a message (the report said it)."""


def _confirmed(args: argparse.Namespace, question: str) -> bool:
    """``--yes``, or the operator's answer on a terminal; refuses without either."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CommandError("not a terminal to confirm on: give --yes")
    answer = input(f"{question} [y/N] ").strip().lower()
    return answer in ("y", "yes")


def _operator_backend(args: argparse.Namespace) -> Any:
    if args.etcd or args.redis:
        return _store_backend(args)
    return PostgresBackend.connect(args.dsn, schema=args.schema, listen=False, max_size=1)


def _print_result(args: argparse.Namespace, document: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(document, indent=2, default=str))
    else:
        print(text)


def _lease_row(backend: Any, work_id: str) -> dict[str, Any] | None:
    for row in backend.rows():
        if row["work_id"] == work_id:
            return dict(row)
    return None


def _expire(args: argparse.Namespace) -> None:
    with _operator_backend(args) as backend:
        expire = getattr(backend, "expire", None)
        if not callable(expire):
            raise CommandError(f"the {_store_name(args)[2:]} backend offers no expire")
        row = _lease_row(backend, args.work_id)
        if row is None or not row["held"]:
            _print_result(
                args,
                {"work_id": args.work_id, "expired": False, "reason": "not held"},
                f"{args.work_id} is not held: nothing to expire",
            )
            raise _Quiet()
        question = (
            f"expire {args.work_id} (holder {row['holder_id']}, token {row['fencing_token']})? "
            "Its holder is fenced at its next write"
        )
        if not _confirmed(args, question):
            raise CommandError("not confirmed: nothing changed")
        now = _lease_row(backend, args.work_id)  # the answer may have taken a while
        if now is None or now["fencing_token"] != row["fencing_token"]:
            raise CommandError(
                f"{args.work_id} changed while waiting for the answer: nothing changed"
            )
        done = expire(args.work_id)
    if not done:
        _print_result(
            args,
            {"work_id": args.work_id, "expired": False, "reason": "not held any more"},
            f"{args.work_id} was not held any more: nothing changed",
        )
        raise _Quiet()
    _print_result(
        args,
        {
            "work_id": args.work_id,
            "expired": True,
            "holder_id": row["holder_id"],
            "fencing_token": row["fencing_token"],
        },
        f"expired {args.work_id} (holder {row['holder_id']}, token {row['fencing_token']}): "
        "the holder is fenced at its next write",
    )


def _forget(args: argparse.Namespace) -> None:
    with _operator_backend(args) as backend:
        row = _lease_row(backend, args.work_id)
        if row is None:
            _print_result(
                args,
                {"work_id": args.work_id, "forgotten": False, "reason": "no row"},
                f"{args.work_id} has no row: nothing to forget",
            )
            raise _Quiet()
        if row["held"] and not args.held:
            raise CommandError(
                f"{args.work_id} is held by {row['holder_id']}: expire it first (or give --held "
                "to delete a held row, fencing its holder)"
            )
        question = (
            f"forget {args.work_id} (token {row['fencing_token']}, exit "
            f"{row['exit_mode'] or '-'})? Its checkpoint is deleted for good"
        )
        if not _confirmed(args, question):
            raise CommandError("not confirmed: nothing changed")
        token = Token(
            args.work_id, str(row["holder_id"]), int(row["fencing_token"]), datetime.now(UTC)
        )
        try:
            backend.forget(token)
        except LeaseLostError:
            _print_result(
                args,
                {"work_id": args.work_id, "forgotten": False, "reason": "changed meanwhile"},
                f"{args.work_id} changed since it was read: nothing deleted",
            )
            raise _Quiet() from None
    _print_result(
        args,
        {"work_id": args.work_id, "forgotten": True, "fencing_token": row["fencing_token"]},
        f"forgot {args.work_id} (token {row['fencing_token']})",
    )


def _web(args: argparse.Namespace) -> None:
    try:
        import uvicorn

        from . import web
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    host, _, port_text = args.bind.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise CommandError(f"--bind takes HOST:PORT, got {args.bind!r}")
    token = web._server.token_from_environment(args.auth_token)
    web.check_bind(host, token)
    codec = _codec(args.codec) if args.codec else None
    hidden: tuple[str, ...] = ()

    async def open_backend() -> Any:
        if args.etcd:
            from ._async.etcd import AsyncEtcdBackend

            return AsyncEtcdBackend(args.etcd, prefix=args.prefix or "worklease/", timeout=5.0)
        if args.redis:
            from ._async.redis import AsyncRedisBackend

            return AsyncRedisBackend.from_url(args.redis, prefix=args.prefix or "worklease:")
        from ._async.postgres import AsyncPostgresBackend

        backend = AsyncPostgresBackend.connect(
            args.dsn, schema=args.schema, listen=False, max_size=2
        )
        await backend.pool.open()
        return backend

    if args.etcd:
        kind = "etcd"
    elif args.redis:
        from urllib.parse import unquote, urlsplit

        from ._redis import parse_redis_url

        kind = "Redis"
        target = parse_redis_url(args.redis)
        raw = urlsplit(args.redis.split(",")[0]).password if "@" in args.redis else None
        hidden = tuple(
            secret for secret in (target.password, raw, unquote(raw) if raw else None) if secret
        )
    else:
        kind = "PostgreSQL"
        try:
            password = conninfo_to_dict(args.dsn).get("password")
        except psycopg.ProgrammingError:
            raise CommandError("an invalid DSN (libpq cannot parse it)") from None
        hidden = (str(password),) if password else ()
    application = web.app(
        open_backend,
        show_checkpoints=args.show_checkpoints,
        allow_actions=args.allow_actions,
        auth_token=token,
        codec=codec,
        label=kind,
        secrets_to_hide=hidden,
    )
    print(f"worklease web: serving on http://{args.bind} (Ctrl-C to stop)", file=sys.stderr)
    uvicorn.run(application, host=host, port=int(port_text), log_level="warning")


def _codec(spec: str) -> Any:
    """``json`` (worklease's JSONCodec of plain values) or ``module:attribute``."""
    from .codec import JSONCodec

    if spec == "json":
        return JSONCodec(object)
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CommandError(f"--codec takes json or module:attribute, got {spec!r}")
    import importlib

    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise CommandError(f"--codec {spec}: {exc}") from None
    return value() if isinstance(value, type) else value


def _store_options(command: argparse.ArgumentParser) -> None:
    """Where the leases are: PostgreSQL (``--dsn``, ``--schema``), etcd or Redis."""
    command.add_argument("--dsn", help=DSN_HELP)
    command.add_argument("--schema", metavar="NAME", help="the schema holding the tables")
    command.add_argument("--etcd", metavar="ENDPOINTS", help=ETCD_HELP)
    command.add_argument(
        "--etcd-prefix", metavar="PREFIX", default=None, help="etcd key prefix (worklease/)"
    )
    command.add_argument("--redis", metavar="URL", help=REDIS_HELP)
    command.add_argument(
        "--redis-prefix", metavar="PREFIX", default=None, help="Redis key prefix (worklease:)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="worklease",
        allow_abbrev=False,
        description="Lease-based work coordination with checkpointed handoff. Commands that "
        "reach a database take --dsn, else $WORKLEASE_DSN, else $DATABASE_URL, else libpq's "
        "PG* variables.",
    )
    parser.add_argument("--version", action="version", version=f"worklease {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run the quick start on the in-memory backend",
        description="Run the same work ID twice on the in-memory backend; the second run "
        "reads what the first one left behind.",
    )
    demo.set_defaults(handler=_demo)

    schema = commands.add_parser(
        "schema",
        help="print the schema SQL",
        description="Print the idempotent SQL that creates the worklease table, sequence "
        "and index (pipe it to psql, or keep it in your migrations).",
    )
    schema.add_argument("--schema", metavar="NAME", help="create the objects in this schema")
    schema.set_defaults(handler=_schema)

    migrate = commands.add_parser(
        "migrate",
        help="create the schema, or upgrade it to this version's (idempotent)",
        description=f"Bring the worklease schema of a database to version {CURRENT_VERSION}: "
        "create it, or run the steps an older table lacks, in one transaction (no step drops "
        "data; safe to run again, and concurrently). A table newer than this worklease is "
        "left alone (exit status 1). With --check nothing is changed: the exit status is 1 "
        "when the table is missing or behind. With --sql the pending SQL is printed for a "
        "migration tool of your own (Django, Alembic); with --from VERSION it needs no "
        "database. The DSN may also come from the standard libpq environment variables "
        "(PGHOST, PGDATABASE, PGUSER, ...).",
    )
    migrate.add_argument("--dsn", help=DSN_HELP)
    migrate.add_argument("--schema", metavar="NAME", help="create the objects in this schema")
    action = migrate.add_mutually_exclusive_group()
    action.add_argument(
        "--check", action="store_true", help="only report the version (exit 1 when behind)"
    )
    action.add_argument(
        "--sql", action="store_true", help="print the pending SQL instead of running it"
    )
    migrate.add_argument(
        "--from",
        dest="from_version",
        type=int,
        metavar="VERSION",
        help=f"with --sql: the SQL from this version (0: no table) to {CURRENT_VERSION}, "
        "without a database",
    )
    migrate.add_argument(
        "--json", action="store_true", help="print the outcome as JSON (not with --sql)"
    )
    migrate.set_defaults(handler=_migrate)

    status = commands.add_parser(
        "status",
        help="list leases with their holder, state and checkpoint size",
        description="One row per lease: work ID, holder, fencing token, state (held: expiry "
        "in the future; released: an exit was declared; expired: expiry passed with no "
        "declared exit), exit mode, previous exit (and previous holder), time until expiry "
        "(or since), checkpoint size and last update. The DSN may also come from the libpq "
        "environment variables.",
    )
    _store_options(status)
    status.add_argument(
        "--work-id", metavar="GLOB", help="only work IDs matching this glob (*, ?, [abc], [!a])"
    )
    status.add_argument(
        "--state", choices=("held", "expired", "released"), help="only leases in this state"
    )
    status.add_argument(
        "--json", action="store_true", help="print one JSON array of objects instead"
    )
    status.add_argument(
        "--watch",
        nargs="?",
        const="2s",
        metavar="INTERVAL",
        help="redraw the table in place every INTERVAL (default 2s) until Ctrl-C",
    )
    status.add_argument(
        "--by-holder",
        action="store_true",
        help="count held work IDs (and pool-group memberships) per holder instead",
    )
    status.set_defaults(handler=_status)

    sweep = commands.add_parser(
        "sweep",
        help="delete retired (and optionally lapsed) rows older than a retention",
        description="Delete rows released RETIRED, not held, and not updated for longer than "
        "RETENTION; with --include-expired also rows whose lease lapsed with no declared exit "
        "(discarding the partial state a successor would resume from). Rows released "
        "FINISHED or ABANDONED are never deleted. DURATION: a number with a unit, units "
        "combinable: 500ms, 90s, 15m, 2h, 7d, 1h30m.",
    )
    _store_options(sweep)
    sweep.add_argument("--retention", required=True, metavar="DURATION", help="e.g. 7d, 12h, 1h30m")
    sweep.add_argument(
        "--include-expired", action="store_true", help="also delete lapsed, undeclared rows"
    )
    sweep.add_argument(
        "--dry-run", action="store_true", help="only count the rows that would be deleted"
    )
    sweep.add_argument("--json", action="store_true", help="print the outcome as JSON")
    sweep.set_defaults(handler=_sweep)

    check = commands.add_parser(
        "check",
        help="check a PostgreSQL (or, with --redis, Redis) deployment for worklease (exit "
        "status 1 on a failure)",
        description="Check the connection, each host of a multi-host DSN (one primary, and no "
        "standby in a random load_balance_hosts route), the schema, the default isolation, "
        "whether the session can write and the role has the grants acquiring needs, the clock "
        "offset to the server, synchronous_commit, standbys and whether replication is "
        "synchronous, server timeouts against the TTL, a transaction-pooling proxy in between "
        "(PgBouncer), "
        "whether the connections of --processes processes with a pool of --pool-size fit in "
        "PgBouncer's pool or the server's max_connections, and whether release notifications "
        "work from this DSN (and through --listen-dsn). Each line is ok, warn or fail; the "
        "exit status is 1 when a check failed (or, with --strict, warned).",
    )
    check.add_argument("--dsn", help=DSN_HELP)
    check.add_argument("--schema", metavar="NAME", help="the schema holding the tables")
    check.add_argument(
        "--redis",
        metavar="URL",
        help="check a Redis deployment instead (the URL forms of status --redis): version, "
        "scripts, persistence, eviction policy, maxmemory, replicas, min-replicas-to-write, "
        "clocks, failover detection time against --ttl, Cluster state",
    )
    check.add_argument(
        "--redis-prefix", metavar="PREFIX", default=None, help="Redis key prefix (worklease:)"
    )
    check.add_argument(
        "--replicas",
        type=int,
        default=0,
        metavar="N",
        help="with --redis: the replicas= your backends use (fails with fewer replicas)",
    )
    check.add_argument(
        "--listen-dsn", metavar="DSN", help="also check the release listener on this route"
    )
    check.add_argument(
        "--ttl", default="30s", metavar="DURATION", help="the lease TTL you use (default 30s)"
    )
    check.add_argument(
        "--pool-size",
        type=int,
        default=DEFAULT_POOL_SIZE,
        metavar="N",
        help="the max_size of each process's application pool (default "
        f"{DEFAULT_POOL_SIZE}, psycopg_pool's); a backend opens {connections_per_backend(0)} "
        "connections of its own on top",
    )
    check.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="how many processes use this DSN, each with its own backend (default 1)",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--strict", action="store_true", help="exit with status 1 on warnings too")
    check.set_defaults(handler=_check)

    for name, handler, summary_text, description in (
        (
            "expire",
            _expire,
            "end a held lease now (its holder is fenced at its next write)",
            "End the current grant of WORK_ID now: its token is replaced by a greater one "
            "nobody holds, so the holder's next write is refused (fenced) and its work stops "
            "there; the next acquire takes over and reads the last checkpoint with previous "
            "exit expired. Asks for confirmation unless --yes. Exit status 1 when the work ID "
            "is not held.",
        ),
        (
            "forget",
            _forget,
            "delete a lease row for good (its checkpoint with it)",
            "Delete the row of WORK_ID (a retired one, typically): the next acquire starts "
            "with no checkpoint and previous exit none, with a greater token. A held row is "
            "refused unless --held (its holder is then fenced). Asks for confirmation unless "
            "--yes. Exit status 1 when there is no row.",
        ),
    ):
        command = commands.add_parser(
            name, help=summary_text, description=description, allow_abbrev=False
        )
        command.add_argument("work_id", metavar="WORK_ID")
        _store_options(command)
        command.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        command.add_argument("--json", action="store_true", help="print the outcome as JSON")
        if name == "forget":
            command.add_argument(
                "--held", action="store_true", help="also delete a held row (fencing its holder)"
            )
        command.set_defaults(handler=handler)

    web_command = commands.add_parser(
        "web",
        help="serve the operator console (a live page of who holds what)",
        description="Serve the operator console: an overview (leases by state, per holder, "
        "expiring soon, handoffs per minute), the leases table (filters, sorting, paging) "
        "and one page per lease, updating live; a JSON API (/api/leases, /api/summary) and "
        "/healthz. Read-only unless --allow-actions (expire, forget; needs --auth-token). "
        "Binding anything but loopback needs --auth-token (or $WORKLEASE_WEB_TOKEN). Needs "
        "the web extra (Starlette, uvicorn).",
        allow_abbrev=False,
    )
    web_command.add_argument("--dsn", help=DSN_HELP)
    web_command.add_argument("--schema", metavar="NAME", help="the schema holding the tables")
    web_command.add_argument("--etcd", metavar="ENDPOINTS", help=ETCD_HELP)
    web_command.add_argument("--redis", metavar="URL", help=REDIS_HELP)
    web_command.add_argument(
        "--prefix", metavar="PREFIX", help="the etcd or Redis key prefix (worklease/, worklease:)"
    )
    web_command.add_argument(
        "--bind", default="127.0.0.1:8080", metavar="HOST:PORT", help="default 127.0.0.1:8080"
    )
    web_command.add_argument(
        "--auth-token", metavar="TOKEN", help="require this token (else $WORKLEASE_WEB_TOKEN)"
    )
    web_command.add_argument(
        "--show-checkpoints",
        action="store_true",
        help="show checkpoints on a lease's page (they may hold private data)",
    )
    web_command.add_argument(
        "--codec", metavar="json|MODULE:ATTR", help="decode shown checkpoints with this codec"
    )
    web_command.add_argument(
        "--allow-actions", action="store_true", help="offer expire and forget (needs a token)"
    )
    web_command.set_defaults(handler=_web)
    for subcommand in commands.choices.values():  # --sche is not taken for --schema silently
        subcommand.allow_abbrev = False
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "from_version", None) is not None:
        if not args.sql:
            parser.error("migrate: --from needs --sql")
        if not 0 <= args.from_version <= CURRENT_VERSION:
            parser.error(f"migrate: --from takes a version from 0 to {CURRENT_VERSION}")
    try:
        if getattr(args, "schema", None) is not None:
            check_schema_name(args.schema)
        stores = [
            flag
            for flag, name in (("--dsn", "dsn"), ("--etcd", "etcd"), ("--redis", "redis"))
            if getattr(args, name, None)
        ]
        if len(stores) > 1:
            raise CommandError(f"give one of --dsn, --etcd and --redis, not {' and '.join(stores)}")
        if getattr(args, "etcd_prefix", None) is not None and not args.etcd:
            raise CommandError("--etcd-prefix needs --etcd")
        if getattr(args, "redis_prefix", None) is not None and not args.redis:
            raise CommandError("--redis-prefix needs --redis")
        if (
            hasattr(args, "dsn")
            and not getattr(args, "etcd", None)
            and not getattr(args, "redis", None)
        ):
            args.dsn = resolve_dsn(args.dsn)
        args.handler(args)
    except _Quiet:
        return 1
    except (CommandError, WorkleaseError, ValueError, ImportError) as exc:
        message = str(exc).removeprefix(f"{args.command}: ")
        print(f"worklease {args.command}: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
