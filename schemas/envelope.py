"""The ``kron.Envelope`` record that opens every kron event and command."""

from __future__ import annotations

from typing import TypedDict


class Envelope(TypedDict):
    event_id: str
    # Dotted past tense, e.g. "job.created", "execution.started"; the codec does not check it.
    event_type: str
    schema_version: int
    occurred_at_ms: int
    tenant: str
    causation_id: str | None
    correlation_id: str | None
    producer: str | None


def make_envelope(
    *,
    event_id: str,
    event_type: str,
    occurred_at_ms: int,
    tenant: str,
    causation_id: str | None = None,
    correlation_id: str | None = None,
    producer: str | None = None,
    schema_version: int = 1,
) -> Envelope:
    """Build the envelope dict; keyword-only so two adjacent str ids cannot be swapped."""
    return {
        "event_id": event_id,
        "event_type": event_type,
        "schema_version": schema_version,
        "occurred_at_ms": occurred_at_ms,
        "tenant": tenant,
        "causation_id": causation_id,
        "correlation_id": correlation_id,
        "producer": producer,
    }
