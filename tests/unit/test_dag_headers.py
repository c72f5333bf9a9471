"""A DAG task instance's attempt names its run and task to the target; an ordinary one does not.

Real runners: the executor and the HTTP runner call bench.receiver.Receiver on loopback, the
command runner starts the worker's sandbox and a real child (the test's own Python), and the
Kafka runner hands its record to a `send` seam (the worker's producer in production).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from bench.receiver import Hit, Receiver
from kron.clock import ManualClock
from streams.domain.commands import CommandRegistry
from streams.domain.ids import task_exec_id
from streams.domain.topics import TopicGrants
from streams.engine.core import Dispatch
from streams.executor import Executor
from streams.targets import AttemptInfo, CommandRunner, HttpRunner, KafkaRunner

RUN = "run-7f3a"
TASK = "extract"
INSTANCE = task_exec_id(RUN, TASK)
DAG_NAMES = ("X-Kron-Run-Id", "X-Kron-Task-Id")


def info(*, dag: bool, tenant: str = "acme") -> AttemptInfo:
    return AttemptInfo(
        exec_id=INSTANCE if dag else "e1", job_id="j1", tenant=tenant,
        scheduled_for_iso="2026-12-01T00:00:00+00:00", attempt=3, fencing_token=3, now_ms=0,
        run_id=RUN if dag else None, task_id=TASK if dag else None)


# --- HTTP ---------------------------------------------------------------------------------------


def wait_hits(receiver: Receiver, job_id: str, count: int) -> list[Hit]:
    return receiver.wait_for(job_id, count, timeout_s=10)


def test_the_executor_passes_run_and_task_to_the_http_target() -> None:
    """Dispatch -> Executor -> AttemptInfo -> HttpRunner -> a real request on loopback."""
    reports: list[tuple[str, dict[str, Any]]] = []

    async def report(partition: int, name: str, record: dict[str, Any], /, **_: Any) -> None:
        reports.append((name, record))

    async def run(url: str) -> None:
        runner = HttpRunner(allow_private=True)
        ex = Executor(runners={"http": runner}, report=report,
                      clock=ManualClock(now_ms=1, monotonic=1.0), worker_id="w",
                      concurrency=2)
        ex.start()
        for exec_id, job, run_id, task_id in ((INSTANCE, "dag-job", RUN, TASK),
                                              ("plain-1", "plain-job", None, None)):
            ex.submit(Dispatch(exec_id=exec_id, job_id=job, tenant="acme",
                               scheduled_for_ms=0, attempt=2, fencing_token=2, lease_s=60.0,
                               target={"url": f"{url}/ok"}, run_id=run_id, task_id=task_id),
                      0)
        for _ in range(500):
            if len(reports) == 2:
                break
            await asyncio.sleep(0.01)
        await ex.stop()
        await runner.close()

    with Receiver() as receiver:
        asyncio.run(run(receiver.url))
        dag_hit, = wait_hits(receiver, "dag-job", 1)
        plain_hit, = wait_hits(receiver, "plain-job", 1)
    assert [name for name, _ in reports] == ["kron.executions.ExecutionSucceeded"] * 2
    headers = dag_hit.headers
    assert headers["X-Kron-Run-Id"] == RUN and headers["X-Kron-Task-Id"] == TASK
    # The idempotency key stays the execution id: the task instance's, stable over attempts.
    assert headers["Idempotency-Key"] == INSTANCE
    assert headers["X-Kron-Attempt"] == "2" and headers["X-Kron-Fencing-Token"] == "2"
    assert not any(name in plain_hit.headers for name in DAG_NAMES)
    assert plain_hit.headers["Idempotency-Key"] == "plain-1"


def test_the_http_runner_sends_no_empty_dag_headers() -> None:
    async def call(url: str) -> None:
        runner = HttpRunner(allow_private=True)
        try:
            for dag in (True, False):
                target = {"url": f"{url}/ok", "headers": {"X-Own": "mine"}}
                out = await runner.run(target, info(dag=dag))
                assert out.ok, out
        finally:
            await runner.close()

    with Receiver() as receiver:
        asyncio.run(call(receiver.url))
        dag_hit, plain_hit = wait_hits(receiver, "j1", 2)
    assert dag_hit.headers["X-Kron-Run-Id"] == RUN
    assert dag_hit.headers["X-Kron-Task-Id"] == TASK
    assert dag_hit.headers["X-Own"] == plain_hit.headers["X-Own"] == "mine"
    # Not present at all: no "X-Kron-Run-Id:" line with an empty value either.
    assert b"x-kron-run" not in plain_hit.head.lower()
    assert b"x-kron-task" not in plain_hit.head.lower()


# --- commands -----------------------------------------------------------------------------------

DUMP = "import json, os, sys\njson.dump(dict(os.environ), open(sys.argv[1], 'w'))\n"


def command_runner(tmp_path: Path) -> CommandRunner:
    (tmp_path / "dump.py").write_text(DUMP)
    registry = CommandRegistry.parse(f"""
[commands.dump]
argv = ["{sys.executable}", "{tmp_path}/dump.py", "{tmp_path}/env.json"]
tenants = ["acme"]
max_timeout_s = 30
""")
    return CommandRunner(registry=registry, scratch_dir=tmp_path / "scratch")


async def test_a_commands_child_sees_its_run_and_task(tmp_path: Path) -> None:
    out = await command_runner(tmp_path).run({"command": "dump"}, info(dag=True))
    assert out.ok, out
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["KRON_RUN_ID"] == RUN and env["KRON_TASK_ID"] == TASK
    assert env["KRON_EXEC_ID"] == INSTANCE and env["KRON_ATTEMPT"] == "3"


async def test_an_ordinary_commands_child_has_no_dag_variables(tmp_path: Path) -> None:
    out = await command_runner(tmp_path).run({"command": "dump"}, info(dag=False))
    assert out.ok, out
    env = json.loads((tmp_path / "env.json").read_text())
    assert "KRON_RUN_ID" not in env and "KRON_TASK_ID" not in env
    assert env["KRON_EXEC_ID"] == "e1"


# --- Kafka --------------------------------------------------------------------------------------


def test_the_kafka_runner_puts_run_and_task_in_the_record_headers() -> None:
    sent: list[tuple[Any, ...]] = []

    async def send(*args: Any) -> None:
        sent.append(args)

    runner = KafkaRunner(send, TopicGrants(own_prefix="kron"))
    target = {"topic": "acme.events", "key": "k", "value": b"v", "headers": {"own": "h"}}
    for dag in (True, False):
        assert asyncio.run(runner.run(target, info(dag=dag))).ok
    (_, _, _, dag_headers), (_, _, _, plain_headers) = sent
    assert dag_headers["X-Kron-Run-Id"] == RUN and dag_headers["X-Kron-Task-Id"] == TASK
    assert dag_headers["Idempotency-Key"] == INSTANCE and dag_headers["own"] == "h"
    assert not any(name in plain_headers for name in DAG_NAMES)
    assert plain_headers["Idempotency-Key"] == "e1"
