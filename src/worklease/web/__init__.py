"""The operator console: ``worklease web`` serves it; ``app(backend)`` is the ASGI
application to mount inside a FastAPI, Starlette or Django-ASGI service (the ``web`` extra:
Starlette and uvicorn).

It lives apart from the lease engine (nothing there imports it) and reads a backend only
through its public methods. Read-only unless started with actions allowed (which need an
auth token); see the guide's "Operator console" page.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "the operator console needs Starlette and uvicorn: pip install 'worklease[web]' "
        "(from a checkout: pip install '.[web]')",
        name=exc.name,
    ) from exc

from ._server import TOKEN_ENV, app, check_bind

__all__ = ["TOKEN_ENV", "app", "check_bind"]
