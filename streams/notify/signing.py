"""``X-Kron-Signature: t=<unix seconds>,v1=<hex>``, v1 = HMAC-SHA256(key, f"{t}.{body}").

The time is in the signed text, so a receiver that checks it is recent (``tolerance_s``)
refuses an old delivery replayed; the key is the tenant's own (KRON_NOTIFY_KEYS), so one
tenant can't forge another's alerts. Several ``v1`` entries are accepted by ``verify``: a
key being rotated may sign with both.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

HEADER: Final = "X-Kron-Signature"
TOLERANCE_S: Final = 300


def signature(key: bytes, body: bytes, t: int) -> str:
    return hmac.new(key, f"{t}.".encode() + body, hashlib.sha256).hexdigest()


def sign(key: bytes, body: bytes, t: int) -> str:
    """The header's value for `body` sent at unix time `t`."""
    return f"t={t},v1={signature(key, body, t)}"


def verify(key: bytes, header: str, body: bytes, *, now_s: int,
           tolerance_s: int = TOLERANCE_S) -> bool:
    """Whether `header` signs `body` with `key`, at a time within `tolerance_s` of now."""
    t: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            t = int(value)
        elif name == "v1":
            candidates.append(value)
    if t is None or abs(now_s - t) > tolerance_s:
        return False
    expected = signature(key, body, t)
    return any(hmac.compare_digest(expected, c) for c in candidates)
