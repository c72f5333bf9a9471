"""A Faust worker whose graceful stop is bounded."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def bounded_stop_worker_class(grace_s: float, on_timeout: Callable[[], None]) -> Any:
    import faust  # imported only when a worker runs

    class BoundedStopWorker(faust.Worker):
        """A graceful stop that hangs must not keep the group waiting for this member: a
        rebalance storm test once saw a stopping worker hang and the survivors idle for two
        minutes. After `grace_s`, `on_timeout` runs (it exits the process hard)."""

        def _schedule_shutdown(self, signal: Any) -> None:
            if not self._signal_stop_time:
                timer = threading.Timer(grace_s, on_timeout)
                timer.daemon = True
                timer.start()
            super()._schedule_shutdown(signal)

    return BoundedStopWorker
