"""A real Apache Kafka broker (KRaft), fetched from Maven Central and run by the project.

There is no Docker engine on the machines kron is developed on, so the broker runs as plain
JVM processes. One node for `make up` and most tests; three nodes (RF 3, min ISR 2) for the
replication and fault tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kron.errors import SetupError

REPO_ROOT = Path(__file__).resolve().parent.parent
POM = REPO_ROOT / "infra" / "kafka" / "pom.xml"
LIBS = REPO_ROOT / "infra" / "kafka" / "target" / "libs"
LOG4J_CONFIG = REPO_ROOT / "infra" / "kafka" / "log4j2.properties"
CLUSTER_ID_FILE = "cluster.id"


@dataclass(frozen=True, kw_only=True, slots=True)
class Node:
    node_id: int
    broker_port: int
    controller_port: int
    data_dir: Path

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "log"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def stdout_file(self) -> Path:
        return self.data_dir / "broker.out"


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """The layout of a local cluster: where each node listens and keeps its data."""

    root: Path
    nodes: tuple[Node, ...] = field(default_factory=tuple)

    @classmethod
    def plan(cls, *, root: Path, size: int = 1, base_port: int = 9092) -> Cluster:
        if size not in (1, 3):
            raise SetupError(f"a local cluster has 1 or 3 nodes, not {size}")
        nodes = tuple(
            Node(
                node_id=i + 1,
                broker_port=base_port + 2 * i,
                controller_port=base_port + 2 * i + 1,
                data_dir=root / f"node-{i + 1}",
            )
            for i in range(size)
        )
        return cls(root=root, nodes=nodes)

    @classmethod
    def plan_free_ports(cls, *, root: Path, size: int = 1) -> Cluster:
        ports = free_ports(2 * size)
        nodes = tuple(
            Node(
                node_id=i + 1,
                broker_port=ports[2 * i],
                controller_port=ports[2 * i + 1],
                data_dir=root / f"node-{i + 1}",
            )
            for i in range(size)
        )
        return cls(root=root, nodes=nodes)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.broker_port}" for n in self.nodes)

    @property
    def replication_factor(self) -> int:
        return 3 if len(self.nodes) == 3 else 1

    @property
    def min_insync_replicas(self) -> int:
        return 2 if len(self.nodes) == 3 else 1


def free_ports(count: int) -> list[int]:
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


# --- jars -----------------------------------------------------------------------------------


def require_tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SetupError(f"'{name}' was not found on PATH. {hint}")
    return path


def ensure_jars() -> Path:
    """Fetch the broker's jars once; Maven's ~/.m2 cache makes later fetches fast."""
    require_tool("java", "kron's local broker needs Java 17 or newer (a JDK or JRE).")
    if LIBS.is_dir() and any(LIBS.glob("kafka_2.13-*.jar")):
        return LIBS
    mvn = require_tool("mvn", "kron fetches the Kafka broker from Maven Central with Maven.")
    cmd = [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not any(LIBS.glob("kafka_2.13-*.jar")):
        raise SetupError(
            "fetching the Kafka jars from Maven Central failed:\n"
            + (result.stdout + result.stderr)[-2000:]
        )
    return LIBS


def classpath() -> str:
    return os.pathsep.join(str(p) for p in sorted(ensure_jars().glob("*.jar")))


# --- configuration and formatting --------------------------------------------------------------


def server_properties(cluster: Cluster, node: Node) -> str:
    voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in cluster.nodes)
    rf = cluster.replication_factor
    lines = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": voters,
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{node.broker_port},"
            f"CONTROLLER://127.0.0.1:{node.controller_port}"
        ),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(node.log_dir),
        "num.partitions": "1",
        # Topics are created explicitly with their own configs; auto-create hides mistakes.
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": str(rf),
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(cluster.min_insync_replicas),
        "default.replication.factor": str(rf),
        "min.insync.replicas": str(cluster.min_insync_replicas),
        "group.initial.rebalance.delay.ms": "0",
        "log.cleaner.backoff.ms": "1000",
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": str(cluster.min_insync_replicas),
    }
    return "".join(f"{k}={v}\n" for k, v in lines.items())


def _java(main: str, *args: str) -> list[str]:
    return [
        "java",
        "-Xms256m",
        "-Xmx1g",
        "-XX:+UseG1GC",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        "-cp",
        classpath(),
        main,
        *args,
    ]


def cluster_id(cluster: Cluster) -> str:
    path = cluster.root / CLUSTER_ID_FILE
    if path.exists():
        return path.read_text().strip()
    out = subprocess.run(
        _java("kafka.tools.StorageTool", "random-uuid"),
        capture_output=True,
        text=True,
        check=True,
    )
    cid = out.stdout.strip().splitlines()[-1]
    cluster.root.mkdir(parents=True, exist_ok=True)
    path.write_text(cid + "\n")
    return cid


def prepare(cluster: Cluster) -> None:
    """Write configs and format each node once; a formatted node is reused as is."""
    cid = cluster_id(cluster)
    for node in cluster.nodes:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        props = node.data_dir / "server.properties"
        props.write_text(server_properties(cluster, node))
        if (node.log_dir / "meta.properties").exists():
            _check_meta(node, cid)
            continue
        result = subprocess.run(
            _java("kafka.tools.StorageTool", "format", "-t", cid, "-c", str(props)),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise SetupError(
                f"formatting {node.log_dir} failed:\n{(result.stdout + result.stderr)[-1500:]}"
            )


def _check_meta(node: Node, cid: str) -> None:
    text = (node.log_dir / "meta.properties").read_text(errors="replace")
    if f"cluster.id={cid}" not in text or f"node.id={node.node_id}" not in text:
        raise SetupError(
            f"the broker data dir {node.log_dir} belongs to another cluster or is corrupt "
            f"(meta.properties does not match). Reset it with `make reset` "
            f"(deletes {node.data_dir.parent}); topics and jobs in it are lost."
        )


# --- processes ------------------------------------------------------------------------------


def _read_pid(node: Node) -> int | None:
    try:
        pid = int(node.pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _alive(pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it so it reads as dead.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def start(cluster: Cluster, *, timeout_s: float = 90.0) -> None:
    """Start every node that isn't running, then wait until a real client sees the cluster."""
    prepare(cluster)
    for node in cluster.nodes:
        if _read_pid(node) is not None:
            continue
        for port in (node.broker_port, node.controller_port):
            if port_in_use(port):
                raise SetupError(
                    f"port 127.0.0.1:{port} is already in use, so broker node {node.node_id} "
                    "cannot listen on it. Stop what holds it (`make down` stops kron's own "
                    "processes) or pick other ports (KRON_BROKER_PORT)."
                )
        _spawn(node)
    wait_ready(cluster, timeout_s=timeout_s)


