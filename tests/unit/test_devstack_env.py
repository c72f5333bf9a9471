"""The environment `make up` gives its processes (kron.devstack.stack_env)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kron import localkafka
from kron.devstack import stack_env
from kron.settings import Settings, hash_api_key

CLUSTER = localkafka.Cluster.plan(root=Path("/nonexistent"), size=1, base_port=19092)


def test_private_targets_are_allowed_by_default() -> None:
    env = stack_env({"PATH": "/bin"}, CLUSTER, "dev=k")
    assert env["KRON_ALLOW_PRIVATE_TARGETS"] == "true"
    assert env["PATH"] == "/bin"
    assert env["KRON_BOOTSTRAP_SERVERS"] == CLUSTER.bootstrap_servers


@pytest.mark.parametrize("value", ["false", "0", "true"])
def test_a_value_the_user_set_is_kept(value: str) -> None:
    env = stack_env({"KRON_ALLOW_PRIVATE_TARGETS": value}, CLUSTER, "dev=k")
    assert env["KRON_ALLOW_PRIVATE_TARGETS"] == value


def test_false_reaches_the_processes_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in stack_env({"KRON_ALLOW_PRIVATE_TARGETS": "false"}, CLUSTER,
                                 "dev=k").items():
        if name.startswith("KRON_"):
            monkeypatch.setenv(name, value)
    assert Settings().allow_private_targets is False


def test_processes_get_hashed_keys_with_their_scopes() -> None:
    env = stack_env({}, CLUSTER, "dev=k1,dev:read=k2")
    assert env["KRON_API_KEYS"] == f"dev={hash_api_key('k1')},dev:read={hash_api_key('k2')}"
