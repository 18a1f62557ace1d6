"""The Redis backend's server-side scripts (``worklease._redis``, ADR-0020) run on a real
Redis 7 through redis-py, before any backend class uses them: tokens from the server clock,
strictly increasing per work ID and above any token of a lost write; expiry decided by the
server's ``TIME``; every guarded write refused as fenced or expired in the same reply; the
checkpoint written together with its extension; release and forget announced; a flushed
script cache reloaded."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

pytest.importorskip("redis")

import redis

from tests.redis_servers import RedisServer
from worklease import Checkpoint, ExitMode, FencedError, LeaseExpiredError, LeaseHeldError
from worklease import _redis as r
from worklease._models import Token

pytestmark = pytest.mark.redis


class Scripts:
    """The six scripts on one client, for one key prefix."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.acquire_script = client.register_script(r.ACQUIRE)
        self.renew_script = client.register_script(r.RENEW)
        self.checkpoint_script = client.register_script(r.CHECKPOINT)
        self.release_script = client.register_script(r.RELEASE)
        self.forget_script = client.register_script(r.FORGET)
        self.read_script = client.register_script(r.READ)

    def key(self, work_id: str) -> str:
        return r.key_of(self.prefix, work_id)

    def acquire(self, work_id: str, holder: str, ttl: float = 30.0) -> r.Grant | LeaseHeldError:
        reply = self.acquire_script(keys=[self.key(work_id)], args=[holder, r.milliseconds(ttl)])
        return r.decode_grant(work_id, reply)

    def token(self, work_id: str, holder: str, ttl: float = 30.0) -> Token:
        grant = self.acquire(work_id, holder, ttl)
        assert isinstance(grant, r.Grant), grant
        return Token(work_id, holder, grant.fencing_token, grant.expires_at)

    def guarded(self, token: Token) -> tuple[list[str], list[str]]:
        return [self.key(token.work_id)], [str(token.fencing_token), token.holder_id]

    def renew(self, token: Token, ttl: float = 30.0) -> datetime:
        keys, args = self.guarded(token)
        reply = self.renew_script(keys=keys, args=[*args, r.milliseconds(ttl)])
        return r.decode_guarded(token, "renew", reply)

    def checkpoint(self, token: Token, state: bytes, ttl: float = 30.0) -> datetime:
        keys, args = self.guarded(token)
        reply = self.checkpoint_script(keys=keys, args=[*args, r.milliseconds(ttl), state])
        return r.decode_guarded(token, "checkpoint", reply)

    def release(self, token: Token, mode: ExitMode, request: str | None = None) -> datetime:
        keys, args = self.guarded(token)
        reply = self.release_script(
            keys=keys,
            args=[*args, mode.value, r.RELEASE_CHANNEL, keys[0], request or r.request_id()],
        )
        return r.decode_guarded(token, "release", reply)

    def forget(self, token: Token, request: str | None = None) -> None:
        keys, args = self.guarded(token)
        reply = self.forget_script(
            keys=keys, args=[*args, r.RELEASE_CHANNEL, keys[0], request or r.request_id()]
        )
        lost = r.outcome(token, "forget", reply)
        if lost is not None:
            raise lost

    def read(self, token: Token) -> Checkpoint:
        reply = self.read_script(keys=[self.key(token.work_id)], args=[str(token.fencing_token)])
        return r.decode_read(token, reply)

    def server_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def wait_past(self, when: datetime) -> None:
        """Until the server's clock passes ``when`` (polled: no guessed sleep)."""
        deadline = time.monotonic() + 30
        while self.server_ms() <= int(when.timestamp() * 1000):
            assert time.monotonic() < deadline, "the server's clock did not move"
            time.sleep(0.01)


@pytest.fixture
def scripts(redis_server: RedisServer) -> Iterator[Scripts]:
    client = redis.Redis.from_url(redis_server.url)
    try:
        yield Scripts(client, f"test-{uuid.uuid4().hex[:8]}:")
    finally:
        client.close()


def test_a_first_grant_takes_its_token_from_the_server_clock(scripts: Scripts) -> None:
    before = scripts.server_ms()
    grant = scripts.acquire("job", "w1")
    after = scripts.server_ms()
    assert isinstance(grant, r.Grant)
    assert before * r.TOKEN_STEPS <= grant.fencing_token <= after * r.TOKEN_STEPS
    assert grant.fencing_token < 2**53  # Lua's doubles hold it exactly
    assert grant.prior == Checkpoint(None, ExitMode.NONE, None)
    expires_ms = int(grant.expires_at.timestamp() * 1000)
    assert before + 30_000 <= expires_ms <= after + 30_000 + 1


def test_a_held_work_id_is_refused_naming_the_holder(scripts: Scripts) -> None:
    token = scripts.token("job", "w1")
    refused = scripts.acquire("job", "w2")
    assert isinstance(refused, LeaseHeldError)
    assert refused.holder_id == "w1"
    assert refused.expires_at == token.expires_at
    assert "work ID 'job' is held by 'w1' until" in str(refused)


