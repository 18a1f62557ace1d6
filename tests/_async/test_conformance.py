"""The public backend conformance suite, run against every backend of the conftest."""

from __future__ import annotations

from worklease.conformance import AsyncBackendConformance


class TestBackendConformance(AsyncBackendConformance):
    """Every conformance case; the ``backend`` fixture comes from the conftest."""
