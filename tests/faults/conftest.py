"""Fixtures of the fault-injection suite, and the reliability report.

Each scenario calls `reliability.record(...)` with what it measured, before it asserts, so a
failing scenario is reported too. At session end the records are merged into
tests/faults/report.json (one entry per scenario, the newest wins, so running one module at a
time keeps the others' figures). `python -m tests.faults.report` renders it into README.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.receiver import Receiver

REPORT = Path(__file__).resolve().parent / "report.json"
_RESULTS: list[dict[str, Any]] = []
FIELDS = ("scenario", "injected", "lost", "duplicates", "max_lateness_ms", "attempts_ok",
          "notes")

pytestmark = pytest.mark.integration


class Reliability:
    def __init__(self, test: str) -> None:
        self.test = test

    def record(self, *, scenario: str, injected: str, lost: int, duplicates: int,
               max_lateness_ms: int | None, attempts_ok: bool, notes: str = "",
               **extra: Any) -> None:
        _RESULTS.append({"scenario": scenario, "injected": injected, "lost": lost,
                         "duplicates": duplicates, "max_lateness_ms": max_lateness_ms,
                         "attempts_ok": attempts_ok, "notes": notes, "test": self.test,
                         "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         **extra})


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Reliability:
    return Reliability(request.node.nodeid)


@pytest.fixture
def fault_receiver() -> Iterator[Receiver]:
    """The loopback target, with the paths that kill the worker calling them."""
    with Receiver() as r:
        yield r


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _RESULTS:
        return
    try:
        old = json.loads(REPORT.read_text())["scenarios"]
    except (OSError, ValueError, KeyError, TypeError):
        old = []
    merged = {r["scenario"]: r for r in old}
    for r in _RESULTS:
        merged[r["scenario"]] = r
    REPORT.write_text(json.dumps({"scenarios": list(merged.values())}, indent=2) + "\n")
