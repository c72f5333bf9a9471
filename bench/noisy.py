"""`kron bench noisy`: a noisy neighbour (tenant A) against a small tenant (B), issue 39.

One stack, two phases, each with its own tenants (every job id, and so every timer lane,
is new in each phase):

- `alone`: tenant B's jobs only, measured first;
- `noisy`: the same B jobs of a fresh tenant, plus tenant A's flood.

The burst form (default): A has `a_jobs` one-offs due at the same second T; B has `b_jobs`
`critical` one-offs due at T and `b_jobs` `normal` ones due at T + 1 s. The `--steady`
form: A has `a_rate` per-second cron jobs and B `b_rate` (half of them `critical`, half
`normal`) for `seconds`, as `kron bench steady` creates them (start_at and end_at bound the
window). Every job is created as `CreateJobs` records of one tenant each, produced straight
to kron.commands before its first slot; the tenant is the record's envelope's, which is
how the worker assigns a job to its tenant's timer lane.

Every target is a loopback HTTP receiver: A's the stack's (a thread of the bench
process), B's one in a process of its own (bench.receiver.ReceiverProcess), as two teams'
endpoints are apart. A shared one measured itself: B's requests waited in its one loop
behind A's before their receive time was read (--steady, same worker code: B critical p99
115.8 ms shared, 67.9 ms apart). Lateness is the receive time minus the
call's X-Kron-Scheduled-For. `lost` and `duplicates` are counted at the receiver, by
Idempotency-Key (the execution id of each created slot, streams.domain.ids.exec_id),
against every slot created; replay.audit's own verdict over kron.jobs and kron.executions
is beside them (`audit_lost`, `audit_duplicates`, `audit`).

Where B's time goes, from outside the worker, per execution from its first
`execution.started` record in kron.executions: `tick_ms` is its envelope's occurred_at_ms
(the time of the tick that decided it) minus its slot, negative when decided ahead
(fire-ahead); `decided_ms` is the record's Kafka timestamp (when the worker's changelog
writer produced it; the topics keep CreateTime) minus its slot; `called_after_decided_ms`
is the receive time minus the later of that and the slot: the dispatch queue, the
dispatch barrier's ack and the HTTP call. `a_decided_before`: how many of A's slots due
in the second before each of B's slot, or with it, were decided before it in the same
partition (kron.executions offsets, the owner's own order), which the host's speed does
not change. `states`: what kron.executions says became of each slot created.
"""

from __future__ import annotations

import bisect
import hashlib
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import KafkaError

from bench.jobs import CommandSink, create_many_command, http_target, job_spec
from bench.procfs import CLK_TCK
from bench.progress import Bar
from bench.receiver import Hit, ReceiverProcess
from bench.report import Result, log, rate, summary
from bench.scenarios import (
    AUDIT_GRACE_MS,
    EVERY_SECOND,
    HTTP_CLOCK,
    Deliveries,
    common,
    next_second,
    now_ms,
    plot_stem,
    sleep_until,
    start_workers,
    wait_quiet,
    write_plots,
)
from bench.stack import History, Stack, main_thread_ticks
from schemas import codec, names
from streams.domain.ids import exec_id
from streams.engine.batch import group_by_partition

BATCH = 100  # jobs per CreateJobs record, as `timers --batch 100` measured them
# Creates applied per second assumed when T is chosen: 25,000/s batched on a quiet host
# (timers-batch), far less on a busy one; T that is too early is said in `setup.margin_ms`.
CREATE_PER_S = 3000.0
LEAD_MS = 5000  # and this much more, for the acks and the first tick
TARGETS = {"critical_p99_ms": 250.0, "normal_p99_ms": 1000.0, "steady_ratio": 2.0}
DECIDED = "execution.started"
# The workers log their "engine stats" line this often (KRON_STATS_EVERY_S, unless
# --worker-env sets it): the result keeps the noisy phase's, to see what the loop did when.
STATS_EVERY_S = "1"
STATS_KEYS = ("uptime_s", "ticks", "ticks_sent", "dispatched", "completed", "backlog", "held",
              "changelog_writes", "reports")


