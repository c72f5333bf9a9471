"""`kron bench noisy` end to end, small: tenant A's flood (or steady load) beside tenant B's
critical and normal jobs, and B alone, through the real command. Only the JSON contract
and the counts are checked: never a timing (a shared 2-core host decides those)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
QUANTILES = {"p50", "p99", "max"}


def bench(*args: str, timeout_s: float) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kron", "bench", "noisy", *args, "--broker-warmup", "0",
         "--json"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the bench stops its broker and worker first
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"kron bench noisy took over {timeout_s}s:\n{err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    assert not (REPO / ".kron" / f"bench-{proc.pid}").exists(), "temp dir left behind"
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def check_contract(r: dict[str, Any]) -> None:
    assert r["scenario"] == "noisy"
    for side in ("tenant_b", "alone"):
        for tier in ("critical", "normal"):
            assert set(r[side][tier]["lateness_ms"]) >= QUANTILES, (side, tier)
    assert "time_to_last_ms" in r["tenant_a"]
    assert r["lost"] == 0 and r["duplicates"] == 0, r
    assert r["audit_lost"] == 0 and r["audit_duplicates"] == 0, r["audit"]
    assert r["unexpected"] == 0
    groups = [r["tenant_a"], *r["tenant_b"].values(), *r["alone"].values()]
    assert all(g["executions"] == g["expected"] for g in groups), groups
    assert set(r["ratios"]) >= {"critical_p99", "normal_p99"}
    assert set(r["phases"]) == {"alone", "noisy"}


def test_burst_runs_every_call_of_both_tenants_once() -> None:
    r = bench("--a-jobs", "2000", "--b-jobs", "20", timeout_s=240)
    check_contract(r)
    assert r["mode"] == "burst"
    assert r["tenant_a"]["expected"] == 2000
    assert {t: g["expected"] for t, g in r["tenant_b"].items()} == {"critical": 20, "normal": 20}
    assert r["alone"]["critical"]["tenant"] != r["tenant_b"]["critical"]["tenant"]
    assert r["tenant_b"]["critical"]["priority"] == "critical"


def test_steady_runs_every_slot_of_both_tenants_once() -> None:
    r = bench("--steady", "--seconds", "3", "--a-rate", "100", "--b-rate", "10",
              timeout_s=240)
    check_contract(r)
    assert r["mode"] == "steady"
    assert r["tenant_a"]["expected"] == 300
    assert {t: g["expected"] for t, g in r["tenant_b"].items()} == {"critical": 15, "normal": 15}
