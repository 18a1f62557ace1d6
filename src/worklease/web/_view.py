# ruff: noqa: E501  (HTML and messages read better unwrapped)
"""The operator console's decisions, no I/O: lease rows as the console shows them, filters,
sorting and paging, the overview's figures, handoffs derived from the tokens it observes,
checkpoint rendering, authentication and CSRF tokens, and the HTML of each page."""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import hmac
import html
import math
import re
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

STATES = ("held", "lapsed", "released", "retired")
"""What a lease row is in the console: held (unexpired, no exit), lapsed (expired, no exit
declared), released (FINISHED or ABANDONED declared) or retired (RETIRED declared)."""
SORTABLE = ("work_id", "holder_id", "fencing_token", "state", "expires_in", "checkpoint_size",
            "updated_at")  # fmt: skip
PAGE_SIZE = 50
EXPIRING_SOON = 10.0
"""Seconds: a held lease with less left is listed under "expiring soon"."""
HANDOFF_MINUTES = 60

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class LeaseRow:
    """One lease as the console shows it (the keys of ``status --json``)."""

    work_id: str
    holder_id: str
    fencing_token: int
    state: str
    exit_mode: str | None
    prev_exit: str | None
    prev_holder_id: str | None
    expires_in: float | None
    """Seconds left while held (``None`` otherwise), as of ``seen_at``."""
    checkpoint_size: int | None
    updated_at: datetime | None

    def as_json(self, now: float, seen_at: float) -> dict[str, Any]:
        return {
            "work_id": self.work_id,
            "holder_id": self.holder_id,
            "fencing_token": self.fencing_token,
            "state": self.state,
            "exit_mode": self.exit_mode,
            "prev_exit": self.prev_exit,
            "prev_holder_id": self.prev_holder_id,
            "expires_in": self.left(now, seen_at),
            "checkpoint_size": self.checkpoint_size,
            "updated_at": _iso(self.updated_at),
        }

    def left(self, now: float, seen_at: float) -> float | None:
        if self.expires_in is None:
            return None
        return round(max(self.expires_in - (now - seen_at), 0.0), 3)


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def state_of(held: bool, exit_mode: str | None) -> str:
    if held:
        return "held"
    if exit_mode == "retired":
        return "retired"
    return "released" if exit_mode else "lapsed"


def lease_rows(raw: Iterable[Any], now: datetime) -> list[LeaseRow]:
    """Backend rows as console rows: the dicts of ``rows()`` (PostgreSQL, etcd, Redis) or the
    memory backend's row snapshots."""
    found: list[LeaseRow] = []
    for row in raw:
        if isinstance(row, Mapping):
            exit_mode = _name(row.get("exit_mode"))
            found.append(
                LeaseRow(
                    str(row["work_id"]),
                    str(row.get("holder_id") or ""),
                    int(row["fencing_token"]),
                    state_of(bool(row["held"]), exit_mode),
                    exit_mode,
                    _name(row.get("prev_exit")),
                    row.get("prev_holder_id"),
                    float(row["ttl_left"])
                    if row["held"] and row.get("ttl_left") is not None
                    else None,
                    row.get("checkpoint_bytes"),
                    row.get("updated_at"),
                )
            )
            continue
        exit_mode = _name(row.exit_mode)
        held = exit_mode is None and row.expires_at > now
        found.append(
            LeaseRow(
                row.work_id,
                row.holder_id,
                row.fencing_token,
                state_of(held, exit_mode),
                exit_mode,
                _name(row.prev_exit),
                row.prev_holder_id,
                (row.expires_at - now).total_seconds() if held else None,
                len(row.checkpoint) if row.checkpoint is not None else None,
                row.updated_at,
            )
        )
    found.sort(key=lambda lease: lease.work_id)
    return found


def _name(value: Any) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))


# -- filters, sorting, paging ---------------------------------------------------------------


MAX_PATTERN = 1024
"""The longest work-ID glob a filter takes."""


@functools.lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """A work-ID glob as ``status --work-id`` takes it (``*``, ``?``, ``[abc]``, ``[!a]``),
    matched against the whole work ID. ``fnmatch``'s translation: its runs of ``*`` are
    atomic groups, so no pattern backtracks catastrophically. ``ValueError`` for a pattern
    too long or that does not compile."""
    if len(pattern) > MAX_PATTERN:
        raise ValueError(f"work_id pattern is longer than {MAX_PATTERN} characters")
    try:
        return re.compile(fnmatch.translate(pattern))
    except re.error as exc:
        raise ValueError(f"work_id pattern {pattern!r} is not a glob: {exc}") from None


