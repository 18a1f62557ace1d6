"""``manage.py check --database ALIAS`` runs ``worklease check`` against the configured
database: each failed check is an error (``worklease.E001``), each warning a warning
(``worklease.W001``). A table that ``manage.py migrate`` would create or upgrade is a warning
(``worklease.W002``), not an error: ``migrate`` runs these checks before it migrates, and
must not be stopped by what it is about to fix; a table newer than this worklease is an
error. Settings problems are reported without ``--database`` (``worklease.E000``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ._conf import Settings, load

__all__ = ["check_deployment", "check_settings"]


@checks.register("worklease")
def check_settings(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    try:
        load()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="worklease.E000")]
    return []


@checks.register("worklease", checks.Tags.database)
def check_deployment(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    try:
        conf = load()
    except ImproperlyConfigured:
        return []  # reported by check_settings
    if not databases or conf.database not in databases:
        return []
    from ..._sync.check import check_postgres
    from ._backend import conninfo

    report = check_postgres(conninfo(conf.database), schema=conf.schema, ttl=conf.check_ttl)
    found: list[checks.CheckMessage] = []
    for finding in report.findings:
        where = f"worklease check on database {conf.database!r}: {finding.name}"
        if finding.name == "schema" and finding.status != "ok" and not _newer(conf):
            found.append(
                checks.Warning(
                    f"{where}: {finding.detail}",
                    hint="run `manage.py migrate` (the worklease app's migration does it)",
                    id="worklease.W002",
                )
            )
        elif finding.status == "fail":
            found.append(checks.Error(f"{where}: {finding.detail}", id="worklease.E001"))
        elif finding.status == "warn":
            found.append(checks.Warning(f"{where}: {finding.detail}", id="worklease.W001"))
    return found


def _newer(conf: Settings) -> bool:
    """Whether the table records a version newer than this worklease (then ``migrate``
    cannot help: an error, not a warning)."""
    import psycopg

    from ..._sync.postgres import probe_schema
    from ._backend import conninfo

    try:
        with psycopg.connect(conninfo(conf.database), autocommit=True, connect_timeout=10) as conn:
            return probe_schema(conn, conf.schema).newer
    except psycopg.Error:
        return False  # the connection finding says why
