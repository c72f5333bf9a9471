"""The README and the docs link only inside the repository, and every link resolves: the file
exists, and a `#fragment` names a heading of it (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)|<(https?://[^>]+)>")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def links(page: Path) -> list[str]:
    return [a or b for a, b in LINK.findall(FENCE.sub("", page.read_text()))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_stays_in_the_repository_and_resolves(page: Path) -> None:
    text = page.read_text()
    assert "../shared" not in text, f"{page}: names a path outside the repository"
    for target in links(page):
        if target.startswith(("http://127.0.0.1", "http://localhost")):
            continue  # the local stack's own pages (the quickstart)
        assert not re.match(r"[a-z]+:", target), f"{page}: links outside: {target}"
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.is_relative_to(ROOT), f"{page}: {target} leaves the repository"
        assert dest.exists(), f"{page}: {target} does not exist"
        if fragment:
            assert fragment in anchors(dest), f"{page}: no heading #{fragment} in {dest.name}"


def test_the_readme_is_a_front_door() -> None:
    """The order the README keeps, the two commands, and the docs it must point to."""
    text = (ROOT / "README.md").read_text()
    heads = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert heads == ["## The two commands", "## Quickstart", "## Semantics", "## Glossary",
                     "## Where to read next"]
    # Issue 39: the Semantics section names the fairness and quota rules.
    semantics = text.split("## Semantics", 1)[1].split("## Glossary", 1)[0]
    for rule in ("priority", "Fair decisions", "Fair dispatch", "max_running",
                 "dispatch_rate_per_s", "tenant concurrency", "create_rate_per_s",
                 "max_active_jobs"):
        assert rule in semantics, rule
    assert "make up" in text and "make test" in text
    for term in ("Job", "Slot", "Execution", "Attempt", "Timer", "Tick", "Lease",
                 "Fencing token", "Owner epoch"):
        assert f"- **{term}**" in text, term
    for doc in ("docs/semantics.md", "docs/operations.md", "docs/producers.md",
                "docs/security.md", "docs/reliability.md", "bench/README.md"):
        assert f"]({doc}" in text, doc


def test_the_reliability_table_is_generated_into_docs_reliability() -> None:
    from tests.faults import report

    assert report.README == ROOT / "docs" / "reliability.md"
    page = report.README.read_text()
    assert page.count(report.START) == 1 and page.count(report.END) == 1
    top = (ROOT / "README.md").read_text()
    assert report.START not in top and "](docs/reliability.md)" in top
