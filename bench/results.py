"""`--save`: a run's result, with the machine it ran on, as bench/results/<name>.json.

`python -m bench.readme` turns these files into bench/README.md's performance table, so a
result must say where it came from: cores, CPU model, RAM, Python, date, git commit.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.hostspeed import timed_loop_ms

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Flags that change only where output goes, not what is measured: left out of `command`.
OUTPUT_FLAGS = {"--json", "--progress", "--save"}
OUTPUT_VALUED = {"--plot", "--label", "--results-dir"}


# The probe's loop: ~60-120 ms of one core on the machines kron is measured on.
PROBE_ITERATIONS = 2_000_000


def speed_probe_ms(*, rounds: int = 3, iterations: int = PROBE_ITERATIONS) -> float:
    """Milliseconds one core takes for a fixed pure-Python loop, the best of `rounds`.

    The same code has measured ~1.5x its CPU per execution an hour after a run that held
    its floor, with no change in between: the speed of a shared machine's core varies. A
    result that carries this figure, taken when the run starts, can be compared with
    another; the best of a few rounds is the least disturbed by other load. Wall time, as
    it was first recorded; bench.hostspeed watches each CPU during the run."""
    return round(timed_loop_ms(iterations, rounds, cpu_time=time.perf_counter), 1)


# bench.create_micro's batch of jobs for the create probe: ~0.6 s of one core when fast.
CREATE_PROBE_JOBS = 20_000


def create_probe_us(*, rounds: int = 3, jobs: int = CREATE_PROBE_JOBS) -> float | None:
    """CPU microseconds a batched create costs `bench.create_micro` (decode, core and
    RocksDB, no broker), the best of `rounds` fresh processes; None if it fails.

    The loop of speed_probe_ms fits in a core's first-level cache and misses the drifts
    that move kron's figures: on 2026-12-03 it read 44-53 ms both while create_micro took
    28-33 us a create and while it took 47-50 us, on the same code. This probe is the
    worker's own kind of work, so a result that carries it can be compared with another
    on what its host did to that work."""
    best: float | None = None
    for _ in range(rounds):
        try:
            out = subprocess.run(
                [sys.executable, "-m", "bench.create_micro", "--jobs", str(jobs),
                 "--batch", "100"], cwd=REPO, capture_output=True, text=True, timeout=300)
            value = float(ast.literal_eval(out.stdout.strip().splitlines()[-1])["create_us"])
        except (OSError, subprocess.SubprocessError, ValueError, SyntaxError, KeyError,
                IndexError, TypeError):
            return None
        best = value if best is None else min(best, value)
    return best


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return platform.processor() or None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        # x86 says "model name"; some ARM kernels only "Hardware" or "Processor".
        if sep and key.strip() in ("model name", "Hardware", "Processor"):
            return " ".join(value.split())
    return platform.processor() or None


def ram_gb(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    kb = next((int(line.split()[1]) for line in text.splitlines()
               if line.startswith("MemTotal:")), None)
    return None if kb is None else round(kb / 2**20, 1)


OUTPUTS = ("bench/results", "docs/perf")


def git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def machine() -> dict[str, Any]:
    # Uncommitted changes to tracked files mean the commit alone does not reproduce the run.
    # Saved results and plots are the bench's own output: a run saved after another one in
    # the same checkout (bench/README.md's -x3 commands) is not a change to what ran.
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                *(f":(exclude){path}" for path in OUTPUTS))
    return {
        "nproc": os.cpu_count(), "cpu_model": cpu_model(), "ram_gb": ram_gb(),
        "python": platform.python_version(), "kernel": platform.release(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD"), "git_dirty": None if dirty is None else bool(dirty),
    }


def command_of(argv: Sequence[str]) -> str:
    """`kron bench SCENARIO ...` as it ran, without the output-only flags: how to reproduce."""
    args = list(argv)
    args = args[args.index("bench") + 1:] if "bench" in args else args[1:]
    out: list[str] = []
    skip = False
    for a in args:
        name = a.split("=", 1)[0]
        if skip or name in OUTPUT_FLAGS:
            skip = False
            continue
        if name in OUTPUT_VALUED:
            skip = "=" not in a  # its value is the next argument
            continue
        out.append(a)
    return " ".join(["kron bench", *out])


def path_for(scenario: str, label: str | None, results_dir: Path = RESULTS_DIR) -> Path:
    if label is not None and not LABEL.match(label):
        raise ValueError(f"label {label!r}: letters, digits, '.', '_' and '-' only")
    return results_dir / (f"{scenario}-{label}.json" if label else f"{scenario}.json")


def save(result: dict[str, Any], *, label: str | None, results_dir: Path = RESULTS_DIR) -> Path:
    path = path_for(result["scenario"], label, results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {**result, "label": label, "machine": machine()}
    tmp = path.with_suffix(".json.tmp")  # never a half-written result for bench.readme
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path