# --- what is created ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Group:
    """One kind of job of one tenant in one phase."""

    name: str  # "a", "critical" or "normal"
    tenant: str
    prefix: str  # names its jobs and its target's path, unique in the run
    jobs: int
    priority: str
    offset_ms: int = 0  # burst: due this long after T

    def ids(self) -> Iterator[str]:
        """Random-looking ids, as the API's are: timers due at the same ms are decided in
        job-id order where no lane sharing applies (fire-ahead), so ids that sort by
        tenant would put one tenant's ahead of the other's every time."""
        for i in range(self.jobs):
            name = f"{self.prefix}{i}"
            yield f"j_{hashlib.blake2b(name.encode(), digest_size=8).hexdigest()}_{name}"

    @property
    def path(self) -> str:
        """Its target's path: the receiver's calls are told apart by it."""
        return f"/{self.prefix.rstrip('-')}"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A phase's slots: one-offs at origin (+ each group's offset), or, with `seconds`,
    per-second cron jobs whose slots are origin, origin + 1 s, ... for `seconds`."""

    origin_ms: int
    seconds: int = 0

    def slots(self, g: Group) -> list[int]:
        if self.seconds:
            return [self.origin_ms + k * 1000 for k in range(self.seconds)]
        return [self.origin_ms + g.offset_ms]

    def end_ms(self, groups: Sequence[Group]) -> int:
        return max(max(self.slots(g)) for g in groups)

    def spec(self, g: Group, url: str) -> dict[str, Any]:
        target = http_target(f"{url}{g.path}")
        if self.seconds:
            spec = job_spec(target=target, cron=EVERY_SECOND, start_at_ms=self.origin_ms,
                            end_at_ms=self.origin_ms + self.seconds * 1000 - 1)
        else:
            spec = job_spec(target=target, run_at_ms=self.origin_ms + g.offset_ms)
        return {**spec, "priority": g.priority}


def burst_groups(phase: str, *, a_jobs: int, b_jobs: int) -> list[Group]:
    """B's critical at T and normal at T + 1 s; A's flood at T (none with a_jobs=0)."""
    p = phase[0]
    b = [Group(name="critical", tenant=f"{phase}-b", prefix=f"{p}bc-", jobs=b_jobs,
               priority="critical"),
         Group(name="normal", tenant=f"{phase}-b", prefix=f"{p}bn-", jobs=b_jobs,
               priority="normal", offset_ms=1000)]
    a = [Group(name="a", tenant=f"{phase}-a", prefix=f"{p}a-", jobs=a_jobs,
               priority="normal")] if a_jobs else []
    return a + b


def steady_groups(phase: str, *, a_rate: int, b_rate: int) -> list[Group]:
    """B's rate split between critical (the odd one) and normal; A's all normal."""
    p = phase[0]
    crit = (b_rate + 1) // 2
    b = [Group(name="critical", tenant=f"{phase}-b", prefix=f"{p}bc-", jobs=crit,
               priority="critical"),
         Group(name="normal", tenant=f"{phase}-b", prefix=f"{p}bn-", jobs=b_rate - crit,
               priority="normal")]
    a = [Group(name="a", tenant=f"{phase}-a", prefix=f"{p}a-", jobs=a_rate,
               priority="normal")] if a_rate else []
    return a + [g for g in b if g.jobs]


class TenantSink(CommandSink):
    """CreateJobs records under a tenant of the caller's choosing: the worker files a job
    under its command envelope's tenant (bench.jobs' own records are all tenant `bench`)."""

    def create_many_as(self, tenant: str, partition: int, jobs: list[dict[str, Any]]) -> None:
        command = create_many_command(jobs)
        command["envelope"]["tenant"] = tenant
        count = len(jobs)

        def delivered(err: KafkaError | None, msg: Any) -> None:
            self._delivered(err, msg, count)

        self._produce({"key": jobs[0]["job_id"].encode(),
                       "value": codec.encode_trusted(names.CREATE_JOBS, command),
                       "partition": partition, "on_delivery": delivered})


@dataclass(frozen=True, kw_only=True)
class Targets:
    """Where each group's calls go: A's to the stack's receiver, B's to B's own."""

    shared: Any  # bench.receiver.Receiver: .url, .hits
    own: ReceiverProcess

    def url(self, g: Group) -> str:
        return str((self.shared if g.name == "a" else self.own).url)

    def sources(self) -> tuple[Any, ...]:
        return self.shared, self.own


