"""Fair decisions: which due timers one round of a tick decides, when more are due than it
takes.

The timer index is split into lanes, one per (tier, tenant) (streams.domain.timer). A round
of `limit` timers takes the system lane's due timers first (leases, held attempts: cheap,
and never to wait behind a flood), then the legacy lane's (keys from before lanes), then
tier by tier (critical, normal, batch); within a tier, the tenants' lanes share the round
in weighted fair turns: start-time fair queueing, each lane's k-th timer of the tick
tagged start + k / weight, the smallest tag taken next. A lane with w of the Σw of the
tier's lanes that have timers due gets limit * w / Σw of the round (±1), whatever it
holds; what a lane does not use goes to the others. Within a lane, due order.

The turns carry over the chunks of one tick (Context.fair), so a tick of many small
rounds shares like one round; ties between equal tags go by the lanes' tenant hashes
scrambled by the tick's time, so the same lanes do not always come first. Nothing here
reads a clock or draws a random number: the same store and tick decide the same.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Final

from streams.domain.policies import Priority
from streams.domain.tenants import TenantTable
from streams.domain.timer import LEGACY_LANE, SYSTEM_LANE, Lane, Tier, tenant_hash
from streams.engine.spec import JobPlan

TimerItem = tuple[bytes, bytes]
# A lane with due timers, as PartitionStore.due_lanes gives it: the timers in due order.
DueLane = tuple[Lane, Generator[TimerItem]]


# By value (a Priority is a StrEnum: its hash and equality are the string's).
TIER_OF_PRIORITY: Final[Mapping[str, Tier]] = {
    Priority.CRITICAL.value: Tier.CRITICAL, Priority.NORMAL.value: Tier.NORMAL,
    Priority.BATCH.value: Tier.BATCH}


def tier_of(plan: JobPlan) -> Tier:
    """The tier of a job's timers: its priority's (JobPlan.priority, normal by default)."""
    return TIER_OF_PRIORITY[plan.priority]


LaneWeight = Callable[[Lane], float]


class TenantWeights:
    """Tenants' weights, by lane: a lane names its tenant by hash only, so the weights are
    looked up by the hashes of the tenants that have one. Any other tenant weighs
    `default`. Weights are settings (every owner must use the same ones, or replays would
    share rounds differently)."""

    def __init__(self, weights: Mapping[str, float] | None = None, *,
                 default: float = 1.0) -> None:
        for tenant, weight in (weights or {}).items():
            if not weight > 0:
                raise ValueError(f"tenant {tenant!r}: a weight must be positive, not {weight}")
        if not default > 0:
            raise ValueError(f"the default weight must be positive, not {default}")
        self._by_hash = {tenant_hash(t): float(w) for t, w in (weights or {}).items()}
        self._default = float(default)

    @classmethod
    def from_table(cls, table: TenantTable) -> TenantWeights:
        """The weights of a tenants table (KRON_TENANTS_FILE): its listed tenants', and its
        defaults' for the rest."""
        return cls({t: q.weight for t, q in table.tenants.items()},
                   default=table.defaults.weight)

    def __call__(self, lane: Lane) -> float:
        return self._by_hash.get(lane.tenant, self._default)


EQUAL_WEIGHTS: LaneWeight = TenantWeights()


@dataclass(slots=True)
class FairState:
    """The turns of one tick so far: per tier, the virtual time (the tag last taken) and
    the lanes the last round left timers in; per lane, [start tag, timers taken since,
    weight]."""

    vtime: dict[int, float] = field(default_factory=dict)
    waiting: dict[int, set[bytes]] = field(default_factory=dict)
    lanes: dict[bytes, list[float]] = field(default_factory=dict)