@dataclass(frozen=True)
class Query:
    """The leases page's filters, sort and page, read from query parameters."""

    state: str | None = None
    holder: str | None = None
    work_id: str | None = None
    sort: str = "work_id"
    descending: bool = False
    page: int = 1

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> Query:
        """Unknown or malformed values raise ``ValueError`` with what is wrong."""
        state = params.get("state") or None
        if state is not None and state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        sort = params.get("sort") or "work_id"
        if sort not in SORTABLE:
            raise ValueError(f"sort must be one of {', '.join(SORTABLE)}, got {sort!r}")
        order = params.get("order") or "asc"
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be asc or desc, got {order!r}")
        try:
            page = int(params.get("page") or 1)
        except ValueError:
            raise ValueError(f"page must be a whole number, got {params.get('page')!r}") from None
        if page < 1:
            raise ValueError(f"page must be 1 or more, got {page}")
        work_id = params.get("work_id") or None
        if work_id is not None:
            glob_regex(work_id)  # refused here (400), not while filtering
        return cls(state, params.get("holder") or None, work_id, sort, order == "desc", page)

    def params(self, **changes: Any) -> dict[str, str]:
        """The query parameters of this view with ``changes``, defaults left out."""
        values: dict[str, Any] = {
            "state": self.state, "holder": self.holder, "work_id": self.work_id,
            "sort": self.sort, "order": "desc" if self.descending else "asc", "page": self.page,
        }  # fmt: skip
        values.update(changes)
        defaults = {"sort": "work_id", "order": "asc", "page": 1}
        return {
            key: str(value)
            for key, value in values.items()
            if value not in (None, "") and defaults.get(key) != value
        }

    def select(self, rows: Sequence[LeaseRow]) -> list[LeaseRow]:
        """The rows that pass the filters, sorted (then by work ID)."""
        matcher = glob_regex(self.work_id) if self.work_id else None
        kept = [
            row
            for row in rows
            if (self.state is None or row.state == self.state)
            and (self.holder is None or row.holder_id == self.holder)
            and (matcher is None or matcher.match(row.work_id))
        ]
        if self.sort != "work_id":
            kept.sort(key=lambda row: row.work_id)
            kept.sort(key=lambda row: _sort_key(row, self.sort), reverse=self.descending)
        elif self.descending:
            kept.reverse()
        return kept

    def paged(self, rows: Sequence[LeaseRow]) -> tuple[list[LeaseRow], int]:
        """This page's rows and the number of pages (at least 1)."""
        pages = max(math.ceil(len(rows) / PAGE_SIZE), 1)
        start = (min(self.page, pages) - 1) * PAGE_SIZE
        return list(rows[start : start + PAGE_SIZE]), pages


def _sort_key(row: LeaseRow, column: str) -> tuple[int, Any]:
    value = getattr(row, column if column != "expires_in" else "expires_in")
    if value is None:
        return (1, 0)  # missing values last
    if isinstance(value, datetime):
        return (0, value.timestamp())
    return (0, value)


# -- the overview -------------------------------------------------------------------------