def create(stack: Stack, targets: Targets, groups: Sequence[Group],
           plan: Plan) -> dict[str, float]:
    """Every group's jobs as CreateJobs records, then until the worker applied them all
    (one JobState each in kron.jobs); seconds to the last ack and to the last apply."""
    base, total = stack.count("jobs"), sum(g.jobs for g in groups)
    sink = TenantSink(stack.settings)
    started = time.monotonic()
    try:
        with Bar("creating (acked by Kafka)", total, unit=" jobs") as bar:
            for g in groups:
                spec = plan.spec(g, targets.url(g))
                jobs = ({"job_id": j, "idempotency_key": None, "spec": spec} for j in g.ids())
                for partition, batch in group_by_partition(jobs, stack.partitions, size=BATCH):
                    sink.create_many_as(g.tenant, partition, batch)
                    bar.update(sink.acked)
            sink.flush()
            bar.update(sink.acked)
        acked = sink.last_ack - started
    finally:
        sink.close()
    timeout = max(60.0, (plan.origin_ms - now_ms()) / 1000 + 60)
    with Bar("applied by the worker", total, unit=" jobs") as bar:
        applied = stack.wait_count("jobs", base + total, timeout,
                                   on_count=lambda c: bar.update(min(total, c - base)))
    if applied is None:
        raise RuntimeError(f"the worker applied {stack.count('jobs') - base} of {total} "
                           f"creates within {timeout:.0f}s")
    return {"jobs": total, "acked_s": round(acked, 3), "applied_s": round(applied - started, 3),
            "applied_per_s": rate(total, applied - started)}


# --- one phase ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Snap:
    """The workers' CPU (since the stack's mark) and main-thread ticks at one moment."""

    at: float  # monotonic
    cpu_s: dict[str, float]
    other_cpu_s: dict[str, float]
    loop_ticks: dict[str, int]


def snap(stack: Stack) -> Snap:
    stack.sampler.sample()
    workers = stack.worker_names()
    ticks = {n: t for n in workers
             if (t := main_thread_ticks(stack.workers[n].pid)) is not None}
    return Snap(at=time.monotonic(), cpu_s=stack.sampler.cpu_s(workers),
                other_cpu_s=stack.sampler.cpu_s(["broker", "bench", "b-receiver"]),
                loop_ticks=ticks)


@dataclass(kw_only=True)
class Phase:
    """One phase's jobs and what the run found of them (filled in as it goes)."""

    name: str
    groups: list[Group]
    plan: Plan
    setup: dict[str, float] = field(default_factory=dict)
    seen: dict[str, Deliveries] = field(default_factory=dict)  # by group name
    drained: bool = False
    snaps: dict[str, Snap] = field(default_factory=dict)  # start, last_call, quiet
    upto: dict[int, int] = field(default_factory=dict)  # each receiver's calls filed so far


def fire_ahead_s(stack: Stack) -> float:
    return float(stack.worker_env.get("KRON_FIRE_AHEAD_S", stack.settings.fire_ahead_s))


def run_phase(stack: Stack, targets: Targets, phase: Phase) -> Phase:
    """Creates the phase's jobs, waits for its slots and drains its calls."""
    total = sum(g.jobs for g in phase.groups)
    log(f"{phase.name}: creating {total:,} jobs ("
        + ", ".join(f"{g.tenant} {g.name} {g.jobs:,}" for g in phase.groups)
        + f"), first slot {datetime.fromtimestamp(phase.plan.origin_ms / 1000, UTC):%T}")
    phase.setup = create(stack, targets, phase.groups, phase.plan)
    phase.setup["margin_ms"] = phase.plan.origin_ms - now_ms()
    log(f"{phase.name}: {total:,} jobs applied in {phase.setup['applied_s']} s "
        f"(acked in {phase.setup['acked_s']} s), {phase.setup['margin_ms']} ms before the "
        "first slot")
    if phase.setup["margin_ms"] < 500:
        log("[yellow]warning:[/yellow] the creates were applied late; the first slots may "
            "start late")
    # CPU counts from just before the workers may decide the first slot (fire-ahead).
    sleep_until(phase.plan.origin_ms - fire_ahead_s(stack) * 1000 - 500, stack)
    phase.snaps["start"] = snap(stack)
    sleep_until(phase.plan.end_ms(phase.groups), stack)
    phase.drained = drain_groups(targets, phase)
    phase.snaps["last_call"] = snap(stack)
    wait_quiet(stack, quiet_s=1.0, timeout_s=60.0)  # the last results, applied
    phase.snaps["quiet"] = snap(stack)
    return phase


