"""The operator console's ASGI application (Starlette): a background reader keeps one
snapshot of the lease rows (every ``refresh`` seconds, through the backend's public
``rows()``), the pages and the JSON API filter, sort and page that snapshot, and the actions
call the backend's ``expire`` and ``forget``."""

from __future__ import annotations

import asyncio  # noqa: TID251 (the console runs on Starlette: asyncio only, no sync twin)
import contextlib
import ipaddress
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from .._failures import first_line
from .._models import Token
from ..codec import Codec
from ..errors import ConfigError, LeaseLostError
from ._view import (
    MIN_TOKEN,
    SECURITY_HEADERS,
    SESSION_SECONDS,
    Handoffs,
    LeaseRow,
    Query,
    checkpoint_views,
    console_key,
    csrf_matches,
    csrf_token,
    esc,
    lease_body,
    lease_href,
    lease_rows,
    leases_body,
    login_body,
    overview_body,
    page,
    session_valid,
    session_value,
    summary,
    token_matches,
)

logger = logging.getLogger("worklease.web")

SESSION_COOKIE = "worklease_session"
TOKEN_ENV = "WORKLEASE_WEB_TOKEN"
EXPIRE_NOTE = (
    "ends the lease now: its holder is fenced at its next write (its work stops there) and "
    "the next acquire takes over, reading the last checkpoint"
)
FORGET_NOTE = "deletes the retired row for good: the next acquire starts with no checkpoint"


class Snapshot:
    """The lease rows as last read, with when, and what went wrong reading them."""

    def __init__(self) -> None:
        self.rows: list[LeaseRow] = []
        self.by_id: dict[str, LeaseRow] = {}
        self.seen_at = 0.0
        self.error: str | None = None
        self.handoffs = Handoffs()
        self.ready = asyncio.Event()


def check_bind(host: str, auth_token: str | None) -> None:
    """Refuse a non-loopback bind without authentication (anyone who can reach it would see
    every lease)."""
    if auth_token:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ConfigError(
            f"refusing to serve on {host} without authentication: anyone who can reach it "
            f"would see every lease; give --auth-token TOKEN (or set {TOKEN_ENV}), or bind "
            "127.0.0.1"
        )


