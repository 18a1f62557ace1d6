"""The decisions behind going around a failing pool and telling permanent connection and
read-only errors from transient ones (``worklease._pg``, ADR-0015); no database needed."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as pg_errors

from worklease import ConfigError
from worklease._pg import (
    PoolTrouble,
    check_conninfo,
    connection_error,
    lost_connection,
    permanent_connect_failure,
    read_only_error,
)


def stats(errors: int = 0, lost: int = 0) -> dict[str, int]:
    return {"connections_errors": errors, "connections_lost": lost, "pool_size": 4}


def test_a_pool_that_never_served_is_in_trouble_once_an_attempt_failed() -> None:
    trouble = PoolTrouble()
    assert not trouble.judge(stats())  # still making its first connection: slow, not failing
    assert not trouble.suspected()
    assert trouble.judge(stats(errors=1))  # one direct attempt tells why it cannot connect
    assert trouble.suspected()


def test_old_failures_are_a_baseline_not_a_sign() -> None:
    """A pool that lost a connection an hour ago and is busy now is waited for."""
    trouble = PoolTrouble()
    trouble.serve(0.0)  # no baseline yet: the first judgement takes one
    assert not trouble.judge(stats(errors=3, lost=1))
    assert not trouble.judge(stats(errors=3, lost=1))
    assert not trouble.suspected()


def test_failures_since_the_pool_last_served_are_trouble() -> None:
    trouble = PoolTrouble()
    assert trouble.serve(10.0)  # a baseline is due
    trouble.baseline(stats(errors=2), 10.0)
    assert not trouble.judge(stats(errors=2))  # busy
    assert trouble.judge(stats(errors=3))  # a reconnect attempt failed since
    assert trouble.suspected()
    trouble.serve(10.5)  # it serves again: out of trouble
    assert not trouble.suspected()


def test_the_baseline_is_refreshed_at_most_once_a_second() -> None:
    trouble = PoolTrouble()
    assert trouble.serve(5.0)
    trouble.baseline(stats(), 5.0)
    assert not trouble.serve(5.5)
    assert trouble.serve(6.0)


def test_a_statement_that_lost_its_connection_is_trouble_until_the_pool_serves() -> None:
    trouble = PoolTrouble()
    trouble.serve(0.0)
    trouble.baseline(stats(), 0.0)
    trouble.connection_lost()
    assert trouble.suspected()
    assert trouble.judge(stats())
    trouble.serve(0.1)
    assert not trouble.judge(stats())


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (psycopg.OperationalError("consuming input failed: server closed the connection"), True),
        (psycopg.InterfaceError("the connection is closed"), True),
        (pg_errors.AdminShutdown("terminating connection due to administrator command"), True),
        (pg_errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only tx"), True),
        # errors of the statement, after which worklease drops the connection itself
        (pg_errors.QueryCanceled("canceling statement due to statement timeout"), False),
        (pg_errors.DeadlockDetected("deadlock detected"), False),
        (pg_errors.SerializationFailure("could not serialize access"), False),
        (pg_errors.UniqueViolation("duplicate key"), False),
    ],
)
def test_what_counts_as_a_lost_connection(error: psycopg.Error, lost: bool) -> None:
    assert lost_connection(error) is lost


ONE_HOST = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: '


@pytest.mark.parametrize(
    "message",
    [
        'FATAL:  password authentication failed for user "app"',
        'FATAL:  database "nope" does not exist',
        'FATAL:  role "nobody" does not exist',
        'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "app", database "app"',
        "fe_sendauth: no password supplied",
        'FATAL:  role "app" is not permitted to log in',
        "server does not support SSL, but SSL was required",
    ],
)
def test_settings_that_can_never_work_are_permanent(message: str) -> None:
    error = psycopg.OperationalError(ONE_HOST + message)
    assert permanent_connect_failure(error)
    mapped = connection_error(error, "acquire")
    assert not mapped.transient
    assert "cannot connect to PostgreSQL (permanent" in str(mapped)


@pytest.mark.parametrize(
    "message",
    [
        "Connection refused\n\tIs the server running on that host and accepting TCP/IP?",
        "timeout expired",
        "FATAL:  the database system is starting up",
        "FATAL:  the database system is shutting down",
        "FATAL:  the database system is in recovery mode",
        "FATAL:  sorry, too many clients already",
        'FATAL:  too many connections for role "app"',
        # an unreachable LDAP or RADIUS server reads like a wrong password: not permanent
        'FATAL:  LDAP authentication failed for user "app"',
        'FATAL:  RADIUS authentication failed for user "app"',
        'FATAL:  PAM authentication failed for user "app"',
    ],
)
def test_what_may_come_back_is_transient(message: str) -> None:
    error = psycopg.OperationalError(ONE_HOST + message)
    assert not permanent_connect_failure(error)
    assert connection_error(error, "acquire").transient


def multi_host(*failures: str) -> psycopg.OperationalError:
    lines = [
        f"- host: 'db{i}', port: '5432', hostaddr: '10.0.0.{i}': {ONE_HOST}{failure}"
        for i, failure in enumerate(failures, 1)
    ]
    return psycopg.OperationalError(
        "Multiple connection attempts failed. All failures were:\n" + "\n".join(lines)
    )


def test_a_multi_host_dsn_is_permanent_only_when_every_host_is() -> None:
    down = "Connection refused"
    unknown = 'FATAL:  database "app" does not exist'
    assert not permanent_connect_failure(multi_host(down, unknown))  # db1 may come back
    assert permanent_connect_failure(multi_host(unknown, unknown))


def test_an_unparsable_conninfo_is_a_config_error_that_repeats_no_password() -> None:
    with pytest.raises(ConfigError) as caught:
        check_conninfo("host=db password=my secret")
    assert "secret" not in str(caught.value)
    with pytest.raises(ConfigError, match='invalid connection option "nonsense"'):
        check_conninfo("host=db nonsense=1")
    assert permanent_connect_failure(psycopg.ProgrammingError("invalid connection option"))


@pytest.mark.parametrize(
    ("row", "permanent"),
    [
        ((False, "on", "user"), True),  # ALTER ROLE ... SET
        ((False, "on", "database"), True),
        ((False, "on", "configuration file"), True),
        ((False, "on", "client"), True),  # options=-c ... on every connection
        ((True, "on", "user"), False),  # a standby: a failover in progress
        ((False, "off", "default"), False),  # promoted between the two round trips
        ((False, "on", "session"), False),  # a SET left on a session a pooler shares
    ],
)
def test_a_read_only_refusal_is_permanent_only_by_a_lasting_setting(
    row: tuple[bool, str, str], permanent: bool
) -> None:
    refused = read_only_error("checkpoint", [row])
    assert (refused is not None) is permanent
    if refused is not None:
        assert not refused.transient
        assert "default_transaction_read_only = on" in str(refused)
        assert f"from {row[2]}" in str(refused)
    assert read_only_error("checkpoint", []) is None
