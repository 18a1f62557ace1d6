# Generated from tests/_async/test_conformance.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""The public backend conformance suite, run against every backend of the conftest."""

from __future__ import annotations

from typing import Any

import pytest

from worklease import MemoryBackend
from worklease._sync.backend import Capabilities
from worklease.conformance import BackendConformance


@pytest.mark.not_on("redis", "redis-cluster")  # tests/_async/test_redis.py, with its flag
class TestBackendConformance(BackendConformance):
    """Every conformance case; the ``backend`` fixture comes from the conftest."""


class Delegating:
    """A backend that forwards every attribute to a memory backend through ``__getattr__``
    (a wrapper, a metrics proxy): its optional methods must still be found (on Python 3.12+
    a runtime protocol check reads attributes statically and would miss them)."""

    def __init__(self) -> None:
        self._inner = MemoryBackend()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TestDelegatingBackendConformance(BackendConformance):
    """The whole suite through a delegating proxy."""

    @pytest.fixture
    def backend(self) -> Any:
        return Delegating()


def test_capabilities_of_a_delegating_backend_are_found() -> None:
    capabilities = Capabilities.of(Delegating())
    assert capabilities.renew_many is not None
    assert capabilities.acquire_with_checkpoint is not None
    assert capabilities.find_available is not None
    assert capabilities.acquire_many is not None
    assert capabilities.watch_releases is not None
    assert capabilities.checkpoint_many is not None
    assert Capabilities.of(object()) == Capabilities(None, None, None, None, None)
