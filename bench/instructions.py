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
from typing import Any

HASH_SEED = "0"


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


def count(jobs: int, seconds: int, workdir: Path) -> Count:
    """One core_micro run under cachegrind."""
    if shutil.which("valgrind") is None:
        raise Unavailable("valgrind is not installed (apt-get install valgrind)")
    out = workdir / f"cachegrind-{seconds}.out"
    env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
    done = subprocess.run(command(jobs, seconds, out), env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0 or not out.exists():
        raise Unavailable(f"core_micro under valgrind failed ({done.returncode}): "
                          f"{done.stderr[-2000:]}")
    return Count(seconds=seconds, instructions=summary_of(out.read_text()))


def measure(jobs: int, seconds: Sequence[int], *,
            counter: Callable[[int, int, Path], Count] = count) -> dict[str, Any]:
    """Both runs at once (each is one thread under valgrind), then the difference."""
    if len(seconds) != 2 or seconds[0] == seconds[1]:
        raise ValueError("give two different numbers of seconds")
    with tempfile.TemporaryDirectory(prefix="kron-instructions-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        counts = list(pool.map(lambda s: counter(jobs, s, Path(tmp)), seconds))
    return {"jobs": jobs, "seconds": [c.seconds for c in counts],
            "instructions": [c.instructions for c in counts],
            "instructions_per_execution": round(per_execution(counts, jobs))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--seconds", type=int, nargs=2, default=[2, 4])
    args = parser.parse_args()
    try:
        print(measure(args.jobs, args.seconds))
    except Unavailable as exc:
        sys.exit(f"bench.instructions: {exc}")


if __name__ == "__main__":
    main()
