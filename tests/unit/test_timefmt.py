"""One time formatter: the API and the audit's findings render a time alike, and the
X-Kron-Scheduled-For header the same instant with the offset targets have always had."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from api import models
from kron.timefmt import iso
from replay import audit
from streams import executor


@pytest.mark.parametrize("ms, text", [
    (0, "1970-01-01T00:00:00.000Z"),
    (1_767_225_600_123, "2026-01-01T00:00:00.123Z"),
    (-1, "1969-12-31T23:59:59.999Z"),
])
def test_every_rendering_is_the_one(ms: int, text: str) -> None:
    assert iso(ms) == models.iso(ms) == audit.iso(ms) == text
    assert datetime.fromisoformat(text).timestamp() * 1000 == pytest.approx(ms)
    # The header as targets have received it since the first release (isoformat's +00:00).
    header = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    assert executor._iso(ms) == header == text[:-1] + "+00:00"


def test_the_audit_renders_what_has_no_time() -> None:
    assert audit.iso(None) == "-"
    assert audit.iso(10**18) == str(10**18)
