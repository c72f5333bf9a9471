"""The query side: a projector folds kron.jobs, kron.executions and kron.dead-letters into
rocksdict views.

Views (one rocksdict, prefixes keep them apart, values are JSON):
  j/<job_id>                         job status and definition
  t/<tenant>/<job_id>                the tenant's job index (cursor pagination by job_id)
  r/<job_id>/<inverted ms>/<exec_id> run history, newest scheduled_for first: runs only (a
                                     DAG run is one run; its task instances are not runs)
  e/<exec_id>                        one execution with its attempts (runs and task instances)
  k/<run_id>/<task_id>               a DAG run's task instances: exec id, state, first start
  c/<tenant>/<state>                 runs per state (/v1/stats): plain runs and DAG runs
  ct/<tenant>/<state>                task instances per state, apart, so a DAG run of many
                                     tasks counts once among the runs
  a/<tenant>                         the tenant's active and paused jobs (for its quota)
  x/<tenant>/<inverted ms>/<exec_id> the tenant's runs across its jobs (deleted ones too),
                                     newest scheduled_for first (GET /v1/runs)
  xs/<tenant>/<state>/<inv ms>/<id>  the same, per state: a run moves when its state does
  m/runs-index                       x/ and xs/ were filled from e/ for a store kept from
                                     before they existed (Views._index_runs)
  dl/<tenant>/..., dx/<id>           kron.dead-letters: the tenant's dead letters and alerts
                                     (api/dead_letters.py)
  o/<topic>/<partition>              the next offset to read: the projector's own offsets

Each record's view changes and its offset go into one write batch, so a restart resumes
exactly where the views stopped. Rebuilding from offset 0 yields the same views.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from rocksdict import Options, Rdict, WriteBatch

from api.dead_letters import apply_dead_letter
from kron.kafka_security import confluent_config
from kron.settings import Settings
from schemas import codec
from schemas.errors import DecodeError
from schemas.jsonable import jsonable
from streams.domain.fencing import EpochFence, epoch_of_headers
from streams.domain.states import ExecutionStatus, JobStatus, Trigger

log = logging.getLogger("kron.projection")

INVERT = (1 << 63) - 1
ACTIVE_JOB = JobStatus.LIVE


def _k(*parts: str) -> bytes:
    return "/".join(parts).encode()


def run_key(job_id: str, scheduled_for_ms: int, exec_id: str) -> bytes:
    return _k("r", job_id, f"{INVERT - scheduled_for_ms:019d}", exec_id)


def tenant_runs_prefix(tenant: str, state: str | None = None) -> bytes:
    """The keys of the tenant's runs (x/), or of those in `state` (xs/); each key ends
    with `<inverted ms>/<exec_id>`, the cursor of GET /v1/runs, the same in both."""
    return _k("x", tenant, "") if state is None else _k("xs", tenant, state, "")


def tenant_run_suffix(scheduled_for_ms: int, exec_id: str) -> bytes:
    return _k(f"{INVERT - scheduled_for_ms:019d}", exec_id)


def task_prefix(run_id: str) -> bytes:
    """The keys of a DAG run's task instances (``k/<run_id>/<task_id>``)."""
    return _k("k", run_id, "")


def task_key(run_id: str, task_id: str) -> bytes:
    return task_prefix(run_id) + task_id.encode()


