"""Per-tenant execution quotas through the real path (issue 39): a broker, `kron api` and
`kron worker` processes reading KRON_TENANTS_FILE, and a loopback HTTP target.

- max_running: slots over the cap are `queued` ("tenant concurrency limit"), visible in the
  runs API and `kron jobs runs`, and start as earlier ones finish; jobs a producer writes
  straight to Kafka are held to the same cap; another tenant's slot due with them runs at
  once.
- dispatch_rate_per_s: the tenant's calls keep to the rate within 10% over 20 s.
- the file is read at start: a change takes effect when the worker restarts.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from bench.receiver import Hit, Receiver
from kron.localkafka import free_ports
from kron.processes import ApiProcess, WorkerProcess
from kron.settings import Settings
from tests.conftest import fresh_settings
from tests.support.stack import Commands, executions, spec, wait_until

pytestmark = pytest.mark.integration

HOLD_S = 2.5  # each call of a capped job takes this long at the target


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def quota_settings(cluster: object, tmp: Path, text: str) -> Settings:
    path = tmp / "tenants.toml"
    path.write_text(text, encoding="utf-8")
    return fresh_settings(cluster, tmp / "data", tenants_file=path,  # type: ignore[arg-type]
                          tenant_burst=1000)


def starts(hits: list[Hit]) -> list[float]:
    return sorted(h.recv_ms / 1000 for h in hits)


def create(client: httpx.Client, name: str, url: str, *, at_ms: int) -> str:
    r = client.post("/v1/jobs", json={
        "name": name, "run_at": datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(),
        "target": {"type": "http", "url": url, "method": "POST"},
        "retry": {"max_attempts": 1}})
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"])


@pytest.fixture
def capped(kafka_cluster: object, tmp_path: Path) -> Iterator[tuple[Settings, Receiver,
                                                                     WorkerProcess,
                                                                     ApiProcess]]:
    settings = quota_settings(kafka_cluster, tmp_path, "[tenants.acme]\nmax_running = 2\n")
    with Receiver() as receiver:
        worker = WorkerProcess(settings, "w1", tmp_path).start()
        api = ApiProcess(settings, tmp_path, free_ports(1)[0])
        try:
            api.start()
            yield settings, receiver, worker, api
        finally:
            api.stop()
            worker.stop()


def test_a_tenant_at_its_cap_gets_queued_runs_that_start_as_earlier_ones_finish(
        capped: tuple[Settings, Receiver, WorkerProcess, ApiProcess]) -> None:
    settings, receiver, worker, api = capped
    slow = f"{receiver.url}/slow/{HOLD_S}"
    tag = uuid.uuid4().hex[:6]
    with httpx.Client(base_url=api.url, headers={"X-API-Key": "key-acme"}, timeout=20) as c:
        # Warm up: the worker owns its partitions before the measured slots fall due.
        warm = create(c, f"warm-{tag}", f"{receiver.url}/ok", at_ms=now_ms())
        assert receiver.wait_for(warm, 1, 90), worker.log()[-3000:]
        due = now_ms() + 4000
        ids = [create(c, f"capped-{tag}-{i}", slow, at_ms=due + i) for i in range(4)]
        # Two more of acme's straight onto Kafka: the worker holds them to the same cap.
        commands = Commands(settings)
        try:
            for i in range(2):
                job_id = f"direct-{tag}-{i}"
                commands.send("CreateJob", job_id, spec=spec(target={"url": slow},
                                                              run_at_ms=due + 10 + i))
                ids.append(job_id)
        finally:
            commands.close()
        with httpx.Client(base_url=api.url, headers={"X-API-Key": "key-globex"},
                          timeout=20) as other:
            free = create(other, f"free-{tag}", f"{receiver.url}/ok", at_ms=due)
        # The last of them waits two calls' time: long enough for the CLI to see it.
        queued = wait_until(lambda: _queued_run(c, ids[-1:]), 30)
        assert queued["reason"] == "tenant concurrency limit"
        cli = _cli(api.url, "runs", queued["job_id"])
        assert cli.returncode == 0, cli.stderr
        assert "queued" in cli.stdout and "tenant concurrency limit" in cli.stdout
        stats = c.get("/v1/stats").json()
        assert stats["queued"] >= 1, stats
        hits = {job_id: receiver.wait_for(job_id, 1, 60) for job_id in ids}
        assert all(hits.values()), {j: len(h) for j, h in hits.items()}
        # The other tenant's slot, due with acme's, ran at once.
        (free_hit,) = receiver.wait_for(free, 1, 30)
        assert free_hit.recv_ms - due < 1000 + 2 * HOLD_S * 1000
        times = starts([h for hs in hits.values() for h in hs])
        # Never three calls at once: the (k+2)-th starts after the k-th ended.
        for k in range(len(times) - 2):
            assert times[k + 2] >= times[k] + HOLD_S - 0.05, times
        # Each ran once, and its runs say so, lateness counted from its scheduled time.
        assert [len(receiver.hits_for(j)) for j in ids] == [1] * 6
        runs = wait_until(lambda: _all_succeeded(c, ids), 30)
        assert max(r["lateness_ms"] for r in runs) >= 2 * HOLD_S * 1000 - 100


def _queued_run(c: httpx.Client, ids: list[str]) -> dict[str, object] | None:
    for job_id in ids:
        for run in c.get(f"/v1/jobs/{job_id}/runs").json().get("runs", []):
            if run["state"] == "queued":
                return {**run, "job_id": job_id}
    return None


def _all_succeeded(c: httpx.Client, ids: list[str]) -> list[dict[str, int]] | None:
    runs = [r for j in ids for r in c.get(f"/v1/jobs/{j}/runs").json().get("runs", [])]
    if len(runs) == len(ids) and all(r["state"] == "succeeded" for r in runs):
        return runs
    return None


def _cli(api_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kron", "jobs", *args, "--api", api_url,
                           "--key", "key-acme"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "250"})


RATE = 20.0  # acme's dispatch_rate_per_s
WINDOW_S = 20.0


def test_the_dispatch_rate_holds_within_ten_percent_over_twenty_seconds(
        kafka_cluster: object, tmp_path: Path) -> None:
    settings = quota_settings(kafka_cluster, tmp_path,
                              f"[tenants.acme]\ndispatch_rate_per_s = {RATE}\n")
    with Receiver(keep_heads=False) as receiver:
        worker = WorkerProcess(settings, "w1", tmp_path).start()
        commands = Commands(settings)
        try:
            warm = f"warm-{uuid.uuid4().hex[:6]}"
            commands.send("CreateJob", warm, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                        run_at_ms=now_ms()))
            assert receiver.wait_for(warm, 1, 90), worker.log()[-3000:]
            count = int(RATE * (WINDOW_S + 6))
            due = now_ms() + 3000
            ids = [f"rate-{i:04d}-{uuid.uuid4().hex[:6]}" for i in range(count)]
            for job_id in ids:
                commands.send("CreateJob", job_id, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                              run_at_ms=due))
            wait_until(lambda: sum(1 for j in ids if receiver.hits_for(j)) >= count, 60)
        finally:
            commands.close()
            worker.stop()
        times = starts([h for j in ids for h in receiver.hits_for(j)])
        assert len(times) == count  # none lost, none twice
        # Those held back a second or more said why while they waited (a run shows them
        # queued, reason "dispatch rate"); each ended succeeded with no reason left.
        records = [e for e in executions(settings) if e["job_id"] in set(ids)]
        held = {e["exec_id"] for e in records if e["reason"] == "dispatch rate"}
        assert len(held) > count // 2, len(held)
        last = {e["exec_id"]: e for e in records}
        assert {(e["state"], e["reason"]) for e in last.values()} == {("succeeded", None)}
        # After the bucket's first second's worth, WINDOW_S seconds of calls at the rate.
        steady = [t for t in times if times[int(RATE)] <= t < times[int(RATE)] + WINDOW_S]
        rate = (len(steady) - 1) / (steady[-1] - steady[0])
        assert abs(rate - RATE) <= 0.10 * RATE, (rate, len(steady))


def test_a_change_to_the_tenants_file_takes_effect_when_the_worker_restarts(
        kafka_cluster: object, tmp_path: Path) -> None:
    settings = quota_settings(kafka_cluster, tmp_path, "[tenants.acme]\nmax_running = 1\n")
    with Receiver() as receiver:
        slow = f"{receiver.url}/slow/{HOLD_S}"
        commands = Commands(settings)
        try:
            first = _run_three(settings, receiver, commands, slow, tmp_path, "before")
            # One at a time: each started after the one before ended.
            assert all(b - a >= HOLD_S - 0.05 for a, b in itertools.pairwise(first))
            assert settings.tenants_file is not None
            settings.tenants_file.write_text("[tenants.acme]\nmax_running = 3\n",
                                             encoding="utf-8")
            second = _run_three(settings, receiver, commands, slow, tmp_path, "after")
            # Three at once now: all started before the first of them ended.
            assert second[-1] - second[0] < HOLD_S, second
        finally:
            commands.close()


def _run_three(settings: Settings, receiver: Receiver, commands: Commands, url: str,
               tmp: Path, name: str) -> list[float]:
    worker = WorkerProcess(settings, name, tmp).start()
    try:
        warm = f"warm-{name}-{uuid.uuid4().hex[:6]}"
        commands.send("CreateJob", warm, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                    run_at_ms=now_ms()))
        assert receiver.wait_for(warm, 1, 90), worker.log()[-3000:]
        due = now_ms() + 2000
        ids = [f"{name}-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
        for i, job_id in enumerate(ids):
            commands.send("CreateJob", job_id, spec=spec(target={"url": url}, run_at_ms=due + i))
        hits = [receiver.wait_for(job_id, 1, 60) for job_id in ids]
        assert all(hits), worker.log()[-3000:]
        return starts([h for hs in hits for h in hs])
    finally:
        worker.stop()
