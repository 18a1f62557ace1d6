"""Fair-share decisions (shared by both flavours): targets, and what one member takes or
sheds on a scan. Pure functions: every case is a chosen view of the group."""

from __future__ import annotations

import pytest

from worklease import PoolConfigError, PoolSurvey
from worklease._fairshare import (
    MEMBER_PREFIX,
    TAKE_STEP,
    Balancer,
    Member,
    check_group,
    decode_member,
    default_group,
    default_max_moves,
    encode_member,
    member_prefix,
    member_work_id,
    targets,
)
from worklease._validation import MAX_WORK_ID_BYTES

IDS = tuple(f"w{i:02d}" for i in range(10))


def members(*names: str, caps: dict[str, int] | None = None) -> list[Member]:
    return [Member(name, (caps or {}).get(name)) for name in names]


# -- targets ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "count"), [(10, 1), (10, 3), (10, 4), (10_000, 3), (10_000, 7), (3, 5), (0, 2)]
)
def test_every_target_is_floor_or_ceil_and_all_are_covered(total: int, count: int) -> None:
    names = [f"m{i}" for i in range(count)]
    goal = targets(total, members(*names))
    assert sum(goal.values()) == total
    assert set(goal.values()) <= {total // count, -(-total // count)}


def test_targets_are_the_same_whoever_computes_them() -> None:
    a = targets(10, members("b", "a", "c"))
    b = targets(10, members("c", "b", "a"))
    assert a == b == {"a": 4, "b": 3, "c": 3}  # the extra one goes by holder-ID order


def test_caps_are_never_exceeded_and_the_rest_is_spread() -> None:
    goal = targets(10, members("a", "b", "c", caps={"a": 1}))
    assert goal == {"a": 1, "b": 5, "c": 4}
    goal = targets(10, members("a", "b", "c", caps={"a": 4, "b": 4, "c": 4}))
    assert goal == {"a": 4, "b": 3, "c": 3}  # the caps do not bind
    goal = targets(10, members("a", "b", caps={"a": 3, "b": 3}))
    assert goal == {"a": 3, "b": 3}  # four uncovered
    goal = targets(10, members("a", "b", "c", caps={"b": 3, "c": 3}))
    assert goal == {"a": 4, "b": 3, "c": 3}
    goal = targets(11, members("a", "b", "c", caps={"a": 3}))
    assert goal == {"a": 3, "b": 4, "c": 4}


# -- naming ------------------------------------------------------------------------------------


def test_groups_and_membership_work_ids() -> None:
    assert default_group(["b", "a"]) == default_group(["a", "b"]) != default_group(["a"])
    assert member_prefix("g").startswith(MEMBER_PREFIX)
    long_holder = "h" * 1024
    work_id = member_work_id("g" * 256, long_holder)
    assert work_id.startswith(member_prefix("g" * 256))
    assert len(work_id.encode()) <= MAX_WORK_ID_BYTES
    assert member_work_id("g", "a") != member_work_id("g", "b")
    for bad in ("", "a/b", "x" * 257, 5, "a\x00b"):
        with pytest.raises(PoolConfigError):
            check_group(bad)


def test_member_state_round_trips_and_garbage_reads_as_uncapped() -> None:
    assert decode_member("a", encode_member(3)) == Member("a", 3)
    assert decode_member("a", encode_member(None)) == Member("a", None)
    for garbage in (None, b"", b"not json", b"[1]", b'{"cap": -1}', b'{"cap": true}'):
        assert decode_member("a", garbage) == Member("a", None)


def test_default_max_moves() -> None:
    assert default_max_moves(12) == 10
    assert default_max_moves(10_000) == 2_500


# -- one member's plan -------------------------------------------------------------------------


def survey(
    free: tuple[str, ...], held: dict[str, int], others: dict[str, bytes | None]
) -> PoolSurvey:
    return PoolSurvey(free, held, others)


def test_alone_a_member_takes_everything_free_within_max_moves() -> None:
    balancer = Balancer(IDS, "me", max_moves=4)
    plan = balancer.plan(survey(IDS, {}, {}), mine=())
    assert (plan.members, plan.target, plan.held) == (1, 10, 0)
    assert len(plan.take) == 4
    assert set(plan.take) <= set(IDS)
    assert plan.shed == ()


def test_a_member_takes_only_up_to_its_share() -> None:
    """Just joined a group where one member holds 4 and 6 are free: it takes its 5."""
    balancer = Balancer(IDS, "me")
    plan = balancer.plan(survey(IDS[4:], {"other": 4}, {"other": None}), mine=())
    assert plan.target == 5
    assert len(plan.take) == 5
    assert set(plan.take) <= set(IDS[4:])


def test_members_prefer_different_free_work_ids() -> None:
    """Rendezvous hashing: two members racing for the same free work IDs each first want the
    ones they rank above the other, so their first picks hardly overlap (by chance, 50 of
    200 each would share about 12)."""
    ids = tuple(f"w{i:03d}" for i in range(200))
    moves = default_max_moves(len(ids))
    a = Balancer(ids, "a", max_moves=moves).plan(survey(ids, {}, {"b": None}), mine=())
    b = Balancer(ids, "b", max_moves=moves).plan(survey(ids, {}, {"a": None}), mine=())
    assert len(a.take) == len(b.take) == 50
    assert len(set(a.take) & set(b.take)) == 0


def test_surplus_is_shed_only_when_seen_twice_and_somebody_lacks() -> None:
    """Holding all 10 when a second member appears: nothing on the first sight (a flicker
    moves nothing), then the 5 the newcomer lacks, the ones this member ranks lowest."""
    balancer = Balancer(IDS, "me")
    view = survey((), {"me": 10}, {"new": None})
    first = balancer.plan(view, mine=IDS)
    assert (first.target, first.held, first.shed) == (5, 10, ())
    second = balancer.plan(view, mine=IDS)
    assert len(second.shed) == 5
    third = balancer.plan(view, mine=IDS, shedding=second.shed)
    assert third.held == 5
    assert third.shed == ()  # the ones being shed no longer count
    ranks = dict(zip(IDS, balancer._own, strict=True))
    assert max(ranks[w] for w in second.shed) < min(ranks[w] for w in set(IDS) - set(second.shed))


def test_no_shed_into_the_void() -> None:
    """Free work IDs already cover what the others lack: nothing is shed."""
    balancer = Balancer(IDS[:6], "me")
    view = survey(("w04", "w05"), {}, {"new": None})  # I hold 4, the newcomer lacks 3
    for _ in range(3):
        plan = balancer.plan(view, mine=IDS[:4])
    assert plan.target == 3
    assert len(plan.shed) == 1  # the newcomer lacks 3, two of them are free


def test_shedding_is_bounded_per_scan() -> None:
    balancer = Balancer(IDS, "me", max_moves=2)
    view = survey((), {}, {"new": None})
    balancer.plan(view, mine=IDS)
    assert len(balancer.plan(view, mine=IDS).shed) == 2


def test_a_flicker_resets_the_confirmation() -> None:
    balancer = Balancer(IDS, "me")
    balancer.plan(survey((), {}, {"new": None}), mine=IDS)  # surplus seen once
    balancer.plan(survey((), {}, {}), mine=IDS)  # the newcomer vanished: at target
    plan = balancer.plan(survey((), {}, {"new": None}), mine=IDS)
    assert plan.shed == ()  # seen once again only


def test_cap_limits_taking_and_reports_uncovered() -> None:
    balancer = Balancer(IDS, "me", cap=2)
    plan = balancer.plan(survey(IDS, {}, {"other": b'{"v":1,"cap":3}'}), mine=())
    assert plan.target == 2
    assert len(plan.take) == 2
    assert plan.uncovered == 5  # 10 - 2 - 3


def test_retired_and_own_work_ids_are_never_taken() -> None:
    balancer = Balancer(IDS, "me")
    plan = balancer.plan(survey(IDS, {}, {}), mine=("w00",), done=("w01",))
    assert "w00" not in plan.take
    assert "w01" not in plan.take
    assert plan.held == 1


def test_a_previous_run_under_the_same_name_does_not_count_as_held() -> None:
    """Leases under this member's holder ID without a slot here (a previous run's, lapsing)
    are neither held nor free."""
    balancer = Balancer(IDS, "me")
    plan = balancer.plan(survey(IDS[5:], {"me": 5}, {"me": None}), mine=())
    assert plan.members == 1
    assert plan.held == 0
    assert set(plan.take) == set(IDS[5:])


def test_surplus_with_nobody_to_take_it_resets_the_confirmation() -> None:
    """Over target (6 of 10, target 5) while the newcomer lacks only what is free: nothing
    is shed and the confirmation starts afresh, so a later real lack needs two scans again."""
    balancer = Balancer(IDS, "me")
    free = IDS[6:]  # 4 free
    lacking = balancer.plan(survey(free, {}, {"new": None}), mine=IDS[:6])
    assert lacking.shed == ()  # seen once: the newcomer lacks 5, 4 are free
    covered = balancer.plan(survey(free, {"new": 1}, {"new": None}), mine=IDS[:6])
    assert covered.shed == ()  # the newcomer lacks 4: the free ones cover it
    again = balancer.plan(survey(free, {}, {"new": None}), mine=IDS[:6])
    assert again.shed == ()  # without the reset this would be the second sighting
    assert len(balancer.plan(survey(free, {}, {"new": None}), mine=IDS[:6]).shed) == 1


def test_ranks_of_members_that_left_are_forgotten() -> None:
    balancer = Balancer(IDS, "me")
    balancer.plan(survey(IDS, {}, {"a": None, "b": None}), mine=())
    assert set(balancer._others) == {"a", "b"}
    balancer.plan(survey(IDS, {}, {"b": None}), mine=())
    assert set(balancer._others) == {"b"}


def test_own_retired_work_ids_count_as_free_for_the_others() -> None:
    """A work ID this member retired is free for the others: it is not shed for."""
    balancer = Balancer(IDS, "me")
    view = survey(("w09",), {}, {"new": None})  # the newcomer lacks 5; w09 (ours, done) free
    for _ in range(2):
        plan = balancer.plan(view, mine=IDS[:9], done=("w09",))
    assert len(plan.shed) == 4  # held 9, target 5, lacking 5 - 1 free


# -- quiet scans and growth in steps (issue 24) ------------------------------------------------


def settled_member() -> tuple[Balancer, dict[str, bytes | None]]:
    """``me`` at its target of 5 beside ``other``, after one full survey at t=100."""
    balancer = Balancer(IDS, "me", full_every=60.0)
    others: dict[str, bytes | None] = {"other": None}
    plan = balancer.plan(survey((), {"other": 5, "me": 5}, others), mine=IDS[:5], now=100.0)
    assert (plan.target, plan.held, plan.take, plan.shed) == (5, 5, (), ())
    return balancer, others


def test_a_member_at_its_target_may_look_at_the_members_only() -> None:
    balancer, others = settled_member()
    assert balancer.settled()
    plan = balancer.quiet(dict(others), held=5, now=130.0)
    assert plan is not None
    assert (plan.members, plan.target, plan.held, plan.take, plan.shed) == (2, 5, 5, (), ())
    assert balancer.settled()  # stays quiet while nothing changes


@pytest.mark.parametrize(
    ("members_seen", "held", "now", "why"),
    [
        ({"other": None, "third": None}, 5, 130.0, "a member joined"),
        ({}, 5, 130.0, "a member left"),
        ({"other": encode_member(2)}, 5, 130.0, "a member's cap changed"),
        ({"other": None}, 4, 130.0, "one of ours ended (lost, retired, handed back)"),
        ({"other": None}, 5, 160.0, "the periodic full survey is due"),
    ],
)
def test_any_change_or_the_safety_net_asks_for_a_full_survey(
    members_seen: dict[str, bytes | None], held: int, now: float, why: str
) -> None:
    balancer, _ = settled_member()
    assert balancer.quiet(members_seen, held=held, now=now) is None, why
    assert not balancer.settled()  # and the next scan is a full one again


def test_only_a_plan_with_nothing_to_move_settles() -> None:
    """Under target, over target, or planned without a clock: every scan is a full one."""
    under = Balancer(IDS, "me")
    under.plan(survey(IDS[5:], {"other": 5}, {"other": None}), mine=(), now=1.0)
    assert not under.settled()
    over = Balancer(IDS, "me")
    over.plan(survey((), {"me": 10}, {"other": None}), mine=IDS, now=1.0)
    assert not over.settled()
    no_clock = Balancer(IDS, "me")
    no_clock.plan(survey((), {"other": 5, "me": 5}, {"other": None}), mine=IDS[:5])
    assert not no_clock.settled()
    assert no_clock.quiet({"other": None}, 5, 0.0) is None


def test_a_cold_member_grows_in_steps_that_at_most_double_what_it_holds() -> None:
    ids = tuple(f"w{i:05d}" for i in range(10_000))
    balancer = Balancer(ids, "me", max_moves=10_000)
    first = balancer.plan(survey(ids, {}, {}), mine=())
    assert len(first.take) == TAKE_STEP
    held = set(first.take)
    second = balancer.plan(survey(tuple(i for i in ids if i not in held), {}, {}), mine=held)
    assert len(second.take) == TAKE_STEP  # max(TAKE_STEP, held) with held == TAKE_STEP
    held |= set(second.take)
    third = balancer.plan(survey(tuple(i for i in ids if i not in held), {}, {}), mine=held)
    assert len(third.take) == 2 * TAKE_STEP
    assert not set(third.take) & held


def _reference_order(holder: str, peers: list[str], free: list[str]) -> list[str]:
    """The rendezvous preference written out directly: the work IDs this member ranks above
    every peer first, then the rest, each by its own rank (8-byte keyed BLAKE2b digests)."""
    import hashlib

    def rank(member: str, work_id: str) -> bytes:
        key = hashlib.sha256(member.encode()).digest()
        return hashlib.blake2b(work_id.encode(), key=key, digest_size=8).digest()

    def key(work_id: str) -> tuple[bool, bytes]:
        own = rank(holder, work_id)
        return (all(own > rank(peer, work_id) for peer in peers), own)

    return sorted(free, key=key, reverse=True)


def test_the_precomputed_preference_matches_the_rendezvous_rule_as_peers_come_and_go() -> None:
    """The order is computed once per set of peers and walked by each scan: after peers
    join and leave it is still exactly the rule, for any subset of free work IDs."""
    ids = tuple(f"job-{i:04d}" for i in range(600))
    free = [work_id for i, work_id in enumerate(ids) if i % 3 != 1]
    balancer = Balancer(ids, "me", max_moves=len(ids))
    for peers in (["p1"], ["p1", "p2", "p3"], ["p3"], [], ["p2", "p4"]):
        view = survey(tuple(free), {}, dict.fromkeys(peers))
        plan = balancer.plan(view, mine=())
        limit = min(len(free), TAKE_STEP, plan.target)
        assert list(plan.take) == _reference_order("me", peers, free)[:limit]
        assert set(balancer._others) == set(peers)


def test_the_rescan_pace_follows_the_cost_of_the_last_scan() -> None:
    from worklease._fairshare import RESCAN_COST_FACTOR, rescan_delay

    assert rescan_delay(1.0, 0.0) == 0.1  # cheap scans: a tenth of the idle interval
    assert rescan_delay(1.0, 0.01) == 0.1
    assert rescan_delay(1.0, 0.5) == RESCAN_COST_FACTOR * 0.5  # costly: three times as long
    assert rescan_delay(1.0, -1.0) == 0.1  # a clock oddity never makes it negative
