"""What the worker's metrics (streams/metrics.py) cost per execution, without a broker.

    python -m bench.metrics_micro [--rounds 6] [--attempts 50000]

Alternates, in one process, metrics counted and not: the executor (submit, its pool, a
runner that answers at once, the report) with and without WorkerCounts, CPU microseconds
an attempt; and the partition core (bench.core_micro: fire and finish over RocksDB) over
TableStore and over the counting store. Prints the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import bench.core_micro as core_micro
from kron.clock import SystemClock
from streams.engine.core import Dispatch
from streams.engine.faust_store import TableStore
from streams.executor import Executor
from streams.metrics import WorkerCounts
from streams.targets import AttemptInfo, Outcome


class Instant:
    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        return Outcome(ok=True, status_code=200)


class Reports:
    """The executor's reporter: counts results, and says when all are in."""

    def __init__(self, expected: int) -> None:
        self.expected, self.seen = expected, 0
        self.done = asyncio.Event()

    async def __call__(self, partition: int, name: str, record: dict[str, Any], /, *,
                       wait_until_lease_ms: int | None = None) -> None:
        self.seen += 1
        if self.seen >= self.expected:
            self.done.set()


async def executor_us(attempts: int, *, metrics: bool) -> float:
    reports = Reports(attempts)
    executor = Executor(runners={"http": Instant()}, report=reports, clock=SystemClock(),
                        worker_id="w", concurrency=64)
    if metrics:
        executor.metrics = WorkerCounts()
    now = SystemClock().now_ms()
    dispatches = [Dispatch(exec_id=f"e{i}", job_id=f"j{i}", tenant=f"t{i % 20}",
                           scheduled_for_ms=now, attempt=1, fencing_token=1,
                           target={"url": "http://127.0.0.1:9/x"}, lease_s=30.0)
                  for i in range(attempts)]
    executor.start()
    started = time.process_time()
    for i, d in enumerate(dispatches):
        executor.submit(d, i % 8)
        if i % 1000 == 999:
            await asyncio.sleep(0)
    await reports.done.wait()
    cpu = time.process_time() - started
    await executor.stop()
    return cpu / attempts * 1e6


def core_us(*, counting: bool) -> dict[str, Any]:
    # core_micro builds its stores from its module's TableStore: swapped for the run.
    store_class = WorkerCounts().store_class() if counting else TableStore
    with (mock.patch.object(core_micro, "TableStore", store_class),
          tempfile.TemporaryDirectory(prefix="kron-metrics-micro-") as root):
        return core_micro.run(500, 8, Path(root))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--attempts", type=int, default=50_000)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {k: [] for k in (
        "executor_on", "executor_off", "fire_on", "fire_off", "finish_on", "finish_off")}
    for i in range(args.rounds):
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            suffix = "on" if on else "off"
            runs[f"executor_{suffix}"].append(
                asyncio.run(executor_us(args.attempts, metrics=on)))
            core = core_us(counting=on)
            runs[f"fire_{suffix}"].append(core["fire_us"])
            runs[f"finish_{suffix}"].append(core["finish_us"])
    print(json.dumps({k: round(statistics.median(v), 2) for k, v in runs.items()}))


if __name__ == "__main__":
    main()
