"""The text of a transactional step's first statement (``_pg.tx_begin``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worklease._pg import statement_timeout, tx_begin


def test_the_bound_is_written_into_both_timeouts() -> None:
    assert tx_begin("1500") == (
        b"BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = 1500; "
        b"SET LOCAL idle_in_transaction_session_timeout = 1500"
    )
    assert tx_begin("0").endswith(
        b"statement_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 0"
    )


@pytest.mark.parametrize("limit", ["", "1.5", "-1", "1e3", " 15", "15; DROP TABLE x", "1²", "١٢"])
def test_anything_but_whole_ascii_milliseconds_is_refused(limit: str) -> None:
    with pytest.raises(ValueError, match="whole milliseconds"):
        tx_begin(limit)


@given(st.floats(min_value=0.0, max_value=1e12, allow_nan=False))
def test_every_bound_a_step_can_have_is_accepted(seconds: float) -> None:
    limit = statement_timeout(seconds)
    assert tx_begin(limit).count(limit.encode()) == 2
