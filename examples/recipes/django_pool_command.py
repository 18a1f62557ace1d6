"""Django: a management command that runs a worklease Pool on the project's own database.

Django 5.1+ keeps a ``psycopg_pool.ConnectionPool`` per database when
``DATABASES[...]["OPTIONS"]["pool"]`` is set. The worklease backend borrows that very pool
(``connection.pool``): one set of connections, one set of settings, and worklease hands each
connection back as it found it. In a project the command lives in
``yourapp/management/commands/run_reports.py`` and runs with ``manage.py run_reports``; here
the settings are configured inline so the file runs on its own:

    python examples/recipes/django_pool_command.py --dsn "host=... dbname=... user=..."

(the DSN also comes from ``WORKLEASE_DSN``). The schema must exist (``worklease migrate``).
Each of four report partitions is built in three steps, checkpointed after each; a partition
that is done is retired, and the command stops once every partition is retired.
"""

# mypy: disable-error-code="misc"
# (the framework is untyped)
from __future__ import annotations

import argparse
import os
import threading
import uuid
from typing import Any

import django
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from psycopg.conninfo import conninfo_to_dict

import worklease

STEPS = 3


def configure_django(dsn: str) -> None:
    """What settings.py holds in a project: the database, with Django's psycopg pool."""
    params = conninfo_to_dict(dsn)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params.get("dbname", "postgres"),
                "USER": params.get("user", ""),
                "PASSWORD": params.get("password", ""),
                "HOST": params.get("host", ""),
                "PORT": params.get("port", ""),
                "OPTIONS": {"pool": {"min_size": 1, "max_size": 4}},
            }
        },
        INSTALLED_APPS=[],
        USE_TZ=True,
    )
    django.setup()


class Command(BaseCommand):
    help = "Build the report partitions, shared with every other process running this command."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--partitions", type=int, default=4)
        parser.add_argument("--run-id", default=uuid.uuid4().hex[:8])

    def handle(self, *args: Any, **options: Any) -> None:
        from django.db import connection

        connection.ensure_connection()  # opens Django's pool
        backend = worklease.PostgresBackend(connection.pool)
        lease = worklease.Lease(backend, holder_id=f"django-{os.getpid()}", ttl=30)
        work_ids = [f"report-{options['run_id']}-{n}" for n in range(options["partitions"])]
        retired: set[str] = set()
        lock = threading.Lock()

        def build(token: worklease.Token, prior: worklease.Checkpoint) -> bytes:
            step = int(prior.state or b"0") + 1
            self.stdout.write(f"{token.work_id}: step {step} of {STEPS}")
            if step == STEPS:
                with lock:
                    retired.add(token.work_id)
                    if len(retired) == len(work_ids):
                        pool.stop()
                raise worklease.Retire(str(step).encode())
            return str(step).encode()

        pool = worklease.Pool(lease, work_ids, build, rerun_interval=0.01, idle_interval=0.05)
        pool.run()
        self.stdout.write(f"all {len(work_ids)} partitions retired; the pool stopped")
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("WORKLEASE_DSN", ""))
    args = parser.parse_args()
    configure_django(args.dsn)
    call_command(Command(), partitions=4)


if __name__ == "__main__":
    main()
