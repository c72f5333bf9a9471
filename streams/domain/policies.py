"""Per-job policies: what to do on overlap, misfire, DST edge cases and failure.

Validation is an explicit ``validate()`` call rather than part of construction: policies are
also rebuilt from historic events, and a limit tightened later must not make old events
undecodable. The API calls ``validate()`` on everything it accepts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from streams.domain.errors import InvalidPolicy


class Overlap(StrEnum):
    """What to do when a slot comes due while the previous execution is still running."""

    ALLOW = "allow"
    SKIP_IF_RUNNING = "skip_if_running"
    QUEUE = "queue"
    REPLACE = "replace"


class MisfireKind(StrEnum):
    """What to do with slots that came due while nothing was firing them (outage, pause)."""

    FIRE_ONCE = "fire_once"
    SKIP_IF_LATE_BY = "skip_if_late_by"
    FIRE_ALL = "fire_all"


class DstNonexistent(StrEnum):
    """A local time inside a spring-forward gap."""

    SKIP = "skip"
    SHIFT_FORWARD = "shift_forward"


class DstAmbiguous(StrEnum):
    """A local time inside a fall-back overlap, which happens twice."""

    FIRST = "first"
    LAST = "last"
    BOTH = "both"


class Backoff(StrEnum):
    EXPONENTIAL = "exponential"
    FIXED = "fixed"


class Priority(StrEnum):
    """A job's tier (JobSpec.priority): a worker calls waiting attempts of critical jobs
    before normal ones and normal before batch, and within a tier shares among tenants by
    weight (streams.fair_dispatch). A DAG's tasks take their job's. Avro's kron.Priority has
    the same symbols."""

    CRITICAL = "critical"
    NORMAL = "normal"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """0 for critical, 1 for normal, 2 for batch: the lower goes first."""
        return PRIORITY_RANK[self]


# By value, so a decoded record's plain string ranks as its member does (hash and equality
# are the string's): PRIORITY_RANK[spec["priority"]].
# Plain dicts typed read-only: a lookup in a mappingproxy costs a call more.
PRIORITY_RANK: Final[Mapping[str, int]] = {
    Priority.CRITICAL.value: 0, Priority.NORMAL.value: 1, Priority.BATCH.value: 2}
# The member of each value, for readers that hold plain strings (streams.engine.spec).
PRIORITIES: Final[Mapping[str, Priority]] = {p.value: p for p in Priority}


MAX_ATTEMPTS_LIMIT = 100
BASE_S_MIN = 0.01
BASE_S_MAX = 3600.0
MAX_S_LIMIT = 86400.0
LATE_BY_S_LIMIT = 366 * 86400.0
FIRE_ALL_CAP_LIMIT = 10_000


def _finite_in(value: object, lo: float, hi: float) -> bool:
    # bool is an int subclass; True as a delay is always a client bug.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and lo <= value <= hi


def _int_in(value: object, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


@functools.cache
def _values(enum: type[StrEnum]) -> tuple[str, ...]:
    # Iterating an enum class is slow (two checks of it were 2% of a create).
    return tuple(m.value for m in enum)


def _check_enum(value: object, enum: type[StrEnum], field: str) -> None:
    # Plain strings equal to a member are fine: StrEnum members compare equal to them.
    allowed = _values(enum)
    if not isinstance(value, str) or value not in allowed:
        raise InvalidPolicy(
            f"{field} must be one of: {', '.join(allowed)}; got {value!r}", field=field
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """How often and how fast a failed execution is retried.

    ``max_attempts`` counts every attempt including the first, so 1 means never retry.
    """

    max_attempts: int = 3
    backoff: Backoff = Backoff.EXPONENTIAL
    base_s: float = 1.0
    max_s: float = 300.0

    def validate(self) -> None:
        ma = self.max_attempts
        if not _int_in(ma, 1, MAX_ATTEMPTS_LIMIT):
            raise InvalidPolicy(
                f"retry.max_attempts must be an integer in 1..{MAX_ATTEMPTS_LIMIT}; got {ma!r}",
                field="retry.max_attempts",
            )
        _check_enum(self.backoff, Backoff, "retry.backoff")
        base = self.base_s
        if not _finite_in(base, BASE_S_MIN, BASE_S_MAX):
            raise InvalidPolicy(
                f"retry.base_s must be a finite number in {BASE_S_MIN}..{BASE_S_MAX}; got {base!r}",
                field="retry.base_s",
            )
        mx = self.max_s
        if not _finite_in(mx, base, MAX_S_LIMIT):
            raise InvalidPolicy(
                f"retry.max_s must be a finite number in base_s..{MAX_S_LIMIT} "
                f"(base_s={base!r}); got {mx!r}",
                field="retry.max_s",
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class MisfirePolicy:
    """How slots missed during an outage are handled once firing resumes.

    ``late_by_s`` is required exactly when ``kind`` is ``skip_if_late_by``; ``fire_all_cap``
    only matters for ``fire_all`` and bounds the burst a long outage can cause.
    """

    kind: MisfireKind = MisfireKind.FIRE_ONCE
    late_by_s: float | None = None
    fire_all_cap: int = 100

    def validate(self) -> None:
        _check_enum(self.kind, MisfireKind, "misfire.kind")
        late = self.late_by_s
        if self.kind == MisfireKind.SKIP_IF_LATE_BY:
            if not _finite_in(late, 0.0, LATE_BY_S_LIMIT):
                raise InvalidPolicy(
                    "misfire.late_by_s is required for skip_if_late_by and must be a finite "
                    f"number in 0..{LATE_BY_S_LIMIT:.0f}; got {late!r}",
                    field="misfire.late_by_s",
                )
        elif late is not None:
            raise InvalidPolicy(
                f"misfire.late_by_s only applies to skip_if_late_by, not {self.kind}",
                field="misfire.late_by_s",
            )
        cap = self.fire_all_cap
        if not _int_in(cap, 1, FIRE_ALL_CAP_LIMIT):
            raise InvalidPolicy(
                f"misfire.fire_all_cap must be an integer in 1..{FIRE_ALL_CAP_LIMIT}; got {cap!r}",
                field="misfire.fire_all_cap",
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class DstPolicy:
    """How cron local times that do not exist, or exist twice, map to instants."""

    nonexistent: DstNonexistent = DstNonexistent.SHIFT_FORWARD
    ambiguous: DstAmbiguous = DstAmbiguous.FIRST

    def validate(self) -> None:
        _check_enum(self.nonexistent, DstNonexistent, "dst.nonexistent")
        _check_enum(self.ambiguous, DstAmbiguous, "dst.ambiguous")
