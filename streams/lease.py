"""The owner's lease: how long this process may still act as owner of its partitions.

Kafka reassigns a member's partitions once the group coordinator has not heard from it
for a session timeout. A process that was paused (SIGSTOP, a VM freeze) or cut off from
the broker cannot tell from its own state that this happened, so it must not act on
partitions longer than the broker would keep them: only until the send time of its last
acknowledged heartbeat (or group sync) plus the session timeout, minus a margin for the
broker's timer. The monotonic clock measures that, so wall-clock steps change nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from kron.clock import Clock
from streams.runtime.group import SendReq, wrap_group_requests

log = logging.getLogger("kron.lease")

# Group protocol requests whose success proves the coordinator still counts us in.
_CONFIRMING = ("HeartbeatRequest", "SyncGroupRequest")


class OwnershipLease:
    def __init__(self, *, clock: Clock, session_timeout_s: float, margin_s: float = 1.0) -> None:
        self._clock = clock
        self._window_s = max(0.5, session_timeout_s - margin_s)
        self._confirmed_at: float | None = None
        self._watched: Any = None

    def confirm(self, sent_at: float) -> None:
        """A request sent at `sent_at` (monotonic) was acknowledged without error."""
        if self._confirmed_at is None or sent_at > self._confirmed_at:
            self._confirmed_at = sent_at

    def valid(self) -> bool:
        at = self._confirmed_at
        return at is not None and self._clock.monotonic() < at + self._window_s

    def remaining_s(self) -> float:
        at = self._confirmed_at
        return 0.0 if at is None else at + self._window_s - self._clock.monotonic()

    def watch(self, coordinator: Any) -> None:
        """Wrap the group coordinator's request path, once per coordinator object.

        aiokafka keeps no record of when a heartbeat last succeeded in a form we can read,
        so the lease listens to the requests themselves.
        """
        if coordinator is None or coordinator is self._watched:
            return
        self._watched = coordinator
        clock, lease = self._clock, self

        def confirming(original: SendReq) -> SendReq:
            async def send_req(request: Any) -> Any:
                sent_at = clock.monotonic()
                response = await original(request)
                if (type(request).__name__.startswith(_CONFIRMING)
                        and getattr(response, "error_code", None) == 0):
                    lease.confirm(sent_at)
                return response
            return send_req

        wrap_group_requests(coordinator, confirming)
        # Installed once, at start-up: nothing stale can be acted on before this point.
        self.confirm(clock.monotonic())
        log.info("ownership lease watching the group coordinator")
