"""What the compiled Avro writers (schemas.writer) and readers (schemas.reader) share:
lines of Python source built up for one schema, with fresh local names and the constants
the source refers to."""

from __future__ import annotations

from typing import Any, Final

# Named types are compiled inline at each use, so records that reuse each other in a chain
# double the code per level; past this a schema is left to fastavro.
MAX_LINES: Final = 20_000


class Unsupported(Exception):
    """The schema uses a type the compiler does not compile."""


class CodeGen:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}
        # Named types by name, as the schema defines them (a later use may name one).
        self._named: dict[str, dict[str, Any]] = {}
        self._n = 0

    def fresh(self, stem: str) -> str:
        self._n += 1
        return f"{stem}{self._n}"

    def const(self, stem: str, value: Any) -> str:
        name = self.fresh(stem)
        self.consts[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        if len(self.lines) >= MAX_LINES:
            raise Unsupported("too much code")
        self.lines.append("    " * depth + line)