def collect(sources: Sequence[Any], phase: Phase) -> int:
    """Files the receivers' new calls under their groups (by path, as Deliveries.update
    does by job-id prefix); the phase's executions seen so far."""
    by_path = {g.path: phase.seen[g.name] for g in phase.groups}
    for i, source in enumerate(sources):
        hits: list[Hit] = source.hits
        end = len(hits)
        for h in hits[phase.upto.get(i, 0):end]:
            seen = by_path.get(h.path)
            if seen is None:
                continue
            seen.per_attempt[(h.key, h.attempt)] += 1
            seen.deliveries[h.key] += 1
            if h.key not in seen.first or h.recv_ms < seen.first[h.key].recv_ms:
                seen.first[h.key] = h
        phase.upto[i] = end
    return sum(len(s.first) for s in phase.seen.values())


def drain_groups(targets: Targets, phase: Phase, quiet_s: float = 8.0) -> bool:
    """Until the receiver saw every slot of the phase; False if it gave up: at a timeout,
    or when no new call came for `quiet_s`."""
    phase.seen = {g.name: Deliveries() for g in phase.groups}
    expected = sum(g.jobs * len(phase.plan.slots(g)) for g in phase.groups)
    deadline = time.monotonic() + 60 + expected / 50
    count, since = -1, time.monotonic()
    with Bar(f"{phase.name}: calls", expected, unit=" calls") as bar:
        while time.monotonic() < deadline:
            n = collect(targets.sources(), phase)
            bar.update(n)
            if n >= expected:
                return True
            if n != count:
                count, since = n, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
            time.sleep(0.1)
    log(f"[yellow]warning:[/yellow] {phase.name}: the receivers saw {count:,} of "
        f"{expected:,} calls")
    return False


# --- figures ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Decision:
    """An execution's first `execution.started` record in kron.executions."""

    at_ms: int  # its Kafka timestamp: when the worker's changelog writer produced it
    tick_ms: int  # its envelope's occurred_at_ms: the time of the tick that decided it
    partition: int
    offset: int
    slot_ms: int  # the slot it is for


def group_figures(g: Group, seen: Deliveries, plan: Plan,
                  decided: dict[str, Decision]) -> dict[str, Any]:
    """A group's lateness and, against every slot created, what the receiver lost or got
    twice (by Idempotency-Key)."""
    expected = {exec_id(j, s) for j in g.ids() for s in plan.slots(g)}
    got = set(seen.deliveries)
    hits = list(seen.first.values())
    last = max((h.recv_ms for h in hits), default=None)
    out: dict[str, Any] = {
        "tenant": g.tenant, "priority": g.priority, "jobs": g.jobs, "expected": len(expected),
        "executions": len(hits),
        "lateness_ms": summary(h.recv_ms - h.scheduled_ms for h in hits),
        "time_to_last_ms": None if last is None else round(last - plan.origin_ms, 1),
        "lost": len(expected - got), "unexpected": len(got - expected),
        "duplicates": seen.redeliveries, "target_duplicates": seen.target_duplicates,
    }
    if out["time_to_last_ms"]:
        out["executions_per_s"] = rate(len(hits), out["time_to_last_ms"] / 1000)
    out["worst_slots"] = worst_slots(hits, plan)
    out.update(breakdown(hits, decided))
    return out


def worst_slots(hits: Sequence[Hit], plan: Plan, top: int = 3) -> list[dict[str, Any]]:
    """The slots (seconds since the first) whose calls were latest, with how many of the
    slot's calls were over 20 ms: a p99 over 60 slots is made of one or two of them."""
    by_slot: dict[int, list[float]] = {}
    for h in hits:
        by_slot.setdefault(h.scheduled_ms, []).append(h.recv_ms - h.scheduled_ms)
    worst = sorted(by_slot.items(), key=lambda kv: max(kv[1]), reverse=True)[:top]
    return [{"slot_s": round((slot - plan.origin_ms) / 1000, 3),
             "max_ms": round(max(late), 1), "over_20_ms": sum(v > 20 for v in late),
             "calls": len(late)} for slot, late in worst]