def app(
    backend: Any,
    *,
    show_checkpoints: bool = False,
    allow_actions: bool = False,
    auth_token: str | None = None,
    codec: Codec[Any] | None = None,
    refresh: float = 0.5,
    label: str | None = None,
    secrets_to_hide: tuple[str, ...] = (),
) -> Starlette:
    """The operator console as an ASGI application, to serve or mount.

    ``backend``: an asyncio backend (``AsyncPostgresBackend``, ``AsyncEtcdBackend``,
    ``AsyncRedisBackend``, ``AsyncMemoryBackend``), or an async callable returning one (it is
    then opened when the application starts and closed when it stops). The console reads it
    only through ``rows()`` (the memory backend: its row snapshots), ``read_checkpoint`` for
    ``show_checkpoints`` (decoded through ``codec`` when given) and, with ``allow_actions``,
    ``expire`` and ``forget``. ``auth_token``: every page but ``/healthz`` then needs it
    (a sign-in form sets a session cookie; scripts send ``Authorization: Bearer TOKEN``);
    ``allow_actions`` requires it. ``refresh``: seconds between two reads of the rows (at
    least four times as long as a read takes, so a large store is not kept busy).
    """
    if allow_actions and not auth_token:
        raise ConfigError(
            f"--allow-actions needs --auth-token (or {TOKEN_ENV}): every action is authorized by it"
        )
    if auth_token is not None and len(auth_token) < MIN_TOKEN:
        raise ConfigError(f"the auth token must be at least {MIN_TOKEN} characters long")
    if not (0.05 <= float(refresh) <= 60):
        raise ConfigError(f"refresh must be between 0.05 and 60 seconds, got {refresh!r}")
    state: dict[str, Any] = {"backend": None}
    snapshot = Snapshot()
    secret = console_key(auth_token) if auth_token else secrets.token_bytes(32)
    hidden = tuple(s for s in secrets_to_hide if s)

    def scrub(text: str) -> str:
        for value in hidden:
            text = text.replace(value, "***")
        return text

    def kind_of(current: Any) -> str:
        if label or current is None:
            return label or ""
        return type(current).__name__.removeprefix("Async").removesuffix("Backend")

    async def read_rows() -> None:
        current = state["backend"]
        try:
            raw = current.rows()
            if asyncio.iscoroutine(raw):
                raw = await raw
            rows = lease_rows(raw, datetime.now(UTC))
        except Exception as exc:  # shown on the pages; the reader goes on
            snapshot.error = scrub(
                f"reading the leases failed: {type(exc).__name__}: {first_line(exc)}"
            )
            logger.warning("worklease web: %s", snapshot.error)
            return
        snapshot.rows, snapshot.by_id = rows, {row.work_id: row for row in rows}
        snapshot.seen_at = time.time()
        snapshot.error = None
        snapshot.handoffs.observe(rows, snapshot.seen_at)
        snapshot.ready.set()

    async def reader() -> None:
        while True:
            started = time.monotonic()
            await read_rows()
            # A big store reads slowly: wait at least 4 reads' time between reads, so the
            # console never keeps the backend busy more than a fifth of the time.
            await asyncio.sleep(max(refresh, 4 * (time.monotonic() - started)))

    starting = asyncio.Lock()

    async def start() -> None:
        """Open the backend (when given a factory) and start the reader, once: at the
        application's startup, or at its first request when mounted inside another
        application (a mounted application's lifespan does not run)."""
        async with starting:
            if state["backend"] is not None:
                return
            if callable(backend) and not hasattr(backend, "acquire"):
                try:
                    state["opened"] = await backend()
                except Exception as exc:  # its text may name the DSN: only the scrubbed one
                    raise ConfigError(
                        scrub(
                            f"opening the backend failed: {type(exc).__name__}: {first_line(exc)}"
                        )
                    ) from None
                state["backend"] = state["opened"]
            else:
                state["backend"] = backend
            await read_rows()
            state["reader"] = asyncio.create_task(reader(), name="worklease-web-reader")

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await start()
        try:
            yield
        finally:
            task = state.get("reader")
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            opened = state.get("opened")
            if opened is not None:
                await opened.close()

    def session_of(request: Request) -> str | None:
        if not auth_token:
            return None
        cookie = request.cookies.get(SESSION_COOKIE)
        return cookie if session_valid(secret, cookie) else None

    def authorized(request: Request) -> bool:
        if not auth_token:
            return True
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer ") and token_matches(auth_token, header[7:].strip()):
            return True
        return session_of(request) is not None

    def secured(response: Response) -> Response:
        for name, value in SECURITY_HEADERS.items():
            response.headers[name] = value
        return response

    def html(request: Request, title: str, body: str, *, nav: str = "", status: int = 200,
             live: bool = True) -> Response:  # fmt: skip
        if request.headers.get("x-worklease-partial") == "1":
            return secured(HTMLResponse(body, status_code=status))
        text = page(title, body, nav=nav, backend=kind_of(state["backend"]), live=live,
                    logged_in=session_of(request) is not None, root=root_of(request))  # fmt: skip
        return secured(HTMLResponse(text, status_code=status))

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            if state["backend"] is None:
                await start()
            if not authorized(request):
                here = route_path(request)
                partial = request.headers.get("x-worklease-partial") == "1"
                if here.startswith("/api/") or request.method != "GET" or partial:
                    return secured(
                        JSONResponse({"error": "authentication required"}, status_code=401)
                    )
                target = (
                    root_of(request)
                    + "/login?next="
                    + quote(
                        here + ("?" + request.url.query if request.url.query else ""),
                        safe="",
                    )
                )
                return secured(RedirectResponse(target, status_code=303))
            return await handler(request)

        return run

    async def overview(request: Request) -> Response:
        now = time.time()
        figures = summary(snapshot.rows, snapshot.handoffs, now, snapshot.seen_at or now)
        return html(request, "Overview", overview_body(figures, snapshot.error), nav="overview")

    async def leases(request: Request) -> Response:
        try:
            query = Query.parse(request.query_params)
        except ValueError as exc:
            body = f'<p class="error" role="alert">{esc(exc)}</p>'
            return html(request, "Leases", body, status=400)
        selected = query.select(snapshot.rows)
        shown, pages = query.paged(selected)
        now = time.time()
        body = leases_body(
            query, shown, len(selected), pages, now, snapshot.seen_at or now, snapshot.error
        )
        return html(request, "Leases", body, nav="leases")

    async def lease(request: Request) -> Response:
        work_id = request.path_params["work_id"]
        row = snapshot.by_id.get(work_id)
        views = None
        if show_checkpoints and row is not None:
            views = await checkpoint_of(row)
        actions: dict[str, str] = {}
        if allow_actions and row is not None:
            if row.state == "held" and callable(getattr(state["backend"], "expire", None)):
                actions["expire"] = EXPIRE_NOTE
            if row.state == "retired":
                actions["forget"] = FORGET_NOTE
        session = session_of(request)
        csrf = csrf_token(secret, session) if session else None
        now = time.time()
        notice = NOTICES.get(request.query_params.get("done") or "")
        body = lease_body(row, work_id, views, actions, csrf, now, snapshot.seen_at or now, notice)
        return html(request, work_id, body, nav="leases", live=not actions)

    async def checkpoint_of(row: LeaseRow) -> list[tuple[str, str]]:
        current = state["backend"]
        token = Token(row.work_id, row.holder_id, row.fencing_token, datetime.now(UTC))
        try:
            read = await current.read_checkpoint(token)
        except LeaseLostError:
            return [("checkpoint", "changed since the last read: reload")]
        except Exception as exc:
            return [("checkpoint", scrub(f"not read: {type(exc).__name__}: {first_line(exc)}"))]
        decoded = None
        if codec is not None and read.state is not None:
            try:
                decoded = repr(codec.decode(read.state))
            except Exception as exc:
                decoded = f"the codec could not decode it: {type(exc).__name__}: {first_line(exc)}"
        return checkpoint_views(read.state, decoded)

    def refuse(request: Request, action: str, work_id: str, status: int, text: str) -> Response:
        logger.warning(
            "worklease web: action %s on %r by %s refused: %s", action, work_id, who(request), text
        )
        return secured(PlainTextResponse(text, status_code=status))

    def who(request: Request) -> str:
        address = request.client.host if request.client else "?"
        forwarded = request.headers.get("x-forwarded-for")
        return f"{address}" + (f" (for {forwarded!r})" if forwarded else "")

    async def act(request: Request) -> Response:
        work_id, action = request.path_params["work_id"], request.path_params["action"]
        if not allow_actions:
            return refuse(
                request,
                action,
                work_id,
                403,
                "actions are off: start the console with --allow-actions",
            )
        if action not in ("expire", "forget"):
            return secured(PlainTextResponse("no such action", status_code=404))
        form = await form_of(request)
        if form is None:
            return refuse(request, action, work_id, 413, "refused: the form is too large")
        bearer = request.headers.get("authorization", "")
        by_header = bearer.lower().startswith("bearer ") and token_matches(
            auth_token, bearer[7:].strip()
        )
        session = session_of(request)
        if not by_header and not csrf_matches(secret, session, str(form.get("csrf") or "")):
            return refuse(
                request,
                action,
                work_id,
                403,
                "refused: a missing or wrong CSRF token (reload the page)",
            )
        await read_rows()  # act on what the backend holds now, not on the page's snapshot
        if snapshot.error is not None:
            return refuse(request, action, work_id, 503, "refused: the leases cannot be read now")
        row = snapshot.by_id.get(work_id)
        if row is None or str(row.fencing_token) != str(form.get("token") or ""):
            return refuse(
                request,
                action,
                work_id,
                409,
                "refused: the lease changed since the page was read (reload it)",
            )
        current = state["backend"]
        when = datetime.now(UTC).isoformat(timespec="seconds")
        try:
            if action == "expire":
                expire = getattr(current, "expire", None)
                if not callable(expire):
                    return refuse(
                        request,
                        action,
                        work_id,
                        409,
                        f"refused: the {kind_of(current)} backend offers no expire",
                    )
                outcome = "expired" if await expire(work_id) else "not-held"
            else:
                if row.state != "retired":
                    return refuse(
                        request,
                        action,
                        work_id,
                        409,
                        "refused: only a retired row is forgotten here",
                    )
                token = Token(work_id, row.holder_id, row.fencing_token, datetime.now(UTC))
                try:
                    await current.forget(token)
                    outcome = "forgot"
                except LeaseLostError:
                    outcome = "changed"
        except Exception as exc:  # the backend failed: say so, without its secrets
            text = scrub(f"the {action} failed: {type(exc).__name__}: {first_line(exc)}")
            return refuse(request, action, work_id, 502, text)
        logger.warning(
            "worklease web: action %s on %r (holder %r, token %d) by %s via %s at %s: %s",
            action, work_id, row.holder_id, row.fencing_token, who(request),
            "token" if by_header else "session", when, outcome,
        )  # fmt: skip
        await read_rows()
        return secured(
            RedirectResponse(
                root_of(request) + "/" + lease_href(work_id) + "?done=" + outcome,
                status_code=303,
            )
        )

    async def api_leases(request: Request) -> Response:
        try:
            query = Query.parse(request.query_params)
        except ValueError as exc:
            return secured(JSONResponse({"error": str(exc)}, status_code=400))
        now = time.time()
        rows = [row.as_json(now, snapshot.seen_at or now) for row in query.select(snapshot.rows)]
        return secured(JSONResponse(rows))

    async def api_summary(request: Request) -> Response:
        now = time.time()
        figures = summary(snapshot.rows, snapshot.handoffs, now, snapshot.seen_at or now)
        figures["error"] = snapshot.error
        return secured(JSONResponse(figures))

    async def healthz(request: Request) -> Response:
        if state["backend"] is None:
            await start()
        stalled = bool(snapshot.seen_at) and time.time() - snapshot.seen_at > max(10 * refresh, 5.0)
        healthy = not stalled and snapshot.error is None and snapshot.ready.is_set()
        age = round(time.time() - snapshot.seen_at, 3) if snapshot.seen_at else None
        body = {"ok": healthy, "read_age_seconds": age, "error": snapshot.error}
        return secured(JSONResponse(body, status_code=200 if healthy else 503))

    async def login(request: Request) -> Response:
        if not auth_token:
            return secured(RedirectResponse(root_of(request) + "/", status_code=303))
        next_path = request.query_params.get("next") or "/"
        if request.method == "GET":
            return html(request, "Sign in", login_body(None, next_path), live=False)
        form = await form_of(request)
        if form is None:
            return secured(PlainTextResponse("the form is too large", status_code=413))
        next_path = str(form.get("next") or "/")
        if not next_path.startswith("/") or next_path.startswith("//") or "\\" in next_path:
            next_path = "/"
        if not token_matches(auth_token, str(form.get("token") or "")):
            logger.warning(
                "worklease web: a sign-in with a wrong token from %s",
                request.client.host if request.client else "?",
            )
            return html(
                request, "Sign in", login_body("wrong token", next_path), status=401, live=False
            )
        response = RedirectResponse(root_of(request) + next_path, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            session_value(secret),
            max_age=SESSION_SECONDS,
            path=root_of(request) + "/",
            httponly=True,
            samesite="strict",
            secure=https(request),
        )
        return secured(response)

    async def logout(request: Request) -> Response:
        response = RedirectResponse(
            root_of(request) + ("/login" if auth_token else "/"), status_code=303
        )
        response.delete_cookie(SESSION_COOKIE, path=root_of(request) + "/")
        return secured(response)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ("console.js", "console.css"):
            return secured(PlainTextResponse("not found", status_code=404))
        text = resources.files("worklease.web").joinpath("static", name).read_text(encoding="utf-8")
        kind = "text/javascript" if name.endswith(".js") else "text/css"
        response = Response(text, media_type=kind)
        secured(response)
        response.headers["Cache-Control"] = "no-cache"
        return response

    routes = [
        Route("/", guarded(overview)),
        Route("/leases", guarded(leases)),
        Route("/lease/{work_id:path}/{action:str}", guarded(act), methods=["POST"]),
        Route("/lease/{work_id:path}", guarded(lease)),
        Route("/api/leases", guarded(api_leases)),
        Route("/api/summary", guarded(api_summary)),
        Route("/healthz", healthz),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/static/{name}", static),
    ]
    return Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(_Headers)])


