"""Start-up failures give one clear message; three-node mode really replicates."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from kron import localkafka
from kron.errors import SetupError
from kron.settings import Settings
from kron.topics import admin_client, create_topics

pytestmark = pytest.mark.integration


def test_missing_java_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SetupError, match="'java' was not found"):
        localkafka.ensure_jars()


def test_missing_maven_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(localkafka, "LIBS", tmp_path / "no-jars")
    java = Path(localkafka.require_tool("java", "")).parent
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / "java").symlink_to(java / "java")
    with pytest.raises(SetupError, match="'mvn' was not found"):
        localkafka.ensure_jars()


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        cluster = localkafka.Cluster.plan(root=tmp_path / "b", size=1, base_port=port)
        with pytest.raises(SetupError, match=f"127.0.0.1:{port} is already in use"):
            localkafka.start(cluster)
    finally:
        holder.close()
        localkafka.stop(cluster)


def test_corrupt_data_dir_names_the_reset(tmp_path: Path) -> None:
    cluster = localkafka.Cluster.plan_free_ports(root=tmp_path / "b", size=1)
    localkafka.prepare(cluster)
    meta = cluster.nodes[0].log_dir / "meta.properties"
    meta.write_text(meta.read_text().replace("cluster.id=", "cluster.id=X"))
    with pytest.raises(SetupError, match="make reset"):
        localkafka.prepare(cluster)


def test_three_nodes_replicate_with_min_isr_two(tmp_path: Path) -> None:
    cluster = localkafka.Cluster.plan_free_ports(root=tmp_path / "b3", size=3)
    with localkafka.running(cluster):
        settings = Settings(bootstrap_servers=cluster.bootstrap_servers,
                            topic_prefix=f"r{uuid.uuid4().hex[:8]}", partitions=3,
                            replication_factor=3, min_insync_replicas=2)
        create_topics(settings)
        md = admin_client(settings).list_topics(timeout=10)
        assert len(md.brokers) == 3
        for partition in md.topics[settings.topic("commands")].partitions.values():
            assert len(partition.replicas) == 3
            assert len(partition.isrs) == 3
    assert localkafka.running_nodes(cluster) == []