class _Reader:
    """A lane's due timers, read as they are asked for: `head` is the next one once
    looked at (`known`), None if there is none. A lane the round does not get to is not
    read at all, and one that gives a timer is not read ahead for the next."""

    __slots__ = ("gen", "head", "known", "lane")

    def __init__(self, lane: Lane, gen: Generator[TimerItem]) -> None:
        self.lane = lane
        self.gen = gen
        self.head: TimerItem | None = None
        self.known = False

    def open(self) -> TimerItem | None:
        """The next timer (read now if not yet), or None."""
        if not self.known:
            self.known = True
            self.head = next(self.gen, None)
        return self.head

    def waiting(self) -> bool:
        """It may hold more (not looked at since its last timer was taken)."""
        return self.head is not None or not self.known

    def take(self, n: int) -> list[TimerItem]:
        head = self.open()
        if head is None or n <= 0:
            return []
        out = [head]
        if n > 1:
            out += itertools.islice(self.gen, n - 1)
        self.head = next(self.gen, None) if len(out) == n else None
        return out

    def pop(self) -> TimerItem:
        """The next timer, known to be there (open); the one after is not read yet."""
        item = self.head
        assert item is not None
        self.head, self.known = None, False
        return item


def _order(lane: Lane) -> tuple[int, int, int]:
    # The system lane first, then the legacy lane (both system tier), then by tier.
    return (lane.tier, 0 if lane == SYSTEM_LANE else 1 if lane == LEGACY_LANE else 2,
            lane.tenant)


def pick(lanes: list[DueLane], limit: int, *, weight: LaneWeight = EQUAL_WEIGHTS,
         state: FairState | None = None, rotation: int = 0) -> tuple[list[TimerItem], bool]:
    """The timers one round decides, in the order to decide them, and whether any due
    timer was left. `lanes` are the lanes that may have due timers (every one that has);
    each is read only once the round gets to it; the caller closes their generators.
    `state` carries the turns over the rounds of one tick; `rotation` (the tick's time)
    scrambles the ties."""
    readers = sorted((_Reader(lane, gen) for lane, gen in lanes), key=lambda r: _order(r.lane))
    out: list[TimerItem] = []
    for tier, group in itertools.groupby(readers, key=lambda r: r.lane.tier):
        room = limit - len(out)
        if room <= 0:
            break
        tier_readers = list(group)
        if tier == Tier.SYSTEM or len(tier_readers) == 1:
            for r in tier_readers:
                out += r.take(limit - len(out))
        else:
            _turns(tier, tier_readers, room, out, weight,
                   state if state is not None else FairState(), _mask(rotation))
    # Whether anything is left: a lane read and not drained, else any lane not read yet
    # that holds a due timer (the first found answers).
    return out, (any(r.head is not None for r in readers)
                 or any(r.open() is not None for r in readers if not r.known))


def _mask(rotation: int) -> int:
    return (rotation * 0x9E3779B1) & 0xFFFFFFFF


def _turns(tier: int, readers: list[_Reader], room: int, out: list[TimerItem],
           weight: LaneWeight, state: FairState, mask: int) -> None:
    """Start-time fair queueing over one tier's lanes, `room` timers at most."""
    vtime = state.vtime.get(tier, 0.0)
    waiting = state.waiting.get(tier, set())
    heap: list[tuple[float, int, int]] = []
    tags: list[list[float]] = []
    for i, r in enumerate(readers):
        # Read when its turn first comes (in the loop below), so a lane the round does not
        # reach is not read; one that turns out to have nothing due drops out then.
        tag = state.lanes.get(r.lane.prefix)
        # A lane new to the tick, or with nothing due when the last round ended: it starts
        # now, with no credit for the turns it did not need. One the last round left
        # timers in goes on from its last turn.
        if tag is None or r.lane.prefix not in waiting:
            tag = state.lanes[r.lane.prefix] = [vtime, 0, weight(r.lane)]
        tags.append(tag)
        heap.append((tag[0] + (tag[1] + 1) / tag[2], r.lane.tenant ^ mask, i))
    heapq.heapify(heap)
    while room and heap:
        finish, tie, i = heap[0]
        r, tag = readers[i], tags[i]
        if r.open() is None:
            heapq.heappop(heap)
            continue
        out.append(r.pop())
        room -= 1
        tag[1] += 1
        vtime = finish
        # Whether it has another is seen when its next turn comes.
        heapq.heapreplace(heap, (tag[0] + (tag[1] + 1) / tag[2], tie, i))
    state.vtime[tier] = vtime
    # Left waiting: lanes not seen drained (those the round did not get to included).
    state.waiting[tier] = {r.lane.prefix for r in readers if r.waiting()}
