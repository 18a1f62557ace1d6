"""Fair share for pools: who belongs to a group, how many work IDs each member should hold,
and which work IDs one member takes or sheds on a scan. Shared by both flavours; no waits,
no I/O.

Members find each other in the lease table itself: every pool holds one *membership lease*
(work ID ``worklease.member/<group>/<digest of its holder ID>``, its checkpoint saying the
member's cap), renewed with its other leases; a crashed member drops out when that lease
lapses. Every member reads the same view (one ``survey`` per scan: the holder of each work ID
of the group, and the live members) and computes the same targets from it, so no member
needs to ask another anything: a member above its target sheds the surplus (stopping the
work, releasing ABANDONED) and a member below takes what is free.

Targets: ``N`` work IDs over the live members, each ``⌊N/P⌋`` or ``⌈N/P⌉`` (the extra ones go
to the first members in holder-ID order), no member above its own ``max_work_ids``, and what
a capped member cannot take spread over the others ("water filling"). Work IDs left over
when every member is at its cap stay uncovered, and the plan says how many.

Which work IDs: rendezvous hashing. Every member ranks every work ID by a hash of (member,
work ID); a free work ID "belongs" to the live member ranking it highest. A member takes
first the free work IDs that belong to it (so members racing for free work mostly want
different ones), then others in its own order, and sheds the ones it ranks lowest; a given
work ID tends to return to the same member.

Stability: a member sheds only when its surplus has been seen on two scans in a row (a
membership that flickers moves nothing) and only as much as the other members lack beyond
the free work IDs (never into the void); both taking and shedding are bounded per scan
(``max_moves``), and taking also grows in steps (at most ``TAKE_STEP`` or as many as the
member already holds, whichever is more): a member starting cold, or a survivor asked to
take over far more than it holds, grows by at most doubling per scan instead of acquiring
(and then renewing) more in one go than it has shown it can carry.

Quiet scans (ADR-0017): a member whose last full survey found it exactly at its target,
with nothing to take or shed, has nothing to decide while the members stay the same and it
still holds as many: if every member is at its target, every work ID is held. So such a
member first reads only the members (``survey`` of no work IDs: a few rows) and surveys the
whole set only when they changed, when its own count changed (a slot ended: lost, retired,
handed back), or when ``FULL_SURVEY_EVERY`` seconds passed since its last full survey (a
safety net for what the members cannot show, such as a lapsed lease of a holder outside the
group). The background cost of a settled pool is then independent of the number of work
IDs; a member under or over its target surveys every scan as before.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from ._validation import MAX_WORK_ID_BYTES, check_work_id
from .errors import PoolConfigError

__all__ = [
    "FULL_SURVEY_EVERY",
    "MEMBER_PREFIX",
    "TAKE_STEP",
    "Balancer",
    "Member",
    "Plan",
    "PoolSurvey",
    "check_group",
    "decode_member",
    "default_group",
    "default_max_moves",
    "encode_member",
    "member_prefix",
    "member_work_id",
    "rescan_delay",
    "targets",
]

MEMBER_PREFIX = "worklease.member/"
"""Work IDs starting with this hold pool memberships, never work."""

TAKE_STEP = 1_000
"""Work IDs a member may take on one scan even when it holds fewer (see the module doc)."""

FULL_SURVEY_EVERY = 300.0
"""Seconds between full surveys of a settled member (see the module doc): the only part of
a settled pool's background work that grows with the number of work IDs, spread thin."""

RESCAN_COST_FACTOR = 3.0
"""A member under its target scans again soon, but never sooner than this many times its
last scan took (see ``rescan_delay``)."""

_MAX_GROUP_BYTES = 256
_HOLDER_DIGEST = 24
_SHED_CONFIRMATIONS = 2


@dataclass(frozen=True, slots=True)
class PoolSurvey:
    """What a backend's ``survey`` returns, read in one step: which of the work IDs asked
    about are free, how many of them each holder holds, and every live member of the group
    with the state its membership lease carries. (Counts, not a row per work ID: a pool over
    10,000 work IDs reads a few rows per scan once everything is held.)"""

    free: tuple[str, ...]
    """The work IDs asked about that an acquire would grant now, in input order."""
    held: Mapping[str, int]
    """Holder ID -> how many of the work IDs asked about it holds right now."""
    members: Mapping[str, bytes | None]
    """Holder ID -> membership checkpoint, for the held membership leases of the group."""


