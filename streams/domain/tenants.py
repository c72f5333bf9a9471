"""Each tenant's quotas and share (``KRON_TENANTS_FILE``, TOML).

The file::

    [defaults]                # for tenants not listed; every key optional
    weight = 1                # share of a worker's dispatches (1..1000)
    max_running = 0           # its executions running at once (a worker splits it across
                              # the partitions it owns); 0: unlimited
    dispatch_rate_per_s = 0   # dispatches a second, a token bucket per tenant in each
                              # worker; 0: unlimited
    create_rate_per_s = 200   # API writes a second (a token bucket per tenant)
    create_burst = 400        # that bucket's size; 2 x create_rate_per_s when not given
    max_active_jobs = 100000  # jobs active or paused at once (the API refuses creates over it)
    notify_webhook = "https://hooks.example/kron"  # failure alerts of jobs without a notify
    notify_on = ["failed", "missed"]               # which outcomes; default ["failed"]

    [tenants.acme]            # a listed tenant: what it omits comes from [defaults]
    weight = 4
    max_running = 50

What ``[defaults]`` omits comes from the process's settings (``KRON_TENANT_RATE_PER_S``,
``KRON_TENANT_BURST``, ``KRON_TENANT_MAX_ACTIVE_JOBS``; :class:`TenantQuotas`' own defaults
for the rest); without a file every tenant has those. A section that sets
``create_rate_per_s`` without ``create_burst`` gets a burst of twice its rate.

A malformed file (bad TOML, an unknown section or key, a value of the wrong type or out of
range) raises ValueError naming the file and the line, and the process stops at start
(kron.settings reads the file while it validates).
"""

from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from streams.domain.errors import PermanentError
from streams.domain.notify import WEBHOOK_MAX, Notify, NotifyEvent, parse_events

WEIGHT_MAX: Final = 1000
MAX_RUNNING_MAX: Final = 1_000_000
RATE_MAX: Final = 1e9
COUNT_MAX: Final = 10**9


@dataclass(frozen=True, kw_only=True, slots=True)
class TenantQuotas:
    """What one tenant may do, and its share of a worker's rounds.

    The API enforces ``create_rate_per_s``/``create_burst`` (every write it takes from the
    tenant's keys) and ``max_active_jobs``; the worker ``weight``, ``max_running`` and
    ``dispatch_rate_per_s`` (0: unlimited).
    """

    weight: int = 1
    # 0: unlimited. A cap is opt-in: a capped tenant's slots are not decided ahead of
    # their time (fire-ahead), and a slot over it costs one more execution record.
    max_running: int = 0
    dispatch_rate_per_s: float = 0.0
    create_rate_per_s: float = 200.0
    create_burst: int = 400
    max_active_jobs: int = 100_000
    # The alerts of the tenant's jobs that set no notify of their own (streams/notify/):
    # None, no default. Its events apply only with a webhook.
    notify_webhook: str | None = None
    notify_on: frozenset[NotifyEvent] = frozenset({NotifyEvent.FAILED})

    @property
    def notify(self) -> Notify | None:
        """The tenant's default notify, if it has one."""
        if self.notify_webhook is None:
            return None
        return Notify(webhook=self.notify_webhook, on=self.notify_on)


@dataclass(frozen=True, slots=True)
class _Rule:
    integer: bool
    lo: float
    hi: float
    lo_open: bool = False  # lo itself is refused

    def check(self, value: Any) -> str | None:
        """None if `value` is good, else what it must be."""
        lo, hi = _num(self.lo), _num(self.hi)
        if self.integer:
            ok = isinstance(value, int) and not isinstance(value, bool)
            what = f"an integer in {lo}..{hi}"
        else:
            ok = (isinstance(value, int | float) and not isinstance(value, bool)
                  and math.isfinite(value))
            what = f"a number in ({lo}, {hi}]" if self.lo_open else f"a number in {lo}..{hi}"
        if ok and (value > self.lo or (value == self.lo and not self.lo_open)) and value <= self.hi:
            return None
        return what


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