def breakdown(hits: Sequence[Any], decided: dict[str, Decision]) -> dict[str, Any]:
    """Against the slot: the tick that decided it and when its decision was produced; and
    the call against the later of that production and the slot."""
    pairs = [(h, decided[h.key]) for h in hits if h.key in decided]
    return {"tick_ms": summary(d.tick_ms - h.scheduled_ms for h, d in pairs),
            "first_tick_ms": min((d.tick_ms - h.scheduled_ms for h, d in pairs), default=None),
            "decided_ms": summary(d.at_ms - h.scheduled_ms for h, d in pairs),
            "first_decided_ms": min((d.at_ms - h.scheduled_ms for h, d in pairs),
                                    default=None),
            "called_after_decided_ms": summary(h.recv_ms - max(d.at_ms, h.scheduled_ms)
                                               for h, d in pairs)}


def decisions(history: History) -> dict[str, Decision]:
    """exec_id -> its first attempt's execution.started record."""
    out: dict[str, Decision] = {}
    for e in history.executions:
        rec = e.record
        if (rec is not None and rec["attempt"] == 1 and rec["task_id"] is None
                and rec["envelope"]["event_type"] == DECIDED and rec["exec_id"] not in out):
            out[rec["exec_id"]] = Decision(
                at_ms=e.timestamp_ms, tick_ms=rec["envelope"]["occurred_at_ms"],
                partition=e.partition, offset=e.offset, slot_ms=rec["scheduled_for_ms"])
    return out


BEHIND_MS = 1000  # A's slots due this long before B's slot, or with it, are counted


def decided_behind(b: Deliveries, a: Deliveries, decided: dict[str, Decision]
                   ) -> dict[str, Any]:
    """For each of B's executions, how many of A's slots due in [its slot - 1 s, its slot]
    were decided before it in the same partition (kron.executions offsets: the owner's
    exact order). A fair round decides B's among its first whatever A holds, and the
    host's speed does not change the count. (Every slot is a whole second here.)"""
    a_offsets: dict[tuple[int, int], list[int]] = {}
    for key in a.first:
        if (d := decided.get(key)) is not None:
            a_offsets.setdefault((d.partition, d.slot_ms), []).append(d.offset)
    for offsets in a_offsets.values():
        offsets.sort()
    ranks = [sum(bisect.bisect_left(a_offsets.get((d.partition, slot), []), d.offset)
                 for slot in range(d.slot_ms - BEHIND_MS, d.slot_ms + 1, BEHIND_MS))
             for key in b.first if (d := decided.get(key)) is not None]
    return {"a_decided_before": summary(ranks)}


def states(g: Group, plan: Plan, latest: dict[str, dict[str, Any]]) -> dict[str, int]:
    """What kron.executions says became of each slot created (`unrecorded`: nothing)."""
    out: Counter[str] = Counter()
    for j in g.ids():
        for slot in plan.slots(g):
            rec = latest.get(exec_id(j, slot))
            out[rec["state"] if rec is not None else "unrecorded"] += 1
    return dict(out)


def phase_figures(phase: Phase) -> dict[str, Any]:
    """The phase's window (first slot to last call), rate and CPU per execution."""
    start, last, quiet = (phase.snaps[k] for k in ("start", "last_call", "quiet"))
    executions = sum(len(s.first) for s in phase.seen.values())
    calls = [h.recv_ms for s in phase.seen.values() for h in s.first.values()]
    window_s = max(0.001, (max(calls, default=phase.plan.origin_ms) - phase.plan.origin_ms)
                   / 1000)
    worker = sum(quiet.cpu_s.values()) - sum(start.cpu_s.values())
    other = {n: round(v - start.other_cpu_s.get(n, 0.0), 2)
             for n, v in quiet.other_cpu_s.items()}
    span = last.at - start.at
    busy = {n: round((t - start.loop_ticks[n]) / CLK_TCK / span, 2)
            for n, t in last.loop_ticks.items() if n in start.loop_ticks and span > 0}
    return {
        "executions": executions, "window_s": round(window_s, 3),
        "executions_per_s": rate(executions, window_s), "drained": phase.drained,
        "worker_cpu_s": round(worker, 2),
        "worker_cpu_us_per_execution": round(worker * 1e6 / executions, 1) if executions
        else None,
        "other_cpu_s": other, "loop_busy": busy,
        "setup": phase.setup, "origin_ms": phase.plan.origin_ms,
    }


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return round(num / den, 2)


