"""A projection rebuilt from offset 0 equals the one that followed the topics live."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from api.projection import Projector, Views, rebuild

pytestmark = pytest.mark.integration


def test_rebuilt_views_equal_live_views(api_stack, tmp_path) -> None:
    live = Views(tmp_path / "live")
    projector = Projector(api_stack.settings, live)
    projector.start()
    try:
        with api_stack.client() as c:
            ids = []
            for i in range(3):
                body = {"name": f"rebuild-{i}", "schedule": {"cron": "* * * * * *"},
                        "target": {"type": "http", "url": f"{api_stack.receiver.url}/ok"},
                        "idempotency_key": uuid.uuid4().hex}
                ids.append(c.post("/v1/jobs", json=body).json()["job_id"])
            run_at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
            ids.append(c.post("/v1/jobs", json={"name": "one", "run_at": run_at, "target": {
                "type": "http", "url": f"{api_stack.receiver.url}/status/500,200"}}).json()[
                "job_id"])
            time.sleep(3)
            c.post(f"/v1/jobs/{ids[0]}:pause")
            for job_id in ids[:3]:
                c.delete(f"/v1/jobs/{job_id}")
        time.sleep(3)  # let in-flight results land
        rebuilt = rebuild(api_stack.settings, tmp_path / "rebuilt")
        assert projector.wait_for(
            lambda: live.offsets() == rebuilt.offsets(), 30), "live projector lagged"
        live_dump, rebuilt_dump = live.dump(), rebuilt.dump()
        assert len(rebuilt_dump) > 20
        assert live_dump.keys() == rebuilt_dump.keys()
        assert live_dump == rebuilt_dump
        runs = [k for k in rebuilt_dump if k.startswith(f"r/{ids[3]}/".encode())]
        assert len(runs) == 1
    finally:
        projector.stop()
        live.close()


def kron(api_stack, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    s = api_stack.settings
    return subprocess.run(
        [sys.executable, "-m", "kron", *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, "KRON_BOOTSTRAP_SERVERS": s.bootstrap_servers,
             "KRON_TOPIC_PREFIX": s.topic_prefix, "KRON_PARTITIONS": str(s.partitions),
             "KRON_API_URL": api_stack.api.url, "KRON_API_KEY": "key-acme", **env})


def test_jobs_cli_talks_to_the_api(api_stack) -> None:
    body = json.dumps({"name": "cli-job", "schedule": "0 5 * * *",
                       "target": {"url": f"{api_stack.receiver.url}/ok"}})
    created = kron(api_stack, "jobs", "create", body, "--json")
    assert created.returncode == 0, created.stderr
    job_id = json.loads(created.stdout)["job_id"]
    listed = kron(api_stack, "jobs", "list", "--json")
    assert job_id in [j["job_id"] for j in json.loads(listed.stdout)["jobs"]]
    assert json.loads(kron(api_stack, "jobs", "pause", job_id, "--json").stdout)[
        "status"] == "paused"
    table = kron(api_stack, "jobs", "list")
    assert "cli-job" in table.stdout and "paused" in table.stdout
    missing = kron(api_stack, "jobs", "get", "nope")
    assert missing.returncode == 1 and "404" in missing.stderr
    bad = kron(api_stack, "jobs", "create", '{"schedule": "61 * * * *", "target": {"url": '
               '"http://x"}}')
    assert bad.returncode == 1 and "schedule" in bad.stderr
    assert kron(api_stack, "jobs", "delete", job_id).returncode == 0


def test_replay_audit_passes_on_this_suites_history(api_stack) -> None:
    result = kron(api_stack, "replay", "audit", "--json")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, report
    assert report["ok"] is True and report["executions"] > 5 and report["jobs"] > 5


def test_replay_export_and_rebuild_commands(api_stack, tmp_path) -> None:
    out = kron(api_stack, "replay", "export", "--topic", "executions")
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert out.returncode == 0 and lines
    assert all("exec_id" in x["record"] for x in lines if x["record"])
    target = tmp_path / "views"
    done = kron(api_stack, "replay", "rebuild", "--target", str(target), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["entries"] > 10
    assert (target / "CURRENT").exists()
    later = kron(api_stack, "replay", "rebuild", "--target", str(tmp_path / "v2"), "--json",
                 "--since", str(time.time_ns() // 1_000_000 + 3_600_000))
    assert later.returncode == 0, later.stderr
    assert json.loads(later.stdout.strip().splitlines()[-1])["entries"] == 0
