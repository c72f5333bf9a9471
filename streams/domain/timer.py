"""Keys of the timer store (a sorted key-value store scanned in due order).

Layout: ``due_ms`` (8 bytes, big-endian unsigned) | ``kind`` (1 byte) | job_id UTF-8 |
0x00 | ref UTF-8. Big-endian integers and UTF-8 both sort bytewise like their values, and
the 0x00 terminator sorts a job_id before any longer job_id it prefixes, so byte order is
exactly (due_ms, kind, job_id, ref) order and "everything due by now" is one range scan.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

_DUE_BYTES = 8
_MAX_DUE = 2 ** (8 * _DUE_BYTES) - 1
_HEADER = _DUE_BYTES + 1


class TimerKind(IntEnum):
    FIRE = 1
    RETRY = 2
    LEASE = 3
    # 4 was DEADLINE, never written: not to be reused while a store might hold one.
    # Attempts decided ahead, looked at when they fall due: in another process than the
    # one holding their calls, that one is gone (see PartitionCore._hand_over).
    HELD = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class TimerKey:
    due_ms: int
    kind: TimerKind
    job_id: str
    ref: str  # the exec_id, or "" for FIRE timers, which belong to the job


def encode_timer_key(*, due_ms: int, kind: TimerKind, job_id: str, ref: str) -> bytes:
    if not 0 <= due_ms <= _MAX_DUE:
        raise ValueError(f"due_ms must be in 0..2**64-1; got {due_ms}")
    if "\x00" in job_id:
        raise ValueError("job_id must not contain NUL: it terminates the job_id in timer keys")
    kind = TimerKind(kind)
    return b"".join(
        (
            due_ms.to_bytes(_DUE_BYTES, "big"),
            bytes((kind,)),
            job_id.encode("utf-8"),
            b"\x00",
            ref.encode("utf-8"),
        )
    )


def decode_timer_key(key: bytes) -> TimerKey:
    sep = key.find(b"\x00", _HEADER)
    if len(key) <= _HEADER or sep < 0:
        raise ValueError(f"not a timer key: {key!r}")
    return TimerKey(
        due_ms=int.from_bytes(key[:_DUE_BYTES], "big"),
        kind=TimerKind(key[_DUE_BYTES]),
        job_id=key[_HEADER:sep].decode("utf-8"),
        ref=key[sep + 1 :].decode("utf-8"),
    )


def kind_of(key: bytes) -> int:
    """A timer key's kind byte, without decoding the rest."""
    return key[_DUE_BYTES]


def due_of(key: bytes) -> int:
    """A timer key's due time, without decoding the rest."""
    return int.from_bytes(key[:_DUE_BYTES], "big")


def due_prefix_upper_bound(now_ms: int) -> bytes:
    """Exclusive upper bound of a scan for every key with ``due_ms <= now_ms``."""
    if now_ms < 0:
        return b""  # nothing is due before the epoch; b"" sorts below every key
    if now_ms >= _MAX_DUE:
        # Above every key: UTF-8 never contains 0xFF, so nothing after the kind byte reaches it.
        return b"\xff" * (_HEADER + 1)
    return (now_ms + 1).to_bytes(_DUE_BYTES, "big")
