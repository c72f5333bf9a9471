"""An attempt's output: what its target gave back, kept on the attempt (kron.Attempt.output).

For HTTP the status line and the start of the body, for a command the tail of what it wrote
to stdout and stderr, for a Kafka target the partition and offset it was written at. Always
at most `limit` bytes of UTF-8 (KRON_OUTPUT_BYTES): the bytes are cut first and decoded with
errors='replace', and since a replacement character (3 bytes) can stand for a single bad
byte, the text is cut again where it came out longer. Nothing is stripped or escaped here:
the API returns it as a JSON string, which escapes whatever it holds.
"""

from __future__ import annotations

from typing import Final

DEFAULT_OUTPUT_BYTES: Final = 4096
# An execution keeps the outputs of its latest attempts up to this many bytes in all (the
# newest always): 100 retries of 4 KiB each would otherwise make every write of its record
# 400 KiB, near the broker's 1 MB message limit. Also KRON_OUTPUT_BYTES's ceiling.
EXECUTION_OUTPUT_BUDGET: Final = 65_536


def head(data: bytes, limit: int) -> str:
    """The first bytes of `data` as text of at most `limit` UTF-8 bytes."""
    if len(data) <= limit and data.isascii():  # the common answer: one copy, no checks
        return data.decode("ascii")
    text = data[:limit].decode("utf-8", "replace")
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    # Valid UTF-8 cut at a byte: "ignore" drops only the character cut in two, at the end.
    return encoded[:limit].decode("utf-8", "ignore")


def tail(data: bytes, limit: int) -> str:
    """The last bytes of `data` as text of at most `limit` UTF-8 bytes."""
    if limit <= 0:
        return ""
    if len(data) <= limit and data.isascii():
        return data.decode("ascii")
    text = data[-limit:].decode("utf-8", "replace")
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    # The cut character is at the start now, where "ignore" drops its continuation bytes.
    return encoded[-limit:].decode("utf-8", "ignore")


def http(version: str, status: int, reason: bytes, body: bytes, limit: int) -> str:
    """`HTTP/1.1 200 OK`, a newline and the body's first bytes (the line alone for an empty
    body). The client reads at most `limit` bytes of the body, so this copies little."""
    found = _lines.get((status, reason, version))
    if found is None:
        found = _status_line(version, status, reason)
    text = found[1]
    # The common answer: a seen ASCII line and a short ASCII body, one lookup and a decode.
    if text is not None and body and len(text) + len(body) <= limit and body.isascii():
        return text + body.decode("ascii")
    return head(found[0] + b"\n" + body if body else found[0], limit)


# Targets answer with a few status lines over and over: each is built once (bounded), with
# the line and its newline as text when it is ASCII.
_LINES_MAX: Final = 1024
_REASON_KEPT: Final = 64
_lines: dict[tuple[int, bytes, str], tuple[bytes, str | None]] = {}


def _status_line(version: str, status: int, reason: bytes) -> tuple[bytes, str | None]:
    line = b"HTTP/%s %d %s" % (version.encode("ascii", "replace"), status, reason)
    found = (line, line.decode("ascii") + "\n" if line.isascii() else None)
    if len(reason) <= _REASON_KEPT:  # a server's odd phrases don't fill the cache
        if len(_lines) >= _LINES_MAX:
            _lines.clear()
        _lines[(status, reason, version)] = found
    return found


def kafka(topic: str, partition: int, offset: int, limit: int) -> str:
    """Where a Kafka target's record was written, as the broker acknowledged it."""
    return head(f"topic {topic} partition {partition} offset {offset}".encode(), limit)


def utf8_len(text: str) -> int:
    """Bytes of `text` in UTF-8; an ASCII str is counted without encoding it."""
    return len(text) if text.isascii() else len(text.encode())