# In TenantQuotas' field order; the file takes exactly these keys in a section.
RULES: Final[Mapping[str, _Rule]] = {
    "weight": _Rule(True, 1, WEIGHT_MAX),
    "max_running": _Rule(True, 0, MAX_RUNNING_MAX),
    "dispatch_rate_per_s": _Rule(False, 0, RATE_MAX),
    "create_rate_per_s": _Rule(False, 0, RATE_MAX, lo_open=True),
    "create_burst": _Rule(True, 1, COUNT_MAX),
    "max_active_jobs": _Rule(True, 1, COUNT_MAX),
}
# Not numbers: the tenant's default failure alerts (docs/semantics.md, Failure alerts).
NOTIFY_KEYS: Final = ("notify_webhook", "notify_on")
FILE_KEYS: Final = (*RULES, *NOTIFY_KEYS)
assert list(FILE_KEYS) == [f.name for f in fields(TenantQuotas)]
SECTIONS: Final = ("defaults", "tenants")


class _Bad(Exception):
    """A semantic error at a key path of the file; from_toml finds its line."""

    def __init__(self, path: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


@dataclass(frozen=True, kw_only=True, slots=True)
class TenantTable:
    """The quotas of every tenant: the listed ones, and ``defaults`` for the rest."""

    defaults: TenantQuotas = TenantQuotas()
    tenants: Mapping[str, TenantQuotas] = field(default_factory=dict)
    source: str = ""  # the file read, if any

    def quotas(self, tenant: str) -> TenantQuotas:
        """The tenant's quotas: its own section's if listed, else the defaults."""
        return self.tenants.get(tenant, self.defaults)

    @classmethod
    def load(cls, file: Path | None, *, base: TenantQuotas = TenantQuotas()) -> TenantTable:
        """The table in ``file`` (:meth:`from_file`); without a file, ``base`` for everyone."""
        return cls(defaults=base) if file is None else cls.from_file(file, base=base)

    @classmethod
    def from_file(cls, path: Path, *, base: TenantQuotas = TenantQuotas()) -> TenantTable:
        """The table in the TOML file at ``path``; ``base`` is what its [defaults] omits.
        A malformed or unreadable file raises ValueError naming ``KRON_TENANTS_FILE``, the
        file and the line."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise ValueError(f"KRON_TENANTS_FILE {path}: {reason}") from exc
        try:
            return cls.from_toml(text, str(path), base=base)
        except ValueError as exc:
            raise ValueError(f"KRON_TENANTS_FILE {exc}") from exc

    @classmethod
    def from_toml(cls, text: str, source: str = "<tenants>", *,
                  base: TenantQuotas = TenantQuotas()) -> TenantTable:
        """The table a TOML document describes. A malformed one raises ValueError whose
        message starts with ``source`` and the line (``tenants.toml, line 7: ...``)."""
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(_syntax_error(source, text, exc)) from None
        try:
            defaults, tenants = _parse(raw, base)
        except _Bad as bad:
            line = _line_of(text, bad.path)
            where = source if line is None else f"{source}, line {line}"
            raise ValueError(f"{where}: {bad.message}") from None
        return cls(defaults=defaults, tenants=tenants, source=source)


# --- parsing ---------------------------------------------------------------------------------


def _parse(raw: dict[str, Any], base: TenantQuotas
           ) -> tuple[TenantQuotas, dict[str, TenantQuotas]]:
    for key, value in raw.items():
        if key not in SECTIONS:
            kind = "section" if isinstance(value, dict) else "key"
            raise _Bad((key,), f"unknown {kind} {_name((key,))!r} at the top level "
                               f"(the file has [defaults] and [tenants.<name>] sections)"
                               f"{_hint(key, SECTIONS)}")
    defaults = _section(_table(raw.get("defaults", {}), ("defaults",)), ("defaults",), base)
    tenants: dict[str, TenantQuotas] = {}
    for name, body in _table(raw.get("tenants", {}), ("tenants",)).items():
        path = ("tenants", name)
        if not name.strip():
            raise _Bad(path, "a tenant's name can't be blank")
        tenants[name] = _section(_table(body, path), path, defaults)
    return defaults, tenants


def _table(value: Any, path: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(path, f"{_name(path)} must be a table ([{_name(path)}]), not "
                         f"{_toml_type(value)}")
    return value


def _section(body: dict[str, Any], path: tuple[str, ...], inherit: TenantQuotas
             ) -> TenantQuotas:
    """A section's quotas over `inherit` (a tenant's over the defaults, the defaults over
    the settings')."""
    values: dict[str, Any] = {}
    for key, value in body.items():
        where = (*path, key)
        if key in NOTIFY_KEYS:
            values[key] = _notify_value(key, value, where)
            continue
        rule = RULES.get(key)
        if rule is None:
            raise _Bad(where, f"{_name(path)}: unknown key {key!r} (one of "
                              f"{', '.join(FILE_KEYS)}){_hint(key, FILE_KEYS)}")
        wanted = rule.check(value)
        if wanted is not None:
            raise _Bad(where, f"{_name(where)} must be {wanted}; got {_shown(value)}")
        values[key] = float(value) if not rule.integer else value
    if "create_rate_per_s" in values and "create_burst" not in values:
        values["create_burst"] = max(1, math.ceil(2 * values["create_rate_per_s"]))
    return replace(inherit, **values)


def _notify_value(key: str, value: Any, where: tuple[str, ...]) -> Any:
    """A notify key's value: an http(s) URL, or a list of the events."""
    if key == "notify_webhook":
        if (not isinstance(value, str) or len(value) > WEBHOOK_MAX
                or not value.lower().startswith(("http://", "https://"))):
            raise _Bad(where, f"{_name(where)} must be an http(s) URL of at most "
                              f"{WEBHOOK_MAX} characters; got {_shown(value)}")
        return value
    try:
        return parse_events(value, field=_name(where))
    except PermanentError as exc:
        raise _Bad(where, f"{exc.message}") from None


def _hint(key: str, known: Any) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _name(path: tuple[str, ...]) -> str:
    """A key path as TOML writes it: tenants.acme.weight, tenants."eu.acme".weight."""
    return ".".join(p if _BARE.fullmatch(p) else json.dumps(p, ensure_ascii=False)
                    for p in path)


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "a date or time"


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return repr(value)
    return _toml_type(value)


# --- lines -------------------------------------------------------------------------------------

_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_AT_END = " (at end of document)"
_HEADER = re.compile(r"\[\[?(?P<key>.+?)\]\]?\s*(?:#.*)?")
_ASSIGNED = re.compile(r"(?P<key>[^=]+?)\s*=")


def _syntax_error(source: str, text: str, exc: tomllib.TOMLDecodeError) -> str:
    """tomllib's message, its position moved to the front: `file, line 3, column 7: ...`."""
    message = str(exc)
    at = _AT.search(message)
    if at is None:
        if message.endswith(_AT_END):  # an unfinished value: named at the file's last line
            last = max((n for n, line in enumerate(text.splitlines(), 1) if line.strip()),
                       default=1)
            return (f"{source}, line {last}: invalid TOML at the end of the file: "
                    f"{message.removesuffix(_AT_END)}")
        return f"{source}: invalid TOML: {message}"
    return (f"{source}, line {at.group(1)}, column {at.group(2)}: invalid TOML: "
            f"{message[:at.start()]}")


def _line_of(text: str, path: tuple[str, ...]) -> int | None:
    """The first line that defines `path` (a table header or a key), else the closest
    enclosing path's; None if none is found. A scan line by line: a header sets the table,
    and a line that parses as TOML on its own defines the keys it holds under it."""
    found: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        header = _HEADER.fullmatch(stripped)
        if header is not None:
            key = _dotted(header["key"])
            if key is not None:
                table = key
                _note(found, table, number)
                continue
        try:
            parsed = tomllib.loads(stripped)
        except tomllib.TOMLDecodeError:
            # The first line of a multi-line value (its key), or a line inside one.
            assigned = _ASSIGNED.match(stripped)
            key = None if assigned is None else _dotted(assigned["key"])
            if key is not None:
                _note(found, table + key, number)
            continue
        for leaf in _paths(parsed):
            _note(found, table + leaf, number)
    for end in range(len(path), 0, -1):
        if path[:end] in found:
            return found[path[:end]]
    return None


def _dotted(key: str) -> tuple[str, ...] | None:
    """A header's dotted key as its parts, as TOML reads them (quotes, escapes)."""
    try:
        parsed = tomllib.loads(f"{key} = 0")
    except tomllib.TOMLDecodeError:
        return None
    parts: list[str] = []
    node: Any = parsed
    while isinstance(node, dict) and len(node) == 1:
        name, node = next(iter(node.items()))
        parts.append(name)
    return tuple(parts)


def _paths(node: dict[str, Any]) -> Iterator[tuple[str, ...]]:
    """Every key path in a parsed line, tables (inline or dotted) and their keys."""
    for key, value in node.items():
        yield (key,)
        if isinstance(value, dict):
            for inner in _paths(value):
                yield (key, *inner)


def _note(found: dict[tuple[str, ...], int], path: tuple[str, ...], number: int) -> None:
    for end in range(1, len(path) + 1):
        found.setdefault(path[:end], number)
