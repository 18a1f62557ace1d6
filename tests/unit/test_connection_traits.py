"""Which connections get worklease's statements prepared (ADR-0011)."""

from __future__ import annotations

from worklease._pg import ConnectionTraits, learn_traits


class Conn:
    """Stands for a connection: the traits are remembered per object."""


def test_only_read_committed_connections_send_prepared() -> None:
    assert ConnectionTraits(True, 0).sends_prepared(None)
    assert ConnectionTraits(True, 0).sends_prepared(30.0)
    assert not ConnectionTraits(False, 0).sends_prepared(None)
    assert not ConnectionTraits(False, 0).sends_prepared(30.0)


def test_a_shorter_session_timeout_sends_bounded_statements_as_simple_queries() -> None:
    role_limited = ConnectionTraits(True, 50)  # a role with statement_timeout = 50ms
    assert role_limited.sends_prepared(None)  # unbounded: the session's timeout applies
    assert not role_limited.sends_prepared(30.0)  # the simple query overrides it to 30 s
    assert role_limited.sends_prepared(0.05)  # no shorter than the bound: prepared
    assert ConnectionTraits(True, 60_000).sends_prepared(30.0)


def test_traits_are_learnt_per_connection() -> None:
    first, second = Conn(), Conn()
    assert learn_traits(first, [("read committed", 0)]) == ConnectionTraits(True, 0)
    assert learn_traits(second, [("repeatable read", "250")]) == ConnectionTraits(False, 250)
    assert learn_traits(Conn(), []) == ConnectionTraits(False, 0)