def ratios(noisy: dict[str, Any], alone: dict[str, Any]) -> dict[str, Any]:
    """B's lateness with A over B's alone, per tier and percentile: the host's speed
    cancels out (mostly)."""
    return {f"{tier}_{q}": ratio(noisy[tier]["lateness_ms"][q], alone[tier]["lateness_ms"][q])
            for tier in ("critical", "normal") if tier in noisy and tier in alone
            for q in ("p50", "p99", "max")}


def verdict(mode: str, b: dict[str, Any], rat: dict[str, Any], a: dict[str, Any] | None,
            lost: int, dups: int) -> dict[str, Any]:
    """The issue's targets, each with its verdict."""
    out: dict[str, Any] = {}
    if mode == "burst":
        out["critical_p99_ms"] = _le(b["critical"]["lateness_ms"]["p99"],
                                     TARGETS["critical_p99_ms"])
        out["normal_p99_ms"] = _le(b["normal"]["lateness_ms"]["p99"], TARGETS["normal_p99_ms"])
    else:
        for tier in ("critical", "normal"):
            if f"{tier}_p99" in rat:
                out[f"{tier}_p99_ratio"] = _le(rat[f"{tier}_p99"], TARGETS["steady_ratio"])
    out["a_completed"] = a is not None and a["lost"] == 0 and a["executions"] == a["expected"]
    out["no_loss"] = lost == 0 and dups == 0
    out["met"] = all(v if isinstance(v, bool) else v["met"] for v in out.values())
    return out


def _le(value: float | None, limit: float) -> dict[str, Any]:
    return {"value": value, "limit": limit, "met": value is not None and value <= limit}


# --- the scenario -------------------------------------------------------------------------


def plan_for(groups: Sequence[Group], seconds: int) -> Plan:
    """The first slot far enough ahead for the creates to be applied before it."""
    jobs = sum(g.jobs for g in groups)
    return Plan(origin_ms=next_second(now_ms() + LEAD_MS + jobs / CREATE_PER_S * 1000),
                seconds=seconds)


def phases(steady: bool, *, a: int, b: int, seconds: int) -> tuple[list[Group], list[Group]]:
    """(alone's groups, noisy's groups)."""
    if steady:
        return (steady_groups("alone", a_rate=0, b_rate=b),
                steady_groups("noisy", a_rate=a, b_rate=b))
    return (burst_groups("alone", a_jobs=0, b_jobs=b),
            burst_groups("noisy", a_jobs=a, b_jobs=b))


def worker_stats(stack: Stack, since_s: float, until_s: float) -> dict[str, list[Any]]:
    """Each worker's "engine stats" lines logged in [since_s, until_s] (wall clock), as
    (seconds since since_s, the STATS_KEYS figures); the noisy phase's start 10 s before
    its first slot."""
    out: dict[str, list[Any]] = {}
    for name, proc in stack.workers.items():
        rows = []
        for line in proc.log().splitlines():
            if '"engine stats"' not in line:
                continue
            rec = orjson.loads(line)
            # kron.logs writes local time, whole seconds.
            at = time.mktime(time.strptime(rec["ts"], "%Y-%m-%dT%H:%M:%S"))
            if since_s <= at <= until_s:
                rows.append([round(at - since_s), *(rec.get(k) for k in STATS_KEYS)])
        out[name] = rows
    return out


