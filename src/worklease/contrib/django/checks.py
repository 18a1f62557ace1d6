"""System checks.

- Settings, on every ``manage.py`` command: ``worklease.E000``.
- The schema, with ``--database`` (Django's rule for checks that reach a database, which
  ``migrate`` runs too): a table ``migrate`` would create or upgrade is a warning
  (``worklease.W002``), so that ``migrate`` is not stopped by what it is about to fix; a
  table newer than this worklease, or a database that does not answer, is an error
  (``worklease.E001``). One connection, one query.
- The whole deployment, with ``--deploy --database``: ``worklease check`` (isolation, writes,
  clock, timeouts, replication, poolers, connection capacity, notifications); each failed
  check is ``worklease.E001``, each warning ``worklease.W001``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from ..._failures import first_line
from ..._migrations import CURRENT_VERSION
from ..._sync.postgres import probe_schema
from ._backend import conninfo
from ._conf import Settings, load

__all__ = ["check_deployment", "check_schema", "check_settings"]


@checks.register("worklease")
def check_settings(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    try:
        load()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="worklease.E000")]
    return []


def _configured(databases: Sequence[str] | None) -> Settings | None:
    try:
        conf = load()
    except ImproperlyConfigured:
        return None  # reported by check_settings
    return conf if databases and conf.database in databases else None


@checks.register("worklease", checks.Tags.database)
def check_schema(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    conf = _configured(databases)
    if conf is None:
        return []
    where = f"worklease on database {conf.database!r}"
    try:
        with psycopg.connect(conninfo(conf.database), autocommit=True, connect_timeout=10) as conn:
            state = probe_schema(conn, conf.schema)
    except psycopg.Error as exc:
        return [checks.Error(f"{where}: cannot connect: {first_line(exc)}", id="worklease.E001")]
    if state.newer:
        return [
            checks.Error(
                f"{where}: the table records schema {state.describe()}",
                hint="upgrade worklease to the version that migrated it",
                id="worklease.E001",
            )
        ]
    if state.current:
        return []
    found = "no worklease table" if not state.exists else f"schema {state.describe()}"
    return [
        checks.Warning(
            f"{where}: {found}; this worklease expects version {CURRENT_VERSION}",
            hint="run `manage.py migrate` (the worklease app's migration), or `worklease migrate`",
            id="worklease.W002",
        )
    ]


@checks.register("worklease", checks.Tags.database, deploy=True)
def check_deployment(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    conf = _configured(databases)
    if conf is None:
        return []
    from ..._sync.check import check_postgres

    pool = connections[conf.database].pool if conf.share_django_pool else None
    report = check_postgres(
        conninfo(conf.database),
        schema=conf.schema,
        ttl=conf.check_ttl,
        pool_size=pool.max_size if pool is not None else conf.pool_size,
    )
    found: list[checks.CheckMessage] = []
    for finding in report.findings:
        if finding.name == "schema":
            continue  # check_schema says it
        text = f"worklease check on database {conf.database!r}: {finding.name}: {finding.detail}"
        if finding.status == "fail":
            found.append(checks.Error(text, id="worklease.E001"))
        elif finding.status == "warn":
            found.append(checks.Warning(text, id="worklease.W001"))
    return found
