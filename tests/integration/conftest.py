from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from bench.receiver import Receiver
from kron.localkafka import free_ports
from kron.processes import ApiProcess, WorkerProcess
from kron.settings import Settings
from tests.conftest import fresh_settings
from tests.support.stack import Commands, spec


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture
def commands(kafka_settings: Settings) -> Iterator[Commands]:
    c = Commands(kafka_settings)
    yield c
    c.close()


@pytest.fixture
def workers(kafka_settings: Settings, tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    """Start with `workers.append(...)`-style helpers: see start_worker."""
    procs: list[WorkerProcess] = []
    yield procs
    for w in procs:
        w.stop()
    for w in procs:
        w.kill()


@pytest.fixture
def start_worker(kafka_settings: Settings, tmp_path: Path, workers: list[WorkerProcess]):
    def start(name: str = "w1") -> WorkerProcess:
        w = WorkerProcess(kafka_settings, name, tmp_path).start()
        workers.append(w)
        return w

    return start


@dataclass
class Stack:
    settings: Settings
    receiver: Receiver
    commands: Commands
    worker: WorkerProcess


@pytest.fixture(scope="module")
def stack(kafka_cluster, tmp_path_factory) -> Iterator[Stack]:
    """One worker shared by a module's tests; each test uses job ids of its own."""
    tmp = tmp_path_factory.mktemp("stack")
    settings = fresh_settings(kafka_cluster, tmp / "data")
    with Receiver() as receiver:
        commands = Commands(settings)
        worker = WorkerProcess(settings, "w1", tmp).start()
        try:
            warm = f"warm-{uuid.uuid4().hex[:8]}"
            commands.send("CreateJob", warm, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                        run_at_ms=time.time_ns() // 1_000_000))
            assert receiver.wait_for(warm, 1, 90), worker.log()[-3000:]
            yield Stack(settings=settings, receiver=receiver, commands=commands, worker=worker)
        finally:
            worker.stop()
            commands.close()


@dataclass
class ApiStack:
    settings: Settings
    receiver: Receiver
    worker: WorkerProcess
    api: ApiProcess

    def client(self, key: str = "key-acme") -> httpx.Client:
        return httpx.Client(base_url=self.api.url, headers={"X-API-Key": key}, timeout=20)


@pytest.fixture(scope="module")
def api_stack(kafka_cluster, tmp_path_factory) -> Iterator[ApiStack]:
    """Broker + a worker + the API as real processes, and a loopback HTTP target."""
    tmp = tmp_path_factory.mktemp("api")
    settings = fresh_settings(kafka_cluster, tmp / "data", tenant_burst=1000)
    with Receiver() as receiver:
        worker = WorkerProcess(settings, "w1", tmp).start()
        api = ApiProcess(settings, tmp, free_ports(1)[0])
        try:
            api.start()
            stack = ApiStack(settings=settings, receiver=receiver, worker=worker, api=api)
            _warm_up(stack)
            yield stack
        finally:
            api.stop()
            worker.stop()


def _warm_up(stack: ApiStack) -> None:
    """Wait until the worker fires, as the `stack` fixture does: the API is ready before the
    worker owns its partitions, and a test's job due 1.5 s after its create once ran 4.3 s
    late on a loaded CI machine while the worker was still joining its group."""
    with stack.client() as c:
        r = c.post("/v1/jobs", json={
            "name": f"warm-{uuid.uuid4().hex[:8]}", "run_at": datetime.now(UTC).isoformat(),
            "target": {"type": "http", "url": f"{stack.receiver.url}/ok", "method": "POST"}})
    assert r.status_code == 201, r.text
    assert stack.receiver.wait_for(r.json()["job_id"], 1, 90), stack.worker.log()[-3000:]
