"""The judgements of ``worklease check`` (no server): what counts as ok, warn and fail."""

from __future__ import annotations

import pytest

from worklease._check import (
    expected_columns,
    judge_clock,
    judge_columns,
    judge_commit,
    judge_isolation,
    judge_listener,
    judge_pooler,
    judge_replication,
    judge_timeouts,
    seconds_setting,
)


def test_expected_columns_come_from_the_schema_file() -> None:
    columns = expected_columns()
    assert columns["work_id"] == "text"
    assert columns["fencing_token"] == "bigint"
    assert columns["expires_at"] == "timestamp with time zone"
    assert columns["checkpoint"] == "bytea"
    assert len(columns) == 10
    assert judge_columns(dict(columns)).status == "ok"


def test_a_missing_or_retyped_column_fails() -> None:
    columns = expected_columns()
    del columns["prev_holder_id"]
    columns["checkpoint"] = "text"
    finding = judge_columns(columns)
    assert finding.status == "fail"
    assert "missing columns: prev_holder_id" in finding.detail
    assert "checkpoint is text, not bytea" in finding.detail


def test_isolation_is_ok_either_way_because_statements_pin_it() -> None:
    assert judge_isolation("read committed").status == "ok"
    finding = judge_isolation("serializable")
    assert finding.status == "ok"
    assert "pins" in finding.detail


@pytest.mark.parametrize(
    ("offset", "round_trip", "status"),
    [(0.0, 0.001, "ok"), (0.9, 0.001, "ok"), (-1.5, 0.001, "warn"), (1.2, 0.6, "ok")],
)
def test_clock_offset(offset: float, round_trip: float, status: str) -> None:
    assert judge_clock(offset, round_trip).status == status


@pytest.mark.parametrize(
    ("setting", "status"),
    [
        ("on", "ok"),
        ("remote_apply", "ok"),
        ("remote_write", "ok"),
        ("local", "warn"),
        ("off", "warn"),
    ],
)
def test_synchronous_commit(setting: str, status: str) -> None:
    assert judge_commit(setting).status == status


def test_replication() -> None:
    assert judge_replication(True, []).status == "fail"
    assert judge_replication(False, []).status == "ok"
    asynchronous = judge_replication(False, [("standby1", "async")])
    assert asynchronous.status == "warn"
    assert "asynchronous" in asynchronous.detail
    assert judge_replication(False, [("a", "async"), ("b", "sync")]).status == "ok"
    assert judge_replication(False, [("a", "quorum")]).status == "ok"
    hidden = judge_replication(False, [("a", None)])
    assert hidden.status == "warn"
    assert "pg_read_all_stats" in hidden.detail


def test_timeouts_against_the_ttl() -> None:
    off = {"statement_timeout": 0.0, "idle_session_timeout": 0.0}
    assert judge_timeouts(off, 30.0).status == "ok"
    short_idle = judge_timeouts({"idle_session_timeout": 10.0}, 30.0)
    assert short_idle.status == "warn"
    assert "idle_session_timeout" in short_idle.detail
    assert judge_timeouts({"idle_session_timeout": 60.0}, 30.0).status == "ok"
    assert judge_timeouts({"statement_timeout": 0.2}, 30.0).status == "warn"
    assert judge_timeouts({"statement_timeout": 5.0}, 30.0).status == "ok"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("500ms", 0.5), ("30s", 30.0), ("5min", 300.0), ("1h", 3600.0), ("250", 0.25)],
)
def test_server_duration_settings(text: str, seconds: float) -> None:
    assert seconds_setting(text) == pytest.approx(seconds)


def test_pooler_and_listener() -> None:
    assert judge_pooler(True).status == "warn"
    assert judge_pooler(False).status == "ok"
    assert judge_listener("listen", "this DSN", True, None).status == "ok"
    fallen = judge_listener("listen", "this DSN", False, "LISTEN failed")
    assert fallen.status == "warn"
    assert "LISTEN failed" in fallen.detail