def _spawn(node: Node) -> None:
    out = node.stdout_file.open("ab")
    proc = subprocess.Popen(
        [*_java("kafka.Kafka", str(node.data_dir / "server.properties"))],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "LOG_DIR": str(node.data_dir)},
    )
    out.close()
    node.pid_file.write_text(f"{proc.pid}\n")


def wait_ready(cluster: Cluster, *, timeout_s: float) -> None:
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    # Connection-refused noise is expected while the JVM starts; keep the client quiet.
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 2})
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        for node in cluster.nodes:
            if _read_pid(node) is None:
                raise SetupError(_crash_message(node))
        try:
            md = admin.list_topics(timeout=2)
            if len(md.brokers) == len(cluster.nodes):
                return
            last_error = f"{len(md.brokers)} of {len(cluster.nodes)} brokers registered"
        except Exception as exc:  # the client raises KafkaException until the broker is up
            last_error = str(exc)
        time.sleep(0.2)
    raise SetupError(f"the broker did not become ready in {timeout_s:.0f}s: {last_error}")


def _crash_message(node: Node) -> str:
    tail = ""
    if node.stdout_file.exists():
        tail = node.stdout_file.read_text(errors="replace")[-3000:]
    hint = ""
    if any(s in tail for s in ("CorruptRecord", "meta.properties", "InconsistentClusterId",
                               "KafkaStorageException", "Invalid cluster.id")):
        hint = (
            f"\nThe data dir {node.data_dir} looks corrupt. Reset it with `make reset` "
            "(this deletes the local broker's data)."
        )
    return f"broker node {node.node_id} exited during start-up.{hint}\n--- broker.out ---\n{tail}"


def stop(cluster: Cluster, *, grace_s: float = 20.0) -> None:
    """SIGTERM for a clean shutdown, then SIGKILL what is still alive after the grace period."""
    pids = [pid for node in cluster.nodes if (pid := _read_pid(node)) is not None]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for node in cluster.nodes:
        node.pid_file.unlink(missing_ok=True)


def kill_node(node: Node, sig: int = signal.SIGKILL) -> None:
    """Fault injection: signal one node of the cluster."""
    pid = _read_pid(node)
    if pid is not None:
        os.kill(pid, sig)


def restart_node(cluster: Cluster, node: Node, *, timeout_s: float = 90.0) -> None:
    if _read_pid(node) is None:
        _spawn(node)
    wait_ready(cluster, timeout_s=timeout_s)


def running_nodes(cluster: Cluster) -> list[Node]:
    return [n for n in cluster.nodes if _read_pid(n) is not None]


@contextlib.contextmanager
def running(cluster: Cluster) -> Iterator[Cluster]:
    start(cluster)
    try:
        yield cluster
    finally:
        stop(cluster)
