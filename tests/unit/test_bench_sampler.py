"""The bench's sampler: each worker's main-thread busy share through the load window, with
/proc's ticks and the clock injected."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.procfs import CLK_TCK, state_of
from bench.stack import Sampler, children_of, main_thread_ticks, read_proc

# Pids no process has: read_proc finds nothing, so only the injected main threads count.
W1, W2, W1_AGAIN, W3 = 4_194_301, 4_194_302, 4_194_303, 4_194_304


class Fake:
    def __init__(self) -> None:
        self.now = 100.0
        self.ticks: dict[int, int | None] = {W1: 1_000, W2: 5_000, W1_AGAIN: 0, W3: 0}

    def run(self, seconds: float, cores: dict[int, float]) -> None:
        """Time passes; each live pid's main thread uses `cores` of a core meanwhile."""
        self.now += seconds
        for pid, share in cores.items():
            ticks = self.ticks[pid]
            assert ticks is not None
            self.ticks[pid] = ticks + round(share * seconds * CLK_TCK)


def sampler(fake: Fake) -> Sampler:
    s = Sampler(main_ticks=fake.ticks.get, clock=lambda: fake.now)
    s.track("w1", W1)
    s.track("w2", W2)
    return s


def test_the_busy_share_is_cpu_seconds_per_second_of_the_window() -> None:
    fake = Fake()
    s = sampler(fake)
    fake.run(5, {W1: 0.2, W2: 0.2})  # before the window: not counted
    s.mark()
    fake.run(2, {W1: 0.9, W2: 0.3})
    s.sample()
    fake.run(2, {W1: 0.9, W2: 0.5})
    s.mark_end()
    fake.run(3, {W1: 0.1, W2: 0.1})  # after the window (the audit): not counted
    s.sample()
    assert s.loop_busy(["w1", "w2", "api"]) == {"w1": 0.9, "w2": 0.4}


def test_a_killed_worker_counts_to_its_last_sample_and_a_restart_is_left_out() -> None:
    fake = Fake()
    s = sampler(fake)
    s.mark()
    fake.run(2, {W1: 1.0, W2: 0.6})
    s.sample()
    fake.ticks[W2] = None  # killed: /proc has no such thread any more
    s.track("w1", W1_AGAIN)  # w1 restarted inside the window
    s.track("w3", W3)  # a worker started inside the window
    fake.run(2, {W1_AGAIN: 0.5, W3: 1.0})
    s.mark_end()
    busy = s.loop_busy(["w1", "w2", "w3"])
    assert busy == {"w1": 1.0, "w2": 0.6}


def test_a_window_with_one_sample_has_no_share_and_a_new_mark_starts_afresh() -> None:
    fake = Fake()
    s = sampler(fake)
    s.mark()
    s.mark_end()  # no time passed
    assert s.loop_busy(["w1", "w2"]) == {}
    s.mark()
    fake.run(1, {W1: 0.25, W2: 0.75})
    s.mark_end()
    assert s.loop_busy(["w1", "w2"]) == {"w1": 0.25, "w2": 0.75}


def test_an_exited_process_that_is_not_reaped_yet_has_no_main_thread_ticks() -> None:
    """A zombie's stat stays readable with its ticks frozen: counted on, it would dilute
    its share over the rest of the window."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        assert wait_for_state(child.pid, "Z"), "the child never became a zombie"
        assert main_thread_ticks(child.pid) is None
    finally:
        child.wait()
    assert main_thread_ticks(child.pid) is None  # reaped: no /proc entry
    assert main_thread_ticks(os.getpid()) is not None


def wait_for_state(pid: int, state: str) -> bool:
    for _ in range(200):  # bounded: 10 s
        if state_of(Path(f"/proc/{pid}/stat").read_text()) == state:
            return True
        time.sleep(0.05)
    return False


def test_a_process_s_figures_include_its_child_processes() -> None:
    """A worker's changelog writer is a child process of the worker: its CPU and memory
    are the worker's. A child that burns CPU shows in the parent's figures while it lives
    (unwaited) and after it is waited for (the parent's cutime)."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c',"
        " 'import time\\nend = time.process_time() + 0.6\\n"
        "while time.process_time() < end: pass\\ntime.sleep(30)'])\n"
        "sys.stdin.readline()\n"
        "child.kill(); child.wait()\n"
        "sys.stdin.readline()\n")], stdin=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            children = children_of(parent.pid)
            got = read_proc(parent.pid)
            assert got is not None
            own = main_thread_ticks(parent.pid)
            assert own is not None
            if children and got[1] - own >= 0.5 * CLK_TCK:
                break
            assert time.monotonic() < deadline, (children, got, own)
            time.sleep(0.1)
        assert got[0] > 2 * 1024  # both interpreters' memory, in kB
        assert parent.stdin is not None
        parent.stdin.write("\n")
        parent.stdin.flush()
        while children_of(parent.pid):  # killed and waited for: in cutime now
            assert time.monotonic() < deadline
            time.sleep(0.05)
        after = read_proc(parent.pid)
        assert after is not None and after[1] - own >= 0.5 * CLK_TCK
    finally:
        parent.kill()
        parent.wait()
