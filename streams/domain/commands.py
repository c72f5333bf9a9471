"""The operator's registry of programs that jobs may run (``KRON_COMMANDS_FILE``, TOML).

A tenant never names a program, an argument list, an image or a working directory. It names
a registered command and fills in the parameters the operator declared, each checked against
a pattern or an enum; the argv is built here from the operator's template, item by item,
and runs without a shell. The API checks a target at create, the worker again at every
attempt (the file may have changed, and commands also arrive straight on Kafka).

The file::

    [defaults]                       # optional; limits every entry starts from
    path = "/usr/local/bin:/usr/bin:/bin"
    [defaults.limits]
    cpu_s = 300
    address_space_mb = 2048
    open_files = 1024
    processes = 512

    [commands."reports.nightly"]
    argv = ["/usr/local/bin/nightly-report", "--day", "{day}", "--format={format}"]
    tenants = ["acme"]               # or ["*"]
    env = ["REPORT_LOCALE"]          # variables a job may set
    max_timeout_s = 600
    [commands."reports.nightly".params.day]
    pattern = '[0-9]{4}-[0-9]{2}-[0-9]{2}'
    [commands."reports.nightly".params.format]
    enum = ["csv", "json"]
    default = "csv"
    [commands."reports.nightly".limits]
    cpu_s = 120

    [commands."etl.load"]            # a container: the runtime runs the registered image
    image = "registry.example/etl:1.4"
    runtime = "podman"               # or "docker"
    argv = ["load", "{table}"]
    tenants = ["*"]
    [commands."etl.load".params.table]
    enum = ["orders", "refunds"]
"""

from __future__ import annotations

import enum
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from streams.domain.errors import PermanentError

_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_PARAM: Final = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_ENV: Final = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
_PLACEHOLDER: Final = re.compile(r"\{([^{}]*)\}")
# What a job may hand over, whatever the pattern says.
ARG_MAX_BYTES: Final = 1024
ENV_MAX_BYTES: Final = 4096
# Variables kron sets itself; no entry may hand them to a job.
RESERVED_ENV: Final = frozenset({"PATH", "LANG", "HOME", "KRON_EXEC_ID", "KRON_JOB_ID",
                                 "KRON_ATTEMPT", "KRON_SCHEDULED_FOR"})
DEFAULT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
ENABLE_HINT: Final = ("an operator enables command targets by registering programs in the "
                      "TOML file named by KRON_COMMANDS_FILE (docs/security.md)")


class Runtime(enum.StrEnum):
    """How an entry runs: on the worker host, or as a registered image in a container."""

    HOST = "host"
    DOCKER = "docker"
    PODMAN = "podman"


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """setrlimit values for the child; None leaves the worker's own limit."""

    cpu_s: int | None = 300
    address_space_mb: int | None = 2048
    open_files: int | None = 1024
    # RLIMIT_NPROC counts every process of the child's user: give commands a user of their
    # own (KRON_COMMAND_USER), or a worker's many threads count against it.
    processes: int | None = 512

    def merged(self, raw: Mapping[str, Any], where: str) -> Limits:
        values = {f: getattr(self, f) for f in ("cpu_s", "address_space_mb", "open_files",
                                                 "processes")}
        for key, value in raw.items():
            if key not in values:
                raise ValueError(f"{where}.limits: unknown limit {key!r} (one of "
                                 f"{', '.join(values)})")
            if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"{where}.limits.{key} must be a positive integer")
            values[key] = value
        return Limits(**values)


@dataclass(frozen=True, kw_only=True, slots=True)
class Param:
    name: str
    pattern: re.Pattern[str] | None = None
    choices: tuple[str, ...] = ()
    default: str | None = None

    def check(self, value: str, field_name: str) -> str:
        if not isinstance(value, str):
            raise PermanentError(f"{field_name} must be a string", field=field_name)
        if len(value.encode()) > ARG_MAX_BYTES or "\x00" in value:
            raise PermanentError(f"{field_name} must be at most {ARG_MAX_BYTES} bytes without "
                                 f"NUL", field=field_name)
        if self.choices and value not in self.choices:
            raise PermanentError(f"{field_name} {value!r} is not one of "
                                 f"{', '.join(self.choices)}", field=field_name)
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise PermanentError(f"{field_name} {value!r} does not match the pattern "
                                 f"{self.pattern.pattern!r}", field=field_name)
        return value