class Views:
    """Reads and writes the view store. Writers use a batch; readers use plain gets."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = Rdict(str(path), Options(raw_mode=True))
        self._index_runs()

    def _index_runs(self) -> None:
        """Fill the tenants' run indexes (x/, xs/) from the executions (e/) once, for a
        store kept from before they existed: the projector only adds runs as their
        records come, and it resumes from its offsets. A fresh store has nothing to fill."""
        if self.db.get(RUNS_INDEXED) is not None:
            return
        batch = Batch(self)
        for _, ex in self.prefix(b"e/"):
            if ex.get("run_id") is None:
                _index_tenant_run(batch, ex["tenant"], ex, None)
        batch.put(RUNS_INDEXED, 1)
        batch.commit()

    def close(self) -> None:
        self.db.close()

    def get(self, key: bytes) -> Any:
        raw = self.db.get(key)
        return None if raw is None else orjson.loads(raw)

    def prefix(self, prefix: bytes, *, start: bytes | None = None) -> Iterator[tuple[bytes, Any]]:
        it = self.db.iter()
        it.seek(start or prefix)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(prefix):
                return
            yield key, orjson.loads(bytes(it.value()))
            it.next()

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self.get(_k("j", job_id))  # type: ignore[no-any-return]

    def execution(self, exec_id: str) -> dict[str, Any] | None:
        return self.get(_k("e", exec_id))  # type: ignore[no-any-return]

    def task_instances(self, run_id: str) -> dict[str, dict[str, Any]]:
        """A DAG run's task instances by task id: each one's index entry (exec_id, state,
        started_at_ms). Tasks that never ran have none."""
        prefix = task_prefix(run_id)
        return {key[len(prefix):].decode(): entry for key, entry in self.prefix(prefix)}

    def job_state(self, job_id: str) -> dict[str, Any] | None:
        """The job's last JobState record, decoded from the Avro bytes the engine wrote."""
        raw = self.db.get(_k("s", job_id))
        return None if raw is None else codec.decode(bytes(raw)).record

    def offsets(self) -> dict[tuple[str, int], int]:
        out = {}
        for key, value in self.prefix(b"o/"):
            _, topic, partition = key.decode().rsplit("/", 2)
            out[(topic, int(partition))] = int(value)
        return out

    def dump(self) -> dict[bytes, bytes]:
        """Every view entry but the offsets and the store's markers (m/): what a rebuild
        must reproduce."""
        it = self.db.iter()
        it.seek_to_first()
        out = {}
        while it.valid():
            key = bytes(it.key())
            if not key.startswith((b"o/", b"m/")):
                out[key] = bytes(it.value())
            it.next()
        return out


class Batch:
    """Writes of one record, read-through so a record sees its own earlier writes."""

    def __init__(self, views: Views) -> None:
        self.views = views
        self.wb = WriteBatch(raw_mode=True)
        self.pending: dict[bytes, bytes | None] = {}

    def get(self, key: bytes) -> Any:
        if key in self.pending:
            raw = self.pending[key]
            return None if raw is None else orjson.loads(raw)
        return self.views.get(key)

    def put(self, key: bytes, value: Any) -> None:
        raw = orjson.dumps(value)
        self.pending[key] = raw
        self.wb.put(key, raw)

    def put_raw(self, key: bytes, raw: bytes) -> None:
        self.wb.put(key, raw)

    def delete(self, key: bytes) -> None:
        self.pending[key] = None
        self.wb.delete(key)

    def commit(self) -> None:
        self.views.db.write(self.wb)


# Marks a store whose tenant run indexes cover every run (see Views._index_runs).
RUNS_INDEXED = b"m/runs-index"


# Bump when request_of or spec_fingerprint changes what they return: views kept from before
# are then rendered again at their job's next record instead of kept (see apply_job).
VIEW_FORMAT = 3  # 2: request_of renders `dag` and `priority`; 3: `notify`


def apply_job(batch: Batch, rec: dict[str, Any], raw: bytes) -> None:
    from api.models import request_of, spec_fingerprint

    tenant = rec["envelope"]["tenant"]
    job_id = rec["job_id"]
    old = batch.get(_k("j", job_id)) or {}
    # A job's spec changes only with its version, so its firings (most of these records)
    # keep the view's spec and fingerprint: they were a fifth of this thread's time, which
    # the request handlers wait for (the GIL).
    same = ("spec" in old and old.get("version") == rec["version"]
            and old.get("created_at_ms") == rec["created_at_ms"]
            and old.get("view_format") == VIEW_FORMAT)
    spec = old["spec"] if same else jsonable(request_of(rec["spec"]))
    fingerprint = old.get("fingerprint") if same else None
    if fingerprint is None and rec["idempotency_key"]:
        # Only a create retried with its key compares fingerprints; api/routes/jobs.py
        # _replayed computes one on demand for the rest.
        fingerprint = spec_fingerprint(rec["spec"])
    view = {
        "job_id": job_id, "tenant": tenant, "version": rec["version"],
        "status": rec["status"], "spec": spec, "fingerprint": fingerprint,
        "view_format": VIEW_FORMAT,
        "created_at_ms": rec["created_at_ms"], "updated_at_ms": rec["updated_at_ms"],
        "next_run_at_ms": rec["next_run_at_ms"], "cursor_ms": rec["cursor_ms"],
        "idempotency_key": rec["idempotency_key"],
        "applied_command_ids": rec["applied_command_ids"],
        "last_run": old.get("last_run"),
    }
    batch.put(_k("j", job_id), view)
    was, now = old.get("status") in ACTIVE_JOB, rec["status"] in ACTIVE_JOB
    if was != now:  # the quota check reads this instead of scanning the tenant's jobs
        key = _k("a", tenant)
        batch.put(key, (batch.get(key) or 0) + (1 if now else -1))
    # The Avro state as written, for updates that patch the exact stored spec.
    batch.put_raw(_k("s", job_id), raw)
    batch.put(_k("t", tenant, job_id), {"status": view["status"],
                                         "name": rec["spec"]["name"]})


