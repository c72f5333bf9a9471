"""The partition core's cost per execution, without Faust or a broker.

    python -m bench.core_micro [--jobs 500] [--seconds 20] [--profile]

R per-second `allow` cron jobs (as `kron bench steady` creates them) over real RocksDB
stores (rocksdict, no write-ahead log, as the worker opens them), fired second by second in
chunks of the worker's TICK_CHUNK, then finished by results in batches of the result
batcher's size. A state write's changelog half (librdkafka's produce and its ack) is left
out: the real benches measure it. Reports CPU
microseconds per execution for the fire (tick) and the finish (report) paths, the median
of the seconds. --profile prints cProfile's top functions for the whole run.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict

from bench.jobs import create_command, job_spec, kafka_target
from streams.app import TICK_CHUNK
from streams.engine.core import Context, Dispatch, PartitionCore, PlanCache
from streams.engine.faust_store import (
    EXECUTION_STATE,
    JOB_STATE,
    RecordCache,
    TableStore,
    TerminalMemo,
)
from streams.reports import MAX_BATCH
from streams.tables import KeyFloor, unlogged_writes

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a whole second
# What a Kafka target's attempt reports as its output (streams.output.kafka), kept on the
# attempt by the finish.
OUTPUT = "topic bench.target partition 0 offset 123456"


class Table:
    """One partition's store, written as FencedTable.write writes it (minus the produce),
    with its key floor: without one every tick's scan walked the fired timers' tombstones
    from the first key, which the worker's scans skip."""

    def __init__(self, path: Path) -> None:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.db = Rdict(str(path), options=options)
        self.db.set_write_options(unlogged_writes())
        self.data = self
        self.floor = KeyFloor()

    def partition_db(self, partition: int) -> Rdict:
        return self.db

    def write(self, partition: int, key: bytes, value: bytes | None, epoch: int) -> None:
        if value is None:
            self.db.delete(key)
        else:
            self.db.put(key, value)
            self.floor.lower(partition, key)


class Partition:
    def __init__(self, root: Path) -> None:
        self.tables = {n: Table(root / n) for n in ("jobs", "executions", "timers")}
        self.job_cache = RecordCache(schema=JOB_STATE)
        self.execution_cache = RecordCache(schema=EXECUTION_STATE)
        self.terminal, self.plans = TerminalMemo(), PlanCache()
        self.seq = 0

    def core(self) -> PartitionCore:
        t = self.tables
        store = TableStore(jobs=t["jobs"], executions=t["executions"], timers=t["timers"],
                           partition=0, epoch=1, terminal=self.terminal,
                           job_cache=self.job_cache, execution_cache=self.execution_cache)
        return PartitionCore(store, self.plans)

    def ctx(self, now_ms: int) -> Context:
        self.seq += 1
        return Context(now_ms=now_ms, causation_id=f"event-{self.seq}", worker="w1", epoch=1)

    def close(self) -> None:
        for t in self.tables.values():
            t.db.close()


def create(part: Partition, jobs: int) -> None:
    spec = job_spec(target=kafka_target("bench.target"), cron="* * * * * *",
                    start_at_ms=T0_MS, end_at_ms=T0_MS + 3_600_000)
    for i in range(jobs):
        cmd = create_command(f"job-{i:06d}", spec)
        cmd["envelope"]["occurred_at_ms"] = T0_MS - 1000
        part.core().on_command("kron.commands.CreateJob", cmd, part.ctx(T0_MS - 1000))


def fire(part: Partition, now_ms: int) -> list[Dispatch]:
    dispatches: list[Dispatch] = []
    while True:
        ctx = part.ctx(now_ms)
        effects, more = part.core().on_tick(ctx, limit=TICK_CHUNK)
        dispatches += [e for e in effects if isinstance(e, Dispatch)]
        if not more:
            return dispatches


def finish(part: Partition, dispatches: list[Dispatch], now_ms: int) -> None:
    for at in range(0, len(dispatches), MAX_BATCH):
        items = [{"exec_id": d.exec_id, "job_id": d.job_id,
                  "scheduled_for_ms": d.scheduled_for_ms, "attempt": d.attempt,
                  "fencing_token": d.fencing_token, "ok": True, "started_at_ms": now_ms,
                  "finished_at_ms": now_ms + 2, "status_code": None, "error_class": None,
                  "error": None, "retry_after_s": None, "output": OUTPUT}
                 for d in dispatches[at:at + MAX_BATCH]]
        part.core().on_report("kron.executions.AttemptsFinished", {"results": items},
                              part.ctx(now_ms + 5))


def run(jobs: int, seconds: int, root: Path) -> dict[str, Any]:
    part = Partition(root)
    try:
        create(part, jobs)
        fire_us, finish_us = [], []
        for s in range(seconds):
            now = T0_MS + s * 1000
            t = time.process_time()
            dispatches = fire(part, now)
            fired = time.process_time()
            finish(part, dispatches, now)
            done = time.process_time()
            assert len(dispatches) == jobs, f"second {s}: {len(dispatches)} of {jobs} fired"
            fire_us.append((fired - t) / jobs * 1e6)
            finish_us.append((done - fired) / jobs * 1e6)
        return {"jobs": jobs, "seconds": seconds,
                "fire_us": round(statistics.median(fire_us), 1),
                "finish_us": round(statistics.median(finish_us), 1)}
    finally:
        part.close()


def run_in_tmp(fn: Callable[..., dict[str, Any]], *args: Any, prefix: str,
               profile: bool) -> None:
    """A micro-benchmark's run(*args, root) over a fresh directory, printed; with
    `profile`, cProfile's top functions first."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if profile:
            profiler = cProfile.Profile()
            result = profiler.runcall(fn, *args, root)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
        else:
            result = fn(*args, root)
        print(result)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    run_in_tmp(run, args.jobs, args.seconds, prefix="kron-core-micro-", profile=args.profile)


if __name__ == "__main__":
    main()
