"""docker-compose.yml can't run here (no container engine); it must parse and match the README."""

from __future__ import annotations

from pathlib import Path

import yaml

from kron.cli import app

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_three_brokers_two_workers_api_and_topic_init() -> None:
    services = compose()["services"]
    brokers = [n for n in services if n.startswith("kafka-")]
    workers = [n for n in services if n.startswith("worker-")]
    assert len(brokers) == 3 and len(workers) == 2
    assert {"api", "topic-init"} <= services.keys()
    assert services["topic-init"]["command"] == ["kron", "topics", "create"]


def test_brokers_form_one_quorum_with_rf3_min_isr2() -> None:
    services = compose()["services"]
    ids = set()
    for name in ("kafka-1", "kafka-2", "kafka-3"):
        env = services[name]["environment"]
        ids.add(env["KAFKA_NODE_ID"])
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].count("@") == 3
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert ids == {"1", "2", "3"}


def test_workers_have_their_own_state_volumes() -> None:
    services = compose()["services"]
    volumes = [services[w]["volumes"][0].split(":")[0] for w in ("worker-1", "worker-2")]
    assert len(set(volumes)) == 2
    assert all(v in compose()["volumes"] for v in volumes)


def test_compose_commands_are_real_cli_commands() -> None:
    """Every `kron ...` command the compose file runs exists in the CLI."""
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    groups = {g.name for g in app.registered_groups}
    for service in compose()["services"].values():
        cmd = service.get("command")
        if cmd and cmd[0] == "kron":
            assert cmd[1] in names | groups, cmd


def test_readme_names_the_compose_services() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docker-compose.yml" in readme
    for word in ("3 KRaft brokers", "2 scheduler workers", "topic-init"):
        assert word in readme
