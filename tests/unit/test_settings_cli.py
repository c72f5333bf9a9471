from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from kron.cli import app
from kron.settings import ApiKey, Scope, Settings, hash_api_key, parse_api_keys


def test_settings_read_the_kron_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRON_BOOTSTRAP_SERVERS", "h1:1,h2:2")
    monkeypatch.setenv("KRON_PARTITIONS", "12")
    monkeypatch.setenv("KRON_API_KEYS", "a=k1, b=k2")
    monkeypatch.setenv("KRON_ALLOW_PRIVATE_TARGETS", "true")
    s = Settings()
    assert s.bootstrap_servers == "h1:1,h2:2"
    assert s.partitions == 12
    assert s.api_key_entries == (ApiKey(tenant="a", scope=Scope.WRITE, key=hash_api_key("k1")),
                                 ApiKey(tenant="b", scope=Scope.WRITE, key=hash_api_key("k2")))
    assert s.allow_private_targets is True


def test_private_targets_are_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KRON_ALLOW_PRIVATE_TARGETS", raising=False)
    assert Settings().allow_private_targets is False


@pytest.mark.parametrize("raw", ["a", "=k", "a=", "a=k,b"])
def test_bad_api_keys_are_rejected(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_api_keys(raw)
    with pytest.raises(ValidationError):
        Settings(api_keys=raw)


def test_api_keys_never_show_in_repr() -> None:
    assert "sekrit" not in repr(Settings(api_keys="a=sekrit"))


def test_bad_partitions_are_rejected() -> None:
    with pytest.raises(ValidationError):
        Settings(partitions=0)


@pytest.mark.parametrize(
    "cmd",
    [
        ["--help"],
        ["worker", "--help"],
        ["api", "--help"],
        ["topics", "create", "--help"],
        ["dev", "up", "--help"],
    ],
)
def test_cli_help_explains_each_command(cmd: list[str]) -> None:
    result = CliRunner().invoke(app, cmd)
    assert result.exit_code == 0
    assert "Usage" in result.output


def test_top_level_help_lists_the_commands() -> None:
    out = CliRunner().invoke(app, ["--help"]).output
    for name in ("worker", "api", "topics"):
        assert name in out


@pytest.mark.parametrize("replicas", [0, 1, 2])
def test_the_standby_replicas_setting_reaches_the_workers_faust_app(
        replicas: int, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from streams.app import Engine

    s = Settings(standby_replicas=replicas, data_dir=tmp_path)
    faust_app = Engine._build_app(SimpleNamespace(settings=s))  # type: ignore[arg-type]
    assert faust_app.conf.table_standby_replicas == replicas


def test_standby_replicas_default_to_one_and_refuse_a_negative() -> None:
    assert Settings().standby_replicas == 1
    with pytest.raises(ValidationError):
        Settings(standby_replicas=-1)
