"""The backend on Django's database, built once per process."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.db import connections
from psycopg.conninfo import make_conninfo

from ..._compat import ThreadLock
from ..._sync.postgres import PostgresBackend
from ._conf import Settings, load

__all__ = ["conninfo", "get_backend", "reset"]

_lock = ThreadLock()
_backend: PostgresBackend | None = None

_DJANGO_ONLY = ("context", "cursor_factory", "prepare_threshold", "autocommit", "pool")
"""Connection parameters Django adds for its own cursors: worklease's connections keep
psycopg's defaults (its own adapters, prepared statements where the route allows)."""


def conninfo(alias: str) -> str:
    """A libpq conninfo string for the Django database ``alias`` (its NAME, USER, PASSWORD,
    HOST, PORT and OPTIONS as Django passes them to psycopg)."""
    params: dict[str, Any] = dict(connections[alias].get_connection_params())
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    return make_conninfo(**{k: v for k, v in params.items() if v is not None and v != ""})


def _build(conf: Settings) -> PostgresBackend:
    wrapper = connections[conf.database]
    pool = wrapper.pool
    if pool is not None and django_settings.USE_TZ:
        # Django's pool hands out connections that read timestamps as aware datetimes; with
        # USE_TZ off its adapters make them naive local times, which a lease must not see.
        pool.open()  # as Django does on its first connection; a no-op once open
        return PostgresBackend(pool, schema=conf.schema)
    return PostgresBackend.connect(
        conninfo(conf.database),
        schema=conf.schema,
        max_size=conf.pool_size,
        name=f"worklease-django-{conf.database}",
    )


def get_backend() -> PostgresBackend:
    global _backend
    with _lock:
        if _backend is None:
            _backend = _build(load())
        return _backend


def reset() -> None:
    """Close the process's backend (the next ``get_backend()`` builds a new one)."""
    global _backend
    with _lock:
        backend, _backend = _backend, None
    if backend is not None:
        backend.close()