def apply_execution(batch: Batch, rec: dict[str, Any], raw: bytes) -> None:
    tenant = rec["envelope"]["tenant"]
    exec_id = rec["exec_id"]
    old = batch.get(_k("e", exec_id))
    view = jsonable({k: v for k, v in rec.items() if k != "envelope"})
    view["tenant"] = tenant
    view["event_type"] = rec["envelope"]["event_type"]
    started = [a["started_at_ms"] for a in rec["attempts"]]
    view["started_at_ms"] = started[0] if started else None
    view["finished_at_ms"] = (rec["attempts"][-1]["finished_at_ms"]
                              if rec["state"] in ExecutionStatus.RAN
                              and rec["attempts"] else None)
    view["lateness_ms"] = (view["started_at_ms"] - rec["scheduled_for_ms"]
                           if started else None)
    if rec.get("run_id") is not None:
        _apply_task_instance(batch, rec, view, old)
        return
    if rec.get("dag") is not None:
        _dag_run_times(batch, rec, view, old)
    batch.put(_k("e", exec_id), view)
    batch.put(run_key(rec["job_id"], rec["scheduled_for_ms"], exec_id), {"state": rec["state"]})
    _index_tenant_run(batch, tenant, view, old)
    _recount(batch, "c", tenant, old, rec["state"])
    job = batch.get(_k("j", rec["job_id"]))
    if job is not None and rec["trigger"] != Trigger.BACKFILL:
        last = job.get("last_run")
        if last is None or last["scheduled_for_ms"] <= rec["scheduled_for_ms"]:
            job["last_run"] = {"exec_id": exec_id, "state": rec["state"],
                               "scheduled_for_ms": rec["scheduled_for_ms"]}
            batch.put(_k("j", rec["job_id"]), job)


def _index_tenant_run(batch: Batch, tenant: str, view: dict[str, Any],
                      old: dict[str, Any] | None) -> None:
    """The run in its tenant's indexes: x/ (all states; its key never moves, so a cursor
    stays valid) and xs/<state> (moved when its state changes). Kept when its job is
    deleted: a deleted job's runs stay readable."""
    suffix = tenant_run_suffix(view["scheduled_for_ms"], view["exec_id"])
    entry = {"job_id": view["job_id"], "state": view["state"]}
    batch.put(tenant_runs_prefix(tenant) + suffix, entry)
    if old is not None and old["state"] != view["state"]:
        batch.delete(tenant_runs_prefix(tenant, old["state"]) + suffix)
    batch.put(tenant_runs_prefix(tenant, view["state"]) + suffix, entry)


def forget_execution(batch: Batch, exec_id: str) -> None:
    """An execution's tombstone (its history window passed, streams.engine.retention):
    every view of it goes, and the per-state counts drop it. Its job's `last_run` summary
    forgets it too, so nothing links to a run that is gone."""
    old = batch.get(_k("e", exec_id))
    if old is None:
        return
    batch.delete(_k("e", exec_id))
    tenant, state = old["tenant"], old["state"]
    if old.get("run_id") is not None:
        batch.delete(task_key(old["run_id"], old["task_id"]))
        _count(batch, "ct", tenant, state, -1)
        return
    batch.delete(run_key(old["job_id"], old["scheduled_for_ms"], exec_id))
    suffix = tenant_run_suffix(old["scheduled_for_ms"], exec_id)
    batch.delete(tenant_runs_prefix(tenant) + suffix)  # GET /v1/runs lists it no more
    batch.delete(tenant_runs_prefix(tenant, state) + suffix)
    _count(batch, "c", tenant, state, -1)
    job = batch.get(_k("j", old["job_id"]))
    if job is not None and (job.get("last_run") or {}).get("exec_id") == exec_id:
        job["last_run"] = None
        batch.put(_k("j", old["job_id"]), job)


