"""Topic records as JSON-ready dicts, for `kron replay export`.

Records are rendered as the API renders them (schemas.jsonable): a named-union branch
``("kron.HttpTarget", {...})`` becomes ``{"type": "HttpTarget", ...}``, bytes their UTF-8
text or ``{"base64": ...}``, and a non-finite float its string ("nan", "inf", "-inf"). A
record's key is its text when it is UTF-8, else ``key_base64`` holds it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from typing import Any

from replay.reader import Entry
from schemas.jsonable import jsonable


def _key(raw: bytes | None) -> tuple[str | None, str | None]:
    """(text, base64): the key as text when it is UTF-8, else as base64."""
    if raw is None:
        return None, None
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, base64.b64encode(raw).decode("ascii")


def _time_ms(entry: Entry) -> int:
    env = (entry.record or {}).get("envelope")
    if isinstance(env, dict) and isinstance(env.get("occurred_at_ms"), int):
        return int(env["occurred_at_ms"])
    return entry.timestamp_ms


def matches(entry: Entry, *, job_id: str | None = None, tenant: str | None = None,
            since_ms: int | None = None, until_ms: int | None = None) -> bool:
    """The filters of :func:`export`: since inclusive, until exclusive, on the envelope's
    occurred_at_ms (the broker timestamp for a tombstone)."""
    rec = entry.record
    if job_id is not None:
        owner = rec.get("job_id") if rec is not None else None
        if owner is None:
            owner = _key(entry.key)[0]
        if owner != job_id:
            return False
    if tenant is not None:
        env = (rec or {}).get("envelope")
        if not isinstance(env, dict) or env.get("tenant") != tenant:
            return False
    if since_ms is not None or until_ms is not None:
        t = _time_ms(entry)
        if since_ms is not None and t < since_ms:
            return False
        if until_ms is not None and t >= until_ms:
            return False
    return True


def export(entries: Iterable[Entry], *, job_id: str | None = None, tenant: str | None = None,
           since_ms: int | None = None, until_ms: int | None = None) -> Iterator[dict[str, Any]]:
    """One JSON-ready dict per entry that passes the filters, in the order given."""
    for entry in entries:
        if not matches(entry, job_id=job_id, tenant=tenant, since_ms=since_ms,
                       until_ms=until_ms):
            continue
        key, key_b64 = _key(entry.key)
        out: dict[str, Any] = {
            "topic": entry.topic,
            "partition": entry.partition,
            "offset": entry.offset,
            "timestamp_ms": entry.timestamp_ms,
            "key": key,
            "name": entry.name,
            "record": jsonable(entry.record),
        }
        if key_b64 is not None:
            out["key_base64"] = key_b64
        yield out