@dataclass(frozen=True, kw_only=True, slots=True)
class RegisteredCommand:
    name: str
    argv: tuple[str, ...]
    tenants: frozenset[str]
    params: Mapping[str, Param]
    env: frozenset[str]
    max_timeout_s: float
    limits: Limits
    runtime: Runtime = Runtime.HOST
    image: str | None = None

    def allows(self, tenant: str) -> bool:
        return "*" in self.tenants or tenant in self.tenants


@dataclass(frozen=True, kw_only=True, slots=True)
class Resolved:
    """What the worker runs for one attempt: built only from the registry's entry."""

    command: RegisteredCommand
    argv: tuple[str, ...]
    env: Mapping[str, str]
    timeout_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandRegistry:
    commands: Mapping[str, RegisteredCommand] = field(default_factory=dict)
    path: str = DEFAULT_PATH
    source: str = ""

    @classmethod
    def load(cls, file: Path | None) -> CommandRegistry:
        """The registry in ``file``; no file: an empty registry that refuses every command
        target. A malformed file raises ValueError naming the file and the line or entry."""
        if file is None:
            return cls()
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"KRON_COMMANDS_FILE {file}: {exc.strerror or exc}") from exc
        try:
            return cls.parse(text, source=str(file))
        except tomllib.TOMLDecodeError as exc:  # its message names the line and column
            raise ValueError(f"KRON_COMMANDS_FILE {file}: {exc}") from exc
        except ValueError as exc:
            raise ValueError(f"KRON_COMMANDS_FILE {file}: {exc}") from exc

    @classmethod
    def parse(cls, text: str, *, source: str = "") -> CommandRegistry:
        raw = tomllib.loads(text)
        _only(raw, {"defaults", "commands"}, "the file")
        defaults = _table(raw.get("defaults", {}), "defaults")
        _only(defaults, {"limits", "path"}, "defaults")
        limits = Limits().merged(_table(defaults.get("limits", {}), "defaults.limits"),
                                 "defaults")
        path = defaults.get("path", DEFAULT_PATH)
        if not isinstance(path, str) or "\x00" in path:
            raise ValueError("defaults.path must be a string")
        entries = _table(raw.get("commands", {}), "commands")
        commands = {name: _entry(name, _table(body, f"commands.{name!r}"), limits)
                    for name, body in entries.items()}
        return cls(commands=commands, path=path, source=source)

    def resolve(self, tenant: str, target: Mapping[str, Any]) -> Resolved:
        """The argv, environment and timeout of a job's command target, or a PermanentError
        naming the field that the registry refuses."""
        name = target.get("command")
        if not self.commands:
            raise PermanentError(f"command targets are disabled on this kron: {ENABLE_HINT}",
                                 field="target.command")
        entry = self.commands.get(name) if isinstance(name, str) else None
        if entry is None:
            raise PermanentError(f"target.command {name!r} is not a registered command "
                                 f"({ENABLE_HINT})", field="target.command")
        if not entry.allows(tenant):
            raise PermanentError(f"target.command {name!r} is not granted to tenant "
                                 f"{tenant!r}", field="target.command")
        return Resolved(command=entry, argv=_argv(entry, target.get("args") or {}),
                        env=_env(entry, target.get("env") or {}),
                        timeout_s=_timeout(entry, target.get("timeout_s")))


def _argv(entry: RegisteredCommand, args: Mapping[str, Any]) -> tuple[str, ...]:
    for key in args:
        if key not in entry.params:
            raise PermanentError(f"target.args.{key} is not a parameter of "
                                 f"{entry.name!r} (it takes: "
                                 f"{', '.join(entry.params) or 'none'})",
                                 field=f"target.args.{key}")
    values: dict[str, str] = {}
    for name, param in entry.params.items():
        value = args.get(name, param.default)
        if value is None:
            raise PermanentError(f"target.args.{name} is required by {entry.name!r}",
                                 field=f"target.args.{name}")
        values[name] = param.check(value, f"target.args.{name}")
    # Each template item gets its values substituted in place: one item stays one argv
    # item, whatever a value holds, and nothing goes through a shell.
    return tuple(_PLACEHOLDER.sub(lambda m: values[m.group(1)], item) for item in entry.argv)


