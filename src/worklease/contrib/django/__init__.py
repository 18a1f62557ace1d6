"""Django integration: an app that creates the worklease schema with ``manage.py migrate``,
runs pools and leaders with ``manage.py worklease_run``, checks the deployment with
``manage.py check --database default``, and hands views one backend on Django's database.

Add the app and say which database holds the leases (all keys optional)::

    INSTALLED_APPS = [..., "worklease.contrib.django"]

    WORKLEASE = {
        "DATABASE": "default",      # a PostgreSQL database of DATABASES (psycopg 3)
        "SCHEMA": None,             # a PostgreSQL schema for the tables (default: search path)
        "POOL_SIZE": 4,             # connections, when worklease opens its own pool
        "CHECK_TTL": "30s",         # the TTL `check` judges server timeouts against
        "WORKERS": {                # what `manage.py worklease_run NAME` runs
            "reports": "myapp.workers.reports",
        },
    }

A worker is a function taking the backend and returning a ``worklease.Pool``, a
``(worklease.Leader, function)`` pair, or a list of those. Needs Django (imported only by this
package; ``import worklease.contrib`` never needs it). See the recipes page of the guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..._sync.postgres import PostgresBackend

__all__ = ["get_backend", "settings"]


def get_backend() -> PostgresBackend:
    """The process's backend on the configured database (built on first use, then shared).

    It uses Django's own connection pool when the database has one (``OPTIONS["pool"]``) and
    ``USE_TZ`` is on; otherwise a pool of its own, opened from the same settings
    (``POOL_SIZE`` connections), so Django's per-thread connections are never borrowed."""
    from ._backend import get_backend as build

    return build()


def settings() -> Any:
    """The validated ``WORKLEASE`` settings (``ImproperlyConfigured`` names a bad key)."""
    from ._conf import load

    return load()
