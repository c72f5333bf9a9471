"""What to fire when slots came due while nothing was firing them (outage, pause, lag).

Invariant ("no lost slot"): every late slot ends up in exactly one of ``fire`` or
``missed``, so the event log accounts for every slot the schedule produced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from streams.domain.policies import MisfireKind, MisfirePolicy
from streams.domain.schedule import Slot


class MissReason(StrEnum):
    COALESCED = "coalesced"
    LATE_BY_EXCEEDED = "late_by_exceeded"
    FIRE_ALL_CAP = "fire_all_cap"


@dataclass(frozen=True, kw_only=True, slots=True)
class MisfireDecision:
    """Slots to fire now (oldest first) and slots to record as missed, with the reason."""

    fire: list[Slot]
    missed: list[tuple[Slot, str]]


def resolve_misfire(
    *, late_slots: Sequence[Slot], now_ms: int, policy: MisfirePolicy
) -> MisfireDecision:
    """Split ``late_slots`` into fire/missed under ``policy``.

    * ``fire_once``: fire only the newest slot; the rest are ``coalesced`` into it.
    * ``skip_if_late_by``: a slot more than ``late_by_s`` old at ``now_ms`` is
      ``late_by_exceeded``; the others fire.
    * ``fire_all``: fire the newest ``fire_all_cap`` slots; older ones are ``fire_all_cap``.
      The newest are kept because they carry the most current intent and are the ones a
      reader of the latest data would expect to have run.
    """
    # Sorting is cheap on the already-ascending input and makes "newest" well defined
    # even if a caller hands over slots out of order.
    slots = sorted(late_slots, key=lambda s: s.scheduled_for_ms)
    if not slots:
        return MisfireDecision(fire=[], missed=[])
    if policy.kind == MisfireKind.FIRE_ONCE:
        return MisfireDecision(
            fire=slots[-1:], missed=[(s, MissReason.COALESCED) for s in slots[:-1]]
        )
    if policy.kind == MisfireKind.SKIP_IF_LATE_BY:
        limit_ms = (policy.late_by_s or 0.0) * 1000
        fire: list[Slot] = []
        missed: list[tuple[Slot, str]] = []
        for s in slots:
            if now_ms - s.scheduled_for_ms > limit_ms:
                missed.append((s, MissReason.LATE_BY_EXCEEDED))
            else:
                fire.append(s)
        return MisfireDecision(fire=fire, missed=missed)
    cut = max(len(slots) - policy.fire_all_cap, 0)
    return MisfireDecision(
        fire=slots[cut:], missed=[(s, MissReason.FIRE_ALL_CAP) for s in slots[:cut]]
    )