def test_tokens_strictly_increase_and_the_successor_learns_how_the_holder_left(
    scripts: Scripts,
) -> None:
    first = scripts.token("job", "w1")
    scripts.checkpoint(first, b"step 3")
    scripts.release(first, ExitMode.ABANDONED)
    second = scripts.token("job", "w2")  # possibly in the same millisecond: previous + 1
    assert second.fencing_token > first.fencing_token
    assert scripts.read(second) == Checkpoint(b"step 3", ExitMode.ABANDONED, "w1")
    lapsing = scripts.renew(second, ttl=0.05)
    scripts.wait_past(lapsing)
    third = scripts.token("job", "w3")
    assert third.fencing_token > second.fencing_token
    assert scripts.read(third) == Checkpoint(b"step 3", ExitMode.EXPIRED, "w2")
    many = [scripts.token(f"many-{n}", "w") for n in range(50)]
    for token in many:
        scripts.release(token, ExitMode.FINISHED)
    again = [scripts.token(f"many-{n}", "w") for n in range(50)]
    assert all(b.fencing_token > a.fencing_token for a, b in zip(many, again, strict=True))


def test_a_token_lost_with_its_write_is_never_reissued(scripts: Scripts) -> None:
    """A promoted replica without the last writes has no row (or an older one): its next
    token still exceeds the lost one, because the server's clock moved on (ADR-0020)."""
    lost = scripts.token("job", "w1")
    scripts.client.delete(scripts.key("job"))  # the replica never saw that grant
    scripts.wait_past(datetime.fromtimestamp(lost.fencing_token / r.TOKEN_STEPS / 1000, UTC))
    successor = scripts.token("job", "w2")
    assert successor.fencing_token > lost.fencing_token
    with pytest.raises(FencedError):
        scripts.checkpoint(lost, b"zombie")  # the deposed holder cannot pass it


def test_every_guarded_write_is_refused_as_fenced_or_expired(scripts: Scripts) -> None:
    old = scripts.token("job", "w1", ttl=0.05)
    scripts.wait_past(old.expires_at)
    lapsed: list[Callable[[Token], Any]] = [
        scripts.renew,
        lambda t: scripts.release(t, ExitMode.FINISHED),
    ]
    for write in lapsed:
        with pytest.raises(LeaseExpiredError, match="the lease expired"):
            write(old)  # renew and release cannot revive a lapsed lease
    current = scripts.token("job", "w2")
    writes: list[Callable[[Token], Any]] = [
        scripts.renew,
        lambda t: scripts.checkpoint(t, b"x"),
        lambda t: scripts.release(t, ExitMode.FINISHED),
        scripts.forget,
        scripts.read,
    ]
    for write in writes:
        with pytest.raises(FencedError):
            write(old)  # a newer token exists: fenced, not expired
    impostor = Token("job", "w9", current.fencing_token, current.expires_at)
    with pytest.raises(FencedError):
        scripts.renew(impostor)
    scripts.release(current, ExitMode.FINISHED)
    with pytest.raises(LeaseExpiredError, match=r"the lease was released \(finished\)"):
        scripts.checkpoint(current, b"after release")
    assert scripts.read(current).state is None  # nothing was written by the refusals
    gone = Token("never", "w1", 1, current.expires_at)
    with pytest.raises(FencedError):
        scripts.renew(gone)  # no row at all


def test_a_checkpoint_revives_a_lapsed_lease_nobody_took(scripts: Scripts) -> None:
    token = scripts.token("job", "w1", ttl=0.05)
    scripts.wait_past(token.expires_at)
    revived = scripts.checkpoint(token, b"still mine", ttl=30)
    assert revived > token.expires_at
    refused = scripts.acquire("job", "w2")
    assert isinstance(refused, LeaseHeldError)
    assert refused.holder_id == "w1"


def test_a_checkpoint_is_stored_with_its_extension_and_cleared_by_empty_state(
    scripts: Scripts,
) -> None:
    token = scripts.token("job", "w1", ttl=5)
    extended = scripts.checkpoint(token, b"\x00binary\xff", ttl=60)
    assert extended > token.expires_at
    row = scripts.client.hgetall(scripts.key("job"))
    assert row[b"c"] == b"\x00binary\xff"
    assert int(row[b"e"]) == int(extended.timestamp() * 1000)
    scripts.checkpoint(token, b"")
    assert b"c" not in scripts.client.hgetall(scripts.key("job"))
    assert scripts.read(token) == Checkpoint(None, ExitMode.NONE, None)


