from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kron.settings import Settings
from tests.support.receiver import Receiver
from tests.support.stack import Commands, WorkerProcess


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
