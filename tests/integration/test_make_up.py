"""`kron dev up` (what `make up` runs): broker, worker and API come up; Ctrl-C stops all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kron.localkafka import free_ports

pytestmark = pytest.mark.integration


def _children(pid: int) -> set[int]:
    out = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        ppid = next((int(line.split()[1]) for line in text.splitlines()
                     if line.startswith("PPid:")), None)
        if ppid == pid:
            child = int(status.parent.name)
            out |= {child} | _children(child)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_dev_up_starts_everything_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    broker_port, api_port = free_ports(1)[0], free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRON_")}
    env.update(KRON_BROKER_PORT=str(broker_port), KRON_API_PORT=str(api_port),
               KRON_PARTITIONS="2")
    proc = subprocess.Popen([sys.executable, "-m", "kron", "dev", "up"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        banner = []
        for line in proc.stdout:  # bounded by pytest's timeout if it never comes up
            banner.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        out_before = "".join(banner)
        assert "kron is up." in out_before, out_before
        body = httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=5).json()
        assert body["broker"]["ok"] is True
        key = (tmp_path / ".kron" / "dev-api-key").read_text().strip()
        r = httpx.get(f"http://127.0.0.1:{api_port}/v1/jobs", headers={"X-API-Key": key})
        assert r.status_code == 200
        started = _children(proc.pid)
        assert len(started) >= 3  # broker JVM, worker, API
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert key in out_before
    assert "everything `make up` started is stopped" in out
    time.sleep(1)
    assert [p for p in started if _alive(p)] == []