PoolSurvey.__module__ = "worklease"


@dataclass(frozen=True, slots=True)
class Member:
    holder_id: str
    cap: int | None


def default_group(work_ids: Iterable[str]) -> str:
    """A group name derived from the set of work IDs: pools over the same set share it."""
    digest = hashlib.sha256("\n".join(sorted(work_ids)).encode("utf-8"))
    return "ids-" + digest.hexdigest()[:20]


def check_group(group: object) -> str:
    """A group name: a work-ID-like string of at most 256 UTF-8 bytes without ``/``."""
    if not isinstance(group, str):
        raise PoolConfigError(f"group must be a str, not {type(group).__name__}")
    try:
        check_work_id(group)
    except ValueError as exc:
        raise PoolConfigError(f"group: {exc}") from None
    if "/" in group:
        raise PoolConfigError("group must not contain '/'")
    if len(group.encode("utf-8")) > _MAX_GROUP_BYTES:
        raise PoolConfigError(f"group must be at most {_MAX_GROUP_BYTES} bytes in UTF-8")
    return group


def member_prefix(group: str) -> str:
    return f"{MEMBER_PREFIX}{group}/"


def member_work_id(group: str, holder_id: str) -> str:
    """The work ID of ``holder_id``'s membership lease in ``group`` (within the work-ID
    limit whatever the holder ID: the row's holder column names the member)."""
    digest = hashlib.sha256(holder_id.encode("utf-8")).hexdigest()[:_HOLDER_DIGEST]
    work_id = member_prefix(group) + digest
    assert len(work_id.encode("utf-8")) <= MAX_WORK_ID_BYTES
    return work_id


def encode_member(cap: int | None) -> bytes:
    """The checkpoint of a membership lease: what other members need to know of this one."""
    return json.dumps({"v": 1, "cap": cap}, separators=(",", ":")).encode("utf-8")


def decode_member(holder_id: str, state: bytes | None) -> Member:
    """A member from its membership checkpoint (unreadable or absent: no cap)."""
    cap: int | None = None
    if state:
        try:
            value = json.loads(state).get("cap")
        except (ValueError, AttributeError):
            value = None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            cap = value
    return Member(holder_id, cap)


def rescan_delay(idle_interval: float, last_scan: float) -> float:
    """How long a member still under its target waits before its next scan: a tenth of the
    idle interval, or ``RESCAN_COST_FACTOR`` times what its last scan took if that is more.
    Scans of a big set while under target read every work ID; on a loaded machine scanning
    back to back would take the time its renewals need and lose what it holds, so the pace
    follows the measured cost (at most about a quarter of the time goes to scanning)."""
    return max(idle_interval / 10, RESCAN_COST_FACTOR * max(last_scan, 0.0))


