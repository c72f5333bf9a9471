"""Avro values as JSON values: the one rendering of kron's records, for the API's views
(api/projection.py) and `kron replay export` (replay/export.py).

- a named-union branch, as fastavro reads it and the API builds it
  (``("kron.HttpTarget", {...})``), becomes the record with its short type name first:
  ``{"type": "HttpTarget", ...}``;
- bytes become their text when they are UTF-8, else ``{"base64": ...}`` (standard
  alphabet, padded);
- a non-finite float becomes its string (``"nan"``, ``"inf"``, ``"-inf"``): JSON has none;
- other tuples become lists; maps and records stay objects, arrays lists.
"""

from __future__ import annotations

import base64
import math
from typing import Any


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, tuple):
        if len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], dict):
            return {"type": value[0].rsplit(".", 1)[-1], **jsonable(value[1])}
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode("ascii")}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
