"""The changelog writer process dies with its worker, even while its input stays open.

No broker: the writer is started as streams.changelog starts it, and waits for its config
frame on a pipe that this test keeps open, so the end of its input cannot be what ends it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench.procfs import state_of

# The worker's stand-in: it starts the writer as ChildChangelogProducer does, on the pipe
# it was handed, says the writer's pid, and waits to be killed.
WORKER = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen(
        [sys.executable, "-m", "streams.changelog_child", str(os.getpid())],
        stdin=int(sys.argv[1]), stdout=subprocess.DEVNULL)
    print(child.pid, flush=True)
    time.sleep(60)
""")


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's reaper may be slow, or absent in a container)."""
    try:
        return state_of(Path(f"/proc/{pid}/stat").read_text()) != "Z"
    except FileNotFoundError:
        return False


def _wait_until_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _running(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux prctl")
def test_the_writer_dies_when_its_worker_is_killed() -> None:
    read_end, write_end = os.pipe()
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(read_end)],
                              pass_fds=(read_end,), stdout=subprocess.PIPE,
                              cwd=Path(__file__).resolve().parents[2])
    writer = 0
    try:
        os.close(read_end)
        assert worker.stdout is not None
        writer = int(worker.stdout.readline())
        # Started, and waiting for its config: our write end keeps its input open.
        time.sleep(0.5)
        assert _running(writer), "the writer ended before its worker did"
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        assert _wait_until_gone(writer, 10.0), "the writer outlived its killed worker"
    finally:
        os.close(write_end)
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        if writer and _running(writer):
            os.kill(writer, signal.SIGKILL)
