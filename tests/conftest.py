"""Test-wide fixtures. The integration fixtures start a REAL Kafka broker on free ports."""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from kron import localkafka
from kron.settings import Settings
from kron.topics import create_topics

REPO = Path(__file__).resolve().parent.parent

# No speed in an assertion: hypothesis's per-example deadline (200 ms) failed property tests
# whenever the two cores were busy with a broker and workers, which says nothing of the code.
hypothesis_settings.register_profile("kron", deadline=None)
hypothesis_settings.load_profile("kron")
# The operator's command registry of the integration tests.
COMMANDS_FILE = REPO / "tests" / "support" / "commands.toml"


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[localkafka.Cluster]:
    """One single-node KRaft broker for the whole session, on free ports, then stopped."""
    root = REPO / ".kron" / f"test-broker-{os.getpid()}"
    shutil.rmtree(root, ignore_errors=True)
    cluster = localkafka.Cluster.plan_free_ports(root=root, size=1)
    # A SIGTERM (CI timeout, Ctrl-C from make) unwinds through the finalizers below, so the
    # broker never outlives the test run.
    signal.signal(signal.SIGTERM, lambda *_: pytest.exit("terminated", returncode=143))
    localkafka.start(cluster)
    try:
        yield cluster
    finally:
        localkafka.stop(cluster)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def kafka_settings(kafka_cluster: localkafka.Cluster, tmp_path: Path) -> Settings:
    """Settings with a topic prefix of its own, so tests never see each other's records."""
    return fresh_settings(kafka_cluster, tmp_path / "data")


def fresh_settings(cluster: localkafka.Cluster, data_dir: Path, **overrides: object) -> Settings:
    fields: dict[str, object] = {
        "bootstrap_servers": cluster.bootstrap_servers,
        "topic_prefix": f"t{uuid.uuid4().hex[:10]}",
        "partitions": 4,
        "data_dir": data_dir,
        "api_keys": "acme=key-acme,globex=key-globex",
        "allow_private_targets": True,
        "commands_file": COMMANDS_FILE,
        **overrides,
    }
    settings = Settings(**fields)  # type: ignore[arg-type]
    create_topics(settings)
    return settings
