"""Deterministic identifiers.

Every id is a pure function of what it identifies, so a replayed or duplicated command
derives the same id and downstream dedup (compacted topics, idempotent producers, worker
claim tables) collapses it. Each kind of id hashes under its own blake2b personalisation,
so ids of different kinds never collide even for equal inputs.
"""

from __future__ import annotations

import hashlib
import struct

_DIGEST_BYTES = 16
_length = struct.Struct(">I").pack


def encode_parts(*parts: str | int) -> bytes:
    """Unambiguous byte encoding: type tag + length prefix per part.

    Plain concatenation would make ("a", "1") and ("a1", "") equal, and the tag keeps
    ``"1"`` and ``1`` apart. Ids already in Kafka depend on these exact bytes. Three ids
    per execution: joined chunks instead of a growing bytearray, 1.56 -> 1.16 us for an
    event id's parts.
    """
    chunks: list[bytes] = []
    for part in parts:
        if isinstance(part, str):
            raw = part.encode("utf-8")
            chunks += (b"s", _length(len(raw)), raw)
        elif isinstance(part, int) and not isinstance(part, bool):
            raw = b"%d" % part
            chunks += (b"i", _length(len(raw)), raw)
        else:
            raise TypeError(f"id parts must be str or int, not {type(part).__name__}")
    return b"".join(chunks)


def _digest(person: bytes, *parts: str | int) -> str:
    return hashlib.blake2b(
        encode_parts(*parts), digest_size=_DIGEST_BYTES, person=person
    ).hexdigest()


def exec_id(job_id: str, scheduled_for_ms: int) -> str:
    """Id of the execution of ``job_id`` for the slot at ``scheduled_for_ms``.

    Deriving it from the slot (not from the firing) is what makes a re-fired slot after a
    crash or rebalance the same execution rather than a second one.
    """
    return _digest(b"kron.exec", job_id, scheduled_for_ms)


def manual_exec_id(job_id: str, command_id: str) -> str:
    """Id of a run-now execution; keyed by the API command so a retried request dedups."""
    return _digest(b"kron.manual", job_id, command_id)


def event_id(*parts: str | int) -> str:
    """Id of an event derived from other records, e.g. ``event_id("fired", exec_id)``."""
    return _digest(b"kron.event", *parts)
