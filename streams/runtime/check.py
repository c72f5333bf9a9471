"""The start-up check: every Faust/aiokafka/mode name kron relies on is there, in the shape
kron uses it. A worker on versions where one moved refuses to start, naming it, instead of
degrading silently (ownership read as empty: nothing would ever dispatch)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Iterable
from typing import Any

from streams.runtime.names import HOOKED_NAMES, PRIVATE_NAMES, Kind, Private

LIBRARIES = ("faust-streaming", "aiokafka", "mode-streaming")


class RuntimeMismatch(RuntimeError):
    """The installed Faust, aiokafka or mode lacks a name kron relies on."""


def owner_class(owner: str) -> type:
    module, _, qualname = owner.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{owner} is not a class")
    return obj


@functools.cache
def _init_sources(cls: type) -> str:
    """The source of every __init__/__post_init__ along the class's MRO."""
    parts = []
    for klass in cls.__mro__:
        for method in ("__init__", "__post_init__"):
            fn = klass.__dict__.get(method)
            if fn is not None:
                # C-implemented: nothing assigned in Python.
                with contextlib.suppress(OSError, TypeError):
                    parts.append(inspect.getsource(fn))
    return "\n".join(parts)


def problem(spec: Private) -> str | None:
    """What is wrong with one name on the installed libraries, or None."""
    where = f"{spec.owner}.{spec.name}"
    try:
        cls = owner_class(spec.owner)
    except (ImportError, AttributeError, TypeError) as exc:
        return f"{spec.owner} cannot be found ({exc!r}), needed for {spec.name}: {spec.why}"
    if spec.kind is Kind.ATTRIBUTE:
        assigned = re.compile(rf"\bself\.{re.escape(spec.name)}\s*(:[^=\n]*)?=(?!=)")
        if hasattr(cls, spec.name) or assigned.search(_init_sources(cls)):
            return None
        return f"{where} is missing (neither on the class nor set in __init__): {spec.why}"
    member = inspect.getattr_static(cls, spec.name, None)
    if member is None:
        return f"{where} is missing: {spec.why}"
    if not inspect.isfunction(member):
        return f"{where} is not a method ({type(member).__name__}): {spec.why}"
    if (spec.kind is Kind.COROUTINE) != inspect.iscoroutinefunction(member):
        want = "an async" if spec.kind is Kind.COROUTINE else "a plain"
        return f"{where} is no longer {want} method: {spec.why}"
    if spec.arity is not None:
        params = list(inspect.signature(member).parameters.values())[1:]
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            return None
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in positional if p.default is p.empty]
        if not len(required) <= spec.arity <= len(positional):
            return (f"{where} takes {len(positional)} positional parameters, kron passes "
                    f"{spec.arity}: {spec.why}")
    return None


def versions() -> str:
    found = []
    for lib in LIBRARIES:
        try:
            found.append(f"{lib} {importlib.metadata.version(lib)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{lib} (not installed)")
    return ", ".join(found)


def verify(specs: Iterable[Private] = PRIVATE_NAMES + HOOKED_NAMES, *,
           objects: Iterable[tuple[Any, str]] = ()) -> None:
    """Raise RuntimeMismatch naming every name that is missing or changed shape. `objects`:
    (object, owner) pairs of the real objects in use, each of which must be an instance of
    its owner class (or the checks of that class say nothing about it)."""
    problems = [p for p in map(problem, specs) if p is not None]
    for obj, owner in objects:
        try:
            cls = owner_class(owner)
        except (ImportError, AttributeError, TypeError) as exc:
            problems.append(f"{owner} cannot be found ({exc!r})")
            continue
        if not isinstance(obj, cls):
            problems.append(f"{type(obj).__module__}.{type(obj).__qualname__} is not a "
                            f"{owner}: kron's checks of that class do not cover it")
    if problems:
        raise RuntimeMismatch(
            f"kron cannot run on the installed {versions()}: "
            + "; ".join(problems)
            + ". Install the versions pinned in pyproject.toml, or port streams/runtime/.")
