"""Pure helpers of the dashboard's read routes (api/ui/data.py): which jobs a search matches,
and a last hour's runs folded into minutes (executions and lateness per minute).

Nothing here reads the views or a request: the routes hand in what they read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kron.timefmt import iso

MINUTE_MS = 60_000

# A job's kinds: how it is scheduled and what it runs. The jobs page filters on either.
SCHEDULE_KINDS = ("cron", "once")
TARGET_KINDS = ("http", "kafka", "command", "dag")
KINDS = SCHEDULE_KINDS + TARGET_KINDS


def parse_label(text: str | None) -> tuple[str, str | None] | None:
    """A metadata label search: ``team=ops`` (that key with that value) or ``team`` (the
    key, any value). None for an empty search. Surrounding blanks are dropped."""
    if text is None or not text.strip():
        return None
    key, sep, value = text.strip().partition("=")
    return key.strip(), value.strip() if sep else None


def job_kinds(spec: Mapping[str, Any]) -> frozenset[str]:
    """A job's kinds from its definition (the request form the API shows): ``cron`` or
    ``once``, and ``dag`` or its target's type (``http``, ``kafka``, ``command``)."""
    out = {"cron" if isinstance(spec.get("schedule"), Mapping) else "once"}
    if spec.get("dag") is not None:
        out.add("dag")
    else:
        target = spec.get("target")
        if isinstance(target, Mapping) and isinstance(target.get("type"), str):
            out.add(target["type"])
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class JobSearch:
    """What the jobs page asks for; an empty field matches every job. Deleted jobs are
    never listed (as in GET /v1/jobs)."""

    name: str | None = None
    label: tuple[str, str | None] | None = None
    status: str | None = None
    kind: str | None = None

    @property
    def needs_definition(self) -> bool:
        """Whether the job's definition must be read (the index has its name and status)."""
        return self.label is not None or self.kind is not None

    def matches_index(self, entry: Mapping[str, Any]) -> bool:
        """The part of the search the tenant's job index (name, status) can answer."""
        status = entry.get("status")
        if status == "deleted" or (self.status and status != self.status):
            return False
        return not self.name or self.name.casefold() in str(entry.get("name", "")).casefold()

    def matches(self, spec: Mapping[str, Any]) -> bool:
        """The rest, on the job's definition: its metadata label and its kind."""
        if self.kind and self.kind not in job_kinds(spec):
            return False
        if self.label is not None:
            metadata = spec.get("metadata") or {}
            key, value = self.label
            if key not in metadata or (value is not None and metadata[key] != value):
                return False
        return True


@dataclass(frozen=True, slots=True)
class RunSample:
    """What the overview needs of one run."""

    scheduled_for_ms: int
    started_at_ms: int | None
    state: str
    lateness_ms: int | None


def percentile(values: list[int], q: float) -> int | None:
    """The nearest-rank q-th percentile (0 < q <= 100) of `values` (sorted here); None if
    there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least the first
    return ordered[int(rank) - 1]


def activity(samples: Iterable[RunSample], *, now_ms: int, minutes: int = 60
             ) -> list[dict[str, Any]]:
    """The last `minutes` whole and current minutes, oldest first: in each, the runs that
    started then (`executions`, their lateness p50, p95 and max), and the runs that ended
    without starting (missed, skipped, cancelled before a start) by their slot's minute."""
    last = now_ms // MINUTE_MS
    first = last - minutes + 1
    started: dict[int, list[int]] = {m: [] for m in range(first, last + 1)}
    counts = dict.fromkeys(range(first, last + 1), 0)
    unstarted: dict[int, dict[str, int]] = {m: {} for m in range(first, last + 1)}
    for s in samples:
        if s.started_at_ms is not None:
            minute = s.started_at_ms // MINUTE_MS
            if minute in counts:
                counts[minute] += 1
                if s.lateness_ms is not None:
                    started[minute].append(s.lateness_ms)
        else:
            minute = s.scheduled_for_ms // MINUTE_MS
            if minute in unstarted:
                unstarted[minute][s.state] = unstarted[minute].get(s.state, 0) + 1
    return [{"minute": iso(m * MINUTE_MS), "executions": counts[m],
             "lateness_ms": {"p50": percentile(started[m], 50),
                             "p95": percentile(started[m], 95),
                             "max": max(started[m]) if started[m] else None},
             "not_started": unstarted[m]}
            for m in range(first, last + 1)]
