"""Run output through the real path: `kron api`, the broker, a worker process (its changelog
writer in its own child process, as by default) with a small KRON_OUTPUT_BYTES, the loopback
HTTP receiver answering with a body (/body/<status>/<n>), the operator's test.chatter command
(tests/support/commands.toml) printing to stdout and stderr, and a Kafka target topic.

Each attempt's output reaches GET /v1/runs/{id} as attempts[].output: the HTTP status line
and the body's start, the command's tail, the Kafka record's place, each within the bound;
another tenant's key sees none of it; `kron jobs run-get` prints it."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from bench.receiver import Receiver, numbered_body
from kron.localkafka import Cluster, free_ports
from kron.processes import ApiProcess, WorkerProcess
from kron.topics import admin_client
from streams.domain.ids import exec_id
from tests.conftest import fresh_settings
from tests.integration.conftest import ApiStack, _warm_up
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

OUTPUT_BYTES = 96
DONE = ("succeeded", "failed")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture(scope="module")
def stack(kafka_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[ApiStack]:
    tmp = tmp_path_factory.mktemp("output")
    settings = fresh_settings(kafka_cluster, tmp / "data", output_bytes=OUTPUT_BYTES)
    env = {"KRON_OUTPUT_BYTES": str(OUTPUT_BYTES)}  # the worker's: it bounds the output
    with Receiver() as receiver:
        worker = WorkerProcess(settings, "w1", tmp, env=env).start()
        api = ApiProcess(settings, tmp, free_ports(1)[0])
        try:
            api.start()
            stack = ApiStack(settings=settings, receiver=receiver, worker=worker, api=api)
            _warm_up(stack)
            yield stack
        finally:
            api.stop()
            worker.stop()


def run_once(stack: ApiStack, target: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A one-off job due now; its run once it ended, as GET /v1/runs/{id} shows it."""
    slot = now_ms()
    with stack.client() as c:
        r = c.post("/v1/jobs", json={"name": f"out-{uuid.uuid4().hex[:6]}",
                                     "run_at": datetime.fromtimestamp(slot / 1000, UTC)
                                     .isoformat(), "target": target, **fields})
        assert r.status_code == 201, r.text
        run_id = exec_id(r.json()["job_id"], slot)

        def ended() -> dict[str, Any] | None:
            got = c.get(f"/v1/runs/{run_id}")
            body: dict[str, Any] = got.json() if got.status_code == 200 else {}
            return body if body.get("state") in DONE else None

        run = wait_until(ended, 60)
    assert run, stack.worker.log()[-3000:]
    return dict(run)


def outputs(run: dict[str, Any]) -> list[str | None]:
    return [a["output"] for a in run["attempts"]]


def within_bound(run: dict[str, Any]) -> None:
    for text in outputs(run):
        assert text is None or len(text.encode()) <= OUTPUT_BYTES, text


def test_an_http_attempt_keeps_its_status_line_and_the_start_of_its_body(
        stack: ApiStack) -> None:
    run = run_once(stack, {"type": "http", "method": "GET",
                           "url": f"{stack.receiver.url}/body/200/5000"})
    assert run["state"] == "succeeded" and run["status_code"] == 200
    line = b"HTTP/1.1 200 OK\n"
    assert outputs(run) == [(line + numbered_body(OUTPUT_BYTES - len(line))).decode()]
    within_bound(run)


def test_each_failed_http_attempt_keeps_its_own_output(stack: ApiStack) -> None:
    run = run_once(stack, {"type": "http", "method": "GET",
                           "url": f"{stack.receiver.url}/body/503/40"},
                   retry={"max_attempts": 2, "backoff": "fixed", "base_s": 0.2})
    assert run["state"] == "failed" and len(run["attempts"]) == 2
    expected = "HTTP/1.1 503 Service Unavailable\n" + numbered_body(40).decode()
    assert outputs(run) == [expected, expected]
    assert [a["outcome"] for a in run["attempts"]] == ["transient", "transient"]


def test_a_command_keeps_the_tail_of_its_stdout_and_stderr(stack: ApiStack) -> None:
    run = run_once(stack, {"type": "command", "command": "test.chatter",
                           "args": {"lines": "300", "code": "0"}})
    assert run["state"] == "succeeded", run
    everything = "".join(f"out line {i}\n" for i in range(300))
    everything += "err: nearly done\nout: the end\n"
    assert outputs(run) == [everything.encode()[-OUTPUT_BYTES:].decode()]
    assert outputs(run)[0].endswith("out line 299\nerr: nearly done\nout: the end\n")


def test_a_failing_command_keeps_its_output_and_its_exit(stack: ApiStack) -> None:
    run = run_once(stack, {"type": "command", "command": "test.chatter",
                           "args": {"lines": "2", "code": "3"}}, retry={"max_attempts": 1})
    assert run["state"] == "failed" and "exited with 3" in run["error"]
    assert outputs(run) == ["out line 0\nout line 1\nerr: nearly done\nout: the end\n"]


def test_a_kafka_target_keeps_the_partition_and_offset_of_its_record(
        stack: ApiStack) -> None:
    topic = f"acme.output-{uuid.uuid4().hex[:8]}"
    admin = admin_client(stack.settings)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    run = run_once(stack, {"type": "kafka", "topic": topic, "value": "hello"})
    assert run["state"] == "succeeded", run
    assert outputs(run) == [f"topic {topic} partition 0 offset 0"]
    consumer = Consumer({"bootstrap.servers": stack.settings.bootstrap_servers,
                         "group.id": f"check-{uuid.uuid4().hex}", "log_level": 2})
    try:  # the record is where the output says
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), 10) == (0, 1)
    finally:
        consumer.close()


def test_output_is_only_visible_to_the_runs_tenant_and_the_cli_prints_it(
        stack: ApiStack) -> None:
    run = run_once(stack, {"type": "http", "method": "GET",
                           "url": f"{stack.receiver.url}/body/200/10"})
    with stack.client("key-globex") as other:
        assert other.get(f"/v1/runs/{run['run_id']}").status_code == 404
    shown = subprocess.run(
        [sys.executable, "-m", "kron", "jobs", "run-get", run["run_id"], "--api",
         stack.api.url, "--key", "key-acme"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "--- attempt 1 output ---\nHTTP/1.1 200 OK\nbody:01234\n" in shown.stdout


def test_the_api_states_outputs_as_json_strings(stack: ApiStack) -> None:
    """The answer is JSON whatever the body held: the receiver's bytes come back as text."""
    run = run_once(stack, {"type": "http", "method": "GET",
                           "url": f"{stack.receiver.url}/body/200/3"})
    with httpx.Client(base_url=stack.api.url, headers={"X-API-Key": "key-acme"}) as c:
        raw = c.get(f"/v1/runs/{run['run_id']}")
    assert raw.headers["content-type"].startswith("application/json")
    assert '"output":"HTTP/1.1 200 OK\\nbod"' in raw.text.replace(": ", ":")
