"""The ``WORKLEASE`` setting, validated (decisions only: no I/O)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ..._pg import check_schema_name
from ..._validation import check_ttl as check_duration
from ...errors import ConfigError

__all__ = ["Settings", "load", "worker_factory"]

_KEYS = ("DATABASE", "SCHEMA", "POOL_SIZE", "SHARE_DJANGO_POOL", "CHECK_TTL", "WORKERS")


@dataclass(frozen=True)
class Settings:
    database: str = "default"
    schema: str | None = None
    pool_size: int = 4
    share_django_pool: bool = False
    check_ttl: float = 30.0
    workers: tuple[tuple[str, str], ...] = ()


def _bad(key: str, why: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"WORKLEASE[{key!r}] {why}")


def load() -> Settings:
    """The ``WORKLEASE`` setting (a dict; every key optional), checked against
    ``DATABASES``."""
    raw = getattr(django_settings, "WORKLEASE", None) or {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"WORKLEASE must be a dict, got {type(raw).__name__}")
    unknown = sorted(str(key) for key in raw if key not in _KEYS)
    if unknown:
        raise ImproperlyConfigured(
            f"WORKLEASE has unknown keys {unknown}; the keys are {', '.join(_KEYS)}"
        )
    database = raw.get("DATABASE", "default")
    if not isinstance(database, str) or database not in django_settings.DATABASES:
        raise _bad("DATABASE", f"must name a database of DATABASES, got {database!r}")
    engine = django_settings.DATABASES[database].get("ENGINE", "")
    if engine != "django.db.backends.postgresql":
        raise _bad("DATABASE", f"names {database!r}, which is {engine!r}, not PostgreSQL")
    options = django_settings.DATABASES[database].get("OPTIONS") or {}
    if options.get("assume_role"):
        raise _bad(
            "DATABASE",
            f"names {database!r}, whose OPTIONS set assume_role: worklease's renewals and "
            "checks open connections of their own, which would run as the login role; grant "
            "the login role what worklease needs instead",
        )
    share = raw.get("SHARE_DJANGO_POOL", False)
    if not isinstance(share, bool):
        raise _bad("SHARE_DJANGO_POOL", f"must be True or False, got {share!r}")
    if share and not options.get("pool"):
        raise _bad("SHARE_DJANGO_POOL", f"needs Django's pool: {database!r} has no OPTIONS['pool']")
    if share and not django_settings.USE_TZ:
        raise _bad(
            "SHARE_DJANGO_POOL",
            "needs USE_TZ = True: with it off, Django's connections read timestamps as naive "
            "local times, which a lease must not see",
        )
    try:
        schema = check_schema_name(raw.get("SCHEMA"))
        check_ttl = check_duration(raw.get("CHECK_TTL", 30.0))
    except (ConfigError, ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"WORKLEASE: {exc}") from None
    pool_size = raw.get("POOL_SIZE", 4)
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or not 1 <= pool_size <= 1000:
        raise _bad("POOL_SIZE", f"must be a whole number from 1 to 1000, got {pool_size!r}")
    workers = raw.get("WORKERS", {})
    if not isinstance(workers, dict) or not all(
        isinstance(name, str) and name and isinstance(path, str) and path
        for name, path in workers.items()
    ):
        raise _bad("WORKERS", "must map names to dotted paths of functions")
    return Settings(database, schema, pool_size, share, check_ttl, tuple(workers.items()))


def worker_factory(conf: Settings, name: str) -> Callable[[Any], Any]:
    """The function ``WORKERS[name]`` names, imported."""
    paths = dict(conf.workers)
    if name not in paths:
        known = ", ".join(sorted(paths)) or "none (set WORKLEASE['WORKERS'])"
        raise ImproperlyConfigured(f"no worker {name!r} in WORKLEASE['WORKERS']; known: {known}")
    try:
        factory = import_string(paths[name])
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"WORKLEASE['WORKERS'][{name!r}] = {paths[name]!r} cannot be imported: {exc}"
        ) from exc
    if not callable(factory):
        raise ImproperlyConfigured(
            f"WORKLEASE['WORKERS'][{name!r}] = {paths[name]!r} is not a function"
        )
    return factory