NOTICES = {
    "expired": "expired: its holder is fenced at its next write, the next acquire takes over",
    "not-held": "it was not held any more: nothing changed",
    "forgot": "forgotten: the row is deleted",
    "changed": "it changed since it was read: nothing deleted",
}
"""What an action's redirect may say (by code: the page never shows text from the URL)."""


class _Headers:
    """The security headers on every response, Starlette's own 404s and 500s too."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._inner(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.decode().lower()
                           not in {name.lower() for name in SECURITY_HEADERS}]  # fmt: skip
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self._inner(scope, receive, sending)


def https(request: Request) -> bool:
    """Whether the browser reached the console over HTTPS (directly or through a proxy that
    says so): the session cookie is then marked Secure."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"


def root_of(request: Request) -> str:
    """Where the console is mounted (``""`` at the root of its own server)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def route_path(request: Request) -> str:
    """The request's path inside the console (without where it is mounted)."""
    path, root = request.url.path, root_of(request)
    return path[len(root) :] if root and path.startswith(root) else path


MAX_FORM = 65536


async def form_of(request: Request) -> dict[str, str] | None:
    """An urlencoded form body (the console's forms send nothing else; no multipart parser
    is needed); ``None`` past ``MAX_FORM`` bytes, read no further."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_FORM:
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            return None
    parsed = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {key: values[-1] for key, values in parsed.items()}


def token_from_environment(given: str | None) -> str | None:
    return given or os.environ.get(TOKEN_ENV) or None
