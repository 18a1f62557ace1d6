# Generated from tests/_async/test_conformance.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""The public backend conformance suite, run against every backend of the conftest."""

from __future__ import annotations

from worklease.conformance import BackendConformance


class TestBackendConformance(BackendConformance):
    """Every conformance case; the ``backend`` fixture comes from the conftest."""