def _env(entry: RegisteredCommand, env: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in env.items():
        where = f"target.env.{key}"
        if key not in entry.env:
            raise PermanentError(f"{where}: {entry.name!r} lets a job set only "
                                 f"{', '.join(sorted(entry.env)) or 'no variables'}",
                                 field=where)
        if not isinstance(value, str) or "\x00" in value or len(value.encode()) > ENV_MAX_BYTES:
            raise PermanentError(f"{where} must be a string of at most {ENV_MAX_BYTES} bytes "
                                 f"without NUL", field=where)
        out[key] = value
    return out


def _timeout(entry: RegisteredCommand, value: Any) -> float:
    if value is None:
        return entry.max_timeout_s
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not 0 < value <= entry.max_timeout_s):
        raise PermanentError(f"target.timeout_s must be in (0, {entry.max_timeout_s}] for "
                             f"{entry.name!r}", field="target.timeout_s")
    return float(value)


# --- loading ---------------------------------------------------------------------------------


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a table")
    return value


def _only(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (allowed: "
                         f"{', '.join(sorted(allowed))})")


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a list of strings")
    if any("\x00" in v for v in value):
        raise ValueError(f"{where} must not hold NUL")
    return list(value)


_ENTRY_KEYS: Final = {"argv", "tenants", "params", "env", "max_timeout_s", "limits", "image",
                      "runtime"}


def _entry(name: str, body: dict[str, Any], defaults: Limits) -> RegisteredCommand:
    where = f"commands.{name!r}"
    if not _NAME.fullmatch(name):
        raise ValueError(f"{where}: a command name is [a-z0-9][a-z0-9_.-]{{0,63}}")
    _only(body, _ENTRY_KEYS, where)
    argv = _strings(body.get("argv", []), f"{where}.argv")
    runtime = _runtime(body.get("runtime"), body.get("image"), where)
    if runtime is Runtime.HOST and (not argv or not argv[0]):
        raise ValueError(f"{where}.argv must name the program (a non-empty first item)")
    tenants = _strings(body.get("tenants", []), f"{where}.tenants")
    if not tenants:
        raise ValueError(f"{where}.tenants must list the tenants allowed (or \"*\")")
    params = {p: _param(p, _table(raw, f"{where}.params.{p}"), f"{where}.params.{p}")
              for p, raw in _table(body.get("params", {}), f"{where}.params").items()}
    for item in argv:
        for placeholder in _PLACEHOLDER.findall(item):
            if placeholder not in params:
                raise ValueError(f"{where}.argv uses {{{placeholder}}}, which is not in "
                                 f"{where}.params")
    env = _strings(body.get("env", []), f"{where}.env")
    for var in env:
        if not _ENV.fullmatch(var) or var in RESERVED_ENV:
            raise ValueError(f"{where}.env: {var!r} can't be set by a job (names are "
                             f"[A-Z_][A-Z0-9_]*, and kron sets {', '.join(sorted(RESERVED_ENV))})")
    timeout = body.get("max_timeout_s", 300)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"{where}.max_timeout_s must be a positive number")
    return RegisteredCommand(
        name=name, argv=tuple(argv), tenants=frozenset(tenants), params=params,
        env=frozenset(env), max_timeout_s=float(timeout),
        limits=defaults.merged(_table(body.get("limits", {}), f"{where}.limits"), where),
        runtime=runtime, image=body.get("image"))


def _runtime(raw: Any, image: Any, where: str) -> Runtime:
    if image is None:
        if raw not in (None, "host"):
            raise ValueError(f"{where}.runtime {raw!r} needs an image")
        return Runtime.HOST
    if not isinstance(image, str) or not image or image.startswith("-") or "\x00" in image:
        raise ValueError(f"{where}.image must be an image reference")
    if raw not in ("docker", "podman"):
        raise ValueError(f"{where}.runtime must be \"docker\" or \"podman\" for an image")
    return Runtime(raw)


def _param(name: str, body: dict[str, Any], where: str) -> Param:
    if not _PARAM.fullmatch(name):
        raise ValueError(f"{where}: a parameter name is [a-z_][a-z0-9_]*")
    _only(body, {"pattern", "enum", "default"}, where)
    pattern, choices = body.get("pattern"), body.get("enum")
    if choices is not None and not choices:
        raise ValueError(f"{where}.enum must list at least one value")
    if (pattern is None) == (choices is None):
        raise ValueError(f"{where} needs exactly one of pattern and enum (never free text)")
    compiled = None
    if pattern is not None:
        if not isinstance(pattern, str):
            raise ValueError(f"{where}.pattern must be a string")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{where}.pattern is not a regular expression: {exc}") from exc
    default = body.get("default")
    param = Param(name=name, pattern=compiled,
                  choices=tuple(_strings(choices, f"{where}.enum")) if choices else (),
                  default=default)
    if default is not None:
        try:
            param.check(default, f"{where}.default")
        except PermanentError as exc:
            raise ValueError(str(exc)) from exc
    return param
