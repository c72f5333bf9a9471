"""Keys of the timer store (a sorted key-value store, scanned lane by lane in due order).

Layout: 0x01 | ``tier`` (1 byte) | ``tenant`` (4 bytes: blake2b of the tenant's name) |
``due_ms`` (8 bytes, big-endian unsigned) | ``kind`` (1 byte) | job_id UTF-8 | 0x00 | ref
UTF-8. The first six bytes name the timer's *lane*: one per (tier, tenant). Big-endian
integers and UTF-8 both sort bytewise like their values, and the 0x00 terminator sorts a
job_id before any longer job_id it prefixes, so within a lane byte order is exactly (due_ms,
kind, job_id, ref) order and "everything due by now in this lane" is one range scan. The
owner finds a partition's lanes by skipping from one lane's prefix to the next
(streams.engine.faust_store) and decides them tier by tier, tenants in weighted turns
(streams.engine.lanes), so one tenant's flood of due timers cannot hold another's back.

Legacy keys, written before lanes: ``due_ms`` (8) | ``kind`` | job_id | 0x00 | ref. Their
first byte is 0x00 (a due time below 2**56 ms, the year 2,280,000), so they sort before
every lane and form one lane of their own, the legacy lane, read as system tier. Nothing
writes them any more; a store from before the upgrade keeps firing them.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from enum import IntEnum

_DUE_BYTES = 8
_MAX_DUE = 2 ** (8 * _DUE_BYTES) - 1
_LEGACY_HEADER = _DUE_BYTES + 1
# The lane's prefix: the layout tag, the tier and the tenant's hash.
LANE_TAG = 0x01
_TENANT_BYTES = 4
LANE_BYTES = 2 + _TENANT_BYTES
_HEADER = LANE_BYTES + _DUE_BYTES + 1
# The legacy lane's keys are those starting with this byte (the top byte of a due time).
LEGACY_PREFIX = b"\x00"


class TimerKind(IntEnum):
    FIRE = 1
    RETRY = 2
    LEASE = 3
    # 4 was DEADLINE, never written: not to be reused while a store might hold one.
    # Attempts decided ahead, looked at when they fall due: in another process than the
    # one holding their calls, that one is gone (see PartitionCore._hand_over).
    HELD = 5
    # An execution queued by its tenant's max_running: started when the tenant has room.
    WAIT = 6
    # Executions whose history window ran out: their records are tombstoned when it falls
    # due (streams.engine.retention), in the housekeeping lane.
    EXPIRE = 7


class Tier(IntEnum):
    """A lane's tier: due timers of a lower tier are decided first."""

    SYSTEM = 0  # leases, held attempts, anything no tenant owns: never behind a flood
    CRITICAL = 1
    NORMAL = 2
    BATCH = 3
    # Housekeeping no tenant waits for (history retention): decided after every tier, with
    # what a round has left, so it never delays a slot.
    HOUSEKEEPING = 4


@dataclass(frozen=True, slots=True)
class Lane:
    """A (tier, tenant) queue of the timer index. `tenant` is the 4-byte hash of the
    tenant's name as an int (tenant_hash), 0 for the system lane, -1 for the legacy lane."""

    tier: int
    tenant: int
    prefix: bytes = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.tenant == -1:
            prefix = LEGACY_PREFIX
        else:
            if not 0 <= self.tier <= 0xFF or not 0 <= self.tenant < 1 << (8 * _TENANT_BYTES):
                raise ValueError(f"not a lane: tier {self.tier}, tenant {self.tenant}")
            prefix = bytes((LANE_TAG, self.tier)) + self.tenant.to_bytes(_TENANT_BYTES, "big")
        object.__setattr__(self, "prefix", prefix)

    @property
    def legacy(self) -> bool:
        return self.tenant == -1


# A tenant's queued executions (TimerKind.WAIT) are in a lane of their own per tier, its
# tier byte offset by this: the owner reads such a lane only while the tenant has room
# (PartitionCore.on_tick), so a tenant at its cap costs no tick any work.
WAITING_TIER = 0x10


def is_waiting(lane: Lane) -> bool:
    return lane.tier >= WAITING_TIER


SYSTEM_LANE = Lane(Tier.SYSTEM, 0)
HOUSEKEEPING_LANE = Lane(Tier.HOUSEKEEPING, 0)
LEGACY_LANE = Lane(Tier.SYSTEM, -1)


@functools.lru_cache(maxsize=1 << 14)
def tenant_hash(tenant: str) -> int:
    """The tenant's lane id: the first 4 bytes of its name's blake2b, as an int."""
    return int.from_bytes(hashlib.blake2b(tenant.encode("utf-8"), digest_size=_TENANT_BYTES)
                          .digest(), "big")


@functools.lru_cache(maxsize=1 << 14)
def tenant_lane(tenant: str, tier: int) -> Lane:
    """The lane of a tenant's timers at a tier (cached: one Lane per pair)."""
    return Lane(tier, tenant_hash(tenant))


# Lanes by prefix, as decode_timer_key reads them (a dict: an lru_cache call costs more).
_LANES: dict[bytes, Lane] = {}


def lane_of_prefix(prefix: bytes) -> Lane:
    """The lane a prefix (lane_prefix_of) names."""
    lane = _LANES.get(prefix)
    if lane is None:
        if prefix == LEGACY_PREFIX:
            return LEGACY_LANE
        if len(_LANES) >= 1 << 16:
            _LANES.clear()
        lane = _LANES[prefix] = Lane(prefix[1], int.from_bytes(prefix[2:LANE_BYTES], "big"))
    return lane


