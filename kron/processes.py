"""kron's own processes as children: THE launcher of `make up` (kron.devstack), the tests, the
fault suite and the benchmarks. Brokers are kron.localkafka's.

- `settings_env(settings)`: the KRON_* variables that give a child the launcher's settings,
  built here and nowhere else.
- `KronProcess`: `python -m kron <args>`, its output appended to a log file; start, signal,
  stop (SIGTERM, then SIGKILL after a grace period), kill, wait, the log, and a readiness
  wait on an HTTP endpoint. `stop_all` stops several side by side.
- `WorkerProcess` and `ApiProcess`: `kron worker` and `kron api` from a Settings, with the
  conventions the callers share: under `log_dir`, `<name>.log` and `<name>-state/` for a
  worker, `api.log` and `api-state/` for the API, which listens on 127.0.0.1:`port`.

Only processes started here are signalled or killed, by their Popen: nothing is looked up
by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Self

from kron.errors import SetupError
from kron.localkafka import REPO_ROOT
from kron.settings import Settings

REPO = REPO_ROOT

# The settings a launcher hands down to its processes. The others come from the environment
# the child inherits (or their defaults); a caller adds more as extra variables.
PASSED: tuple[str, ...] = (
    "bootstrap_servers", "topic_prefix", "partitions", "replication_factor",
    "min_insync_replicas", "kafka_security_protocol", "kafka_sasl_mechanism",
    "kafka_sasl_username", "kafka_sasl_password", "kafka_ssl_ca_file", "kafka_ssl_cert_file",
    "kafka_ssl_key_file", "kafka_ssl_check_hostname", "session_timeout_s", "misfire_grace_s",
    "fire_ahead_s", "standby_replicas", "api_keys", "allow_private_targets",
    "commands_file", "kafka_target_topics", "tenant_rate_per_s", "tenant_burst",
    "tenant_max_active_jobs", "tenants_file", "history_days",
)
# Unset (None) is passed as "" (which these read as unset) so an inherited value can't leak
# in; the other optional settings are left out when unset (a Path can't be empty).
EMPTY_IS_UNSET = frozenset({"commands_file", "tenants_file"})


def env_value(value: object) -> str:
    """A setting as its KRON_* variable spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    get_secret = getattr(value, "get_secret_value", None)
    if callable(get_secret):
        return str(get_secret())
    return str(value)


def settings_env(settings: Settings, names: Iterable[str] = PASSED) -> dict[str, str]:
    """KRON_* variables that give a child process these settings (`names` of them). API keys
    go down hashed: Settings holds nothing else."""
    out: dict[str, str] = {}
    for name in names:
        value = getattr(settings, name)
        if value is None and name not in EMPTY_IS_UNSET:
            continue
        out[f"KRON_{name.upper()}"] = env_value(value)
    return out


def clean_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without any KRON_* variable (the caller's own must not leak in)."""
    return {k: v for k, v in (os.environ if environ is None else environ).items()
            if not k.startswith("KRON_")}


class KronProcess:
    """`python -m kron <args>` as a child process, its output appended to `log_path`.

    `new_session`: in a session of its own, so a terminal's Ctrl-C reaches only the launcher,
    which then stops it in order. `expected_exit` is set once the launcher signals it.
    """

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path, *,
                 cwd: Path | None = None, new_session: bool = False) -> None:
        self.name = name
        self.args = args
        self.command = [sys.executable, "-m", "kron", *args]
        self.env = env
        self.log_path = log_path
        self.cwd = cwd
        self.new_session = new_session
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.expected_exit = False

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command, env=self.env, cwd=self.cwd,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=self.new_session)
        self.started = time.monotonic()
        self.expected_exit = False
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        self.expected_exit = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float | None = None) -> bool:
        """True if it exited (or never started) within the time."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.alive():
            self.signal(signal.SIGKILL)
            self.wait(30)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM; SIGKILL if it has not exited after `grace_s`."""
        if not self.alive():
            return
        self.signal(signal.SIGTERM)
        if not self.wait(grace_s):
            self.kill()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, n: int = 3000) -> str:
        return self.log()[-n:]

    def wait_http(self, url: str, timeout_s: float = 60.0,
                  ok_statuses: tuple[int, ...] = (200,), interval_s: float = 0.3) -> None:
        """Until GET `url` answers one of `ok_statuses`. SetupError, with the log's last
        lines, if the process exits first or the time runs out."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise SetupError(f"{url} never answered: `kron {' '.join(self.args)}` exited "
                                 f"({self.returncode}); {self.log_path}:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=5).status_code in ok_statuses:
                    return
            time.sleep(interval_s)
        raise SetupError(f"{url} did not answer {ok_statuses} within {timeout_s:.0f}s; "
                         f"{self.log_path}:\n{self.tail()}")


def stop_all(procs: Iterable[KronProcess], grace_s: float = 20.0) -> None:
    """SIGTERM all at once (a clean Faust shutdown takes seconds), SIGKILL what is left."""
    procs = list(procs)
    for p in procs:
        p.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        if not p.wait(max(0.1, deadline - time.monotonic())):
            p.kill()


def _env(settings: Settings, base: Mapping[str, str] | None, own: dict[str, str],
         extra: Mapping[str, str]) -> dict[str, str]:
    """The base environment (the launcher's own by default), the settings, the process's
    own variables, then the caller's extra ones, each over the one before."""
    return {**(os.environ if base is None else base), "PYTHONPATH": str(REPO),
            **settings_env(settings), **own, **extra}


class WorkerProcess(KronProcess):
    """`kron worker` named `name` (its KRON_WORKER_ID), state in `<log_dir>/<name>-state/`."""

    def __init__(self, settings: Settings, name: str, log_dir: Path, *,
                 base_env: Mapping[str, str] | None = None, new_session: bool = False,
                 env: Mapping[str, str] | None = None) -> None:
        self.data_dir = log_dir / f"{name}-state"
        super().__init__(name, ["worker"], _env(settings, base_env, {
            "KRON_DATA_DIR": str(self.data_dir), "KRON_WORKER_ID": name}, env or {}),
            log_dir / f"{name}.log", cwd=REPO, new_session=new_session)


class ApiProcess(KronProcess):
    """`kron api` on 127.0.0.1:`port`, state in `<log_dir>/api-state/`; `start` returns once
    it is ready."""

    def __init__(self, settings: Settings, log_dir: Path, port: int, *,
                 base_env: Mapping[str, str] | None = None, new_session: bool = False,
                 env: Mapping[str, str] | None = None) -> None:
        self.port = port
        self.data_dir = log_dir / "api-state"
        super().__init__("api", ["api"], _env(settings, base_env, {
            "KRON_DATA_DIR": str(self.data_dir), "KRON_API_HOST": "127.0.0.1",
            "KRON_API_PORT": str(port)}, env or {}),
            log_dir / "api.log", cwd=REPO, new_session=new_session)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait_path: str | None = "/readyz", ok_statuses: tuple[int, ...] = (200,),
              timeout_s: float = 60.0) -> Self:
        """Starts it and waits until GET `wait_path` answers one of `ok_statuses` (None: does
        not wait; `wait_http` later)."""
        super().start()
        if wait_path is not None:
            self.wait_http(f"{self.url}{wait_path}", timeout_s, ok_statuses, interval_s=0.2)
        return self