@dataclass
class Handoffs:
    """Handoffs per minute, derived from the tokens the console observes between two reads:
    a work ID whose token changed to a new grant counts once (a first grant does not)."""

    tokens: dict[str, int] = field(default_factory=dict)
    minutes: deque[tuple[int, int]] = field(default_factory=deque)
    primed: bool = False

    def observe(self, rows: Sequence[LeaseRow], now: float) -> int:
        """Record one read; return how many handoffs it saw."""
        seen = {row.work_id: row.fencing_token for row in rows}
        count = 0
        if self.primed:
            for work_id, token in seen.items():
                before = self.tokens.get(work_id)
                if before is not None and token != before:
                    count += 1
        self.tokens, self.primed = seen, True
        minute = int(now // 60)
        if self.minutes and self.minutes[-1][0] == minute:
            self.minutes[-1] = (minute, self.minutes[-1][1] + count)
        else:
            self.minutes.append((minute, count))
        while self.minutes and self.minutes[0][0] <= minute - HANDOFF_MINUTES:
            self.minutes.popleft()
        return count

    def per_minute(self, now: float) -> list[int]:
        """The last hour, oldest first, one count per minute (0 for minutes unseen)."""
        minute = int(now // 60)
        counts = dict(self.minutes)
        return [counts.get(m, 0) for m in range(minute - HANDOFF_MINUTES + 1, minute + 1)]


def summary(
    rows: Sequence[LeaseRow], handoffs: Handoffs, now: float, seen_at: float
) -> dict[str, Any]:
    counts = dict.fromkeys(STATES, 0)
    holders: dict[str, int] = {}
    for row in rows:
        counts[row.state] += 1
        if row.state == "held":
            holders[row.holder_id] = holders.get(row.holder_id, 0) + 1
    soon = sorted(
        (
            row
            for row in rows
            if row.state == "held" and (row.left(now, seen_at) or 0) < EXPIRING_SOON
        ),
        key=lambda row: row.left(now, seen_at) or 0,
    )
    return {
        "counts": counts,
        "total": len(rows),
        "holders": dict(sorted(holders.items(), key=lambda item: (-item[1], item[0]))),
        "expiring_soon": [row.as_json(now, seen_at) for row in soon[:20]],
        "handoffs_per_minute": handoffs.per_minute(now),
        "read_at": datetime.fromtimestamp(seen_at, UTC).isoformat().replace("+00:00", "Z"),
    }


# -- checkpoints ---------------------------------------------------------------------------


def checkpoint_views(state: bytes | None, decoded: str | None) -> list[tuple[str, str]]:
    """How a checkpoint is shown: hex, UTF-8 where it decodes, and the codec's reading."""
    if state is None:
        return [("checkpoint", "none")]
    views = [("size", f"{len(state)} B"), ("hex", state.hex(" ", 2) if state else "(empty)")]
    try:
        views.append(("UTF-8", state.decode("utf-8")))
    except UnicodeDecodeError:
        views.append(("UTF-8", "(not UTF-8)"))
    if decoded is not None:
        views.append(("decoded", decoded))
    return views


# -- authentication and CSRF -------------------------------------------------------------


SESSION_SECONDS = 12 * 3600
"""How long a sign-in lasts."""
MIN_TOKEN = 16
"""The shortest auth token the console takes."""


def console_key(token: str) -> bytes:
    """The key of sessions and CSRF tokens, derived from the auth token: every process of a
    console (several workers behind one address) accepts the others' sessions, and a new
    token ends every session."""
    return hashlib.sha256(b"worklease-web-session:" + token.encode()).digest()


def session_value(key: bytes, now: float | None = None) -> str:
    """A signed session: when it was issued, and an HMAC of that (never the token)."""
    issued = str(int(time.time() if now is None else now))
    return issued + "." + hmac.new(key, b"session:" + issued.encode(), hashlib.sha256).hexdigest()


def session_valid(key: bytes, value: str | None, now: float | None = None) -> bool:
    if not value or "." not in value:
        return False
    issued, _, signature = value.partition(".")
    if not issued.isdigit():
        return False
    expected = hmac.new(key, b"session:" + issued.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        return False
    age = (time.time() if now is None else now) - int(issued)
    return 0 <= age < SESSION_SECONDS


def token_matches(expected: str | None, given: str | None) -> bool:
    """Constant-time comparison of an auth token (``False`` when none is configured)."""
    if not expected or given is None:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def csrf_token(secret: bytes, session: str) -> str:
    return hmac.new(secret, b"csrf:" + session.encode(), hashlib.sha256).hexdigest()


def csrf_matches(secret: bytes, session: str | None, given: str | None) -> bool:
    if not session or not given:
        return False
    return hmac.compare_digest(csrf_token(secret, session).encode(), given.encode())


# -- HTML ----------------------------------------------------------------------------------


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def lease_href(work_id: str) -> str:
    quoted = quote(work_id, safe="")
    if quoted in (".", ".."):  # a browser would resolve them as path steps
        quoted = quoted.replace(".", "%2E")
    return "lease/" + quoted


def page(title: str, body: str, *, nav: str, backend: str, live: bool = True,
         logged_in: bool = False, root: str = "") -> str:  # fmt: skip
    """A whole page; links are relative to ``root`` (where the console is mounted)."""
    links = "".join(
        f'<a href="{href}"{" aria-current=page" if nav == name else ""}>{label}</a>'
        for name, href, label in (("overview", "./", "Overview"), ("leases", "leases", "Leases"))
    )
    live_attr = ' data-live="1"' if live else ""
    logout = (
        '<form method="post" action="logout" class="logout"><button>Log out</button></form>'
        if logged_in
        else ""
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · worklease</title>
<base href="{esc(root)}/">
<link rel="stylesheet" href="static/console.css">
<script src="static/console.js" defer></script>
</head><body>
<header><strong>worklease</strong> <span class="backend">{esc(backend)}</span>
<nav>{links}</nav><span id="status" class="status" aria-live="polite"></span>{logout}</header>
<main id="main"{live_attr}>
{body}
</main></body></html>"""


def overview_body(figures: Mapping[str, Any], error: str | None) -> str:
    counts = figures["counts"]
    cards = "".join(
        f'<div class="card {state}"><span class="count" data-state="{state}">{counts[state]}'
        f"</span><span>{state}</span></div>"
        for state in STATES
    )
    holders = figures["holders"]
    widest = max(holders.values(), default=1)
    bars = (
        "".join(
            f'<div class="bar"><span class="label">{esc(h)}</span><span class="fill" '
            f'data-width="{round(100 * n / widest)}"><i></i>'
            f'</span><span class="n">{n}</span></div>'
            for h, n in holders.items()
        )
        or '<p class="empty">no lease is held</p>'
    )
    soon = (
        "".join(
            f'<tr><td><a href="{lease_href(r["work_id"])}">{esc(r["work_id"])}</a></td>'
            f'<td>{esc(r["holder_id"])}</td><td class="num countdown" data-left="{r["expires_in"]}">'
            f"{duration(r['expires_in'])}</td></tr>"
            for r in figures["expiring_soon"]
        )
        or f'<tr><td colspan="3" class="empty">none within {EXPIRING_SOON:.0f}s</td></tr>'
    )
    chart = handoff_chart(figures["handoffs_per_minute"])
    problem = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    return f"""{problem}<h1>Overview</h1>
<section class="cards" aria-label="leases by state">{cards}</section>
<p class="total">{figures["total"]} lease row(s), read at <time>{esc(figures["read_at"])}</time></p>
<div class="columns">
<section><h2>Held leases per holder</h2><div class="bars" id="holders">{bars}</div></section>
<section><h2>Expiring soon</h2><table class="soon"><thead><tr><th>work ID</th><th>holder</th>
<th>expires in</th></tr></thead><tbody>{soon}</tbody></table></section>
</div>
<section><h2>Handoffs per minute, last hour</h2>{chart}</section>"""


def handoff_chart(counts: Sequence[int]) -> str:
    """An inline SVG bar chart, oldest minute on the left."""
    top = max(max(counts, default=0), 1)
    width, height = 600, 120
    step = width / max(len(counts), 1)
    bars = "".join(
        f'<rect x="{i * step + 1:.1f}" y="{height - height * n / top:.1f}" '
        f'width="{max(step - 2, 1):.1f}" height="{height * n / top:.1f}"><title>'
        f"{len(counts) - 1 - i} min ago: {n}</title></rect>"
        for i, n in enumerate(counts)
        if n
    )
    total = sum(counts)
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{total} handoffs in the last hour" data-total="{total}">{bars}'
        f'<line x1="0" y1="{height}" x2="{width}" y2="{height}"></line></svg>'
        f'<p class="legend">{total} handoff(s) seen in the last hour (max {max(counts, default=0)}/min; the console '
        "counts token changes between its reads)</p>"
    )


def leases_body(query: Query, shown: Sequence[LeaseRow], matched: int, pages: int,
                now: float, seen_at: float, error: str | None) -> str:  # fmt: skip
    def header(column: str, label: str) -> str:
        descending = not query.descending if query.sort == column else False
        params = query.params(sort=column, order="desc" if descending else "asc", page=1)
        mark = ("▼" if query.descending else "▲") if query.sort == column else ""
        return f'<th><a href="leases?{esc(urlencode(params))}">{label}</a>{mark}</th>'

    states = "".join(
        f'<option value="{s}"{" selected" if query.state == s else ""}>{s}</option>' for s in STATES
    )
    rows = (
        "".join(
            f'<tr data-work-id="{esc(r.work_id)}" data-state="{r.state}">'
            f'<td><a href="{lease_href(r.work_id)}">{esc(r.work_id)}</a></td>'
            f"<td>{esc(r.holder_id)}</td><td class=num>{r.fencing_token}</td>"
            f'<td><span class="state {r.state}">{r.state}</span></td>'
            f'<td class="num countdown" data-left="{r.left(now, seen_at) if r.left(now, seen_at) is not None else ""}">'
            f"{duration(r.left(now, seen_at))}</td>"
            f"<td class=num>{'-' if r.checkpoint_size is None else f'{r.checkpoint_size} B'}</td>"
            f"<td>{age(r.updated_at, now)}</td>"
            f"<td>{esc(r.prev_exit or '-')}{f' ({esc(r.prev_holder_id)})' if r.prev_holder_id else ''}</td>"
            "</tr>"
            for r in shown
        )
        or '<tr><td colspan="8" class="empty">no lease matches</td></tr>'
    )
    current = min(query.page, pages)
    pager = []
    if current > 1:
        pager.append(
            f'<a rel="prev" href="leases?{esc(urlencode(query.params(page=current - 1)))}">← previous</a>'
        )
    pager.append(f"<span>page {current} of {pages} · {matched} lease(s)</span>")
    if current < pages:
        pager.append(
            f'<a rel="next" href="leases?{esc(urlencode(query.params(page=current + 1)))}">next →</a>'
        )
    problem = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    return f"""{problem}<h1>Leases</h1>
<form class="filters" method="get" action="leases">
<label>state <select name="state"><option value="">any</option>{states}</select></label>
<label>holder <input name="holder" value="{esc(query.holder or "")}" placeholder="worker-1"></label>
<label>work ID <input name="work_id" value="{esc(query.work_id or "")}" placeholder="tenant-*"></label>
<button>Filter</button></form>
<table class="leases"><thead><tr>{header("work_id", "work ID")}{header("holder_id", "holder")}
{header("fencing_token", "token")}{header("state", "state")}{header("expires_in", "expires in")}
{header("checkpoint_size", "checkpoint")}{header("updated_at", "last write")}<th>previous exit</th></tr></thead>
<tbody>{rows}</tbody></table>
<nav class="pager">{"".join(pager)}</nav>"""


def age(when: datetime | None, now: float) -> str:
    if when is None:
        return "-"
    return duration(max(now - when.timestamp(), 0.0)) + " ago"


def lease_body(row: LeaseRow | None, work_id: str, views: list[tuple[str, str]] | None,
               actions: Mapping[str, str], csrf: str | None, now: float, seen_at: float,
               notice: str | None) -> str:  # fmt: skip
    note = f'<p class="notice" role="status">{esc(notice)}</p>' if notice else ""
    if row is None:
        return f'{note}<h1>{esc(work_id)}</h1><p class="empty">no lease row for this work ID</p>'
    fields = [
        ("holder", row.holder_id), ("token", str(row.fencing_token)), ("state", row.state),
        ("exit", row.exit_mode or "-"), ("expires in", duration(row.left(now, seen_at))),
        ("previous exit", row.prev_exit or "-"), ("previous holder", row.prev_holder_id or "-"),
        ("checkpoint size", "-" if row.checkpoint_size is None else f"{row.checkpoint_size} B"),
        ("last write", _iso(row.updated_at) or "-"),
    ]  # fmt: skip
    table = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in fields)
    if views is None:
        shown = '<p class="hidden-note">Checkpoints are not shown: start the console with --show-checkpoints to see them (they may hold private data).</p>'
    else:
        shown = (
            "<h2>Checkpoint</h2><dl class=checkpoint>"
            + "".join(f"<dt>{esc(k)}</dt><dd><pre>{esc(v)}</pre></dd>" for k, v in views)
            + "</dl>"
        )
    forms = ""
    for action, explanation in actions.items():
        forms += (
            f'<form method="post" action="{lease_href(row.work_id)}/{action}" class="action" '
            f'data-confirm="{esc(explanation)}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf or "")}">'
            f'<input type="hidden" name="token" value="{row.fencing_token}">'
            f'<button class="danger">{esc(action.capitalize())} now</button> '
            f"<span>{esc(explanation)}</span></form>"
        )
    return f"""{note}<h1>{esc(row.work_id)}</h1>
<table class="lease">{table}</table>
{forms}
{shown}"""


def login_body(error: str | None, next_path: str) -> str:
    problem = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    return f"""{problem}<h1>Sign in</h1>
<form method="post" action="login" class="login">
<input type="hidden" name="next" value="{esc(next_path)}">
<label>Access token <input type="password" name="token" autocomplete="current-password" autofocus></label>
<button>Sign in</button></form>"""