@dataclass(frozen=True, kw_only=True, slots=True)
class TimerKey:
    due_ms: int
    kind: TimerKind
    job_id: str
    ref: str  # the exec_id, or "" for FIRE timers, which belong to the job
    lane: Lane = SYSTEM_LANE


# A kind's byte and a byte's kind, looked up: TimerKind(value) costs ~1 us (EnumType's
# __call__), and a timer's key is encoded and decoded once or more per execution.
_KIND_BYTE: dict[int, bytes] = {kind: bytes((kind,)) for kind in TimerKind}
_KIND_OF: dict[int, TimerKind] = {int(kind): kind for kind in TimerKind}
# TimerKey's slots' own setters (spec._PLAN_SETTERS says why): a frozen dataclass's
# __init__ sets each through object.__setattr__.
_SET_KEY = tuple(getattr(TimerKey, name).__set__
                 for name in ("due_ms", "kind", "job_id", "ref", "lane"))


def encode_timer_key(*, due_ms: int, kind: TimerKind, job_id: str, ref: str,
                     lane: Lane) -> bytes:
    """The key of a timer in `lane`. LEGACY_LANE gives the layout from before lanes, which
    only tests and tools write (its due time must then be below 2**56)."""
    if not 0 <= due_ms <= _MAX_DUE:
        raise ValueError(f"due_ms must be in 0..2**64-1; got {due_ms}")
    if "\x00" in job_id:
        raise ValueError("job_id must not contain NUL: it terminates the job_id in timer keys")
    kind_byte = _KIND_BYTE.get(kind)
    if kind_byte is None:
        raise ValueError(f"not a timer kind: {kind!r}")
    head = lane.prefix
    if head == LEGACY_PREFIX:
        if due_ms >> 56:
            raise ValueError("a legacy key's due_ms must be below 2**56")
        head = b""
    return b"".join(
        (
            head,
            due_ms.to_bytes(_DUE_BYTES, "big"),
            kind_byte,
            job_id.encode("utf-8"),
            b"\x00",
            ref.encode("utf-8"),
        )
    )


def decode_timer_key(key: bytes) -> TimerKey:
    tag = key[:1]
    if tag == b"\x01":
        start, lane = LANE_BYTES, lane_of_prefix(key[:LANE_BYTES])
    elif tag == LEGACY_PREFIX:
        start, lane = 0, LEGACY_LANE
    else:
        raise ValueError(f"not a timer key: {key!r}")
    header = start + _LEGACY_HEADER
    sep = key.find(b"\x00", header)
    if len(key) <= header or sep < 0:
        raise ValueError(f"not a timer key: {key!r}")
    kind = _KIND_OF.get(key[start + _DUE_BYTES])
    if kind is None:
        raise ValueError(f"not a timer key (kind {key[start + _DUE_BYTES]}): {key!r}")
    tk = object.__new__(TimerKey)
    set_due, set_kind, set_job, set_ref, set_lane = _SET_KEY
    set_due(tk, int.from_bytes(key[start:start + _DUE_BYTES], "big"))
    set_kind(tk, kind)
    set_job(tk, key[header:sep].decode("utf-8"))
    set_ref(tk, key[sep + 1:].decode("utf-8"))
    set_lane(tk, lane)
    return tk


def kind_of(key: bytes) -> int:
    """A timer key's kind byte, without decoding the rest."""
    return key[_HEADER - 1] if key[0] == LANE_TAG else key[_DUE_BYTES]


def due_of(key: bytes) -> int:
    """A timer key's due time, without decoding the rest."""
    if key[0] == LANE_TAG:
        return int.from_bytes(key[LANE_BYTES:LANE_BYTES + _DUE_BYTES], "big")
    return int.from_bytes(key[:_DUE_BYTES], "big")


def lane_prefix_of(key: bytes) -> bytes | None:
    """The prefix of the lane holding `key`, or None for a key that is no timer's (Faust's
    offset key, say: it sorts after every lane)."""
    first = key[:1]
    if first == b"\x01":
        return key[:LANE_BYTES]
    if first == LEGACY_PREFIX:
        return LEGACY_PREFIX
    return None


def lane_end(prefix: bytes) -> bytes:
    """The smallest key above every key of the lane `prefix` names (the next lane's
    smallest possible prefix)."""
    if prefix == LEGACY_PREFIX:
        return b"\x01"
    return (int.from_bytes(prefix, "big") + 1).to_bytes(LANE_BYTES, "big")


def due_bound(prefix: bytes, now_ms: int) -> bytes:
    """Exclusive upper bound of a scan of lane `prefix` for every key with due_ms <= now_ms;
    with now_ms -1, the lane's lower bound (a scan from it starts at the lane's first key)."""
    if now_ms < 0:
        return prefix
    if prefix == LEGACY_PREFIX:
        return (now_ms + 1).to_bytes(_DUE_BYTES, "big") if now_ms + 1 < 1 << 56 else b"\x01"
    if now_ms >= _MAX_DUE:
        return lane_end(prefix)
    return prefix + (now_ms + 1).to_bytes(_DUE_BYTES, "big")


def due_order(item: tuple[bytes, bytes]) -> bytes:
    """A (key, value) pair's place in due order across lanes: its key past the lane prefix
    (due_ms, kind, job_id, ref), for heapq.merge of lanes read in key order."""
    key = item[0]
    return key[LANE_BYTES:] if key[0] == LANE_TAG else key
