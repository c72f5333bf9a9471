"""Whether the assignment this process holds is settled: recovered, and not being replaced.

Events from Kafka are guarded by Faust itself: a rebalance suspends the agent, and a record
fetched under an older generation is dropped. Events of our own making (ticks, results
applied in the process) skip the topic and that guard, so they need their own. Faust's
`app.rebalancing` is not enough: a rebalance that begins while the previous one's tables
are still recovering is cleared by that recovery's end, so the flag reads False while the
new rebalance is under way and the partitions may already belong to someone else.

The gate closes when any rebalance begins and opens only when a recovery ends for an
assignment newer than the one held when the last rebalance began.
"""

from __future__ import annotations

import threading
from typing import Any

from streams.runtime.group import follow_rebalances


class RebalanceGate:
    def __init__(self) -> None:
        # The consumer thread begins rebalances; the event loop ends them.
        self._lock = threading.Lock()
        self._open = False
        self._held_at_start = 0

    def started(self, held_generation: int) -> None:
        """A rebalance begins; `held_generation` is that of the assignment held now."""
        with self._lock:
            self._open = False
            self._held_at_start = held_generation

    def ended(self, recovered_generation: int) -> None:
        """A recovery ended for the assignment of `recovered_generation`."""
        with self._lock:
            self._open = recovered_generation > 0 and recovered_generation != self._held_at_start

    @property
    def open(self) -> bool:
        return self._open

    def install(self, app: Any) -> None:
        """Follow Faust's rebalance start (called in the consumer thread as soon as it learns
        of a rebalance) and end (after the tables of the new assignment are recovered)."""
        follow_rebalances(app, started=self.started, ended=self.ended)
