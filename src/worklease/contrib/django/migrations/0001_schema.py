"""Creates the worklease schema in the configured database, or brings an existing table to
the current version (``PostgresBackend.apply_schema``: the missing steps only, idempotent).
A later worklease that adds a schema step ships a migration calling the same function."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations


def apply_schema(apps: Any, schema_editor: Any) -> None:
    from worklease._sync.postgres import PostgresBackend
    from worklease.contrib.django._conf import load

    conf = load()
    if schema_editor.connection.alias != conf.database:
        return  # the leases live in another database
    schema_editor.connection.ensure_connection()
    # Django's raw psycopg connection. apply_schema runs the steps in a transaction of its
    # own under the migration lock (Django has not begun one on it yet), which commits
    # before Django records this migration: were the recording to fail, running it again
    # finds nothing to do.
    PostgresBackend.apply_schema(schema_editor.connection.connection, schema=conf.schema)


class Migration(migrations.Migration):
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(apply_schema, migrations.RunPython.noop, elidable=False)
    ]
