"""The ``worklease`` command line (also ``python -m worklease``).

Commands: ``demo`` (the quick start on the in-memory backend), ``schema`` (print the schema
SQL) and ``migrate`` (apply it to a database). Expected failures print one line to stderr and
exit with status 1; usage errors exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import psycopg
from psycopg import sql

from ._models import Checkpoint, Token
from ._pg import TABLE, check_schema_name, schema_sql
from ._sync.lease import Lease
from ._sync.memory import MemoryBackend
from ._sync.postgres import PostgresBackend
from ._sync.runner import Runner
from .errors import WorkleaseError

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
    name = sql.Identifier(schema, TABLE) if schema else sql.Identifier(TABLE)
    row = conn.execute(
        sql.SQL("SELECT to_regclass({})").format(sql.Literal(name.as_string(conn)))
    ).fetchone()
    return row is not None and row[0] is not None


def _migrate(args: argparse.Namespace) -> None:
    schema = args.schema
    try:
        with psycopg.connect(args.dsn or "", autocommit=True, connect_timeout=10) as conn:
            existed = _table_exists(conn, schema)
            PostgresBackend.apply_schema(conn, schema=schema)
            where = f"schema {schema!r}" if schema else "the search path's first schema"
            if existed:
                print(f"worklease schema already present in {where}; nothing to do")
            else:
                print(f"created the worklease table, sequence and index in {where}")
    except psycopg.Error as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CommandError(f"migrate failed: {message}") from exc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="worklease",
        description="Lease-based work coordination with checkpointed handoff.",
    )
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
        help="create the schema in a database (idempotent)",
        description="Apply the schema SQL to a database, in one transaction; safe to run "
        "again. The DSN may also come from the standard libpq environment variables "
        "(PGHOST, PGDATABASE, PGUSER, ...).",
    )
    migrate.add_argument(
        "--dsn", default="", help="libpq connection string or URI (default: PG* variables)"
    )
    migrate.add_argument("--schema", metavar="NAME", help="create the objects in this schema")
    migrate.set_defaults(handler=_migrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _parser().parse_args(argv)
    try:
        if getattr(args, "schema", None) is not None:
            check_schema_name(args.schema)
        args.handler(args)
    except (CommandError, WorkleaseError, ValueError) as exc:
        print(f"worklease {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
