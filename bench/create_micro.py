"""The worker's cost per create, without Faust or a broker.

    python -m bench.create_micro [--jobs 20000] [--batch 1] [--profile] [--encode-only]
                                 [--split]

Pending one-off jobs (as `kron bench timers` creates them) go through what the worker does
with a command record after Faust hands it over: the Avro decode, then one CreateJob
(`--batch 1`, with the spec's bytes adopted as the engine does) or a CreateJobs batch of
up to --batch jobs (streams.engine.batch.apply_batch), over real RocksDB stores
(core_micro's). The records are encoded before the clock starts. Faust's consumer and
stream, and each state write's produce, are left out: `kron bench timers` measures them.
Reports CPU microseconds per create.

--split also reports how much of that is state I/O: the same job and timer records
written again into fresh stores (the lookup that finds each id free, then both writes),
without the decode, checks and encodes that made them. The rest is the command's own
work, which a create's state does not constrain.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from typing import Any

from bench.core_micro import T0_MS, Partition, run_in_tmp
from bench.jobs import create_command, create_many_command, http_target, job_spec
from schemas import codec, names
from streams.engine.batch import apply_batch
from streams.engine.faust_store import job_encoder


def records(jobs: int, batch: int) -> list[bytes]:
    spec = job_spec(target=http_target("http://127.0.0.1:9/never"),
                    run_at_ms=T0_MS + 86_400_000)
    ids = [f"p-{i}" for i in range(jobs)]
    if batch == 1:
        return [codec.encode(names.CREATE_JOB, create_command(i, spec)) for i in ids]
    return [codec.encode(names.CREATE_JOBS, create_many_command(
        [{"job_id": i, "idempotency_key": None, "spec": spec} for i in ids[at:at + batch]]))
        for at in range(0, jobs, batch)]


@functools.cache
def reader() -> codec.ItemFieldReader:
    return codec.ItemFieldReader(names.CREATE_JOBS)


def apply(part: Partition, value: bytes) -> None:
    """One command record, as Engine._agent applies it (one partition of one)."""
    decoded, spec_bytes = reader().decode(value)
    core = part.core()
    if decoded.name == names.CREATE_JOBS:
        for job, blob in zip(decoded.record["jobs"], spec_bytes, strict=True):
            job_encoder().keep(job["spec"], blob)
        _, refused = apply_batch(core, decoded.record, partitions=1, partition=0,
                                 context=lambda: part.ctx(T0_MS), refusable=lambda e: False)
        assert not refused, refused
        return
    job_encoder().adopt(value, decoded)
    core.on_command(decoded.name, decoded.record, part.ctx(T0_MS))


def run(jobs: int, batch: int, root: Path, *, split: bool = False) -> dict[str, Any]:
    values = records(jobs, batch)
    part = Partition(root / "created" if split else root)
    try:
        started = time.process_time()
        for value in values:
            apply(part, value)
        spent = time.process_time() - started
        created = sum(1 for _ in part.tables["jobs"].db.items())
        assert created == jobs, f"{created} of {jobs} jobs created"
        result = {"jobs": jobs, "batch": batch, "create_us": round(spent / jobs * 1e6, 1)}
        if split:
            result["state_io_us"] = state_io_us(part, root / "rewritten")
        return result
    finally:
        part.close()


def state_io_us(created: Partition, root: Path) -> float:
    """CPU microseconds per create to write what `created` holds again, as a create
    writes it: a lookup of a job's key, then a job and a timer (each table in key order,
    so not paired by job: the cost is the same). Asserts that the stores written hold the
    same bytes."""
    rows = {name: _rows(created, name) for name in ("jobs", "timers")}
    pairs = list(zip(rows["jobs"], rows["timers"], strict=True))
    again = Partition(root)
    try:
        jobs, timers = again.tables["jobs"], again.tables["timers"]
        started = time.process_time()
        for (job_key, job), (timer_key, timer) in pairs:
            if jobs.db.get(job_key) is not None:  # the lookup a create makes, kept under -O
                raise AssertionError(f"{job_key!r} written twice")
            jobs.write(0, job_key, job, 1)
            timers.write(0, timer_key, timer, 1)
        spent = time.process_time() - started
        for name, written in rows.items():
            assert _rows(again, name) == written, name
    finally:
        again.close()
    return round(spent / len(pairs) * 1e6, 2)


def _rows(part: Partition, table: str) -> list[tuple[bytes, bytes]]:
    db: Any = part.tables[table].db  # raw mode: keys and values are bytes
    return [(bytes(k), bytes(v)) for k, v in db.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--split", action="store_true",
                        help="also report the part of a create that is state I/O")
    parser.add_argument("--encode-only", action="store_true",
                        help="only encode the records (bench.instructions subtracts this)")
    args = parser.parse_args()
    if args.encode_only:
        print({"jobs": args.jobs, "batch": args.batch,
               "records": len(records(args.jobs, args.batch))})
        return
    run_in_tmp(functools.partial(run, split=args.split), args.jobs, args.batch,
               prefix="kron-create-micro-", profile=args.profile)


if __name__ == "__main__":
    main()
