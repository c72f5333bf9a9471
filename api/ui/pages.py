"""The dashboard's pages and its two static files.

A page is a Jinja2 template rendered with nothing of the tenant's: its frame, its forms and
the ids its path names (autoescaped). The data comes after, in the browser, from the keyed
JSON API (app.js's fetch with `Authorization: Bearer <key>`, the key in sessionStorage),
so a page needs no key and shows another tenant nothing. Every answer here carries a strict
Content-Security-Policy: scripts and styles only from this origin, no inline script."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from api.problems import Problem

HERE = Path(__file__).parent
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


@dataclass(frozen=True, slots=True)
class Page:
    template: str
    title: str
    nav: str  # which tab of the navigation is this page's


PAGES = {
    "overview": Page("overview.html", "Overview", "overview"),
    "signin": Page("signin.html", "Sign in", ""),
    "jobs": Page("jobs.html", "Jobs", "jobs"),
    "job_new": Page("job_new.html", "New job", "jobs"),
    "job": Page("job.html", "Job", "jobs"),
    "run": Page("run.html", "Run", "jobs"),
    "failures": Page("failures.html", "Failures", "failures"),
}


class Dashboard:
    """The templates and static files, loaded once (at include_ui)."""

    def __init__(self, root: Path = HERE) -> None:
        self.env = Environment(loader=FileSystemLoader(root / "templates"),
                               autoescape=select_autoescape(default=True, default_for_string=True),
                               auto_reload=False)
        self.static: dict[str, tuple[bytes, str]] = {}
        for path in sorted((root / "static").iterdir()):
            if path.suffix in STATIC_TYPES:
                self.static[path.name] = (path.read_bytes(), STATIC_TYPES[path.suffix])
        # A version in the static files' URLs: a changed file is fetched anew.
        digest = hashlib.sha256(b"".join(body for body, _ in self.static.values()))
        self.version = digest.hexdigest()[:12]

    def render(self, name: str, **ids: str) -> HTMLResponse:
        page = PAGES[name]
        html = self.env.get_template(page.template).render(
            page=name, title=page.title, nav=page.nav, version=self.version, **ids)
        return HTMLResponse(html, headers={**HEADERS, "Cache-Control": "no-store"})

    def file(self, name: str) -> Response:
        found = self.static.get(name)
        if found is None:
            raise Problem(404, "not-found", f"no file {name!r}")
        body, media_type = found
        return Response(body, media_type=media_type,
                        headers={**HEADERS, "Cache-Control": "public, max-age=3600"})


def router(dashboard: Dashboard) -> APIRouter:
    pages = APIRouter(prefix="/ui", include_in_schema=False)

    @pages.get("", response_class=HTMLResponse)
    async def overview() -> HTMLResponse:
        return dashboard.render("overview")

    @pages.get("/signin", response_class=HTMLResponse)
    async def signin() -> HTMLResponse:
        return dashboard.render("signin")

    @pages.get("/jobs", response_class=HTMLResponse)
    async def jobs() -> HTMLResponse:
        return dashboard.render("jobs")

    @pages.get("/jobs/new", response_class=HTMLResponse)
    async def job_new() -> HTMLResponse:
        return dashboard.render("job_new")

    @pages.get("/jobs/{job_id}", response_class=HTMLResponse)
    async def job(job_id: str) -> HTMLResponse:
        return dashboard.render("job", job_id=job_id)

    @pages.get("/runs/{run_id}", response_class=HTMLResponse)
    async def run(run_id: str) -> HTMLResponse:
        return dashboard.render("run", run_id=run_id)

    @pages.get("/failures", response_class=HTMLResponse)
    async def failures() -> HTMLResponse:
        return dashboard.render("failures")

    @pages.get("/static/{name}")
    async def static(name: str) -> Response:
        return dashboard.file(name)

    return pages
