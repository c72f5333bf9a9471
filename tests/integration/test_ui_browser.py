"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright, against
the real stack (the broker, a worker and `kron api` as processes, a loopback HTTP target).

One user story: sign in with tenant acme's key, create a cron job through the form, see its
runs succeed on the job page, pause it, find it by its label, retry a failed DAG run, cancel
a running plain run and retry a failed one from their pages (and see a refused command's
reason, and each attempt's output), see the overview's counts and charts, and on the
failures page a failed run and its failure alerts among the dead letters, paged; then sign
in as globex and see none of it.
Along the way: hostile job names render as text, and no page breaks its Content-Security-
Policy or throws.

Screenshots of the pages go to the test's tmp dir; with KRON_UI_SCREENSHOT=1 to docs/img/
(dashboard.png, the job page, is the README's; dashboard-run.png a retried run's attempts
and their output)."""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright import sync_api

from streams.domain.ids import exec_id
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

expect = sync_api.expect
expect.set_options(timeout=20_000)  # a loaded CI host: the pages poll every 2 to 15 s

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "docs" / "img"  # with KRON_UI_SCREENSHOT=1: the README's and the docs'

HOSTILE = '<img src=x onerror="window.__xss=1">'
FAILED_OUTPUT = "HTTP/1.1 500 Internal Server Error\nok"  # the receiver's /status/500


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Debian's chromium is not installed: `make setup` installs it (as root, "
                    "or through sudo -n), or `apt-get install chromium`")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            yield b
        finally:
            b.close()


class Tab:
    """A page in a context of its own (its own sessionStorage), recording what broke."""

    def __init__(self, browser: Any, base: str) -> None:
        self.base = base
        self.context = browser.new_context(viewport={"width": 1280, "height": 860})
        self.context.set_default_timeout(20_000)
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.failed: list[tuple[int, str]] = []  # answers >= 400: (status, path)
        # A CSP violation or a script error is a console error; a failed answer is one too
        # ("Failed to load resource"), recorded by its path instead.
        self.page.on("console", lambda m: self.problems.append(m.text)
                     if m.type == "error" and "Failed to load resource" not in m.text
                     else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("response", lambda r: self.failed.append(
            (r.status, r.url.removeprefix(base))) if r.status >= 400 else None)
        self.page.on("dialog", lambda d: d.accept())

    def go(self, path: str) -> Any:
        self.page.goto(self.base + path)
        return self.page

    def sign_in(self, key: str, then: str = "/ui") -> None:
        page = self.go(then)
        page.wait_for_url("**/ui/signin?next=*")
        page.fill("#signin-key", key)
        page.click("#signin-submit")
        page.wait_for_url(self.base + then)

    def text(self, selector: str) -> str:
        return str(self.page.text_content(selector) or "")

    def close(self) -> None:
        self.context.close()


def api_job(c: httpx.Client, **fields: Any) -> str:
    r = c.post("/v1/jobs", json={"run_at": datetime.now(UTC).isoformat(), **fields})
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"])


def test_a_tenant_creates_watches_and_pauses_a_job_and_another_sees_none_of_it(
        api_stack, browser, tmp_path: Path) -> None:
    base, receiver = api_stack.api.url, api_stack.receiver
    shots = SHOTS if os.environ.get("KRON_UI_SCREENSHOT") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    label = f"ui-{uuid.uuid4().hex[:6]}"
    name = f"every-2s-{label}"
    with api_stack.client() as c:
        # A failed run for the failures page, and a job whose name is markup.
        failing = api_job(c, name=f"failing-{label}", retry={"max_attempts": 1},
                          target={"url": f"{receiver.url}/status/500"})
        api_job(c, name=HOSTILE, metadata={"team": label, HOSTILE: HOSTILE},
                target={"url": f"{receiver.url}/ok"})
        # A DAG run: a fans out to b (which fails) and c; d needs both, so it never runs.
        slot = time.time_ns() // 1_000_000
        dag_job = api_job(c, name=f"dag-{label}", run_at=datetime.fromtimestamp(
            slot / 1000, UTC).isoformat(), dag={"tasks": [
                {"id": "a", "target": {"type": "http", "url": f"{receiver.url}/ok"}},
                {"id": "b", "target": {"type": "http", "url": f"{receiver.url}/status/500"},
                 "depends_on": ["a"], "retry": {"max_attempts": 1}},
                {"id": "c", "target": {"type": "http", "url": f"{receiver.url}/ok"},
                 "depends_on": ["a"]},
                {"id": "d", "target": {"type": "http", "url": f"{receiver.url}/ok"},
                 "depends_on": ["b", "c"]}]})
        dag_run = exec_id(dag_job, slot)

    acme = Tab(browser, base)
    try:
        # A wrong key is refused and stays off the page's storage.
        page = acme.go("/ui/jobs")
        page.wait_for_url("**/ui/signin?next=*")
        page.fill("#signin-key", "not-a-key")
        page.click("#signin-submit")
        page.wait_for_selector("#signin-error:not([hidden])")
        assert "not valid" in acme.text("#signin-error")
        assert page.evaluate("sessionStorage.getItem('kron.key')") is None
        page.fill("#signin-key", "key-acme")
        page.click("#signin-submit")
        page.wait_for_url(base + "/ui/jobs")
        assert acme.text("#tenant") == "acme"

        # Create a cron job through the form: every 2 seconds, at the loopback target.
        page.click("#new-job")
        page.wait_for_url(base + "/ui/jobs/new")
        page.fill("#f-name", name)
        page.check("#f-cron-kind")
        page.fill("#f-cron", "*/2 * * * * *")
        page.fill("#f-tz", "Europe/Berlin")
        page.select_option("#f-method", "POST")
        page.fill("#f-url", f"{receiver.url}/ok")
        page.fill("#f-metadata", f"team={label}\nowner=ui-test")
        page.click("#f-submit")
        page.wait_for_url("**/ui/jobs/j_*")
        job_id = page.url.rsplit("/", 1)[-1]
        page.wait_for_selector("#job:not([hidden])")
        assert acme.text("#job-name") == name
        assert acme.text("#job-status") == "active"
        expect(page.locator("#upcoming li")).to_have_count(5)
        expect(page.locator("#upcoming")).to_contain_text("Europe/Berlin")
        assert f'"team": "{label}"' in acme.text("#job-spec")

        # Its runs succeed, on the job page (which refreshes itself).
        page.wait_for_selector("#runs tbody tr .state-succeeded", timeout=60_000)
        assert receiver.wait_for(job_id, 1, 10), api_stack.worker.log()[-3000:]
        done = page.locator("#runs tbody tr:has(.state-succeeded)").first
        assert "ms" in str(done.locator("td").nth(4).text_content())  # its lateness
        run_id = str(done.get_attribute("data-run-id"))

        # Pause it: the page shows it paused, the API agrees, the pause button is spent.
        page.click("#btn-pause")
        expect(page.locator("#job-status")).to_have_text("paused")
        assert page.is_disabled("#btn-pause") and page.is_enabled("#btn-resume")
        with api_stack.client() as c:
            assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "paused"
        page.wait_for_selector("#upcoming-note:has-text('Paused')")
        shot = shots / "dashboard.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000

        # A run's page: its attempts and status codes.
        page.click(f"#runs tbody tr[data-run-id='{run_id}'] a")
        page.wait_for_selector("#run:not([hidden])")
        assert acme.text("#run-state") == "succeeded"
        assert "200" in acme.text("#attempts tbody")
        # Its output (attempts[].output): the target's status line and the body's start.
        expect(page.locator("#attempts tbody tr.output[data-attempt='1'] pre")).to_have_text(
            "HTTP/1.1 200 OK\nok")
        # A succeeded run takes no command; a stale page's button is refused by the API
        # (409) and the page says why, in the API's words.
        assert page.is_hidden("#btn-retry") and page.is_hidden("#btn-cancel")
        page.evaluate("document.querySelector('#btn-retry').hidden = false")
        page.click("#btn-retry")
        expect(page.locator("#run-action-result")).to_contain_text(
            f"Retry failed: run '{run_id}' is succeeded")
        expect(page.locator("#run-action-result")).to_contain_text(
            "only a failed, missed or skipped run can be retried")
        expect(page.locator("#btn-retry")).to_be_hidden()
        page.click("#run-job")
        page.wait_for_url(f"{base}/ui/jobs/{job_id}")

        # A DAG run's page: its tasks drawn and listed, coloured by state.
        page = acme.go(f"/ui/runs/{dag_run}")
        page.wait_for_selector("#dag-graph g.node.state-upstream_failed", timeout=60_000)
        expect(page.locator("#run-state")).to_have_text("failed")
        states = {str(n.get_attribute("data-task-id")): str(n.get_attribute("class"))
                  for n in page.locator("#dag-graph g.node").all()}
        assert states == {"a": "node state-succeeded", "b": "node state-failed",
                          "c": "node state-succeeded", "d": "node state-upstream_failed"}
        assert page.locator("#dag-graph line.edge").count() == 4
        assert "500" in acme.text("#tasks tbody tr[data-task-id='b']")
        expect(page.locator("#tasks tbody tr[data-task-id='b'] details pre")).to_have_text(
            "#1\n" + FAILED_OUTPUT)  # its attempt's output, folded
        page.screenshot(path=str(shots / "dashboard-dag.png"))
        # A failed DAG run can be retried from its page (b fails again), not cancelled.
        assert page.is_hidden("#btn-cancel")
        page.click("#btn-retry")
        expect(page.locator("#run-action-result")).to_have_text(re.compile(r"^Retry: "))
        with api_stack.client() as c:
            def b_attempts() -> int:
                tasks = c.get(f"/v1/runs/{dag_run}").json()["tasks"]
                return len(next(t for t in tasks if t["task_id"] == "b")["attempts"])

            assert wait_until(lambda: b_attempts() == 2, 60), c.get(f"/v1/runs/{dag_run}").text

        # A plain run that stays running (its target answers after 30 s) is cancelled from
        # its page: the run ends cancelled, and neither button is offered after.
        with api_stack.client() as c:
            slow = api_job(c, name=f"slow-{label}", retry={"max_attempts": 1},
                           target={"url": f"{receiver.url}/slow/30", "timeout_s": 60})
        page = acme.go(f"/ui/jobs/{slow}")
        page.wait_for_selector("#runs tbody tr:has(.state-running) a", timeout=60_000)
        page.click("#runs tbody tr:has(.state-running) a")
        page.wait_for_url("**/ui/runs/*")
        slow_run = page.url.rsplit("/", 1)[-1]
        page.wait_for_selector("#run:not([hidden])")
        expect(page.locator("#run-state")).to_have_text("running")
        assert page.is_hidden("#btn-retry")
        assert receiver.wait_for(slow, 1, 10), api_stack.worker.log()[-3000:]
        page.click("#btn-cancel")  # its dialog is accepted
        expect(page.locator("#run-action-result")).to_have_text(re.compile(r"^Cancel: "))
        expect(page.locator("#run-state")).to_have_text("cancelled")
        expect(page.locator("#btn-cancel")).to_be_hidden()
        assert page.is_hidden("#btn-retry")
        with api_stack.client() as c:
            assert c.get(f"/v1/runs/{slow_run}").json()["state"] == "cancelled"

        # A failed plain run (a 500, one attempt allowed) is retried from its page: a second
        # attempt of the same execution, with the same Idempotency-Key, which fails again.
        with api_stack.client() as c:
            failed = wait_until(lambda: [r for r in c.get(f"/v1/jobs/{failing}/runs").json()[
                "runs"] if r["state"] == "failed"], 60)
            assert failed, c.get(f"/v1/jobs/{failing}/runs").text
        failed_run = failed[0]["run_id"]
        page = acme.go(f"/ui/runs/{failed_run}")
        page.wait_for_selector("#run:not([hidden])")
        expect(page.locator("#run-state")).to_have_text("failed")
        expect(page.locator("#attempts tbody tr.attempt")).to_have_count(1)
        assert page.is_hidden("#btn-cancel")
        page.click("#btn-retry")
        expect(page.locator("#run-action-result")).to_have_text(re.compile(r"^Retry: "))
        expect(page.locator("#attempts tbody tr.attempt")).to_have_count(2, timeout=60_000)
        expect(page.locator("#run-state")).to_have_text("failed")
        assert "500" in acme.text("#attempts tbody tr.attempt[data-attempt='2']")
        for n in (1, 2):  # each attempt's output under it
            expect(page.locator(f"#attempts tbody tr.output[data-attempt='{n}'] pre")
                   ).to_have_text(FAILED_OUTPUT)
        page.screenshot(path=str(shots / "dashboard-run.png"))
        hits = receiver.wait_for(failing, 2, 10)
        assert [h.attempt for h in hits] == [1, 2] and {h.key for h in hits} == {failed_run}

        # The jobs list finds it by its label and kind; the markup name is only text.
        page = acme.go(f"/ui/jobs?label=team%3D{label}")
        page.wait_for_selector("#jobs tbody tr")
        names = page.locator("#jobs tbody tr td:first-child").all_text_contents()
        assert sorted(names) == sorted([name, HOSTILE])
        assert page.evaluate("window.__xss") is None
        assert page.locator("#jobs img").count() == 0
        page.select_option("#filter-kind", "cron")
        page.click("#job-filter button[type=submit]")
        expect(page.locator("#jobs tbody tr")).to_have_count(1)
        assert acme.text("#jobs tbody").startswith(name)
        assert "kind=cron" in page.url
        page.screenshot(path=str(shots / "dashboard-jobs.png"))

        # The overview: counts from /v1/stats, executions and lateness drawn for the hour.
        page = acme.go("/ui")
        page.wait_for_selector("#chart-executions svg rect.bar:not([height='0'])")
        expect(page.locator("#count-succeeded")).not_to_have_text("\u2013")
        assert int(acme.text("#count-succeeded")) >= 1
        assert page.locator("#chart-lateness svg polyline").count() == 2
        page.screenshot(path=str(shots / "dashboard-overview.png"))

        # The failures page: the failed run, and its two failures' alerts among the dead
        # letters (each names its job and run).
        def dead_letters() -> list[dict[str, Any]]:
            with api_stack.client() as c:
                r = c.get("/v1/dead-letters", params={"limit": 500})
            assert r.status_code == 200, r.text
            return list(r.json()["dead_letters"])

        def alerts_of(job: str) -> list[dict[str, Any]]:
            return [d for d in dead_letters() if (d["alert"] or {}).get("job_id") == job]

        assert wait_until(lambda: len(alerts_of(failing)) == 2, 60), dead_letters()
        page = acme.go("/ui/failures")
        page.wait_for_selector(f"#failed-runs tbody tr:has-text('failing-{label}')")
        alerts = page.locator(f"#dead-letters tbody tr.kind-alert:has-text('failing-{label}')")
        expect(alerts).to_have_count(2)
        for n in range(2):
            row = alerts.nth(n)
            expect(row).to_contain_text("execution_failed")
            expect(row).to_contain_text("500")
            assert row.locator(f"a[href='/ui/runs/{failed_run}']").count() == 1
            assert row.locator(f"a[href='/ui/jobs/{failing}']").count() == 1
            expect(row.locator("details pre")).to_have_text(FAILED_OUTPUT)  # folded
        assert page.is_hidden("#dead-letters-more")
        page.screenshot(path=str(shots / "dashboard-failures.png"))
        # Paged by the list's cursor: two at a time, newest first, none twice.
        page = acme.go("/ui/failures?dl_limit=2")
        expect(page.locator("#dead-letters tbody tr")).to_have_count(2)
        page.click("#dead-letters-more")
        expect(page.locator("#dead-letters tbody tr")).to_have_count(4)
        shown = [str(r.get_attribute("data-dl-id"))
                 for r in page.locator("#dead-letters tbody tr").all()]
        listed = {d["id"]: d["occurred_at"] for d in dead_letters()}
        assert len(set(shown)) == 4 and set(shown) <= set(listed), (shown, listed)
        times = [listed[i] for i in shown]
        assert times == sorted(times, reverse=True), times
        # Deleting a job from its page (the dialog is accepted) leads back to the list.
        page.click(f"#failed-runs a[href='/ui/jobs/{failing}']")
        page.wait_for_selector("#job:not([hidden])")
        page.click("#btn-delete")
        page.wait_for_url(base + "/ui/jobs")
        with api_stack.client() as c:
            assert c.get(f"/v1/jobs/{failing}").status_code == 404
        assert acme.problems == [], acme.problems
        # The wrong key's 401, and the stale retry button's 409.
        assert sorted(set(acme.failed)) == [(401, "/v1/stats"), (409, f"/v1/runs/{run_id}:retry")
                                            ], acme.failed
    finally:
        acme.close()

    # Another tenant signs in: the job is not found, the list is empty, the run not found.
    globex = Tab(browser, base)
    try:
        globex.sign_in("key-globex", then=f"/ui/jobs/{job_id}")
        page = globex.page
        page.wait_for_selector("#notice:not([hidden])")
        assert "not found" in globex.text("#notice").lower()
        assert page.is_hidden("#job")
        assert globex.text("#job-name") == ""
        page = globex.go(f"/ui/jobs?label=team%3D{label}")
        page.wait_for_selector("#jobs-empty:not([hidden])")
        assert page.locator("#jobs tbody tr").count() == 0
        page = globex.go("/ui/jobs")
        page.wait_for_selector("#jobs-empty:not([hidden])")
        page = globex.go(f"/ui/runs/{run_id}")
        page.wait_for_selector("#notice:not([hidden])")
        assert "not found" in globex.text("#notice").lower()
        page = globex.go(f"/ui/runs/{slow_run}")  # nor cancel or retry another's
        page.wait_for_selector("#notice:not([hidden])")
        assert "not found" in globex.text("#notice").lower()
        assert page.is_hidden("#btn-cancel") and page.is_hidden("#btn-retry")
        page = globex.go("/ui/failures")
        page.wait_for_selector("#failures-empty:not([hidden])")
        expect(page.locator("#dead-letters-note")).to_have_text("None.")
        assert page.is_hidden("#dead-letters")
        assert page.locator("#dead-letters tbody tr").count() == 0
        # Signing out forgets the key: the next page asks for one again.
        page.click("#signout")
        page.wait_for_url("**/ui/signin")
        assert page.evaluate("sessionStorage.getItem('kron.key')") is None
        assert globex.problems == [], globex.problems
        assert {s for s, _ in globex.failed} == {404}, globex.failed
        assert {p for _, p in globex.failed} == {
            f"/v1/jobs/{job_id}", f"/v1/runs/{run_id}", f"/v1/runs/{slow_run}"}, globex.failed
    finally:
        globex.close()

    with api_stack.client() as c:  # the job stops calling the target
        assert c.delete(f"/v1/jobs/{job_id}").status_code == 200
