"""The operator console's decisions that need no server or browser (``worklease.web._view``):
handoffs from observed tokens, filters, sorting and paging."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")

from worklease.web._view import PAGE_SIZE, Handoffs, LeaseRow, Query


def row(work_id: str, token: int, holder: str = "h", state: str = "held") -> LeaseRow:
    return LeaseRow(work_id, holder, token, state, None, None, None, 10.0, None, None)


def test_handoffs_count_token_changes_between_reads_per_minute() -> None:
    handoffs = Handoffs()
    assert handoffs.observe([row("a", 1), row("b", 2)], now=600.0) == 0  # first read: grants
    assert handoffs.observe([row("a", 1), row("b", 5), row("c", 6)], now=610.0) == 1  # b moved
    assert handoffs.observe([row("a", 7), row("b", 8), row("c", 6)], now=670.0) == 2
    counts = handoffs.per_minute(now=670.0)
    assert len(counts) == 60
    assert counts[-2:] == [1, 2]  # minute 10: one handoff, minute 11: two
    assert sum(handoffs.per_minute(now=670.0 + 3600)) == 0  # an hour later: gone
    handoffs.observe([row("a", 7)], now=670.0 + 3600)
    assert len(handoffs.minutes) == 1  # older minutes dropped


def test_the_leases_query_filters_sorts_and_pages() -> None:
    rows = [row(f"job-{n:03d}", n, holder="a" if n % 2 else "b") for n in range(120)]
    rows.append(row("other", 500, state="retired"))
    query = Query.parse({"holder": "a", "work_id": "job-0[0-4]?", "sort": "fencing_token",
                         "order": "desc"})  # fmt: skip
    picked = query.select(rows)
    assert [r.fencing_token for r in picked] == list(range(49, 0, -2))
    page_two, pages = Query.parse({"page": "2"}).paged(Query().select(rows))
    assert pages == 3
    assert page_two[0].work_id == f"job-{PAGE_SIZE:03d}"
    last, _ = Query.parse({"page": "99"}).paged(rows)  # past the end: the last page
    assert last[-1].work_id == "other"
    assert Query.parse({"state": "retired"}).select(rows) == [rows[-1]]
    assert Query(sort="holder_id").params(page=1) == {"sort": "holder_id"}
    for bad in ({"state": "asleep"}, {"sort": "nope"}, {"order": "up"}, {"page": "0"},
                {"page": "x"}, {"work_id": "*" * 2000}):  # fmt: skip
        with pytest.raises(ValueError):
            Query.parse(bad)
