"""The dashboard at /ui (issue 40, part 2): server-rendered pages, tenant-scoped by API keys.

pages.py serves the pages (Jinja2 templates in templates/) and app.js and style.css
(static/); the pages hold no data: app.js signs in with an API key kept in sessionStorage
and reads the keyed JSON API (/v1/..., and data.py's /ui/api/... for what /v1 lacks)."""

from __future__ import annotations

from fastapi import FastAPI

from api.ui import data, pages


def include_ui(app: FastAPI) -> None:
    """Mounts the dashboard's pages, static files and read routes on the API app."""
    app.include_router(data.router)
    app.include_router(pages.router(pages.Dashboard()))
