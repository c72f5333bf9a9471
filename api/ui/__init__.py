"""The dashboard at /ui (issue 40, part 2): server-rendered pages, tenant-scoped by API keys."""

from __future__ import annotations

from fastapi import FastAPI


def include_ui(app: FastAPI) -> None:
    """Mounts the dashboard's routes on the API app (none yet: issue 40 part 2 fills this)."""
