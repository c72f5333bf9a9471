"""/metrics of the API and of a worker, scraped during and after a load through the real
path (`kron api`, the broker, `kron worker`, a loopback target) and read with
prometheus_client's own parser: the worker's executions by tenant and outcome are what
kron.executions records (the history `kron replay audit` judges, which finds nothing wrong),
its attempts and dead letters are what the target answered, and the API counted each
create under its route template."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kron.processes import REPO, clean_environ, settings_env
from streams.metrics_server import PORT_FILE
from tests.integration.conftest import ApiStack
from tests.support.stack import executions, wait_until

pytestmark = pytest.mark.integration

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]
TERMINAL = {"succeeded", "failed", "missed", "skipped", "cancelled"}
# (tenant, path, how many, retry): 50 one-offs due together.
LOAD = [("acme", "/ok", 25, None), ("acme", "/status/400", 10, None),
        ("globex", "/ok", 10, None),
        ("globex", "/status/503,200", 5, {"max_attempts": 3, "backoff": "fixed", "base_s": 0.2})]


def scrape(url: str) -> Samples:
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200, r.text
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def by(samples: Samples, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """A metric's values keyed by the given labels' values."""
    return {tuple(dict(k)[label] for label in labels): v
            for k, v in samples.get(name, {}).items()}


def worker_metrics_url(stack: ApiStack) -> str:
    port_file = stack.worker.data_dir / PORT_FILE
    assert wait_until(port_file.exists, 60), stack.worker.tail()
    return f"http://127.0.0.1:{int(port_file.read_text())}/metrics"


def create_load(stack: ApiStack) -> set[str]:
    due = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
    jobs: set[str] = set()
    for tenant, path, count, retry in LOAD:
        with stack.client(f"key-{tenant}") as c:
            for _ in range(count):
                body: dict[str, Any] = {
                    "name": f"m-{uuid.uuid4().hex[:6]}", "run_at": due,
                    "target": {"type": "http", "url": f"{stack.receiver.url}{path}",
                               "method": "POST"}}
                if retry is not None:
                    body["retry"] = retry
                r = c.post("/v1/jobs", json=body)
                assert r.status_code == 201, r.text
                jobs.add(r.json()["job_id"])
    return jobs


def recorded_ends(stack: ApiStack) -> dict[str, tuple[str, str]]:
    """exec_id -> (tenant, state) of each execution, as its last record in kron.executions
    has it."""
    last: dict[str, tuple[str, str]] = {}
    for rec in executions(stack.settings):
        last[rec["exec_id"]] = (rec["envelope"]["tenant"], str(rec["state"]))
    return last


def test_counters_match_the_recorded_history(api_stack: ApiStack) -> None:
    stack = api_stack
    worker_url = worker_metrics_url(stack)
    jobs = create_load(stack)
    during = scrape(worker_url)
    assert by(during, "kron_partitions_owned") == {(): stack.settings.partitions}
    ended_so_far: list[float] = []

    def all_ended() -> dict[str, tuple[str, str]] | None:
        # Both pages scraped and parsed all through the load; counters only grow.
        ended_so_far.append(sum(scrape(worker_url).get("kron_executions_total", {}).values()))
        assert ended_so_far == sorted(ended_so_far)
        scrape(f"{stack.api.url}/metrics")
        # The topics are this module's own: the load and the fixture's warm-up job.
        ends = recorded_ends(stack)
        done = [state for _, state in ends.values() if state in TERMINAL]
        return ends if len(done) == len(jobs) + 1 else None

    ends = wait_until(all_ended, 90, 0.5)
    assert ends, stack.worker.tail()
    expected = Counter(ends.values())
    after = wait_until(lambda: _settled(worker_url, expected), 30, 0.5)
    assert after, (expected, by(scrape(worker_url), "kron_executions_total",
                                "tenant", "outcome"))
    executions_total = by(after, "kron_executions_total", "tenant", "outcome")
    assert executions_total == {("acme", "succeeded"): 26, ("acme", "failed"): 10,
                                ("globex", "succeeded"): 15}

    attempts = by(after, "kron_attempts_total", "tenant", "outcome")
    assert attempts == {("acme", "succeeded"): 26, ("acme", "permanent"): 10,
                        ("globex", "succeeded"): 15, ("globex", "transient"): 5}
    # Every slot's first call timed once: 50 and the warm-up.
    lateness = by(after, "kron_trigger_lateness_seconds_count", "tenant", "priority")
    assert lateness == {("acme", "normal"): 36, ("globex", "normal"): 15}
    assert by(after, "kron_dead_letters_total", "reason") == {("execution_failed",): 10}
    assert by(after, "kron_attempts_in_flight") == {(): 0}
    assert sum(by(after, "kron_dispatch_queue_depth", "tenant").values()) == 0
    assert by(after, "kron_changelog_ack_seconds_count")[()] > 0
    lag = by(after, "kron_consumer_lag", "topic", "partition")
    assert {t for t, _ in lag} <= {stack.settings.topic("commands"),
                                   stack.settings.topic("signals")}
    assert all(v >= 0 for v in lag.values())
    assert "process_cpu_seconds_total" in after
    _audit_is_clean(stack)
    _api_counted_the_creates(stack)


def _settled(url: str, expected: Counter[tuple[str, str]]) -> Samples | None:
    """The scrape once the worker's counts caught up with what is recorded."""
    samples = scrape(url)
    got = by(samples, "kron_executions_total", "tenant", "outcome")
    return samples if got == dict(expected) else None


def _audit_is_clean(stack: ApiStack) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kron", "replay", "audit", "--json"], cwd=REPO,
        env={**clean_environ(), **settings_env(stack.settings)},
        capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and report["ok"] is True, report
    assert report["executions"] > 0


def _api_counted_the_creates(stack: ApiStack) -> None:
    api = scrape(f"{stack.api.url}/metrics")
    counts = by(api, "kron_api_request_duration_seconds_count", "route", "method", "status")
    # The load's 50 and the fixture's warm-up job.
    assert counts[("/v1/jobs", "POST", "201")] == 51
    assert all("{" in route or route in ("/v1/jobs", "/readyz", "/healthz", "/metrics")
               for route, _, _ in counts), counts
