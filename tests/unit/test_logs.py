from __future__ import annotations

import json
import logging

from kron.logs import JsonFormatter


def test_log_lines_are_json_with_extra_fields() -> None:
    record = logging.LogRecord("kron.engine", logging.INFO, __file__, 1, "engine stats %s",
                               ("now",), None)
    record.backlog = 3
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "engine stats now" and line["backlog"] == 3
    assert line["level"] == "INFO" and line["logger"] == "kron.engine"
