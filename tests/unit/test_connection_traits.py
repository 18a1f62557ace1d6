"""How worklease sends its statements on each connection (ADR-0011, ADR-0015)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from worklease import ConfigError
from worklease._pg import ConnectionTraits, check_prepare, learn_traits, prepares


class Conn:
    """Stands for a connection: the traits are remembered per object. ``key_pid`` is the
    server process named in its cancel key (a proxy hands out keys of its own)."""

    def __init__(
        self, key_pid: int = 100, *, port: int = 6432, prepare_threshold: int | None = 5
    ) -> None:
        self.pgconn = SimpleNamespace(backend_pid=key_pid)
        self.info = SimpleNamespace(host="db.example", port=port, dbname="app")
        self.prepare_threshold = prepare_threshold


def test_only_read_committed_connections_send_statements_alone() -> None:
    assert ConnectionTraits(True, 0).extended(None)
    assert ConnectionTraits(True, 0).extended(30.0)
    assert not ConnectionTraits(False, 0).extended(None)
    assert not ConnectionTraits(False, 0).extended(30.0)


def test_a_shorter_session_timeout_sends_bounded_statements_as_simple_queries() -> None:
    role_limited = ConnectionTraits(True, 50)  # a role with statement_timeout = 50ms
    assert role_limited.extended(None)  # unbounded: the session's timeout applies
    assert not role_limited.extended(30.0)  # the simple query overrides it to 30 s
    assert role_limited.extended(0.05)  # no shorter than the bound: alone
    assert ConnectionTraits(True, 60_000).extended(30.0)


def test_traits_are_learnt_per_connection() -> None:
    first, second = Conn(100), Conn(200)
    assert learn_traits(first, [("read committed", 0, 100)]) == ConnectionTraits(True, 0)
    assert learn_traits(second, [("repeatable read", "250", 200)]) == ConnectionTraits(False, 250)
    assert learn_traits(Conn(), []) == ConnectionTraits(False, 0)


def test_a_server_process_other_than_the_cancel_keys_means_a_proxy() -> None:
    # PgBouncer (either pool mode) hands every client a cancel key of its own: the process
    # it names is not the server process that answers.
    assert learn_traits(Conn(1_407_145_819), [("read committed", 0, 7638)]).proxied
    assert not learn_traits(Conn(7643), [("read committed", 0, 7643)]).proxied


def test_by_default_only_a_direct_connection_gets_prepared_statements(
    caplog: pytest.LogCaptureFixture,
) -> None:
    direct = ConnectionTraits(True, 0, proxied=False)
    proxied = ConnectionTraits(True, 0, proxied=True)
    assert prepares(None, direct, Conn(port=5001))
    assert not prepares(None, proxied, Conn(port=5001))
    # prepare=True: the user vouches for the route (a pooler keeping statements per client)
    assert prepares(True, proxied, Conn(port=5001))


def test_one_warning_per_route_names_the_cause_and_the_remedies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxied = ConnectionTraits(True, 0, proxied=True)
    with caplog.at_level(logging.WARNING, logger="worklease"):
        for _ in range(3):
            prepares(None, proxied, Conn(port=5002))
        prepares(None, proxied, Conn(port=5003, prepare_threshold=None))
        prepares(True, proxied, Conn(port=5004))  # chosen explicitly: nothing to say
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    at_risk, safe = messages
    assert "db.example:5002" in at_risk
    assert "through a proxy" in at_risk
    assert "prepare=True" in at_risk
    # the application's own statements are at risk only with psycopg's default threshold
    assert "prepare_threshold': None" in at_risk
    assert "db.example:5003" in safe
    assert "prepare_threshold" not in safe


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_prepare_takes_none_or_a_bool(value: object) -> None:
    assert check_prepare(None) is None
    assert check_prepare(True) is True
    assert check_prepare(False) is False
    with pytest.raises(ConfigError, match="prepare must be None, True or False"):
        check_prepare(value)
