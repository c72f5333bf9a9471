"""The operator's command registry: loading, and what a tenant's target may fill in."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.domain.commands import CommandRegistry, Limits, Runtime
from streams.domain.errors import PermanentError

FILE = """
[defaults.limits]
cpu_s = 30
open_files = 64

[commands."reports.nightly"]
argv = ["/usr/local/bin/nightly", "--day", "{day}", "--format={format}"]
tenants = ["acme"]
env = ["REPORT_LOCALE"]
max_timeout_s = 600
[commands."reports.nightly".params.day]
pattern = '[0-9]{4}-[0-9]{2}-[0-9]{2}'
[commands."reports.nightly".params.format]
enum = ["csv", "json"]
default = "csv"
[commands."reports.nightly".limits]
cpu_s = 120

[commands."etl.load"]
image = "registry.example/etl:1.4"
runtime = "podman"
argv = ["load", "{table}"]
tenants = ["*"]
[commands."etl.load".params.table]
enum = ["orders", "refunds"]
"""
REGISTRY = CommandRegistry.parse(FILE)


def target(command: str = "reports.nightly", **kw: object) -> dict[str, object]:
    return {"command": command, "args": {"day": "2026-12-01"}, **kw}


def test_argv_is_built_from_the_template_item_by_item() -> None:
    resolved = REGISTRY.resolve("acme", target())
    assert resolved.argv == ("/usr/local/bin/nightly", "--day", "2026-12-01", "--format=csv")
    assert resolved.timeout_s == 600.0
    assert resolved.command.limits == Limits(cpu_s=120, address_space_mb=2048, open_files=64,
                                             processes=512)
    other = REGISTRY.resolve("acme", target(args={"day": "2026-01-02", "format": "json"},
                                            env={"REPORT_LOCALE": "de"}, timeout_s=5))
    assert other.argv[-1] == "--format=json"
    assert other.env == {"REPORT_LOCALE": "de"} and other.timeout_s == 5.0


def test_a_container_entry_names_its_image_and_runtime() -> None:
    resolved = REGISTRY.resolve("globex", {"command": "etl.load", "args": {"table": "orders"}})
    assert resolved.command.runtime is Runtime.PODMAN
    assert resolved.command.image == "registry.example/etl:1.4"
    assert resolved.argv == ("load", "orders")


@pytest.mark.parametrize(("tenant", "tgt", "field"), [
    ("globex", target(), "target.command"),  # not granted
    ("acme", target("nope"), "target.command"),
    ("acme", {"command": "reports.nightly"}, "target.args.day"),  # required
    ("acme", target(args={"day": "2026-12-1"}), "target.args.day"),  # pattern is a fullmatch
    ("acme", target(args={"day": "2026-12-01", "format": "xml"}), "target.args.format"),
    ("acme", target(args={"day": "2026-12-01", "x": "1"}), "target.args.x"),
    ("acme", target(args={"day": "x" * 2000}), "target.args.day"),
    ("acme", target(env={"LD_PRELOAD": "/x.so"}), "target.env.LD_PRELOAD"),
    ("acme", target(timeout_s=601), "target.timeout_s"),
    ("acme", target(timeout_s=True), "target.timeout_s"),
])
def test_refusals_name_the_field(tenant: str, tgt: dict[str, object], field: str) -> None:
    with pytest.raises(PermanentError) as info:
        REGISTRY.resolve(tenant, tgt)
    assert info.value.field == field


def test_no_registry_refuses_and_says_how_to_enable() -> None:
    with pytest.raises(PermanentError, match="KRON_COMMANDS_FILE"):
        CommandRegistry().resolve("acme", target())
    assert CommandRegistry.load(None) == CommandRegistry()


@given(st.text(max_size=40))
def test_a_parameter_value_is_one_argv_item_and_matches_its_pattern(value: str) -> None:
    """Whatever a tenant sends, it either fully matches the operator's pattern and lands in
    exactly the template's item, or is refused: no splitting, no shell, no extra items."""
    try:
        resolved = REGISTRY.resolve("acme", target(args={"day": value}))
    except PermanentError as exc:
        assert exc.field == "target.args.day"
        assert not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value)
        return
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value)
    assert len(resolved.argv) == 4 and resolved.argv[2] == value


@pytest.mark.parametrize(("text", "message"), [
    ('[commands."x"]\nargv = ["a"\ntenants = ["*"]\n', "line 3"),  # TOML names the line
    ('[commands."x"]\nargv = ["/bin/echo", "{y}"]\ntenants = ["*"]\n', "{y}"),
    ('[commands."x"]\nargv = ["/bin/echo"]\n', "tenants"),
    ('[commands."x"]\nargv = []\ntenants = ["*"]\n', "argv"),
    ('[commands."X Y"]\nargv = ["a"]\ntenants = ["*"]\n', "name"),
    ('[commands."x"]\nargv = ["a", "{p}"]\ntenants = ["*"]\n[commands."x".params.p]\n',
     "pattern"),
    ('[commands."x"]\nargv = ["a", "{p}"]\ntenants = ["*"]\n[commands."x".params.p]\nenum = []\n',
     "enum"),
    ('[commands."x"]\nargv = ["a"]\ntenants = ["*"]\nenv = ["PATH"]\n', "PATH"),
    ('[commands."x"]\nargv = ["a"]\ntenants = ["*"]\nimage = "i"\n', "runtime"),
    ('[commands."x"]\nargv = ["a"]\ntenants = ["*"]\nshell = true\n', "shell"),
    ('[commands."x"]\nargv = ["a"]\ntenants = ["*"]\n[commands."x".limits]\ncpu_s = -1\n',
     "cpu_s"),
    ('[commands."x"]\nargv = ["a", "{p}"]\ntenants = ["*"]\n[commands."x".params.p]\n'
     'enum = ["a"]\ndefault = "b"\n', "default"),
])
def test_a_malformed_file_is_refused_naming_the_problem(tmp_path: Path, text: str,
                                                       message: str) -> None:
    path = tmp_path / "commands.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        CommandRegistry.load(path)
    assert str(path) in str(info.value)
