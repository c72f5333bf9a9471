"""A worker's metrics without a broker: label folding bounds the series, the counts become
the exposition prometheus_client's own parser reads back, the store counts each
execution's end once, and the probe reads its gauges on the loop."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streams.domain.timer import SYSTEM_LANE, Lane, TimerKind, encode_timer_key
from streams.metrics import LATENESS_BUCKETS, OTHER, Folder, Histogram, WorkerCounts
from streams.metrics_server import (
    Snapshot,
    WorkerCollector,
    WorkerProbe,
    count_timer_keys,
    families,
)


@dataclass
class Attempt:
    tenant: str = "acme"
    priority: str = "normal"
    attempt: int = 1
    scheduled_for_ms: int = 1_000
    task_id: str | None = None


def parse(registry: CollectorRegistry) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Each sample by name and sorted labels, as Prometheus would read the page."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def exposition(snapshot: Snapshot) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    class Fixed:
        def collect(self) -> Any:
            return list(families(snapshot))

    registry = CollectorRegistry()
    registry.register(Fixed())
    return parse(registry)


def test_label_values_past_the_limit_fold_into_other() -> None:
    folder = Folder(3)
    assert [folder.fold(t) for t in ("a", "b", "a", "c", "d", "e", "b")] == [
        "a", "b", "a", "c", OTHER, OTHER, "b"]
    many = Folder(2)
    for i in range(10_000):
        many.fold(f"t{i}")
    assert len(many._known) <= 8  # bounded memory too, not only bounded series


def test_counts_become_series_bounded_by_the_tenant_limit() -> None:
    counts = WorkerCounts(max_tenants=2)
    for i in range(50):
        counts.attempt(Attempt(tenant=f"t{i % 5}"), "succeeded", 1_020)
    counts.attempt(Attempt(tenant="t0"), "permanent", 1_020)
    for tenant, state in [("t0", "succeeded"), ("t4", "failed"), ("t3", "missed")]:
        counts.execution(tenant, state)
    page = exposition(Snapshot(attempts=counts.attempts, executions=counts.executions,
                               lateness=counts.lateness))
    attempts = page["kron_attempts_total"]
    assert attempts == {
        (("outcome", "succeeded"), ("tenant", "t0")): 10,
        (("outcome", "succeeded"), ("tenant", "t1")): 10,
        (("outcome", "succeeded"), ("tenant", OTHER)): 30,
        (("outcome", "permanent"), ("tenant", "t0")): 1}
    assert page["kron_executions_total"] == {
        (("outcome", "succeeded"), ("tenant", "t0")): 1,
        (("outcome", "failed"), ("tenant", OTHER)): 1,
        (("outcome", "missed"), ("tenant", OTHER)): 1}
    tenants = {dict(k)["tenant"] for k in page["kron_trigger_lateness_seconds_count"]}
    assert tenants == {"t0", "t1", OTHER}


def test_lateness_is_the_first_call_of_a_slot_only() -> None:
    counts = WorkerCounts()
    counts.attempt(Attempt(scheduled_for_ms=1_000), "succeeded", 1_030)  # 30 ms late
    counts.attempt(Attempt(scheduled_for_ms=1_000, attempt=2), "succeeded", 9_000)  # a retry
    counts.attempt(Attempt(scheduled_for_ms=1_000, task_id="b"), "succeeded", 9_000)  # a task
    counts.attempt(Attempt(scheduled_for_ms=5_000, priority="critical"), "timeout", 4_990)
    page = exposition(Snapshot(lateness=counts.lateness))
    normal = (("priority", "normal"), ("tenant", "acme"))
    assert page["kron_trigger_lateness_seconds_count"][normal] == 1
    assert page["kron_trigger_lateness_seconds_sum"][normal] == 0.03
    buckets = page["kron_trigger_lateness_seconds_bucket"]
    assert buckets[(("le", "0.025"), *normal)] == 0
    assert buckets[(("le", "0.05"), *normal)] == 1
    assert buckets[(("le", "+Inf"), *normal)] == 1
    early = (("le", "0.005"), ("priority", "critical"), ("tenant", "acme"))
    assert buckets[early] == 1  # called early (held call): lateness 0, not negative


def test_a_histogram_is_cumulative_and_counts_past_its_last_bound() -> None:
    hist = Histogram(LATENESS_BUCKETS)
    for value in (0.001, 0.3, 0.3, 1_000.0):
        hist.observe(("x",), value)
    page = exposition(Snapshot(lateness=hist))["kron_trigger_lateness_seconds_bucket"]
    by_le = {dict(k)["le"]: v for k, v in page.items()}
    assert by_le["0.005"] == 1 and by_le["0.25"] == 1 and by_le["0.5"] == 3
    assert by_le["300.0"] == 3 and by_le["+Inf"] == 4


class Breaker:
    def __init__(self, hosts: list[str]) -> None:
        self.hosts = hosts

    def open_hosts(self) -> list[str]:
        return self.hosts


class FakeExecutor:
    def __init__(self) -> None:
        self.in_flight = 3
        self.breaker = Breaker(["a.example", "b.example", "c.example"])
        self.loop_thread: int | None = None

    def queue_depths(self) -> dict[str, int]:
        self.loop_thread = threading.get_ident()
        return {"acme": 4, "globex": 2, "initech": 1}


class Iter:
    def __init__(self, keys: list[bytes]) -> None:
        self.keys, self.i = sorted(keys), 0

    def seek_to_first(self) -> None:
        self.i = 0

    def seek(self, key: bytes) -> None:
        self.i = next((n for n, k in enumerate(self.keys) if k >= key), len(self.keys))

    def valid(self) -> bool:
        return self.i < len(self.keys)

    def key(self) -> bytes:
        return self.keys[self.i]

    def next(self) -> None:
        self.i += 1


class DB:
    def __init__(self, keys: list[bytes]) -> None:
        self.keys = keys

    def iter(self) -> Iter:
        return Iter(self.keys)


class Timers:
    def __init__(self, dbs: dict[int, DB]) -> None:
        self.dbs = dbs

    def partition_db(self, partition: int) -> DB:
        return self.dbs[partition]


class FakeWorker:
    def __init__(self, timers: Timers) -> None:
        self.timers = timers
        self.app = None  # no consumer yet: no lag
        self.runtime = None

    def owned_partitions(self) -> frozenset[int]:
        return frozenset({0, 3})

    def may_apply_here(self, partition: int) -> bool:
        return True


def keys(kind: TimerKind, n: int) -> list[bytes]:
    """Timers in two lanes (a tenant's and the system's), as the engine writes them."""
    lanes = [Lane(2, 77), SYSTEM_LANE]
    return [encode_timer_key(due_ms=1_000 + i, kind=kind, job_id=f"job-{i}", ref="r",
                             lane=lanes[i % 2]) for i in range(n)]


def test_timer_keys_are_counted_by_kind_in_chunks_up_to_fausts_offset_key(
        monkeypatch: Any) -> None:
    import streams.metrics_server as server

    monkeypatch.setattr(server, "TIMERS_CHUNK", 7)
    db = DB([*keys(TimerKind.FIRE, 20), *keys(TimerKind.LEASE, 5), b"__faust\x00offset__"])
    counts: dict[tuple[int, str], int] = {}
    start, rounds = None, 0
    while True:
        start = count_timer_keys(db, 2, start, counts)
        rounds += 1
        if start is None:
            break
    assert counts == {(2, "fire"): 20, (2, "lease"): 5}
    assert rounds == 4


def test_a_scrape_reads_the_gauges_on_the_event_loop_thread() -> None:
    counts = WorkerCounts(max_tenants=1)
    counts.execution("acme", "succeeded")
    executor = FakeExecutor()
    worker = FakeWorker(Timers({0: DB(keys(TimerKind.FIRE, 3)), 3: DB(keys(TimerKind.RETRY, 2))}))
    probe = WorkerProbe(counts=counts, executor=executor, worker=worker, topics=["t"],
                        monotonic=lambda: 0.0, max_hosts=2)
    collector = WorkerCollector(probe)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(collector.started(), loop).result(5)
        registry = CollectorRegistry()
        registry.register(collector)
        page = parse(registry)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    assert executor.loop_thread == thread.ident
    assert page["kron_attempts_in_flight"] == {(): 3}
    assert page["kron_partitions_owned"] == {(): 2}
    # acme was seen first (an execution), so it keeps its name; the rest are `other`.
    assert page["kron_dispatch_queue_depth"] == {(("tenant", "acme"),): 4,
                                                 (("tenant", OTHER),): 3}
    assert page["kron_circuit_open"] == {(("host", "a.example"),): 1,
                                         (("host", "b.example"),): 1,
                                         (("host", OTHER),): 1}
    assert page["kron_timers_pending"] == {(("kind", "fire"), ("partition", "0")): 3,
                                           (("kind", "retry"), ("partition", "3")): 2}
    assert page["kron_executions_total"] == {(("outcome", "succeeded"), ("tenant", "acme")): 1}


def test_without_a_loop_a_scrape_serves_the_last_snapshot() -> None:
    probe = WorkerProbe(counts=WorkerCounts(), executor=FakeExecutor(),
                        worker=FakeWorker(Timers({})), topics=[], monotonic=lambda: 0.0)
    registry = CollectorRegistry()
    registry.register(WorkerCollector(probe))
    page = parse(registry)
    assert page["kron_attempts_in_flight"] == {(): 0}
    assert "kron_executions_total" not in page


class WriteOnlyTable:
    def write(self, partition: int, key: bytes, value: bytes | None, epoch: int) -> None:
        pass


def test_the_store_counts_each_end_of_an_execution_once() -> None:
    from schemas import codec, names
    from streams.engine.faust_store import RecordCache, TerminalMemo
    from tests.golden.make_golden import SAMPLES

    counts = WorkerCounts()
    memo = TerminalMemo()
    store_class = counts.store_class()

    def store() -> Any:  # one per event, over the worker's memo, as the driver makes them
        table = WriteOnlyTable()
        return store_class(jobs=table, executions=table, timers=table, partition=0,
                           job_cache=RecordCache(), execution_cache=RecordCache(),
                           terminal=memo)

    ex = codec.decode(codec.encode(names.EXECUTION_STATE,
                                   SAMPLES[(names.EXECUTION_STATE, 1)][0])).record
    tenant = ex["envelope"]["tenant"]
    for state, attempt in [("running", 1), ("succeeded", 1), ("succeeded", 1),
                           ("running", 2), ("failed", 2), ("failed", 2)]:
        store().put_execution({**ex, "state": state, "attempt": attempt})
    other = {**ex, "exec_id": "another", "state": "missed", "attempt": 0}
    store().put_execution(other)
    task = {**ex, "exec_id": "a-task", "state": "failed", "run_id": "run", "task_id": "b"}
    store().put_execution(task)  # a DAG task instance: its run is what counts
    assert counts.executions == {(tenant, "succeeded"): 1, (tenant, "failed"): 1,
                                 (tenant, "missed"): 1}


def test_a_flush_that_waits_for_acks_reports_how_long() -> None:
    from streams.changelog import Changelog

    class Books(Changelog):
        def _write(self, *args: Any) -> None:
            pass

        def poll(self) -> None:
            pass

    async def scenario() -> list[float]:
        waits: list[float] = []
        log = Books(on_offsets=lambda offsets: None, on_fatal=lambda why: None)
        log.on_ack_wait = waits.append
        await log.flush()  # nothing written: nothing to wait for, nothing observed
        log.produce("t", 0, b"k", b"v", None)
        flushing = asyncio.ensure_future(log.flush())
        await asyncio.sleep(0.02)
        log._ack(("t", 0), 1, 0)
        log._settle()
        await flushing
        return waits

    waits = asyncio.run(scenario())
    assert len(waits) == 1 and 0.015 <= waits[0] < 1.0


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


class Consumer:
    def assignment(self) -> set[TP]:
        return {TP("k.commands", 0), TP("k.signals", 1), TP("k.jobs-changelog", 0),
                TP("k.commands", 2)}

    def highwater(self, tp: TP) -> int | None:
        return {TP("k.commands", 0): 120, TP("k.signals", 1): 7}.get(tp)


class Commits:
    def committed(self, tp: TP) -> int | None:
        return {TP("k.commands", 0): 100}.get(tp)


class App:
    consumer = Consumer()


class Runtime:
    def commit_control(self) -> Commits:
        return Commits()


def test_lag_is_the_high_watermark_past_the_commit_of_the_topics_read() -> None:
    worker = FakeWorker(Timers({}))
    worker.app, worker.runtime = App(), Runtime()  # type: ignore[assignment]
    probe = WorkerProbe(counts=WorkerCounts(), executor=FakeExecutor(), worker=worker,
                        topics=["k.commands", "k.signals"], monotonic=lambda: 0.0)
    # Standby changelogs are not lag; a partition without a high watermark yet is left out;
    # one never committed lags by all it holds.
    assert probe._lag() == {("k.commands", 0): 20, ("k.signals", 1): 7}


def test_serve_binds_a_free_port_and_says_where(tmp_path: Any) -> None:
    import urllib.request

    from streams.metrics_server import PORT_FILE, serve

    probe = WorkerProbe(counts=WorkerCounts(), executor=FakeExecutor(),
                        worker=FakeWorker(Timers({})), topics=[], monotonic=lambda: 0.0)
    port = serve(WorkerCollector(probe), host="127.0.0.1", port=0, data_dir=tmp_path)
    assert port and int((tmp_path / PORT_FILE).read_text()) == port
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    names = {f.name for f in text_string_to_metric_families(page.decode())}
    assert {"kron_attempts_in_flight", "kron_partitions_owned", "process_cpu_seconds"} <= names
    # The port taken: logged, not fatal, and no port file of its own.
    assert serve(WorkerCollector(probe), host="127.0.0.1", port=port,
                 data_dir=tmp_path / "nowhere") is None


def test_timers_are_recounted_no_more_than_their_share_of_the_loop_allows() -> None:
    now = [0.0]

    def monotonic() -> float:  # every reading is 0.2 s later: each chunk "takes" 0.2 s
        now[0] += 0.2
        return now[0]

    dbs = {0: DB(keys(TimerKind.FIRE, 3)), 3: DB(keys(TimerKind.RETRY, 2))}
    probe = WorkerProbe(counts=WorkerCounts(), executor=FakeExecutor(),
                        worker=FakeWorker(Timers(dbs)), topics=[], monotonic=monotonic)

    def pending() -> dict[tuple[int, str], int]:
        return asyncio.run(probe.snapshot()).timers

    assert pending() == {(0, "fire"): 3, (3, "retry"): 2}
    dbs[0].keys = keys(TimerKind.FIRE, 5)
    # Two chunks took 0.4 s: the next count waits 0.4 / 2% = 20 s, not 10.
    now[0] = 15.0
    assert pending()[(0, "fire")] == 3
    now[0] = 21.0
    assert pending()[(0, "fire")] == 5
