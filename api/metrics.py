"""The API's Prometheus metrics (issue 40, part 1): /metrics and request durations."""

from __future__ import annotations

from fastapi import FastAPI

from kron.settings import Settings


def install_metrics(app: FastAPI, settings: Settings) -> None:
    """Serves /metrics and times requests (nothing yet: issue 40 part 1 fills this)."""