def _dag_run_times(batch: Batch, rec: dict[str, Any], view: dict[str, Any],
                   old: dict[str, Any] | None) -> None:
    """A DAG run has no attempts of its own: it started when its first task attempt did
    (kept up by its task instances' records, see _apply_task_instance), and finished when
    it ended."""
    if old is not None and old.get("dag") is not None:
        first = old["started_at_ms"]
    else:  # its first record (a run record normally comes before its task instances')
        first = _first_start(batch, rec["exec_id"], {})
    _set_start(view, first)
    view["finished_at_ms"] = (rec["updated_at_ms"] if rec["state"] in ExecutionStatus.RAN
                              else None)


def _apply_task_instance(batch: Batch, rec: dict[str, Any], view: dict[str, Any],
                         old: dict[str, Any] | None) -> None:
    """A DAG task instance: its own view, an entry under its run, counted apart from runs.
    Not in its job's run history, not its job's last run."""
    run_id, exec_id = rec["run_id"], rec["exec_id"]
    batch.put(_k("e", exec_id), view)
    entry = {"exec_id": exec_id, "state": rec["state"], "started_at_ms": view["started_at_ms"]}
    batch.put(task_key(run_id, rec["task_id"]), entry)
    _recount(batch, "ct", rec["envelope"]["tenant"], old, rec["state"])
    run = batch.get(_k("e", run_id))
    if run is None or run.get("dag") is None:
        return
    now, was = view["started_at_ms"], (old or {}).get("started_at_ms")
    first = run["started_at_ms"]
    if now is not None and (first is None or now < first):
        first = now
    elif was is not None and was == first and now != was:
        # This instance held the run's first start and its start moved (a report's own
        # start time replaced the dispatch's): the first start is the earliest again.
        first = _first_start(batch, run_id, {rec["task_id"]: entry})
    if first != run["started_at_ms"]:
        _set_start(run, first)
        batch.put(_k("e", run_id), run)


def _first_start(batch: Batch, run_id: str, changed: dict[str, dict[str, Any]]) -> int | None:
    """The earliest first-attempt start of the run's task instances (`changed`: this
    record's entries, not committed yet)."""
    entries = {**batch.views.task_instances(run_id), **changed}
    starts = [e["started_at_ms"] for e in entries.values() if e["started_at_ms"] is not None]
    return min(starts) if starts else None


def _set_start(view: dict[str, Any], started_at_ms: int | None) -> None:
    view["started_at_ms"] = started_at_ms
    view["lateness_ms"] = (None if started_at_ms is None
                           else started_at_ms - view["scheduled_for_ms"])


def _recount(batch: Batch, kind: str, tenant: str, old: dict[str, Any] | None,
             state: str) -> None:
    """Moves an execution between the per-state counts `kind` (c: runs, ct: task instances)."""
    old_state = old["state"] if old else None
    if old_state != state:
        if old_state is not None:
            _count(batch, kind, tenant, old_state, -1)
        _count(batch, kind, tenant, state, +1)


def _count(batch: Batch, kind: str, tenant: str, state: str, delta: int) -> None:
    key = _k(kind, tenant, state)
    batch.put(key, (batch.get(key) or 0) + delta)


@dataclass(slots=True)
class PendingJob:
    """A create the API published; `view` is the job as the projection will show it."""

    tenant: str
    job_id: str
    view: dict[str, Any]
    spec: dict[str, Any]  # the Avro JobSpec, for previews and patches before projection
    acked: bool = False   # False while Kafka has not acknowledged it: not shown yet
    born: float = field(default_factory=time.monotonic)