def default_max_moves(total: int) -> int:
    """How many work IDs one member takes or sheds per scan by default: a quarter of the
    set (at least 10), so a big move is spread over a few scans."""
    return max(10, -(-total // 4))


def targets(total: int, members: Sequence[Member]) -> dict[str, int]:
    """How many work IDs each member should hold (see the module doc). Deterministic: every
    member computes the same answer from the same members."""
    order = sorted(members, key=lambda member: member.holder_id)
    result: dict[str, int] = {}
    remaining = total
    open_ = list(order)
    while open_:
        share, extra = divmod(remaining, len(open_))
        capped = [m for m in open_ if m.cap is not None and m.cap <= share]
        if capped:  # these cannot take a full share: they take their cap, the rest is re-spread
            for member in capped:
                result[member.holder_id] = member.cap or 0
                remaining -= member.cap or 0
            open_ = [m for m in open_ if m not in capped]
            continue
        for member in open_:
            bonus = 1 if extra > 0 and (member.cap is None or member.cap > share) else 0
            extra -= bonus
            result[member.holder_id] = share + bonus
        break
    return result


def _rank_key(holder_id: str) -> bytes:
    return hashlib.sha256(holder_id.encode("utf-8")).digest()


def _rank(key: bytes, work_id: str) -> int:
    """The rendezvous rank of ``work_id`` for the member whose ``_rank_key`` is ``key``
    (higher: preferred)."""
    digest = hashlib.blake2b(work_id.encode("utf-8"), key=key, digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _ranks(holder_id: str, work_ids: Iterable[str]) -> array[int]:
    """The rendezvous rank of each work ID for ``holder_id``, in ``work_ids`` order: 8 bytes
    per work ID (a pool over 100,000 work IDs keeps one such array per peer)."""
    key = _rank_key(holder_id)
    return array("Q", (_rank(key, work_id) for work_id in work_ids))


@dataclass(frozen=True, slots=True)
class Plan:
    """What one scan of one member does."""

    members: int
    """Live members counted (this one included)."""
    target: int
    held: int
    """Work IDs this member holds (slots running here, not counting those being shed)."""
    take: tuple[str, ...] = ()
    """Free work IDs to acquire, best first."""
    shed: tuple[str, ...] = ()
    """Work IDs held here to hand over (stop, final checkpoint, release ABANDONED)."""
    uncovered: int = 0
    """Work IDs no member may hold: every member is at its ``max_work_ids``."""


@dataclass(slots=True)
class Balancer:
    """The fair-share decisions of one pool member, scan after scan."""

    work_ids: tuple[str, ...]
    holder_id: str
    cap: int | None = None
    max_moves: int = 10
    full_every: float = FULL_SURVEY_EVERY
    _surplus_seen: int = field(default=0, init=False)
    _settled: tuple[dict[str, bytes | None], int, float] | None = field(default=None, init=False)
    """After a full survey that found this member at its target with nothing to move: the
    members seen, the work IDs held, and when the next full survey is due anyway."""
    _last: Plan | None = field(default=None, init=False)
    _own: array[int] = field(default_factory=lambda: array("Q"), init=False)
    """This member's rank of each work ID, in ``work_ids`` order."""
    _others: dict[str, array[int]] = field(default_factory=dict, init=False)
    """Each peer's rank of each work ID (same order), computed once per peer."""
    _preferred: array[int] = field(default_factory=lambda: array("I"), init=False)
    """Positions in ``work_ids`` in the order this member takes free ones (see
    ``_preference``), rebuilt when the peers change: a scan only walks it."""
    _preferred_for: tuple[str, ...] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._own = _ranks(self.holder_id, self.work_ids)

    def _lowest_first(self, work_ids: Iterable[str]) -> list[str]:
        """``work_ids`` by this member's rank, lowest first (ranks recomputed: no map from
        work ID to position is kept, and ranking what it sheds is rare)."""
        key = _rank_key(self.holder_id)
        return sorted(work_ids, key=lambda work_id: _rank(key, work_id))

    def _preference(self, free: list[str], peers: list[str], limit: int) -> tuple[str, ...]:
        """The first ``limit`` of ``free`` in the order this member should try them: those
        it ranks above every peer first (they are "its" work IDs), then the rest, each by its
        own rank. The order over all work IDs is computed when the peers change (one rank
        array per new peer, then a sort); a scan walks it, so its cost does not depend on
        the number of peers."""
        wanted = tuple(sorted(peers))
        if wanted != self._preferred_for:
            self._reorder(wanted)
        free_now = set(free)
        work_ids = self.work_ids
        found = (work_ids[i] for i in self._preferred if work_ids[i] in free_now)
        return tuple(islice(found, limit))

    def _reorder(self, peers: tuple[str, ...]) -> None:
        for gone in set(self._others) - set(peers):
            del self._others[gone]  # a member that left (a restart with a new holder ID)
        for peer in peers:
            if peer not in self._others:
                self._others[peer] = _ranks(peer, self.work_ids)
        own = self._own
        positions = range(len(own))
        best: Iterable[int] | None = None
        for ranks in self._others.values():
            best = ranks if best is None else map(max, best, ranks)
        if best is None:
            first: list[int] = list(positions)
            rest: list[int] = []
        else:
            wins = [mine > other for mine, other in zip(own, best, strict=True)]
            first = [i for i in positions if wins[i]]
            rest = [i for i in positions if not wins[i]]
        first.sort(key=own.__getitem__, reverse=True)
        rest.sort(key=own.__getitem__, reverse=True)
        self._preferred = array("I", first + rest)
        self._preferred_for = peers

    def settled(self) -> bool:
        """Whether the next scan may start with a look at the members only (``quiet``)."""
        return self._settled is not None

    def quiet(self, members: Mapping[str, bytes | None], held: int, now: float) -> Plan | None:
        """After a look at the members only: the plan of a scan with nothing to do (the last
        full survey's figures, nothing taken or shed) when nothing this member decides on can
        have changed, else ``None``: a full survey is needed. ``held``: work IDs with a slot
        running here that are not being handed over; ``now``: monotonic seconds."""
        settled, last = self._settled, self._last
        if settled is None or last is None:
            return None
        seen, was_held, due = settled
        if now >= due or held != was_held or dict(members) != seen:
            self._settled = None
            return None
        return Plan(last.members, last.target, held, uncovered=last.uncovered)

    def plan(
        self,
        survey: PoolSurvey,
        mine: Iterable[str],
        shedding: Iterable[str] = (),
        done: Iterable[str] = (),
        *,
        now: float | None = None,
    ) -> Plan:
        """This member's next moves. ``mine``: work IDs with a slot running here (holding or
        about to); ``shedding``: those of them already being handed over; ``done``: work IDs
        this member retired or gave up, never taken again. With ``now`` (monotonic seconds),
        a plan with nothing to move lets the next scans be quiet (see ``quiet``)."""
        result = self._plan(survey, set(mine), set(shedding), set(done))
        self._last = result
        settled = result.held == result.target and not result.take and not result.shed
        if now is not None and settled:
            self._settled = (dict(survey.members), result.held, now + self.full_every)
        else:
            self._settled = None
        return result

    def _plan(self, survey: PoolSurvey, mine: set[str], shedding: set[str], done: set[str]) -> Plan:
        leaving = shedding & mine
        staying = mine - leaving
        members = [
            decode_member(holder, state)
            for holder, state in survey.members.items()
            if holder != self.holder_id
        ]
        members.append(Member(self.holder_id, self.cap))  # alive, whether seen yet or not
        goal = targets(len(self.work_ids), members)
        target = goal[self.holder_id]
        # Our own holdings are the slots running here: a lease under our name without a slot
        # is a previous run's, lapsing.
        counts = {holder: n for holder, n in survey.held.items() if holder != self.holder_id}
        unclaimed = [work_id for work_id in survey.free if work_id not in mine]
        free = [work_id for work_id in unclaimed if work_id not in done]
        uncovered = len(self.work_ids) - sum(goal.values())
        held = len(staying)
        take: tuple[str, ...] = ()
        shed: tuple[str, ...] = ()
        if held < target:
            self._surplus_seen = 0
            peers = [member.holder_id for member in members if member.holder_id != self.holder_id]
            step = min(target - held, self.max_moves, max(TAKE_STEP, held))
            take = self._preference(free, peers, step)
        elif held > target:
            self._surplus_seen += 1
            lacking = sum(
                max(goal[member.holder_id] - counts.get(member.holder_id, 0), 0)
                for member in members
                if member.holder_id != self.holder_id
            )
            # What the others lack beyond the free work IDs (ours retired or given up
            # included: others may take those).
            wanted = min(held - target, lacking - len(unclaimed), self.max_moves)
            if wanted <= 0:
                self._surplus_seen = 0  # nobody to hand to: a later sighting starts afresh
            elif self._surplus_seen >= _SHED_CONFIRMATIONS:
                ranked = self._lowest_first(staying)
                shed = tuple(ranked[:wanted])
        else:
            self._surplus_seen = 0
        return Plan(len(members), target, held, take, shed, max(uncovered, 0))
