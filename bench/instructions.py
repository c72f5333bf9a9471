"""The partition core's cost per execution in machine instructions: the same on a slow host
as on a fast one.

    python -m bench.instructions [--jobs 500] [--seconds 2 4]

This host's CPUs change speed for seconds at a time (bench.hostspeed), and on 2026-12-02
the same `bench.core_micro` run took 143-217 us per fire from one run to the next, against
42-53 us on the day its figure was first taken. Timings cannot show a change of a few
percent under that. Instructions retired can: `bench.core_micro` runs twice under
valgrind's cachegrind (instruction counting only, no cache simulation), once for each
number of seconds, with the same jobs and hash seed. Start-up, imports and the creates
are the same in both runs, so the difference divided by the extra executions is what one
execution costs the core (fire and finish, RocksDB included; the produce and Faust are
not, as in core_micro). Two runs of the same commit differed by under 0.05%.

    python -m bench.instructions --creates [--jobs 2000] [--batch 100]

counts a create the same way, with `bench.create_micro`: its runs for N and 2N jobs, less
its runs that only encode those jobs' command records (which it does before its clock
starts), leave what N creates cost the worker (decode and core, RocksDB included).

Instructions are not time (a cache miss costs more than an add), so a change is judged by
both: instructions to see it at all, the full benches to see that it matters.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

HASH_SEED = "0"
T = TypeVar("T")
R = TypeVar("R")


class Unavailable(RuntimeError):
    """valgrind is not installed, or it did not produce a count."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Count:
    seconds: int
    instructions: int


def summary_of(text: str) -> int:
    """The instruction total of a cachegrind output file (its `summary:` line)."""
    for line in text.splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise Unavailable("cachegrind wrote no summary line")


@dataclass(frozen=True, kw_only=True, slots=True)
class CreateCount:
    jobs: int
    encode_only: bool
    instructions: int


def per_create(counts: Sequence[CreateCount]) -> float:
    """Instructions per create from create_micro runs for N and 2N jobs, each once in full
    and once encoding only: start-up and the records' encode cancel out."""
    by = {(c.jobs, c.encode_only): c.instructions for c in counts}
    sizes = sorted({c.jobs for c in counts})
    if len(by) != 4 or len(sizes) != 2:
        raise ValueError("give runs for two numbers of jobs, in full and encoding only")
    small, large = sizes
    full = by[(large, False)] - by[(small, False)]
    encode = by[(large, True)] - by[(small, True)]
    return (full - encode) / (large - small)


def per_execution(counts: Sequence[Count], jobs: int) -> float:
    """Instructions per execution from two runs that differ only in their seconds."""
    short, long = sorted(counts, key=lambda c: c.seconds)
    extra = (long.seconds - short.seconds) * jobs
    if extra <= 0:
        raise ValueError("the runs must differ in seconds")
    return (long.instructions - short.instructions) / extra


def command(jobs: int, seconds: int, out: Path) -> list[str]:
    return ["valgrind", "--tool=cachegrind", "--cache-sim=no",
            f"--cachegrind-out-file={out}", sys.executable, "-m", "bench.core_micro",
            "--jobs", str(jobs), "--seconds", str(seconds)]


def create_command(jobs: int, batch: int, encode_only: bool, out: Path) -> list[str]:
    return ["valgrind", "--tool=cachegrind", "--cache-sim=no",
            f"--cachegrind-out-file={out}", sys.executable, "-m", "bench.create_micro",
            "--jobs", str(jobs), "--batch", str(batch),
            *(["--encode-only"] if encode_only else [])]


def _instructions(argv: list[str], out: Path, what: str) -> int:
    if shutil.which("valgrind") is None:
        raise Unavailable("valgrind is not installed (apt-get install valgrind)")
    env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.exists():
        raise Unavailable(f"{what} under valgrind failed ({done.returncode}): "
                          f"{done.stderr[-2000:]}")
    return summary_of(out.read_text())


def count(jobs: int, seconds: int, workdir: Path) -> Count:
    """One core_micro run under cachegrind."""
    out = workdir / f"cachegrind-{seconds}.out"
    return Count(seconds=seconds,
                 instructions=_instructions(command(jobs, seconds, out), out, "core_micro"))


def count_creates(jobs: int, batch: int, encode_only: bool, workdir: Path) -> CreateCount:
    """One create_micro run under cachegrind."""
    out = workdir / f"cachegrind-{jobs}-{int(encode_only)}.out"
    argv = create_command(jobs, batch, encode_only, out)
    return CreateCount(jobs=jobs, encode_only=encode_only,
                       instructions=_instructions(argv, out, "create_micro"))


def _two_at_a_time(run: Callable[[T, Path], R], args: Sequence[T]) -> list[R]:
    """run(arg, workdir) for every arg, two at a time (each is one thread under valgrind)."""
    with tempfile.TemporaryDirectory(prefix="kron-instructions-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda a: run(a, Path(tmp)), args))


def measure(jobs: int, seconds: Sequence[int], *,
            counter: Callable[[int, int, Path], Count] = count) -> dict[str, Any]:
    """Both runs at once (each is one thread under valgrind), then the difference."""
    if len(seconds) != 2 or seconds[0] == seconds[1]:
        raise ValueError("give two different numbers of seconds")
    counts = _two_at_a_time(lambda s, tmp: counter(jobs, s, tmp), seconds)
    return {"jobs": jobs, "seconds": [c.seconds for c in counts],
            "instructions": [c.instructions for c in counts],
            "instructions_per_execution": round(per_execution(counts, jobs))}


def measure_creates(jobs: int, batch: int, *,
                    counter: Callable[[int, int, bool, Path], CreateCount] = count_creates,
                    ) -> dict[str, Any]:
    """create_micro for `jobs` and twice as many, in full and encoding only, two at a time."""
    if jobs < 1 or batch < 1:
        raise ValueError("jobs and batch must be positive")
    runs = [(n, encode_only) for encode_only in (False, True) for n in (jobs, 2 * jobs)]
    counts = _two_at_a_time(lambda r, tmp: counter(r[0], batch, r[1], tmp), runs)
    return {"jobs": [jobs, 2 * jobs], "batch": batch,
            "instructions": {f"{c.jobs}{' encode only' if c.encode_only else ''}":
                             c.instructions for c in counts},
            "instructions_per_create": round(per_create(counts))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None,
                        help="jobs per run (default 500; with --creates, 2000)")
    parser.add_argument("--seconds", type=int, nargs=2, default=[2, 4])
    parser.add_argument("--creates", action="store_true",
                        help="count a create (bench.create_micro), not an execution")
    parser.add_argument("--batch", type=int, default=100,
                        help="with --creates: jobs per CreateJobs record (1: CreateJob)")
    args = parser.parse_args()
    try:
        if args.creates:
            print(measure_creates(args.jobs or 2000, args.batch))
        else:
            print(measure(args.jobs or 500, args.seconds))
    except Unavailable as exc:
        sys.exit(f"bench.instructions: {exc}")


if __name__ == "__main__":
    main()