class Unprojected:
    """Creates Kafka acknowledged (or is acknowledging) that the views do not show yet.

    POST /v1/jobs answers once Kafka has the command, so the API's own reads (get, list,
    idempotent retries, the quota) consult this until the projector applies the job: then
    the projector drops the entry under `lock`, in the same step as its view write, so a
    reader holding `lock` never counts a job twice or not at all. Bounded: when `limit`
    creates wait for the worker, `reserve` refuses (the API answers 503); an entry the
    projection never shows (a command the worker refused) expires after `ttl_s`.
    """

    def __init__(self, limit: int = 20_000, ttl_s: float = 600.0) -> None:
        self.lock = threading.Lock()
        self.limit = limit
        self.ttl_s = ttl_s
        self._by_id: OrderedDict[str, PendingJob] = OrderedDict()  # oldest first
        self._by_tenant: dict[str, dict[str, PendingJob]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def reserve(self, job: PendingJob) -> bool:
        """Hold a place for a create about to be published; False when full."""
        with self.lock:
            self._expire(time.monotonic())
            if len(self._by_id) >= self.limit or job.job_id in self._by_id:
                return False
            self._by_id[job.job_id] = job
            self._by_tenant.setdefault(job.tenant, {})[job.job_id] = job
            return True

    def drop(self, job_id: str) -> None:
        """The job is projected, or its publish failed."""
        with self.lock:
            self._drop(job_id)

    def _drop(self, job_id: str) -> None:
        job = self._by_id.pop(job_id, None)
        if job is not None:
            tenant = self._by_tenant[job.tenant]
            tenant.pop(job_id, None)
            if not tenant:
                del self._by_tenant[job.tenant]

    def _expire(self, now: float) -> None:
        while self._by_id:
            oldest = next(iter(self._by_id.values()))
            if not oldest.acked or now - oldest.born < self.ttl_s:
                return
            self._drop(oldest.job_id)

    def get(self, tenant: str, job_id: str) -> PendingJob | None:
        """The tenant's entry, acknowledged or still being published."""
        return self._by_tenant.get(tenant, {}).get(job_id)

    def count(self, tenant: str) -> int:
        """Entries of `tenant` (call with `lock` held, beside the projected count)."""
        return len(self._by_tenant.get(tenant, ()))

    def acked_of(self, tenant: str, after: str | None = None) -> list[PendingJob]:
        """The tenant's acknowledged entries with job_id > `after`, by job_id."""
        with self.lock:
            jobs = [j for j in self._by_tenant.get(tenant, {}).values()
                    if j.acked and (after is None or j.job_id > after)]
        return sorted(jobs, key=lambda j: j.job_id)


class Projector:
    """A thread that keeps the views current and tells waiters how far it got."""

    def __init__(self, settings: Settings, views: Views) -> None:
        self.settings = settings
        self.views = views
        self.topics = {settings.topic("jobs"): apply_job,
                       settings.topic("executions"): apply_execution,
                       settings.topic("dead-letters"): apply_dead_letter}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.applied = 0
        self.caught_up = False
        self.start_offsets: dict[tuple[str, int], int] = {}
        self._fence = EpochFence()
        self.unprojected = Unprojected()
        self._jobs_topic = settings.topic("jobs")
        self._executions_topic = settings.topic("executions")
        self._wakers: set[Callable[[], None]] = set()  # wait_async's, called after a batch

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kron-projector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _consumer(self, since_ms: int | None = None) -> Consumer:
        consumer = Consumer(confluent_config(self.settings, {
            "group.id": f"kron-projector-{uuid.uuid4().hex}",  # offsets live in the views
            "enable.auto.commit": False, "log_level": 3, "fetch.wait.max.ms": 50,
        }))
        stored = self.views.offsets()
        assignment = []
        for topic in self.topics:
            md = consumer.list_topics(topic, timeout=30).topics[topic]
            for p in md.partitions:
                assignment.append(TopicPartition(topic, p, stored.get((topic, p),
                                                                      OFFSET_BEGINNING)))
        if since_ms is not None:
            # Start at the first record at or after `since_ms` (end of partition if none).
            wanted = [TopicPartition(tp.topic, tp.partition, since_ms) for tp in assignment]
            assignment = consumer.offsets_for_times(wanted, timeout=30)
        self.start_offsets = {(tp.topic, tp.partition): tp.offset for tp in assignment}
        consumer.assign(assignment)
        return consumer

    def _run(self) -> None:
        consumer = None
        while not self._stop.is_set():
            try:
                consumer = consumer or self._consumer()
                self._poll(consumer)
            except Exception:  # the broker may be down; keep trying, never die
                log.exception("projector error; retrying")
                time.sleep(1)
        if consumer is not None:
            consumer.close()

    def _poll(self, consumer: Consumer) -> None:
        # consume() waits out its whole timeout unless the batch fills: keep it short, it is
        # the floor under every read-your-writes wait (PATCH, pause, delete...).
        msgs = consumer.consume(500, 0.05)
        if not msgs:
            self.caught_up = True
            return
        for msg in msgs:
            if msg.error():
                continue
            topic, partition = str(msg.topic()), int(msg.partition() or 0)
            value = msg.value()
            # A tombstone (history retention) names what it deletes by its key.
            key = msg.key() if value is None else None
            if not self._fence.admit((topic, partition),
                                     epoch_of_headers(msg.headers()), msg.timestamp()[1]):
                value = key = None  # a replaced owner's late write: never state, so not shown
            self.apply(topic, partition, int(msg.offset() or 0), value, tombstone_of=key)
        with self._cond:
            self._cond.notify_all()
        for wake in list(self._wakers):
            wake()

    def apply(self, topic: str, partition: int, offset: int, value: bytes | None, *,
              tombstone_of: bytes | None = None) -> None:
        """Fold one record in; `tombstone_of`: the key of a tombstone (value None)."""
        batch = Batch(self.views)
        job_id = None
        if value is None and tombstone_of is not None and topic == self._executions_topic:
            forget_execution(batch, tombstone_of.decode("utf-8", "replace"))
        if value is not None:
            try:
                decoded = codec.decode(value)
                self.topics[topic](batch, decoded.record, value)
                if topic == self._jobs_topic:
                    job_id = decoded.record["job_id"]
            except (DecodeError, KeyError, TypeError) as exc:
                log.warning("projection skipped %s[%s]@%s: %s", topic, partition, offset, exc)
        batch.put(_k("o", topic, str(partition)), offset + 1)
        if job_id is None:
            batch.commit()
        else:
            with self.unprojected.lock:  # the view and the pending entry change together
                batch.commit()
                self.unprojected._drop(job_id)
        self.applied += 1

    def wait_for(self, predicate: Any, timeout_s: float) -> bool:
        """Read-your-writes: wait (bounded) until the views satisfy `predicate`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    async def wait_async(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """`wait_for` on the event loop: no thread per waiter (the default pool has a few,
        which capped concurrent writes), woken by the projector after each batch."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(event.set)

        self._wakers.add(wake)
        deadline = loop.time() + timeout_s
        try:
            while True:
                event.clear()  # before the check: a batch applied after it sets it again
                if predicate():
                    return True
                left = deadline - loop.time()
                if left <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), left)
        finally:
            self._wakers.discard(wake)


def rebuild(settings: Settings, target: Path, *, progress: Any = None,
            since_ms: int | None = None, timeout_s: float = 600.0) -> Views:
    """Fold both topics from offset 0 (or from `since_ms`) into a fresh store at `target`,
    with the same code the live projector runs, until it reaches the topics' current ends."""
    views = Views(target)
    projector = Projector(settings, views)
    consumer = projector._consumer(since_ms)
    try:
        ends = {}
        for tp in consumer.assignment():
            _, high = consumer.get_watermark_offsets(tp, timeout=30)
            start = projector.start_offsets.get((tp.topic, tp.partition), 0)
            # A negative start is "from the beginning" (0 records read yet) or, after a
            # time lookup, "nothing at or after that time": then there is nothing to read.
            if high > 0 and not (since_ms is not None and (start < 0 or start >= high)):
                ends[(tp.topic, tp.partition)] = high
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = views.offsets()
            if all(done.get(tp, 0) >= high for tp, high in ends.items()):
                return views
            projector._poll(consumer)
            if progress is not None:
                progress(projector.applied)
        raise TimeoutError(f"rebuild did not reach the topics' ends in {timeout_s:.0f}s")
    finally:
        consumer.close()
