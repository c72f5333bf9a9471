"""`make up` / `make down`: the local stack in the foreground, and its clean-up. The broker is
kron.localkafka's, the worker and the API are kron.processes's."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from kron import localkafka
from kron.processes import KronProcess
from kron.settings import Settings, format_api_keys, parse_api_keys
from kron.topics import create_topics

STATE = Path(".kron")
RUN = STATE / "run"
BROKER_ROOT = STATE / "broker"
KEY_FILE = STATE / "dev-api-key"
WORKER_METRICS_PORT = 9101


def dev_api_keys() -> str:
    """KRON_API_KEYS if set; else a random key for tenant `dev`, kept in .kron/dev-api-key."""
    if os.environ.get("KRON_API_KEYS"):
        parse_api_keys(os.environ["KRON_API_KEYS"])
        return os.environ["KRON_API_KEYS"]
    STATE.mkdir(exist_ok=True)
    if not KEY_FILE.exists():
        KEY_FILE.write_text(secrets.token_urlsafe(24) + "\n")
        KEY_FILE.chmod(0o600)
    return f"dev={KEY_FILE.read_text().strip()}"


def worker_metrics_port() -> str:
    """The worker's /metrics port under `make up`: KRON_METRICS_PORT, else 9101."""
    return os.environ.get("KRON_METRICS_PORT") or str(WORKER_METRICS_PORT)


def stack_env(environ: Mapping[str, str], cluster: localkafka.Cluster,
              keys: str) -> dict[str, str]:
    """The environment of the stack's processes: the caller's, and the local broker's."""
    return {
        **environ,
        "KRON_BOOTSTRAP_SERVERS": cluster.bootstrap_servers,
        "KRON_REPLICATION_FACTOR": str(cluster.replication_factor),
        "KRON_MIN_INSYNC_REPLICAS": str(cluster.min_insync_replicas),
        # Processes get the keys hashed: the plaintext stays with the user (.kron/dev-api-key).
        "KRON_API_KEYS": format_api_keys(parse_api_keys(keys)),
        # Locally the targets are mostly on this machine, so private addresses are allowed
        # unless the user says otherwise (KRON_ALLOW_PRIVATE_TARGETS=false tries the guard).
        "KRON_ALLOW_PRIVATE_TARGETS": environ.get("KRON_ALLOW_PRIVATE_TARGETS") or "true",
    }


def spawn(name: str, args: list[str], env: dict[str, str]) -> KronProcess:
    """`kron <args>` logging to .kron/run/<name>.log, its pid in .kron/run/<name>.pid (for
    `make down` from another shell)."""
    proc = KronProcess(name, args, env, RUN / f"{name}.log").start()
    (RUN / f"{name}.pid").write_text(f"{proc.pid}\n")
    return proc


def up(*, nodes: int = 1) -> None:
    keys = dev_api_keys()
    port = int(os.environ.get("KRON_BROKER_PORT", "9092"))
    cluster = localkafka.Cluster.plan(root=BROKER_ROOT, size=nodes, base_port=port)
    print(f"kron: starting a {nodes}-node Kafka broker on {cluster.bootstrap_servers} ...")
    localkafka.start(cluster)
    env = stack_env(os.environ, cluster, keys)
    settings = Settings(bootstrap_servers=cluster.bootstrap_servers)
    procs: list[KronProcess] = []
    try:
        create_topics(settings.model_copy(update={
            "replication_factor": cluster.replication_factor,
            "min_insync_replicas": cluster.min_insync_replicas}))
        procs.append(spawn("worker", ["worker"], {
            **env, "KRON_DATA_DIR": str(STATE / "worker-1"),
            # A fixed place to scrape the worker (the API serves its own /metrics on :8000).
            "KRON_METRICS_PORT": worker_metrics_port()}))
        api = spawn("api", ["api"], env)
        procs.append(api)
        url = f"http://{settings.api_host}:{settings.api_port}"
        api.wait_http(f"{url}/healthz", 60)
        _banner(url, cluster, keys, procs)
        _watch(procs)
    except KeyboardInterrupt:
        print("\nkron: stopping ...")
    finally:
        for proc in reversed(procs):
            proc.stop()
        localkafka.stop(cluster)
        for pid_file in RUN.glob("*.pid"):
            pid_file.unlink()
        print("kron: everything `make up` started is stopped.")


def _banner(url: str, cluster: localkafka.Cluster, keys: str,
            procs: list[KronProcess]) -> None:
    tenant, _, key = keys.split(",")[0].partition("=")
    print(
        f"kron is up.\n"
        f"  broker   {cluster.bootstrap_servers}  (data: {BROKER_ROOT}/)\n"
        f"  worker   pid {procs[0].pid}  (log: {RUN}/worker.log)  metrics "
        f"http://127.0.0.1:{worker_metrics_port()}/metrics\n"
        f"  api      {url}  docs {url}/docs  pid {procs[1].pid}  (log: {RUN}/api.log)\n"
        f"  api key  tenant '{tenant}': {key}"
        + (f"  (saved in {KEY_FILE})" if KEY_FILE.exists() else "")
        + "\nPress Ctrl-C to stop everything (or run `make down` from another shell).",
        flush=True,
    )


def _watch(procs: list[KronProcess]) -> None:
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while not stop:
        for proc in procs:
            if not proc.alive():
                print(f"kron: process {proc.pid} exited with {proc.returncode}; stopping.")
                return
        time.sleep(0.5)


def down() -> None:
    for pid_file in RUN.glob("*.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError):
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            print(f"stopped {pid_file.stem} (pid {pid})")
        pid_file.unlink()
    for root in [BROKER_ROOT, *STATE.glob("test-broker-*")]:
        if root.is_dir():
            sizes = sorted({int(p.name.split("-")[1]) for p in root.glob("node-*")})
            if sizes:
                cluster = localkafka.Cluster.plan(root=root, size=3 if len(sizes) == 3 else 1)
                localkafka.stop(cluster)
    print("kron: nothing of the local stack is running.")


def reset() -> None:
    down()
    for path in [BROKER_ROOT, *STATE.glob("worker-*"), *STATE.glob("test-broker-*"),
                 STATE / "data"]:
        shutil.rmtree(path, ignore_errors=True)
    print("kron: local broker data and worker state deleted.")
