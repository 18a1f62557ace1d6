"""The operator console (``worklease web``, issue 28) in a real browser: Playwright driving
the system Chromium (Debian's ``chromium``; no browser download), against PostgreSQL with a
running pool of holders.

``WORKLEASE_SCREENSHOTS=DIR`` also saves the pages (light and dark) for the docs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("playwright")

import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests import pg
from worklease import (
    AsyncPostgresBackend,
    Checkpoint,
    ExitMode,
    FencedError,
    Lease,
    Pool,
    PostgresBackend,
    Token,
)
from worklease.web import app

pytestmark = [pytest.mark.postgres, pytest.mark.browser]

CHROMIUM = (
    os.environ.get("WORKLEASE_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
)
SHOTS = os.environ.get("WORKLEASE_SCREENSHOTS")
CONSOLE_SCRIPT = Path(sys.executable).with_name("worklease")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(dsn: str, **options: Any) -> Iterator[str]:
    """The console for ``dsn`` on a free loopback port, in a thread; its base URL."""
    port = _free_port()

    async def open_backend() -> AsyncPostgresBackend:
        backend = AsyncPostgresBackend.connect(dsn, listen=False, max_size=2)
        await backend.pool.open()
        return backend

    options.setdefault("refresh", 0.25)
    config = uvicorn.Config(
        app(open_backend, label="PostgreSQL", **options),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the console did not start"
        assert time.monotonic() < deadline, "the console did not start within 30 s"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """The system Chromium through Playwright (no browser download), for this module only:
    Playwright's sync API keeps an event loop running in this thread while it is open, which
    would break every asyncio test after it in the same process (so not pytest-playwright's
    session-wide browser)."""
    if not os.access(CHROMIUM, os.X_OK):
        reason = f"no Chromium at {CHROMIUM} (apt-get install chromium): browser tests skipped"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def dsn(postgres_dsn: str) -> str:
    pg.reset(postgres_dsn)
    return postgres_dsn


@contextmanager
def running_pool(dsn: str, holder: str, work_ids: list[str]) -> Iterator[Pool]:
    """A pool of ``holder`` over ``work_ids`` in a thread. Each work ID's run checkpoints
    every 0.2 s and holds its lease until the pool stops, so every lease stays held while
    the test looks (a run that ended and was rerun would leave its lease free in between,
    and a page could show fewer than all)."""
    backend = PostgresBackend.connect(dsn, max_size=4)
    stopping = threading.Event()

    def work(token: Token, prior: Checkpoint) -> bytes:
        while not stopping.wait(0.2):
            lease.checkpoint(token, f"{holder} step at {time.time():.1f}".encode())
        return f"{holder} stopped at {time.time():.1f}".encode()

    lease = Lease(backend, holder_id=holder, ttl=30)
    pool = Pool(lease, work_ids, work, idle_interval=0.2, rerun_interval=0.1, fair_share=False)
    thread = threading.Thread(target=pool.run, daemon=True)
    thread.start()
    try:
        yield pool
    finally:
        stopping.set()
        pool.stop()
        thread.join(30)
        backend.close()


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def held_by(dsn: str) -> dict[str, str]:
    with PostgresBackend.connect(dsn, listen=False, max_size=1) as backend:
        return {r["work_id"]: r["holder_id"] for r in backend.rows() if r["held"]}


def shoot(page: Page, name: str) -> None:
    if not SHOTS:
        return
    Path(SHOTS).mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.wait_for_timeout(150)
        page.screenshot(path=str(Path(SHOTS) / f"console-{name}-{scheme}.png"), full_page=True)
    page.emulate_media(color_scheme="light")


def test_the_overview_and_table_show_a_running_pool(dsn: str, page: Page) -> None:
    first, second = [f"job-{n}" for n in range(4)], [f"task-{n}" for n in range(3)]
    with (
        running_pool(dsn, "worker-a", first),
        running_pool(dsn, "worker-b", second),
        serving(dsn) as base,
    ):
        wait_until(lambda: len(held_by(dsn)) == 7)
        page.goto(base + "/")
        expect(page.locator('.count[data-state="held"]')).to_have_text("7")
        bars = page.locator("#holders .bar")
        expect(bars).to_have_count(2)
        expect(bars.nth(0).locator(".label")).to_have_text("worker-a")
        expect(bars.nth(0).locator(".n")).to_have_text("4")
        expect(bars.nth(1).locator(".n")).to_have_text("3")
        widths = bars.locator(".fill i").evaluate_all("bars => bars.map(b => b.offsetWidth)")
        assert widths[0] > widths[1] > 0  # 4 : 3, drawn by the script (no inline styles)
        shoot(page, "overview")
        page.goto(base + "/leases")
        rows = page.locator("table.leases tbody tr")
        expect(rows).to_have_count(7)
        expect(page.locator('tr[data-work-id="job-0"] td').nth(1)).to_have_text("worker-a")
        expect(page.locator('tr[data-work-id="task-2"] .state')).to_have_text("held")
        shoot(page, "leases")
        page.locator('a[href="lease/job-1"]').click()
        expect(page.locator("h1")).to_have_text("job-1")
        expect(page.locator(".hidden-note")).to_contain_text("--show-checkpoints")


def test_a_release_and_a_new_acquisition_appear_without_reload(dsn: str, page: Page) -> None:
    """Measured from the write to the row changing on the page (no navigation)."""
    with PostgresBackend.connect(dsn, max_size=2) as backend, serving(dsn) as base:
        lease = Lease(backend, holder_id="worker-a", ttl=30)
        token = lease.acquire("job-1")
        page.goto(base + "/leases")
        expect(page.locator('tr[data-work-id="job-1"] .state')).to_have_text("held")
        page.evaluate("window.__loaded = performance.timeOrigin")
        latencies = []
        started = time.monotonic()
        lease.release(token, ExitMode.FINISHED)
        expect(page.locator('tr[data-work-id="job-1"] .state')).to_have_text(
            "released", timeout=5000
        )
        latencies.append(time.monotonic() - started)
        started = time.monotonic()
        lease.acquire("job-2")
        expect(page.locator('tr[data-work-id="job-2"] .state')).to_have_text("held", timeout=5000)
        latencies.append(time.monotonic() - started)
        assert page.evaluate("window.__loaded") == page.evaluate("performance.timeOrigin")
        print(f"live update latency (release, acquire): {[round(x, 2) for x in latencies]} s")


def test_filters_sorting_and_paging_work(dsn: str, page: Page) -> None:
    with PostgresBackend.connect(dsn, max_size=2) as backend, serving(dsn) as base:
        a = Lease(backend, holder_id="worker-a", ttl=30)
        b = Lease(backend, holder_id="worker-b", ttl=30)
        for n in range(60):
            (a if n % 2 else b).acquire(f"tenant-{n:02d}")
        a.release(a.acquire("other-1"), ExitMode.RETIRED)
        page.goto(base + "/leases")
        expect(page.locator("nav.pager")).to_contain_text("page 1 of 2 · 61 lease(s)")
        expect(page.locator("table.leases tbody tr")).to_have_count(50)
        page.locator('a[rel="next"]').click()
        expect(page.locator("table.leases tbody tr")).to_have_count(11)
        page.goto(base + "/leases")
        page.select_option('select[name="state"]', "retired")
        page.locator(".filters button").click()
        expect(page.locator("table.leases tbody tr")).to_have_count(1)
        expect(page.locator('tr[data-work-id="other-1"]')).to_be_visible()
        page.goto(base + "/leases")
        page.fill('input[name="holder"]', "worker-a")
        page.fill('input[name="work_id"]', "tenant-1[0-3]")
        page.locator(".filters button").click()
        ids = page.locator("table.leases tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.workId)"
        )
        assert ids == ["tenant-11", "tenant-13"]
        page.goto(base + "/leases?sort=work_id&order=desc&work_id=tenant-*")
        first = page.locator("table.leases tbody tr").first
        expect(first).to_have_attribute("data-work-id", "tenant-59")
        api = httpx.get(base + "/api/leases", params={"state": "retired"}).json()
        assert [row["work_id"] for row in api] == ["other-1"]
        assert set(api[0]) == {
            "work_id", "holder_id", "fencing_token", "state", "exit_mode", "prev_exit",
            "prev_holder_id", "expires_in", "checkpoint_size", "updated_at",
        }  # fmt: skip
        bad = httpx.get(base + "/api/leases", params={"state": "sleeping"})
        assert bad.status_code == 400
        assert "state must be one of" in bad.json()["error"]


def test_an_action_with_the_token_expires_a_lease_and_its_holder_is_fenced(
    dsn: str, page: Page
) -> None:
    secret = "s3cret-console-token"
    with (
        PostgresBackend.connect(dsn, max_size=2) as backend,
        serving(dsn, allow_actions=True, auth_token=secret, show_checkpoints=True) as base,
    ):
        lease = Lease(backend, holder_id="worker-a", ttl=30)
        token = lease.acquire("job-1")
        lease.checkpoint(token, b'{"step": 3}')
        page.goto(base + "/lease/job-1")
        expect(page.locator("h1")).to_have_text("Sign in")
        page.fill('input[name="token"]', "wrong")
        page.locator(".login button").click()
        expect(page.locator(".error")).to_have_text("wrong token")
        page.fill('input[name="token"]', secret)
        page.locator(".login button").click()
        expect(page.locator("h1")).to_have_text("job-1")
        expect(page.locator(".checkpoint")).to_contain_text('{"step": 3}')
        shoot(page, "lease")
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator("form.action button").click()
        expect(page.locator(".notice")).to_contain_text("fenced at its next write")
        with pytest.raises(FencedError):
            lease.checkpoint(token, b"after")
        successor = Lease(backend, holder_id="worker-b", ttl=30)
        taken = successor.acquire("job-1")
        assert successor.read_checkpoint(taken) == Checkpoint(
            b'{"step": 3}', ExitMode.EXPIRED, "worker-a"
        )


def test_an_action_without_the_token_is_refused(dsn: str) -> None:
    secret = "s3cret-console-token"
    with (
        PostgresBackend.connect(dsn, max_size=2) as backend,
        serving(dsn, allow_actions=True, auth_token=secret) as base,
    ):
        lease = Lease(backend, holder_id="worker-a", ttl=30)
        token = lease.acquire("job-1")
        wait_until(lambda: "job-1" in httpx.get(
            base + "/api/leases", headers={"Authorization": f"Bearer {secret}"}
        ).text)  # fmt: skip
        form = {"token": str(token.fencing_token), "csrf": "x"}
        anonymous = httpx.post(base + "/lease/job-1/expire", data=form)
        assert anonymous.status_code == 401
        assert anonymous.json() == {"error": "authentication required"}
        with httpx.Client(base_url=base) as client:  # signed in, but no CSRF token
            client.post("/login", data={"token": secret, "next": "/"})
            forged = client.post("/lease/job-1/expire", data=form)
        assert forged.status_code == 403
        assert "CSRF" in forged.text
        assert httpx.get(base + "/api/leases").status_code == 401
        assert httpx.get(base + "/healthz").status_code == 200  # a probe needs no token
        lease.renew(token)  # still the holder's
        headers = httpx.get(base + "/healthz").headers
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"


def test_a_public_bind_without_auth_refuses_to_start(postgres_dsn: str) -> None:
    refused = subprocess.run(
        [str(CONSOLE_SCRIPT), "web", "--dsn", postgres_dsn, "--bind", "0.0.0.0:18999"],
        capture_output=True, text=True, timeout=60, check=False,
        env={k: v for k, v in os.environ.items() if k != "WORKLEASE_WEB_TOKEN"},
    )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "worklease web: refusing to serve on 0.0.0.0 without authentication: anyone who can "
        "reach it would see every lease; give --auth-token TOKEN (or set WORKLEASE_WEB_TOKEN), "
        "or bind 127.0.0.1"
    )
    actions = subprocess.run(
        [str(CONSOLE_SCRIPT), "web", "--dsn", postgres_dsn, "--allow-actions"],
        capture_output=True, text=True, timeout=60, check=False,
        env={k: v for k, v in os.environ.items() if k != "WORKLEASE_WEB_TOKEN"},
    )  # fmt: skip
    assert actions.returncode == 1
    assert "--allow-actions needs --auth-token" in actions.stderr


def test_ten_thousand_leases_render_their_first_page(dsn: str, page: Page) -> None:
    """Server-side filtering and paging: the first page of 10,000 leases (its time is
    printed, measured in the browser; the target lives in the issue, not here)."""
    with PostgresBackend.connect(dsn, max_size=2) as backend:
        ids = [f"bulk-{n:05d}" for n in range(10_000)]
        for start in range(0, len(ids), 1000):
            assert len(backend.acquire_many(ids[start : start + 1000], "bulk", 120)) == 1000
    with serving(dsn, refresh=1.0) as base:
        timings = []
        for _ in range(3):
            started = time.monotonic()
            page.goto(base + "/leases")
            expect(page.locator("table.leases tbody tr")).to_have_count(50)
            timings.append(time.monotonic() - started)
        expect(page.locator("nav.pager")).to_contain_text("10000 lease(s)")
        navigation = page.evaluate(
            "JSON.stringify(performance.getEntriesByType('navigation')[0].toJSON())"
        )
        loaded = json.loads(navigation)
        print(
            f"10,000 leases: first page in {[round(t, 3) for t in timings]} s (Playwright "
            f"goto to rows), load event at {loaded['loadEventEnd']:.0f} ms"
        )


def test_the_console_mounted_inside_another_application_links_under_its_path() -> None:
    """Mounted (a mounted application's lifespan does not run): the reader starts at the
    first request, and every link, form and redirect stays under the mount path."""
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    from worklease import AsyncMemoryBackend

    memory = AsyncMemoryBackend()
    outer = Starlette(routes=[Mount("/ops", app=app(memory, auth_token="tok-1234567890abcdef"))])
    with TestClient(outer) as client:
        first = client.get("/ops/leases", follow_redirects=False)
        assert first.status_code == 303
        assert first.headers["location"] == "/ops/login?next=%2Fleases"
        form = {"token": "tok-1234567890abcdef", "next": "/leases"}
        signed = client.post("/ops/login", data=form, follow_redirects=False)
        assert signed.headers["location"] == "/ops/leases"
        body = client.get("/ops/leases").text
        assert '<base href="/ops/">' in body
        assert 'href="leases?' in body
        assert client.get("/ops/static/console.js").status_code == 200
        assert client.get("/ops/healthz").json()["ok"] is True


def test_a_backend_error_reaches_the_page_without_the_password() -> None:
    """A read that fails shows on the pages and /healthz (503), the password replaced."""
    from starlette.testclient import TestClient

    class Failing:
        async def acquire(self, *args: Any) -> None:  # looks like a backend
            raise AssertionError

        async def rows(self) -> list[dict[str, Any]]:
            raise ConnectionError("connection to user:hunter2-secret@db failed")

    console = app(Failing(), secrets_to_hide=("hunter2-secret",), label="PostgreSQL")
    with TestClient(console) as client:
        overview = client.get("/").text
        health = client.get("/healthz")
    assert "reading the leases failed: ConnectionError" in overview
    assert "hunter2-secret" not in overview
    assert "user:***@db" in overview
    assert health.status_code == 503
    assert "hunter2-secret" not in health.text


def test_hostile_input_is_escaped_refused_or_bounded() -> None:
    """What the security review tried: markup in a refused parameter comes back escaped; a
    glob that would backtrack forever, or does not compile, is answered at once; a huge form
    is refused unread; a short token, a partial page after the session ended, Starlette's own
    404 (with the headers) and a session past its time."""
    from starlette.testclient import TestClient

    from worklease import AsyncMemoryBackend, ConfigError
    from worklease.web._view import SESSION_SECONDS, console_key, session_valid, session_value

    memory = AsyncMemoryBackend()
    with TestClient(app(memory)) as client:
        evil = '<meta http-equiv=refresh content="0;url=https://evil.example/">'
        page_ = client.get("/leases", params={"state": evil})
        assert page_.status_code == 400
        assert "<meta http-equiv" not in page_.text
        assert "&lt;meta" in page_.text
        slow = client.get("/api/leases", params={"work_id": "*?" * 30 + "x"})
        assert slow.status_code == 200
        assert client.get("/api/leases", params={"work_id": "x" * 2000}).status_code == 400
        missing = client.get("/nowhere")
        assert missing.status_code == 404
        assert missing.headers["x-frame-options"] == "DENY"
    secret = "tok-1234567890abcdef"
    with TestClient(app(memory, auth_token=secret, allow_actions=True)) as client:
        urlencoded = {"content-type": "application/x-www-form-urlencoded"}
        huge = client.post("/login", content=b"token=" + b"x" * 200_000, headers=urlencoded)
        assert huge.status_code == 413
        partial = client.get("/leases", headers={"X-Worklease-Partial": "1"})
        assert partial.status_code == 401  # the page's script then reloads to sign in
    with pytest.raises(ConfigError, match="at least 16 characters"):
        app(memory, auth_token="short")
    key = console_key(secret)
    issued = session_value(key, now=1_000_000)
    assert session_valid(key, issued, now=1_000_000 + 60)
    assert not session_valid(key, issued, now=1_000_000 + SESSION_SECONDS + 1)
    assert not session_valid(console_key("another-token-0123456"), issued, now=1_000_060)
    assert not session_valid(key, "1000000.forged", now=1_000_060)
