"""Command targets as a hostile tenant would try them, through the real path: a real broker,
a worker and the API as processes, the operator's registry (tests/support/commands.toml).

The worker here holds secrets in its environment, as a production worker does; nothing a job
names may reach them, run a program the operator did not register, or outlive its attempt.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from kron.localkafka import free_ports as _free_ports
from kron.processes import ApiProcess, WorkerProcess
from kron.settings import Settings
from replay.reader import read_topic
from tests.conftest import fresh_settings
from tests.support.stack import Commands, latest_executions, spec, wait_until

pytestmark = pytest.mark.integration

SECRET = f"secret-{uuid.uuid4().hex}"


class Stack:
    def __init__(self, settings: Settings, worker: WorkerProcess, api: ApiProcess,
                 commands: Commands, tmp: Path) -> None:
        self.settings, self.worker, self.api, self.commands, self.tmp = (
            settings, worker, api, commands, tmp)

    def client(self, key: str = "key-acme") -> httpx.Client:
        return httpx.Client(base_url=self.api.url, headers={"X-API-Key": key}, timeout=20)

    def create(self, target: dict[str, Any], key: str = "key-acme",
               **fields: Any) -> httpx.Response:
        with self.client(key) as c:
            return c.post("/v1/jobs", json={
                "name": f"cmd-{uuid.uuid4().hex[:6]}", "run_at": datetime.now(UTC).isoformat(),
                "target": target, **fields})

    def final(self, job_id: str, timeout_s: float = 30) -> dict[str, Any]:
        done = wait_until(lambda: [e for e in latest_executions(self.settings, job_id).values()
                                   if e["state"] in ("succeeded", "failed")], timeout_s)
        assert done, (latest_executions(self.settings, job_id), self.worker.log()[-3000:])
        return dict(done[0])


@pytest.fixture(scope="module")
def cmd_stack(kafka_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("cmd")
    settings = fresh_settings(kafka_cluster, tmp / "data")
    worker = WorkerProcess(settings, "w1", tmp)
    # What a production worker holds: a broker password, and some other secret of the host.
    worker.env |= {"KRON_KAFKA_SASL_PASSWORD": SECRET, "DATABASE_URL": f"postgres://{SECRET}"}
    worker.start()
    api = ApiProcess(settings, tmp, _free_ports(1)[0])
    commands = Commands(settings)
    try:
        api.start()
        stack = Stack(settings, worker, api, commands, tmp)
        # Ready once the worker runs a registered command.
        warm = tmp / "warm.txt"
        r = stack.create({"type": "command", "command": "test.append",
                          "args": {"out": str(warm)}})
        assert r.status_code == 201, r.text
        assert wait_until(warm.exists, 90), (
            [(e["state"], e["last_error"]) for e in
             latest_executions(settings, r.json()["job_id"]).values()], worker.log()[-3000:])
        yield stack
    finally:
        api.stop()
        worker.stop()
        commands.close()


def test_a_command_sees_none_of_the_workers_secrets(cmd_stack: Stack) -> None:
    out = cmd_stack.tmp / f"env-{uuid.uuid4().hex[:6]}.txt"
    r = cmd_stack.create({"type": "command", "command": "test.env", "args": {"out": str(out)},
                          "env": {"GREETING": "hi"}})
    assert r.status_code == 201, r.text
    assert cmd_stack.final(r.json()["job_id"])["state"] == "succeeded"
    text = out.read_text()
    assert SECRET not in text
    names = {line.split("=", 1)[0] for line in text.splitlines() if "=" in line}
    assert names <= {"PATH", "LANG", "HOME", "PWD", "SHLVL", "_", "GREETING", "KRON_EXEC_ID",
                     "KRON_JOB_ID", "KRON_ATTEMPT", "KRON_SCHEDULED_FOR", "HOME_IS_DIR"}, names
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert env["GREETING"] == "hi" and env["KRON_JOB_ID"] == r.json()["job_id"]
    assert env["HOME_IS_DIR"] == "yes"
    assert not os.path.isdir(env["HOME"])  # the attempt's scratch HOME is gone


def test_a_grandchild_is_killed_at_the_timeout(cmd_stack: Stack) -> None:
    pidfile = cmd_stack.tmp / f"pid-{uuid.uuid4().hex[:6]}"
    r = cmd_stack.create({"type": "command", "command": "test.sleeper",
                          "args": {"pidfile": str(pidfile)}, "timeout_s": 2},
                         retry={"max_attempts": 1})
    assert r.status_code == 201, r.text
    final = cmd_stack.final(r.json()["job_id"])
    assert final["state"] == "failed" and "timed out" in final["last_error"]
    pid = int(pidfile.read_text())

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"

    assert wait_until(gone, 10), f"grandchild {pid} of the timed-out command still runs"


@pytest.mark.parametrize(("target", "field"), [
    ({"type": "command", "argv": ["/bin/sh", "-c", "env"]}, "target.argv"),
    ({"type": "command", "image": "alpine:3"}, "target.image"),
    ({"type": "command", "command": "rm"}, "target.command"),
    ({"type": "command", "command": "globex.only"}, "target.command"),
    ({"type": "command", "command": "test.exit", "args": {"code": "1; id"}}, "target.args.code"),
    ({"type": "command", "command": "test.exit"}, "target.args.code"),
    ({"type": "command", "command": "test.env", "args": {"out": "/tmp/x"},
      "env": {"LD_PRELOAD": "/tmp/evil.so"}}, "target.env.LD_PRELOAD"),
])
def test_the_api_refuses_what_the_registry_does_not_grant(cmd_stack: Stack,
                                                          target: dict[str, Any],
                                                          field: str) -> None:
    r = cmd_stack.create(target)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["field"] == field


def test_another_tenant_can_use_only_its_own_commands(cmd_stack: Stack) -> None:
    r = cmd_stack.create({"type": "command", "command": "globex.only"}, key="key-globex")
    assert r.status_code == 201, r.text


def test_a_direct_producers_forbidden_commands_are_dead_lettered_and_nothing_runs(
        cmd_stack: Stack) -> None:
    """kron.commands is trusted with the tenant it names, and still held to the operator's
    grants: a CreateJob naming a program, another tenant's command or another tenant's
    topic, or an UpdateJob with a parameter off its pattern, never arms anything."""
    marker = cmd_stack.tmp / f"direct-{uuid.uuid4().hex[:6]}"
    now = int(time.time() * 1000)
    legacy = f"direct-argv-{uuid.uuid4().hex[:6]}"
    cmd_stack.commands.send("CreateJob", legacy, spec=spec(target={
        "argv": ["/bin/sh", "-c", f"touch {marker}"], "env": {}, "cwd": None,
        "timeout_s": 5.0, "image": None}, run_at_ms=now))
    foreign = f"direct-foreign-{uuid.uuid4().hex[:6]}"
    cmd_stack.commands.send("CreateJob", foreign, spec=spec(
        target={"command": "globex.only"}, run_at_ms=now))
    topic = f"direct-topic-{uuid.uuid4().hex[:6]}"
    cmd_stack.commands.send("CreateJob", topic, spec=spec(
        target={"topic": "globex.payments", "key": None, "value": b"x", "headers": {}},
        run_at_ms=now))
    update = f"direct-update-{uuid.uuid4().hex[:6]}"
    cmd_stack.commands.send("CreateJob", update, spec=spec(
        target={"command": "test.exit", "args": {"code": "0"}}, cron="0 0 1 1 *"))
    cmd_stack.commands.send("UpdateJob", update, spec=spec(
        target={"command": "test.exit", "args": {"code": "0; touch /tmp/x"}},
        cron="0 0 1 1 *"), expected_version=None)

    def letters() -> dict[str, dict[str, Any]]:
        return {e.key.decode(): e.record for e in read_topic(
            cmd_stack.settings.bootstrap_servers, cmd_stack.settings.topic("dead-letters"))
            if e.record and e.key and e.key.decode() in (legacy, foreign, topic, update)}

    found = wait_until(lambda: len(letters()) == 4 and letters(), 30)
    assert found, ({k: r["error"] for k, r in letters().items()},
                   [ln for ln in cmd_stack.worker.log().splitlines() if "direct-" in ln][-10:])
    assert all(r["error_class"] == "validation" for r in found.values())
    assert "can't name a program" in found[legacy]["error"]
    assert "not granted to tenant 'acme'" in found[foreign]["error"]
    assert "target.args.code" in found[update]["error"]
    assert "globex.payments" in found[topic]["error"]
    time.sleep(2)
    assert not marker.exists()
    assert latest_executions(cmd_stack.settings, legacy) == {}
    assert latest_executions(cmd_stack.settings, foreign) == {}
    assert latest_executions(cmd_stack.settings, topic) == {}