def noisy(*, a_jobs: int, b_jobs: int, steady: bool, seconds: int, a_rate: int, b_rate: int,
          workers: int, partitions: int, plot_dir: Path | None = None, label: str | None = None,
          worker_env: dict[str, str] | None = None, broker_warmup_s: float = 0.0) -> Result:
    """B alone, then B beside A's flood (burst) or A's steady load (`steady`)."""
    window = seconds if steady else 0
    alone_groups, noisy_groups = phases(steady, a=a_rate if steady else a_jobs,
                                        b=b_rate if steady else b_jobs, seconds=window)
    env = {"KRON_STATS_EVERY_S": STATS_EVERY_S, **(worker_env or {})}
    with Stack(partitions=partitions, worker_env=env,
               broker_warmup_s=broker_warmup_s) as stack, ReceiverProcess() as own:
        stack.sampler.track("b-receiver", own.pid)
        targets = Targets(shared=stack.receiver, own=own)
        start_workers(stack, workers)
        stack.mark()
        done = []
        for name, groups in (("alone", alone_groups), ("noisy", noisy_groups)):
            phase = Phase(name=name, groups=groups, plan=plan_for(groups, window))
            done.append(run_phase(stack, targets, phase))
        stack.mark_end()
        ended_s = time.time()
        time.sleep(1.5)  # the last changelog writes reach Kafka after the calls they caused
        history = stack.history(grace_ms=AUDIT_GRACE_MS)
        result = assemble(stack, done[0], done[1], history, steady=steady)
        result["worker_stats"] = {
            "every_s": float(env["KRON_STATS_EVERY_S"]), "columns": ["t_s", *STATS_KEYS],
            "rows": worker_stats(stack, done[1].plan.origin_ms / 1000 - 10, ended_s)}
        result["plots"] = plots(plot_dir, label, done[1], steady=steady)
        return result


def tiers(phase: Phase, decided: dict[str, Decision],
          latest: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {g.name: {**group_figures(g, phase.seen[g.name], phase.plan, decided),
                    "states": states(g, phase.plan, latest)}
           for g in phase.groups}
    if "a" in phase.seen:
        for name in ("critical", "normal"):
            out[name].update(decided_behind(phase.seen[name], phase.seen["a"], decided))
    return out


def assemble(stack: Stack, alone: Phase, noisy: Phase, history: History, *,
             steady: bool) -> Result:
    decided, latest = decisions(history), history.latest()
    lone, loud = tiers(alone, decided, latest), tiers(noisy, decided, latest)
    a = loud.pop("a", None)
    groups = [*lone.values(), *loud.values(), *([a] if a else [])]
    lost = sum(g["lost"] for g in groups)
    dups = sum(g["duplicates"] for g in groups)
    rat = ratios(loud, lone)
    mode = "steady" if steady else "burst"
    figures = phase_figures(noisy)
    seen = Deliveries()
    for s in noisy.seen.values():
        seen.per_attempt.update(s.per_attempt)
    result = common(stack, "noisy", executions=figures["executions"],
                    duration_s=figures["window_s"],
                    lateness=[h.recv_ms - h.scheduled_ms
                              for h in noisy.seen["critical"].first.values()],
                    history=history, seen=seen)
    result.update({
        "mode": mode, "tenant_a": a, "tenant_b": loud, "alone": lone, "ratios": rat,
        "lost": lost, "duplicates": dups,
        "target_duplicates": sum(g["target_duplicates"] for g in groups),
        "unexpected": sum(g["unexpected"] for g in groups),
        "audit_lost": history.lost, "audit_duplicates": history.duplicates,
        "phases": {"alone": phase_figures(alone), "noisy": figures},
        "targets": verdict(mode, loud, rat, a, lost + history.lost, dups + history.duplicates),
        "seconds": noisy.plan.seconds, "lateness_clock": HTTP_CLOCK,
        "fire_ahead_s": fire_ahead_s(stack),
    })
    return result


def plots(plot_dir: Path | None, label: str | None, phase: Phase, *,
          steady: bool) -> list[str] | None:
    """B's lateness beside A (both tiers), and every call of the noisy phase per second."""
    b_hits = [h for n in ("critical", "normal") for h in phase.seen[n].first.values()]
    every = [h for s in phase.seen.values() for h in s.first.values()]
    return write_plots(
        plot_dir, stem=plot_stem("noisy", label),
        title=f"tenant B beside tenant A ({'steady' if steady else 'burst'})",
        values_ms=[h.recv_ms - h.scheduled_ms for h in b_hits],
        times_s=[(h.recv_ms - phase.plan.origin_ms) / 1000 for h in every],
        hist_label="tenant B's lateness beside A (ms, log scale)", counted="B's calls",
        rate_label="calls/s, A and B (by receive time, 1 s buckets)",
        time_label="seconds since T" if not steady else "seconds since the window start")
