"""What a saved result records about the checkout it ran from."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import results


def _repo(tmp_path: Path) -> Path:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    for path in ("streams/app.py", "bench/results/steady.json", "docs/perf/a.png"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("v1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    return tmp_path


def test_saved_results_do_not_make_a_checkout_dirty_but_code_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path)
    monkeypatch.setattr(results, "REPO", repo)
    assert results.machine()["git_dirty"] is False
    (repo / "bench/results/steady.json").write_text("v2\n")
    (repo / "docs/perf/a.png").write_text("v2\n")
    assert results.machine()["git_dirty"] is False
    (repo / "streams/app.py").write_text("v2\n")
    assert results.machine()["git_dirty"] is True
