"""Ready-made observers: stdlib logging, Prometheus and OpenTelemetry.

``LoggingObserver`` needs nothing beyond the standard library. ``PrometheusObserver`` needs
``prometheus_client`` (the ``prometheus`` extra) and ``OpenTelemetryObserver``
needs ``opentelemetry-api`` (the ``otel`` extra); they are imported on first
use, so importing this package never requires either.

Each observer is at once a ``LeaseObserver``, a ``VacuumObserver`` and a ``PoolObserver``,
works with both flavours, and may be called from any thread and from the event loop.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .log import LoggingObserver

if TYPE_CHECKING:
    from .otel import OpenTelemetryObserver
    from .prometheus import PrometheusObserver

__all__ = ["LoggingObserver", "OpenTelemetryObserver", "PrometheusObserver"]

_LAZY = {
    "OpenTelemetryObserver": ".otel",
    "PrometheusObserver": ".prometheus",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