def test_release_and_forget_announce_the_key(scripts: Scripts) -> None:
    pubsub = scripts.client.pubsub()  # type: ignore[no-untyped-call,unused-ignore]
    pubsub.subscribe(r.RELEASE_CHANNEL)
    try:
        assert pubsub.get_message(timeout=5)["type"] == "subscribe"
        token = scripts.token("released", "w1")
        scripts.release(token, ExitMode.FINISHED)
        forgotten = scripts.token("forgotten", "w1")
        scripts.forget(forgotten)
        seen: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=1)
            if message and message["type"] == "message":
                seen.append(message["data"])
        assert seen == [scripts.key("released").encode(), scripts.key("forgotten").encode()]
        assert [r.work_id_of(scripts.prefix, key) for key in seen] == ["released", "forgotten"]
        assert r.work_id_of("another:", seen[0]) is None
        # only a tombstone with the token is left, for a second
        tombstone = scripts.client.hgetall(scripts.key("forgotten"))
        assert tombstone.pop(b"n")  # the forget's request ID
        assert tombstone == {
            b"t": str(forgotten.fencing_token).encode(),
            b"h": b"w1",
            b"f": b"1",
        }
        assert 0 < scripts.client.pttl(scripts.key("forgotten")) <= 1000
        again = scripts.token("forgotten", "w2")  # at once, possibly in the same millisecond
        assert again.fencing_token > forgotten.fencing_token
        assert scripts.read(again) == Checkpoint(None, ExitMode.NONE, None)
        assert scripts.client.pttl(scripts.key("forgotten")) == -1  # a row again: no expiry
    finally:
        pubsub.close()


def test_a_token_ahead_of_the_clock_is_followed_by_exactly_the_next(scripts: Scripts) -> None:
    """``previous + 1`` when the row's token is ahead of the clock: after a release, a
    forget's tombstone, and never deleted by a sweep while the clock is behind it."""
    token = scripts.token("job", "w1")
    ahead = (scripts.server_ms() + 3_600_000) * r.TOKEN_STEPS  # an hour ahead
    scripts.client.hset(scripts.key("job"), "t", str(ahead))
    moved = Token("job", "w1", ahead, token.expires_at)
    scripts.release(moved, ExitMode.RETIRED)
    after_release = scripts.token("job", "w2")
    assert after_release.fencing_token == ahead + 1
    scripts.forget(after_release)
    assert scripts.client.pttl(scripts.key("job")) > 3_000_000  # kept until the clock passes it
    after_forget = scripts.token("job", "w3")
    assert after_forget.fencing_token == ahead + 2
    scripts.release(after_forget, ExitMode.RETIRED)
    sweep = scripts.client.register_script(r.SWEEP)
    swept = sweep(keys=[scripts.key("job")], args=[str(ahead + 2), "0", "1"])
    assert swept == 0  # deleting it would let the clock undercut its token
    assert scripts.token("job", "w4").fencing_token == ahead + 3


def test_the_same_release_or_forget_sent_again_succeeds(scripts: Scripts) -> None:
    """A client that retried after sending: the repeat (same request ID) finds its own write
    and succeeds; a second call (another request ID) is refused as on every backend."""
    token = scripts.token("job", "w1")
    scripts.release(token, ExitMode.FINISHED, request="call-1")
    scripts.release(token, ExitMode.FINISHED, request="call-1")  # the same call again
    for mode in (ExitMode.FINISHED, ExitMode.ABANDONED):  # a second release is refused
        with pytest.raises(LeaseExpiredError, match=r"released \(finished\)"):
            scripts.release(token, mode, request="call-2")
    again = scripts.token("job", "w2")
    scripts.forget(again, request="call-3")
    scripts.forget(again, request="call-3")  # the same call again
    with pytest.raises(FencedError):
        scripts.forget(again, request="call-4")  # a second forget finds no row
    with pytest.raises(FencedError):
        scripts.renew(again)  # a tombstone is no grant


def test_the_sweep_script_leaves_what_changed_since_it_was_read(scripts: Scripts) -> None:
    sweep = scripts.client.register_script(r.SWEEP)
    token = scripts.token("job", "w1")
    scripts.release(token, ExitMode.RETIRED)
    seen = str(token.fencing_token)
    scripts.wait_past(datetime.fromtimestamp(scripts.server_ms() / 1000 + 0.01, UTC))
    assert sweep(keys=[scripts.key("job")], args=[seen, "3600000", "1"]) == 0  # too recent
    successor = scripts.token("job", "w2")  # granted again since it was read
    assert sweep(keys=[scripts.key("job")], args=[seen, "0", "1"]) == 0
    scripts.release(successor, ExitMode.RETIRED)
    scripts.forget(Token("job", "w2", successor.fencing_token, successor.expires_at))
    # the tombstone of a forget: neither swept nor an error
    assert sweep(keys=[scripts.key("job")], args=[str(successor.fencing_token), "0", "1"]) == 0
    other = scripts.token("other", "w1")
    scripts.release(other, ExitMode.RETIRED)
    scripts.wait_past(datetime.fromtimestamp(scripts.server_ms() / 1000 + 0.01, UTC))
    assert sweep(keys=[scripts.key("other")], args=[str(other.fencing_token), "0", "1"]) == 1


def test_a_flushed_script_cache_is_loaded_again(scripts: Scripts) -> None:
    token = scripts.token("job", "w1")
    scripts.client.script_flush()
    scripts.checkpoint(token, b"after the flush")  # NOSCRIPT: loaded again and run
    assert scripts.read(token).state == b"after the flush"
