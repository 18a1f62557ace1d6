"""The backend conformance suite, for authors of third-party backends.

A backend passes when every test of the suite passes against it. The suite is a pytest
test-class base in two flavours: ``BackendConformance`` for a synchronous ``Backend`` and
``AsyncBackendConformance`` for an asyncio ``AsyncBackend``. Subclass the one that matches
your backend in a class whose name starts with ``Test`` and provide a function-scoped
fixture named ``backend`` that returns a fresh, empty backend for each test::

    # test_my_backend.py
    import pytest

    from worklease.conformance import BackendConformance


    class TestMyBackend(BackendConformance):
        @pytest.fixture
        def backend(self):
            backend = MyBackend(...)  # a fresh, empty backend for every test
            yield backend
            backend.close()

For an asyncio backend::

    from worklease.conformance import AsyncBackendConformance


    class TestMyAsyncBackend(AsyncBackendConformance):
        @pytest.fixture
        async def backend(self):
            async with MyAsyncBackend(...) as backend:
                yield backend

The fixture may also live in a ``conftest.py``. The suite needs pytest; the asyncio suite
also needs pytest-asyncio with ``asyncio_mode = "auto"``. Importing this module imports
pytest. Each test's docstring names the case of the backend contract it checks.
"""

from __future__ import annotations

from ._async.conformance import AsyncBackendConformance
from ._sync.conformance import BackendConformance

__all__ = ["AsyncBackendConformance", "BackendConformance"]
