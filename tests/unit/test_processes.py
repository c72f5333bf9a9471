"""kron.processes: the environment a launcher gives `kron worker` and `kron api`, and the
life of a KronProcess (start, readiness, stop, kill, log)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from kron.errors import SetupError
from kron.processes import (
    ApiProcess,
    KronProcess,
    WorkerProcess,
    clean_environ,
    settings_env,
    stop_all,
)
from kron.settings import Settings, hash_api_key

COMMANDS = Path(__file__).resolve().parents[1] / "support" / "commands.toml"


def settings(**fields: object) -> Settings:
    base: dict[str, object] = {
        "bootstrap_servers": "127.0.0.1:19092", "topic_prefix": "tp", "partitions": 3,
        "api_keys": "acme=k1,acme:read=k2", "allow_private_targets": True,
        "kafka_target_topics": "acme=shared.*", "commands_file": COMMANDS,
        "session_timeout_s": 6.0, **fields}
    return Settings(**base)  # type: ignore[arg-type]


def test_a_child_reading_the_env_gets_the_same_settings(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    s = settings(tenant_burst=7, replication_factor=3, min_insync_replicas=2)
    for name in list(os.environ):
        if name.startswith("KRON_"):
            monkeypatch.delenv(name)
    for name, value in settings_env(s).items():
        monkeypatch.setenv(name, value)
    child = Settings()
    for field in ("bootstrap_servers", "topic_prefix", "partitions", "api_keys",
                  "allow_private_targets", "kafka_target_topics", "commands_file",
                  "session_timeout_s", "tenant_burst", "replication_factor",
                  "min_insync_replicas"):
        assert getattr(child, field) == getattr(s, field), field


def test_the_env_spells_what_the_launchers_pass() -> None:
    env = settings_env(settings())
    assert env["KRON_ALLOW_PRIVATE_TARGETS"] == "true"
    assert env["KRON_KAFKA_TARGET_TOPICS"] == "acme=shared.*"
    assert env["KRON_COMMANDS_FILE"] == str(COMMANDS)
    # Keys go down hashed, each with its scope.
    assert env["KRON_API_KEYS"] == f"acme={hash_api_key('k1')},acme:read={hash_api_key('k2')}"
    off = settings_env(settings(allow_private_targets=False, commands_file=None))
    assert off["KRON_ALLOW_PRIVATE_TARGETS"] == "false"
    assert off["KRON_COMMANDS_FILE"] == ""  # unset, over an inherited value
    assert "KRON_KAFKA_SSL_CA_FILE" not in off  # unset optional paths are left out


def test_worker_and_api_processes(tmp_path: Path) -> None:
    s = settings()
    w = WorkerProcess(s, "w7", tmp_path, base_env={"PATH": "/bin", "KRON_LOG_LEVEL": "X"},
                      env={"KRON_LOCAL_TICKS": "false"})
    assert w.args == ["worker"] and w.log_path == tmp_path / "w7.log"
    assert w.data_dir == tmp_path / "w7-state"
    assert w.env["KRON_DATA_DIR"] == str(w.data_dir) and w.env["KRON_WORKER_ID"] == "w7"
    assert w.env["KRON_LOCAL_TICKS"] == "false" and w.env["PATH"] == "/bin"
    assert w.env["KRON_LOG_LEVEL"] == "X"  # the base environment is kept
    api = ApiProcess(s, tmp_path, 18_123, base_env=clean_environ({"KRON_X": "1", "A": "b"}))
    assert api.url == "http://127.0.0.1:18123" and api.env["KRON_API_PORT"] == "18123"
    assert api.env["KRON_DATA_DIR"] == str(tmp_path / "api-state")
    assert "KRON_X" not in api.env and api.env["A"] == "b"


def python(tmp_path: Path, code: str, name: str = "p") -> KronProcess:
    """A KronProcess running `python -c code` instead of `python -m kron` (the same
    handling; no broker needed)."""
    proc = KronProcess(name, [], {"PATH": "/usr/bin:/bin"}, tmp_path / f"{name}.log")
    proc.command = [sys.executable, "-c", code]
    return proc


def test_stop_kill_and_log(tmp_path: Path) -> None:
    ignores = python(tmp_path, "import signal, time\nsignal.signal(signal.SIGTERM, "
                     "signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)", "stubborn")
    polite = python(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(60)", "polite")
    ignores.start()
    polite.start()
    deadline = time.monotonic() + 20
    while not ("up" in ignores.log() and "up" in polite.log()) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the stubborn one ignores SIGTERM
    assert ignores.alive() and polite.alive()
    stop_all([ignores, polite], grace_s=1.0)
    assert not ignores.alive() and not polite.alive()
    assert ignores.returncode == -signal.SIGKILL and polite.returncode == -signal.SIGTERM
    assert ignores.expected_exit and "up" in polite.log()


def test_wait_http_names_the_exit_and_shows_the_log(tmp_path: Path) -> None:
    dead = python(tmp_path, "print('bad setting KRON_X')\nraise SystemExit(2)")
    dead.start()
    with pytest.raises(SetupError, match=r"exited \(2\)[\s\S]*bad setting KRON_X"):
        dead.wait_http("http://127.0.0.1:1/readyz", 10)
