"""Local table state is trusted only after a clean stop.

Faust writes a record to the local RocksDB at once and to its changelog topic through the
producer. A worker that dies (kill -9, a lost lease, a full disk) can leave local state
ahead of Kafka: writes of events that were never committed. Those events are delivered
again, but the handlers are idempotent and find the writes already applied, so they would
never reach the changelog, and a later owner restoring from Kafka would not see them. So a
worker starts from its local state only if the previous one stopped cleanly, after every
changelog write was acknowledged; otherwise it rebuilds the state from the changelogs.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger("kron.localstate")

MARKER = "clean-shutdown"


def prepare(data_dir: Path, table_dir: Path) -> bool:
    """Before the worker starts: drop local tables unless the last stop was clean.
    Returns whether local state was kept."""
    marker = data_dir / MARKER
    clean = marker.exists()
    marker.unlink(missing_ok=True)  # from now on, a crash leaves no marker
    if clean or not table_dir.exists():
        return clean
    log.warning("the last stop was not clean: local state may be ahead of Kafka; rebuilding "
                "it from the changelogs", extra={"table_dir": str(table_dir)})
    shutil.rmtree(table_dir)
    return False


def mark_clean(data_dir: Path) -> None:
    """After the last changelog write was acknowledged."""
    (data_dir / MARKER).write_text("kron worker stopped cleanly\n")
