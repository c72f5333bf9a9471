"""History retention: an execution leaves the hot path once its history window has passed.

When an event ends executions (a terminal write of any kind: succeeded, failed, cancelled,
skipped, missed; a DAG run's end), the core notes their ids (`note_saved`), and when the
event's writes are done it arms one EXPIRE timer per group of them, due the window after
the end (`flush`), grouped as lease timers are (one timer a few dozen executions, not one
each). When it falls due (`on_expire`) the partition's owner writes each one's tombstone
to kron.executions; the API's projection drops its views on the tombstone.

Why timers and not a periodic sweep: the time index is already ordered by due time, so
"everything that expires by now" is the same range scan as every other timer, and the
work is spread exactly as the executions ended. A sweep would need an index of the
executions by end time that does not exist, or a scan of the whole partition's history at
every pass. EXPIRE timers live in a lane of their own at the lowest tier
(streams.domain.timer.HOUSEKEEPING_LANE): a round of a tick decides them with what every
tenant's timers left over, so expiring history never delays a slot.

An execution is never tombstoned while anything may still read it:

- one that is not terminal (a rerun or a DAG run's retry started it again: its next end
  arms its own timer), and a DAG run with a task instance not terminal;
- before its window has passed since its *last* write (a later terminal write armed its
  own timer; an older one's timer looks again at the later time), nor before every lease
  timer of its attempts has fired (the lease timer of a slot's first attempt, finding no
  execution, would decide the slot again: PartitionCore._mend_lost_start). Those fire by
  the end plus the job's lease_s;
- the job's cursor slot's execution while the job still lists it in `running` (an `allow`
  job, and a one-off, keep a finished run there until the job is next written):
  PartitionCore._restart_lost_start starts the cursor slot again when it is listed running
  with no record. This timer first takes it off the list (a job write) and looks
  again SETTLE_MS later, by when that write is durable: the jobs and the executions
  changelogs are separate partitions, so a tombstone written in the same event could land
  without the job write;
- a DAG task instance on its own: task instances go with their run, after it (the run's
  tombstone first), so no run is left naming task instances that are gone.

The slot of a tombstoned execution is not run again: a job fires its slots from
`next_run_at`/`cursor_ms` in its own record, never by looking for missing executions
(except the torn-write repairs above, which the rules above keep away). A redelivered
EXPIRE timer finds no record and does nothing. A crash between an execution's terminal
write and its EXPIRE timer's (separate changelog partitions) can leave that execution
unexpired: a leak of history, never a loss.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Final, TypedDict

import orjson

from streams.domain.ids import exec_id, task_exec_id
from streams.domain.timer import HOUSEKEEPING_LANE, TimerKind, encode_timer_key
from streams.engine.records import ExecutionRecord, JobRecord
from streams.engine.runs import is_run
from streams.engine.store import TERMINAL, PartitionStore

if TYPE_CHECKING:
    from streams.engine.core import Context, PartitionCore

# Executions one EXPIRE timer lists at most: a tick decides timers 32 at a time
# (partition_driver.TICK_CHUNK), so a chunk tombstones ~2,000 records at most.
GROUP_MAX: Final = 64
# After the last lease of an execution's attempts is due (end + lease_s), this much more,
# for the tick that fires it.
LEASE_SLACK_MS: Final = 5_000
# How long after taking an execution off its job's `running` list the tombstone waits,
# so the job write is durable first (at most the window itself).
SETTLE_MS: Final = 600_000
DEFAULT_LEASE_S: Final = 60.0
EXPIRED_EVENT: Final = "job.history_expired"


class ExpireTimer(TypedDict):
    """The executions one event ended, to expire together."""

    x: list[str]


def note_saved(core: PartitionCore, ex: ExecutionRecord, ctx: Context) -> None:
    """After every execution write: one that ended is expired when its window has passed
    (a task instance goes with its run, so it is not noted)."""
    if core.history_ms and ex["state"] in TERMINAL and ex["run_id"] is None:
        ctx.ended.append(ex["exec_id"])


def flush(core: PartitionCore, ctx: Context) -> None:
    """Arm the EXPIRE timers of the executions this event ended (PartitionCore._flush_leases
    calls this before the event's fired timers are deleted)."""
    if not ctx.ended:
        return
    ids = list(dict.fromkeys(ctx.ended))  # an execution written twice in one event: once
    ctx.ended.clear()
    due = ctx.now_ms + core.history_ms
    for i in range(0, len(ids), GROUP_MAX):
        arm(core.store, due, ids[i:i + GROUP_MAX])


def arm(store: PartitionStore, due_ms: int, exec_ids: list[str]) -> None:
    value = orjson.dumps(ExpireTimer(x=exec_ids))
    # Named by content, as grouped lease timers are: a redelivered event that ended other
    # executions must not overwrite the timer its first delivery wrote.
    digest = hashlib.blake2b(value, digest_size=8).hexdigest()
    store.put_timer(encode_timer_key(due_ms=due_ms, kind=TimerKind.EXPIRE, job_id="",
                                     ref=digest, lane=HOUSEKEEPING_LANE), value)


def on_expire(core: PartitionCore, data: ExpireTimer, ctx: Context) -> None:
    """An EXPIRE timer fell due: tombstone each execution it lists that may go, and look
    again later at those that may not yet."""
    later: dict[int, list[str]] = {}
    for ex_id in data["x"]:
        again = _expire_one(core, ex_id, ctx)
        if again is not None:
            later.setdefault(again, []).append(ex_id)
    for due, ids in sorted(later.items()):
        arm(core.store, due, ids)


def _expire_one(core: PartitionCore, ex_id: str, ctx: Context) -> int | None:
    """Tombstone one execution if it may go; else when to look again (None: never, its
    record is gone or running again, and a later end arms its own timer)."""
    store = core.store
    ex = store.execution(ex_id)
    if ex is None or ex["state"] not in TERMINAL:
        return None
    job = store.job(ex["job_id"])
    keep_until = _keep_until(core.history_ms, ex, job)
    if ctx.now_ms < keep_until:
        return keep_until
    tasks = _task_instances(store, ex)
    if any(t["state"] not in TERMINAL for t in tasks):
        return ctx.now_ms + _settle_ms(core)  # a run's instance still live: not yet
    if job is not None and _restartable(job, ex_id):
        _release(core, job, ex_id, ctx)
        return ctx.now_ms + _settle_ms(core)
    store.delete_execution(ex_id)  # the run before its task instances
    for task in tasks:
        store.delete_execution(task["exec_id"])
    return None


def _keep_until(history_ms: int, ex: ExecutionRecord, job: JobRecord | None) -> int:
    """The earliest time the execution may go: its window after its last write, and not
    before every lease timer of its attempts has fired."""
    lease_s = DEFAULT_LEASE_S
    if job is not None:
        lease_s = float(job["spec"].get("lease_s") or DEFAULT_LEASE_S)
    leases_done = int(lease_s * 1000) + LEASE_SLACK_MS
    return ex["updated_at_ms"] + max(history_ms, leases_done)


def _settle_ms(core: PartitionCore) -> int:
    return max(1_000, min(SETTLE_MS, core.history_ms))


def _task_instances(store: PartitionStore, run: ExecutionRecord) -> list[ExecutionRecord]:
    """A DAG run's task instances that have records (none for any other execution)."""
    if not is_run(run) or run["dag"] is None:
        return []
    found = (store.execution(task_exec_id(run["exec_id"], t["task_id"]))
             for t in run["dag"]["tasks"])
    return [t for t in found if t is not None]


def _restartable(job: JobRecord, ex_id: str) -> bool:
    """The job's cursor slot's execution, listed running: what _restart_lost_start would
    start again if it had no record. (Any other listed id without a record is only pruned.)"""
    cursor = job["cursor_ms"]
    return (cursor is not None and ex_id in job["running"]
            and ex_id == exec_id(job["job_id"], cursor))


def _release(core: PartitionCore, job: JobRecord, ex_id: str, ctx: Context) -> None:
    """Take an ended execution off its job's `running` list (see the module's note)."""
    job["running"] = [e for e in job["running"] if e != ex_id]
    core._save_job(ctx, job, EXPIRED_EVENT)
