"""The backend on Django's database: one per process, rebuilt when Django's settings for the
database change (a test database, ``override_settings``, a fork)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connections
from psycopg.conninfo import make_conninfo

from ..._compat import ThreadLock
from ..._sync.postgres import PostgresBackend
from ._conf import Settings, load

__all__ = ["closing_connections", "conninfo", "get_backend", "reset"]

F = TypeVar("F", bound=Callable[..., Any])

_lock = ThreadLock()
_backend: PostgresBackend | None = None
_built_for: tuple[object, ...] | None = None

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


def _target(conf: Settings) -> tuple[object, ...]:
    """What the backend is built for: when it changes, the backend is built again."""
    if conf.share_django_pool:
        return (os.getpid(), conf, id(connections[conf.database].pool))
    return (os.getpid(), conf, conninfo(conf.database))


def _build(conf: Settings) -> PostgresBackend:
    if conf.share_django_pool:
        pool = connections[conf.database].pool
        pool.open()  # as Django does on its first connection; a no-op once open
        return PostgresBackend(pool, schema=conf.schema)
    return PostgresBackend.connect(
        conninfo(conf.database),
        schema=conf.schema,
        max_size=conf.pool_size,
        name=f"worklease-django-{conf.database}",
    )


def get_backend() -> PostgresBackend:
    global _backend, _built_for
    conf = load()
    target = _target(conf)
    with _lock:
        stale, forked = None, False
        if _backend is not None and _built_for != target:
            assert _built_for is not None
            forked = _built_for[0] != os.getpid()
            stale = _backend
            _backend = None
        if _backend is None:
            _backend, _built_for = _build(conf), target
        backend = _backend
    if stale is not None and not forked:  # a parent's pool is the parent's to close
        stale.close()
    return backend


def reset(**_: Any) -> None:
    """Close the process's backend (the next ``get_backend()`` builds a new one). Connected
    to Django's ``setting_changed`` signal."""
    global _backend, _built_for
    with _lock:
        backend, _backend, _built_for = _backend, None, None
    if backend is not None:
        backend.close()


def closing_connections(fn: F) -> F:
    """Wrap a work function (or a leader's term function) so that the Django connections its
    thread opened are closed when it returns: pool slots and leader terms run in threads of
    their own, outside any request, and Django closes a thread's connection only at the end
    of a request."""

    @functools.wraps(fn)
    def closing(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            for connection in connections.all(initialized_only=True):
                connection.close()

    return closing  # type: ignore[return-value]
