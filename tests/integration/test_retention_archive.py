"""History retention and archive through the real path: a broker, a worker and the API as
processes, with KRON_HISTORY_DAYS set to seconds' worth (0.0001 days: 8.64 s).

A cron job's runs and a DAG run (with its task instances) are archived as Parquet by
`kron replay archive` (as a command, and as a kron job running it: a registered command
target), an archived day is read back with pyarrow, then they expire: the worker tombstones
them in kron.executions, the API answers 404 for each and lists none, and `kron replay
audit` still passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.receiver import Receiver
from kron.localkafka import REPO_ROOT, free_ports
from kron.processes import ApiProcess, WorkerProcess, clean_environ, settings_env
from kron.settings import Settings
from replay.archive import day_of, read_day
from replay.reader import read_topic
from streams.domain.ids import exec_id, task_exec_id
from tests.conftest import fresh_settings
from tests.integration.conftest import ApiStack
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

HISTORY_DAYS = 0.0001  # 8.64 s


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture(scope="module")
def kept(kafka_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiStack]:
    """The API stack of tests/integration/conftest.py, with a history window of seconds."""
    tmp = tmp_path_factory.mktemp("retention")
    settings = fresh_settings(kafka_cluster, tmp / "data", history_days=HISTORY_DAYS)
    with Receiver() as receiver:
        worker = WorkerProcess(settings, "w1", tmp).start()
        api = ApiProcess(settings, tmp, free_ports(1)[0])
        try:
            api.start()
            yield ApiStack(settings=settings, receiver=receiver, worker=worker, api=api)
        finally:
            api.stop()
            worker.stop()


def replay(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**clean_environ(), **settings_env(settings), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "kron", "replay", *args], env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def runs_of(c: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    r = c.get(f"/v1/jobs/{job_id}/runs", params={"limit": 500})
    assert r.status_code == 200, r.text
    return list(r.json()["runs"])


def ran(c: httpx.Client, job_id: str, n: int) -> list[dict[str, Any]]:
    """The job's runs once n of them succeeded."""
    done = wait_until(lambda: len(r := [x for x in runs_of(c, job_id)
                                        if x["state"] == "succeeded"]) >= n and r, 60)
    assert done, runs_of(c, job_id)
    return list(done)


def archive_as_a_job(stack: ApiStack, c: httpx.Client, root: Path, before_ms: int) -> None:
    """`kron replay archive` run by the worker as a one-off job's registered command."""
    env = {"KRON_TEST_PYTHON": sys.executable, "PYTHONPATH": str(REPO_ROOT),
           "KRON_BOOTSTRAP_SERVERS": stack.settings.bootstrap_servers,
           "KRON_TOPIC_PREFIX": stack.settings.topic_prefix}
    r = c.post("/v1/jobs", json={
        "name": f"archive-{uuid.uuid4().hex[:6]}", "run_at": _iso(now_ms()),
        "retry": {"max_attempts": 1}, "lease_s": 120,
        "target": {"type": "command", "command": "test.kron-archive",
                   "args": {"before": str(before_ms), "to": str(root)}, "env": env,
                   "timeout_s": 120}})
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    done = wait_until(lambda: [x for x in runs_of(c, job_id)
                               if x["state"] in ("succeeded", "failed")], 150)
    assert done, stack.worker.log()[-3000:]
    run = c.get(f"/v1/runs/{done[0]['run_id']}").json()
    assert done[0]["state"] == "succeeded", run


def _iso(ms: int) -> str:
    from kron.timefmt import iso
    return iso(ms)


def test_runs_are_archived_then_expire_and_the_audit_still_passes(
        kept: ApiStack, tmp_path: Path) -> None:
    stack = kept
    with stack.client() as c:
        # A one-off DAG run of two tasks: it goes with its task instances.
        url = stack.receiver.url
        slot = now_ms()
        r = c.post("/v1/jobs", json={
            "name": f"dag-{uuid.uuid4().hex[:6]}", "lease_s": 1, "run_at": _iso(slot),
            "dag": {"tasks": [
                {"id": "a", "target": {"type": "http", "method": "POST", "url": f"{url}/ok"}},
                {"id": "b", "target": {"type": "http", "method": "POST", "url": f"{url}/ok"},
                 "depends_on": ["a"]}]}})
        assert r.status_code == 201, r.text
        dag_run = exec_id(r.json()["job_id"], slot)
        dag_ids = {dag_run, task_exec_id(dag_run, "a"), task_exec_id(dag_run, "b")}
        # Every 2 s for 7 s, then completed: its runs stay listed until retention.
        r = c.post("/v1/jobs", json={
            "name": f"kept-{uuid.uuid4().hex[:6]}", "lease_s": 1, "end_at": _iso(now_ms() + 7000),
            "schedule": {"cron": "*/2 * * * * *", "timezone": "UTC"},
            "target": {"type": "http", "method": "POST", "url": f"{stack.receiver.url}/ok"}})
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        ran(c, job_id, 3)
        assert wait_until(lambda: c.get(f"/v1/jobs/{job_id}").json()["status"] == "completed"
                          and all(x["state"] == "succeeded" for x in runs_of(c, job_id)), 60)
        runs = runs_of(c, job_id)
        assert wait_until(lambda: c.get(f"/v1/runs/{dag_run}").json().get("state")
                          == "succeeded", 60)
        ids = {x["run_id"] for x in runs}

        # Archived before retention: by the command, then by a kron job running it (the
        # same files, merged: the rows stay the same).
        root = tmp_path / "archive"
        before = now_ms() + 1000
        time.sleep(1.0)
        out = replay(stack.settings, "archive", "--before", str(before), "--to", str(root),
                     "--json")
        assert out.returncode == 0, out.stderr[-3000:]
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        # Each day archived (the UTC date the runs ended on: today, or two across midnight),
        # read back with pyarrow.
        assert summary["days"] and summary["days"][-1] == day_of(now_ms()), summary
        rows = {r["exec_id"]: r for day in summary["days"] for r in read_day(root, day)}
        assert ids | dag_ids <= set(rows), (ids, dag_ids, sorted(rows))
        assert all(rows[i]["state"] == "succeeded" and rows[i]["job_id"] == job_id
                   for i in ids)
        archive_as_a_job(stack, c, root, before)
        again = {r["exec_id"]: r for day in summary["days"] for r in read_day(root, day)}
        assert {i: again[i] for i in ids} == {i: rows[i] for i in ids}

        # Retention: each run gone from the API, and tombstoned in kron.executions.
        gone = wait_until(lambda: all(c.get(f"/v1/runs/{i}").status_code == 404
                                      for i in ids | dag_ids), 90)
        assert gone, stack.worker.log()[-3000:]
        assert [x for x in runs_of(c, job_id) if x["run_id"] in ids] == []
    tombstoned = {e.key.decode() for e in read_topic(stack.settings.bootstrap_servers,
                                                     stack.settings.topic("executions"))
                  if e.tombstone and e.key is not None}
    assert ids | dag_ids <= tombstoned

    audit = replay(stack.settings, "audit", "--json")
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-2000:]
    report = json.loads(audit.stdout.strip().splitlines()[-1])
    assert report["ok"], report
    assert os.path.isdir(root)
