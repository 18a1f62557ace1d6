"""Django integration: an app that creates the worklease schema with ``manage.py migrate``,
runs pools and leaders with ``manage.py worklease_run``, checks the deployment with
``manage.py check --database default``, and hands views one backend on Django's database.

Add the app and say which database holds the leases (all keys optional)::

    INSTALLED_APPS = [..., "worklease.contrib.django"]

    WORKLEASE = {
        "DATABASE": "default",      # a PostgreSQL database of DATABASES (psycopg 3)
        "SCHEMA": None,             # a PostgreSQL schema for the tables (default: search path)
        "POOL_SIZE": 4,             # connections of worklease's own pool
        "SHARE_DJANGO_POOL": False, # True: borrow Django's pool (OPTIONS["pool"]) instead
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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ..._sync.postgres import PostgresBackend

__all__ = ["closing_connections", "get_backend", "reset", "settings"]

F = TypeVar("F", bound=Callable[..., Any])


def get_backend() -> PostgresBackend:
    """The process's backend on the configured database, built on first use and shared.

    By default it opens a pool of its own (``POOL_SIZE`` connections) from the database's
    settings, so that Django's connections, which each thread keeps until its request ends,
    never starve a lease; with ``SHARE_DJANGO_POOL`` it borrows Django's pool
    (``OPTIONS["pool"]``, with room for both). It is built again when those settings change
    (a test database, ``override_settings``) and in a forked child: call it when you use it,
    not at import time."""
    from ._backend import get_backend as build

    return build()


def reset() -> None:
    """Close the process's backend; the next ``get_backend()`` builds a new one."""
    from ._backend import reset as close

    close()


def closing_connections(fn: F) -> F:
    """Wrap a work function or a leader's term function so that the Django connections its
    thread opened are closed when it returns (pool slots and terms run in threads of their
    own, outside any request: nothing else closes them)."""
    from ._backend import closing_connections as wrap

    return wrap(fn)


def settings() -> Any:
    """The validated ``WORKLEASE`` settings (``ImproperlyConfigured`` names a bad key)."""
    from ._conf import load

    return load()
