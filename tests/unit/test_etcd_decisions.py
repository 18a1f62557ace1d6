"""The etcd backend's shared decisions (``worklease._etcd``): endpoint and prefix checks, key
ranges, record parsing from the JSON gateway's answers, fencing-token compares, the meaning
of error answers, keepalive requests and answers, and the waits for a connection. Pure: no
etcd needed.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from worklease import (
    BackendError,
    Checkpoint,
    ConfigError,
    ExitMode,
    FencedError,
    LeaseExpiredError,
    Token,
)
from worklease._etcd import (
    CONNECTIONS,
    KEEPALIVE_BODY_BYTES,
    MAIN_CONNECTIONS,
    QUEUE_WAIT,
    RENEWAL_CONNECTIONS,
    TOKEN_SLOTS,
    Keepalives,
    Record,
    WorkKeys,
    check_endpoints,
    check_prefix,
    closed_in_flight,
    judge_error,
    keepalive_answers,
    keepalive_bodies,
    lane_wait,
    lease_seconds,
    pool_timeout,
    prefix_end,
    queue_timeout,
    queue_wait,
    record_of,
    records,
    same_token,
)

PREFIX = b"app/"
KINDS = (b"t", b"h", b"c", b"p", b"x", b"u")


def enc(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def dec(text: str) -> bytes:
    return base64.b64decode(text)


def token(work_id: str, holder_id: str, fencing_token: int) -> Token:
    return Token(work_id, holder_id, fencing_token, datetime(2030, 1, 1, tzinfo=UTC))


# -- check_endpoints -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:2379", ("http://127.0.0.1:2379",)),
        (
            "http://a:2379,https://b:2380 , c:2381",
            ("http://a:2379", "https://b:2380", "http://c:2381"),
        ),
        (["http://a:1", "b:2"], ("http://a:1", "http://b:2")),
        (("https://a:1",), ("https://a:1",)),
        ("localhost:2379", ("http://localhost:2379",)),
        ("http://a:2379/", ("http://a:2379",)),  # a bare trailing slash is no path
        ("http://[::1]:2379", ("http://[::1]:2379",)),
    ],
)
def test_check_endpoints_accepts_and_normalizes(given: Any, expected: tuple[str, ...]) -> None:
    assert check_endpoints(given) == expected


@pytest.mark.parametrize(
    "given",
    [
        pytest.param("", id="empty-string"),
        pytest.param([], id="empty-list"),
        pytest.param(",", id="only-comma"),
        pytest.param("http://a:1,", id="trailing-comma"),
        pytest.param(["http://a:1", ""], id="empty-item"),
        pytest.param(["http://a:1", "http://a:1"], id="duplicate"),
        pytest.param("a:1,http://a:1", id="duplicate-after-normalizing"),
        pytest.param(["http://a:1/", "http://a:1"], id="duplicate-with-slash"),
        pytest.param("http://a:1/v3", id="path"),
        pytest.param("http://a:1?x=1", id="query"),
        pytest.param("http://a:1#frag", id="fragment"),
        pytest.param("ftp://a:1", id="ftp"),
        pytest.param("unix:///tmp/etcd.sock", id="unix"),
        pytest.param("grpc://a:1", id="grpc"),
        pytest.param("http://:2379", id="no-host"),
        pytest.param([1], id="non-str-item"),
        pytest.param(None, id="none"),
        pytest.param(2379, id="int"),
    ],
)
def test_check_endpoints_rejects(given: Any) -> None:
    with pytest.raises(ConfigError):
        check_endpoints(given)


def test_check_endpoints_error_is_a_value_error_too() -> None:
    with pytest.raises(ValueError, match="twice"):
        check_endpoints(["http://a:1", "a:1"])


# -- check_prefix and prefix_end -------------------------------------------------------------


def test_check_prefix_encodes_utf8() -> None:
    assert check_prefix("app/") == b"app/"
    assert check_prefix("caf\u00e9/") == "caf\u00e9/".encode()


@pytest.mark.parametrize("given", ["", "a\x00b", "\x00", b"app/", None, 5])
def test_check_prefix_rejects(given: object) -> None:
    with pytest.raises(ConfigError):
        check_prefix(given)


@pytest.mark.parametrize(
    ("key", "end"),
    [
        (b"app/", b"app0"),
        (b"a", b"b"),
        (b"a\xff", b"b"),
        (b"a\xff\xff", b"b"),
        (b"a\x00", b"a\x01"),
        (b"\xff", b"\x00"),  # every key
        (b"", b"\x00"),
    ],
)
def test_prefix_end(key: bytes, end: bytes) -> None:
    assert prefix_end(key) == end


@pytest.mark.parametrize("key", [b"app/", b"a\xff", b"x\x00", b"k\xfe"])
def test_prefix_end_bounds_every_key_with_the_prefix_and_nothing_else(key: bytes) -> None:
    end = prefix_end(key)
    for suffix in (b"", b"\x00", b"z", b"\xff\xff\xff", b"\xff" * 10 + b"q"):
        assert key <= key + suffix < end
    assert not end.startswith(key)


# -- lease_seconds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "seconds"),
    [(0.2, 1), (1.0, 1), (1.5, 2), (30, 30), (30.0, 30), (1.000001, 2), (0.0, 1), (-3.0, 1)],
)
def test_lease_seconds_rounds_up_to_at_least_one(ttl: float, seconds: int) -> None:
    result = lease_seconds(ttl)
    assert result == seconds
    assert isinstance(result, int)
    assert result >= ttl  # never shorter than asked


# -- WorkKeys --------------------------------------------------------------------------------


def in_range(keys: WorkKeys, key: bytes) -> bool:
    return keys.base <= key < keys.end


def test_work_keys_layout() -> None:
    keys = WorkKeys.of(PREFIX, "w")
    assert keys.work_id == "w"
    assert keys.base == b"app/w\x00"
    assert keys.key(b"t") == b"app/w\x00t"
    assert keys.end == b"app/w\x01"
    body = keys.read()["request_range"]
    assert dec(body["key"]) == keys.base
    assert dec(body["range_end"]) == keys.end


@pytest.mark.parametrize("work_id", ["w", "w/x", "w\u00e9", "wx", "w w", "job-1"])
def test_work_keys_range_covers_exactly_one_work_id(work_id: str) -> None:
    others = ["w", "w/x", "w\u00e9", "wx", "w w", "job-1", "job-10", "v", "x"]
    keys = WorkKeys.of(PREFIX, work_id)
    for kind in KINDS:
        assert in_range(keys, keys.key(kind)), kind
    for other in others:
        if other == work_id:
            continue
        other_keys = WorkKeys.of(PREFIX, other)
        for kind in KINDS:
            assert not in_range(keys, other_keys.key(kind)), (work_id, other, kind)
    # nor does it reach outside the prefix
    assert not in_range(keys, b"other/" + work_id.encode() + b"\x00t")


# -- records ---------------------------------------------------------------------------------


def kv(key: bytes, value: bytes | None, mod: int, **extra: str) -> dict[str, Any]:
    """One kv as etcd's JSON gateway returns it: bytes base64, int64 as strings, empty
    fields left out."""
    item: dict[str, Any] = {"key": enc(key), "mod_revision": str(mod), "create_revision": "2"}
    if value:
        item["value"] = enc(value)
    item.update(extra)
    return item


def sample_kvs() -> list[dict[str, Any]]:
    return [
        kv(b"app/w\x00t", b"2\x00holder-1", 17, version="3"),
        kv(b"app/w\x00h", b"holder-1", 17, lease="7587868372634823424"),
        kv(b"app/w\x00c", b"state-bytes", 19),
        kv(b"app/w\x00p", json.dumps({"exit": "finished", "holder": "old"}).encode(), 17),
        kv(b"app/w\x00u", b"1700000000.5", 19),
        kv(b"app/w/x\x00t", b"0\x00other", 20),
        kv(b"app/w/x\x00p", json.dumps({"exit": "none", "holder": None}).encode(), 20),
        kv(b"app/w/x\x00x", b"retired", 21),
        kv(b"app/w/x\x00u", b"1700000001.25", 21),
        # ignored: outside the prefix, an unknown kind, no NUL separator
        kv(b"other/w\x00t", b"0\x00intruder", 30),
        kv(b"app/w\x00z", b"?", 31),
        kv(b"app/stray", b"?", 32),
    ]


def test_records_parses_gateway_kvs() -> None:
    found = records(PREFIX, sample_kvs())
    assert set(found) == {"w", "w/x"}
    w = found["w"]
    assert w.work_id == "w"
    assert w.holder_id == "holder-1"
    assert w.token == 17 * TOKEN_SLOTS + 2
    assert w.token_revision == 17
    assert w.held is True
    assert w.hold_holder == "holder-1"
    assert w.hold_lease == 7587868372634823424
    assert w.checkpoint == b"state-bytes"
    assert w.checkpoint_revision == 19
    assert w.prev_exit is ExitMode.FINISHED
    assert w.prev_holder_id == "old"
    assert w.exit_mode is None
    assert w.exit_revision == 0
    assert w.updated == 1700000000.5
    assert w.updated_revision == 19
    assert w.exists

    x = found["w/x"]
    assert x.holder_id == "other"
    assert x.token == 20 * TOKEN_SLOTS
    assert x.held is False
    assert x.hold_lease == 0
    assert x.checkpoint is None
    assert x.checkpoint_revision == 0
    assert x.prev_exit is ExitMode.NONE
    assert x.prev_holder_id is None
    assert x.exit_mode is ExitMode.RETIRED
    assert x.exit_revision == 21


def test_records_judgements() -> None:
    found = records(PREFIX, sample_kvs())
    w, x = found["w"], found["w/x"]
    mine = token("w", "holder-1", 17 * TOKEN_SLOTS + 2)
    assert w.owned_by(mine)
    assert w.lost(mine, "renew") is None
    assert isinstance(w.lost(token("w", "holder-1", 17 * TOKEN_SLOTS + 1), "renew"), FencedError)
    assert isinstance(w.lost(token("w", "holder-2", mine.fencing_token), "renew"), FencedError)
    assert w.checkpoint_view() == Checkpoint(b"state-bytes", ExitMode.FINISHED, "old")
    # the holder never declared an exit: its successor records it as expired
    assert w.successor_prev() == (ExitMode.EXPIRED, "holder-1")

    released = token("w/x", "other", 20 * TOKEN_SLOTS)
    assert isinstance(x.lost(released, "checkpoint"), LeaseExpiredError)
    assert x.successor_prev() == (ExitMode.RETIRED, "other")


def test_record_of_a_work_id_without_keys() -> None:
    record = record_of(PREFIX, "never", sample_kvs())
    assert record == Record("never")
    assert not record.exists
    assert record.successor_prev() == (ExitMode.NONE, None)
    assert record.checkpoint_view() == Checkpoint()
    assert isinstance(record.lost(token("never", "h", 1000), "renew"), FencedError)


def test_records_of_nothing() -> None:
    assert records(PREFIX, []) == {}


# -- same_token ------------------------------------------------------------------------------


def test_same_token_compares_revision_and_grant_value() -> None:
    keys = WorkKeys.of(PREFIX, "w")
    compares = same_token(keys, token("w", "holder-1", 17 * TOKEN_SLOTS + 2))
    assert len(compares) == 2
    by_target = {c["target"]: c for c in compares}
    assert set(by_target) == {"MOD", "VALUE"}
    for compare in compares:
        assert dec(compare["key"]) == keys.key(b"t")
        assert compare["result"] == "EQUAL"
    assert by_target["MOD"]["mod_revision"] == "17"
    assert dec(by_target["VALUE"]["value"]) == b"2\x00holder-1"


def test_same_token_matches_what_records_parsed() -> None:
    """The compares of a token built from a parsed record ask exactly for that kv."""
    kvs = sample_kvs()
    record = records(PREFIX, kvs)["w"]
    assert record.holder_id is not None
    grant = next(item for item in kvs if dec(item["key"]) == b"app/w\x00t")
    compares = same_token(WorkKeys.of(PREFIX, "w"), token("w", record.holder_id, record.token))
    by_target = {c["target"]: c for c in compares}
    assert by_target["MOD"]["mod_revision"] == grant["mod_revision"]
    assert by_target["VALUE"]["value"] == grant["value"]
    # another slot of the same revision, or another holder, asks for something else
    other_slot = same_token(WorkKeys.of(PREFIX, "w"), token("w", "holder-1", record.token + 1))
    assert {c["target"]: c for c in other_slot}["VALUE"]["value"] != grant["value"]
    other_holder = same_token(WorkKeys.of(PREFIX, "w"), token("w", "holder-2", record.token))
    assert {c["target"]: c for c in other_holder}["VALUE"]["value"] != grant["value"]


# -- judge_error -----------------------------------------------------------------------------


def error(code: int, message: str) -> dict[str, Any]:
    return {"error": message, "code": code, "message": message}


@pytest.mark.parametrize(
    ("status", "body", "idempotent", "transient", "elsewhere"),
    [
        # not applied: another member may take a write
        pytest.param(503, error(14, "etcdserver: no leader"), False, True, True, id="no-leader"),
        pytest.param(
            503, error(14, "etcdserver: not capable"), False, True, True, id="not-capable"
        ),
        pytest.param(
            503, error(14, "etcdserver: too many requests"), False, True, True, id="too-many"
        ),
        # maybe applied: a write is never sent again, but the error is transient
        pytest.param(
            503, error(14, "etcdserver: leader changed"), False, True, False, id="leader-changed"
        ),
        pytest.param(
            503,
            error(14, "etcdserver: request timed out"),
            False,
            True,
            False,
            id="write-timed-out",
        ),
        pytest.param(
            504, error(4, "context deadline exceeded"), False, True, False, id="write-deadline"
        ),
        pytest.param(502, None, False, True, False, id="bad-gateway-write"),
        # an idempotent read may go anywhere
        pytest.param(
            503,
            error(14, "etcdserver: leader changed"),
            True,
            True,
            True,
            id="read-leader-changed",
        ),
        pytest.param(
            503,
            error(14, "etcdserver: request timed out"),
            True,
            True,
            True,
            id="read-timed-out",
        ),
        pytest.param(503, None, True, True, True, id="read-unavailable-no-body"),
        # not transient
        pytest.param(
            400,
            error(3, "etcdserver: duplicate key given in txn request"),
            False,
            False,
            False,
            id="invalid-argument",
        ),
        pytest.param(
            400,
            error(3, "etcdserver: too many operations in txn request"),
            True,
            False,
            False,
            id="invalid-argument-read",
        ),
        pytest.param(
            403,
            error(7, "etcdserver: permission denied"),
            True,
            False,
            False,
            id="permission-denied",
        ),
    ],
)
def test_judge_error(
    status: int,
    body: dict[str, Any] | None,
    idempotent: bool,
    transient: bool,
    elsewhere: bool,
) -> None:
    answer = judge_error(status, body, "acquire", idempotent=idempotent)
    assert isinstance(answer.error, BackendError)
    assert answer.error.transient is transient
    assert answer.elsewhere is elsewhere
    assert answer.reauthenticate is False
    assert "acquire" in str(answer.error)
    if body is not None:
        assert body["message"] in str(answer.error)


def test_judge_error_invalid_auth_token_asks_to_reauthenticate() -> None:
    answer = judge_error(
        401, error(16, "etcdserver: invalid auth token"), "renew", idempotent=False
    )
    assert answer.reauthenticate is True
    assert answer.error.transient is True
    assert answer.elsewhere is False


def test_judge_error_unauthenticated_without_token_is_no_reauthentication() -> None:
    answer = judge_error(
        401,
        error(16, "etcdserver: authentication failed, invalid user ID or password"),
        "renew",
        idempotent=True,
    )
    assert answer.reauthenticate is False
    assert answer.error.transient is False


@pytest.mark.parametrize("work_ids", [["w"], ["w", "w/x"]])
def test_every_parsed_record_comes_from_its_own_range(work_ids: Sequence[str]) -> None:
    """Filtering the sample kvs by a work ID's range and parsing gives that work ID alone."""
    kvs = sample_kvs()
    for work_id in work_ids:
        keys = WorkKeys.of(PREFIX, work_id)
        mine = [item for item in kvs if in_range(keys, dec(item["key"]))]
        found = records(PREFIX, mine)
        assert set(found) == {work_id}
        assert found[work_id] == records(PREFIX, kvs)[work_id]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("127.0.0.1", "needs a port"),
        ("http://etcd-0", "needs a port"),
        ("http://etcd-0:99999", "bad port"),
        (b"http://127.0.0.1:2379", "not bytes"),
    ],
)
def test_check_endpoints_needs_a_port_and_text(given: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_endpoints(given)


# -- keepalives ----------------------------------------------------------------------------

LEASES = [7587869046386753000 + i for i in range(100)]  # etcd's IDs: 19 digits


def answer_line(lease: int, ttl: int | None) -> str:
    """One line of the gateway's keepalive answer stream (TTL left out when 0, as etcd does
    for a lease it does not have)."""
    result: dict[str, Any] = {"header": {"revision": "7"}, "ID": str(lease)}
    if ttl is not None:
        result["TTL"] = str(ttl)
    return json.dumps({"result": result})


def stream(leases: Sequence[int], ttl: int | None = 30) -> str:
    return "\n".join(answer_line(lease, ttl) for lease in leases) + "\n"


def lines_of(body: str) -> list[int]:
    return [int(json.loads(line)["ID"]) for line in body.split("\n")]


def test_keepalive_bodies_fit_what_the_gateway_reads_before_it_answers() -> None:
    bodies = keepalive_bodies(LEASES)
    assert [lease for body in bodies for lease in lines_of(body)] == LEASES  # each once, in order
    assert all(len(body.encode()) <= KEEPALIVE_BODY_BYTES for body in bodies)
    assert len(lines_of(bodies[0])) == 19  # as many 19-digit IDs as fit in 512 bytes
    assert keepalive_bodies([]) == []
    assert keepalive_bodies([5]) == ['{"ID":5}']


def test_a_short_answer_stream_leaves_the_unanswered_leases_unknown_not_gone() -> None:
    answered, error = keepalive_answers(stream(LEASES[:17]), "renew")
    assert error is None
    assert answered == dict.fromkeys(LEASES[:17], 30)  # the other 83 are not "TTL 0"


def test_a_lease_etcd_does_not_have_is_answered_gone() -> None:
    text = stream(LEASES[:1]) + answer_line(LEASES[1], None) + "\n"
    answered, error = keepalive_answers(text, "renew")
    assert error is None
    assert answered == {LEASES[0]: 30, LEASES[1]: 0}


def test_an_error_in_the_stream_keeps_what_was_answered_before_it() -> None:
    failure = json.dumps({"error": {"grpc_code": 14, "message": "etcdserver: no leader"}})
    answered, error = keepalive_answers(stream(LEASES[:3]) + failure + "\n", "renew")
    assert answered == dict.fromkeys(LEASES[:3], 30)
    assert isinstance(error, BackendError)
    assert error.transient
    assert "no leader" in str(error)


def serve(refresh: Keepalives, answer: Any) -> list[bool]:
    """Run a refresh against ``answer(body) -> stream text``; each ``take``'s verdict."""
    verdicts: list[bool] = []
    while refresh.waiting:
        for body in refresh.bodies():
            verdicts.append(refresh.take(answer(body)))
        refresh.next_round()
    return verdicts


def test_leases_a_short_answer_left_out_are_sent_again_until_every_one_is_answered() -> None:
    sent: list[int] = []

    def first_half(body: str) -> str:  # every stream comes back cut in half
        leases = lines_of(body)
        kept = leases[: (len(leases) + 1) // 2]
        sent.extend(leases)
        return stream(kept)

    refresh = Keepalives(LEASES, "renew", members=3)
    verdicts = serve(refresh, first_half)
    assert refresh.alive == dict.fromkeys(LEASES, 30)
    assert not any(verdicts)  # every stream answered something: no member to leave
    assert set(sent) == set(LEASES)
    assert len(sent) > len(LEASES)  # the unanswered ones went again


def test_a_lease_answered_gone_is_not_sent_again() -> None:
    sent: list[int] = []

    def gone(body: str) -> str:
        sent.extend(lines_of(body))
        return stream(lines_of(body), ttl=None)

    refresh = Keepalives(LEASES[:3], "renew", members=3)
    serve(refresh, gone)
    assert refresh.alive == dict.fromkeys(LEASES[:3], 0)
    assert sent == LEASES[:3]


def test_keepalives_nobody_answers_end_in_a_transient_error_after_one_round_per_member() -> None:
    rounds: list[int] = []

    def nothing(body: str) -> str:
        rounds.append(len(lines_of(body)))
        return ""

    refresh = Keepalives(LEASES[:5], "renew", members=3)
    with pytest.raises(BackendError) as caught:
        serve(refresh, nothing)
    assert caught.value.transient
    assert not isinstance(caught.value, LeaseExpiredError)
    assert rounds == [5, 5, 5]  # each round on another member, then it gives up
    assert "0 of 5 leases" in str(caught.value)
    assert refresh.alive == {}


def test_a_member_reporting_an_error_is_left_for_the_next_and_named_in_the_end() -> None:
    failure = json.dumps({"error": {"grpc_code": 14, "message": "etcdserver: no leader"}})
    refresh = Keepalives(LEASES[:2], "renew", members=2)
    assert refresh.take(failure) is True  # try another member
    refresh.next_round()
    assert refresh.take(stream(LEASES[:1])) is False
    refresh.next_round()  # progress: no stall
    assert refresh.waiting == LEASES[1:2]
    assert refresh.take(failure) is True
    refresh.next_round()
    assert refresh.take(failure) is True
    with pytest.raises(BackendError, match="no leader") as caught:
        refresh.next_round()
    assert "1 of 2 leases" in str(caught.value)


# -- waiting for a connection --------------------------------------------------------------


def test_waiting_for_a_connection_is_named_and_is_no_members_failure() -> None:
    error = queue_timeout("acquire", "calls", MAIN_CONNECTIONS, queue_wait(5.0))
    assert error.transient
    assert f"{MAIN_CONNECTIONS} connections for calls" in str(error)
    assert "busy with this backend's other calls" in str(error)
    assert "no etcd member was asked" in str(error)
    assert error.__cause__ is None
    local = pool_timeout("renew", TimeoutError("timed out"))
    assert local.transient
    assert "no etcd member was asked" in str(local)


def test_a_failover_attempt_that_got_no_connection_names_the_member_asked_before() -> None:
    asked = TimeoutError("timed out")
    error = queue_timeout("read_checkpoint", "calls", 16, 30.0, last=asked, member="http://m1:1")
    assert error.transient
    assert "no etcd member was asked" not in str(error)
    assert "after etcd at http://m1:1 failed (timed out)" in str(error)
    assert error.__cause__ is asked
    said = BackendError("read_checkpoint: etcd answered 'leader changed' (HTTP 503)")
    late = queue_timeout("read_checkpoint", "calls", 16, 0.0, deadline=True, last=said, member="m")
    assert "failed (etcd answered 'leader changed' (HTTP 503))" in str(late)
    assert late.__cause__ is said


def test_the_wait_for_a_connection_is_not_the_request_timeout() -> None:
    assert queue_wait(1.0) == QUEUE_WAIT
    assert queue_wait(60.0) == 60.0
    assert CONNECTIONS == MAIN_CONNECTIONS + RENEWAL_CONNECTIONS + 1  # and the watch's


@pytest.mark.parametrize(
    ("left", "expected"),
    [
        (None, (30.0, False)),  # no deadline: the lane's bound
        (45.0, (30.0, False)),  # a deadline after the bound
        (30.0, (30.0, False)),
        (2.5, (2.5, True)),  # the caller's deadline comes first
        (0.0, (0.0, True)),
        (-1.0, (0.0, True)),  # passed: nothing is sent
    ],
)
def test_the_wait_for_a_connection_ends_at_the_callers_deadline(
    left: float | None, expected: tuple[float, bool]
) -> None:
    assert lane_wait(30.0, left) == expected


def test_a_request_still_waiting_at_its_callers_deadline_says_it_was_never_sent() -> None:
    waited = queue_timeout("checkpoint", "calls", 16, 1.25, deadline=True)
    assert waited.transient
    assert "the caller's deadline came while it waited 1.25 s" in str(waited)
    assert "the request was never sent: no etcd member was asked" in str(waited)
    passed = queue_timeout("acquire", "calls", 16, 0.0, deadline=True)
    assert passed.transient
    assert str(passed) == (
        "acquire: the caller's deadline had passed; the request was never sent: "
        "no etcd member was asked"
    )


def test_a_request_in_flight_when_the_backend_closed_reads_as_closed() -> None:
    read = closed_in_flight("status", idempotent=True)
    assert not read.transient
    assert str(read).startswith("status: the backend is closed")
    assert "unknown" not in str(read)
    write = closed_in_flight("release", idempotent=False)
    assert str(write).startswith("release: the backend is closed")
    assert "whether its write was applied is unknown" in str(write)
