"""The dashboard's rendering helpers (api/ui/static/app.js), run in Debian's chromium with no
server: app.js is loaded into a blank page (its start, on DOMContentLoaded, never runs) and
its functions called on the shapes the API answers. What a tenant wrote (names, errors,
outputs) must come out as text, never as markup.

The browser test (tests/integration/test_ui_browser.py) drives the same code against the
real stack; this one covers what that stack can't show on demand: a queued run's reason, an
attempt's output, every state's run commands, a refused command's dead letter."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright import sync_api

APP_JS = Path(__file__).resolve().parents[2] / "api" / "ui" / "static" / "app.js"
HOSTILE = '<img src=x onerror="window.__xss=1">'


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Debian's chromium is not installed: `make setup` installs it (as root, "
                    "or through sudo -n), or `apt-get install chromium`")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=found, headless=True)
        try:
            tab = browser.new_page()
            tab.set_content("<!doctype html><html><body></body></html>")
            tab.add_script_tag(content=APP_JS.read_text())
            yield tab
        finally:
            browser.close()


def html(page: Any, call: str, arg: Any) -> dict[str, Any]:
    """What `call(arg)` builds, put in a table body: its text, its markup and its images."""
    return dict(page.evaluate(
        """([call, arg]) => {
             const made = window[call] ? window[call](arg) : eval(call)(arg);
             const host = document.createElement("tbody");
             for (const n of [].concat(made)) host.append(n);
             return { text: host.textContent, html: host.innerHTML,
                      imgs: host.querySelectorAll("img").length,
                      rows: host.querySelectorAll(":scope > tr").length };
           }""", [call, arg]))


def test_a_queued_run_shows_why_it_waits(page: Any) -> None:
    queued = html(page, "runState", {"state": "queued", "reason": "tenant concurrency limit"})
    assert queued["text"] == "queued tenant concurrency limit"
    assert 'class="badge state-queued"' in queued["html"]
    rate = html(page, "runState", {"state": "queued", "reason": "dispatch rate"})
    assert rate["text"] == "queued dispatch rate"
    # Another state's reason is not a queue's: the badge alone (the reason has its column).
    cancelled = html(page, "runState", {"state": "cancelled", "reason": "cancelled by user"})
    assert cancelled["text"] == "cancelled"
    assert html(page, "runState", {"state": "queued", "reason": None})["text"] == "queued"
    assert page.evaluate("runStateText({state: 'queued', reason: 'dispatch rate'})") == \
        "queued (dispatch rate)"
    assert page.evaluate("runStateText({state: 'running', reason: null})") == "running"
    marked = html(page, "runState", {"state": "queued", "reason": HOSTILE})
    assert marked["imgs"] == 0 and marked["text"] == "queued " + HOSTILE


@pytest.mark.parametrize(("run", "cancel", "retry"), [
    ({"state": "queued"}, True, False),
    ({"state": "running"}, True, False),
    ({"state": "retry_pending"}, True, False),
    ({"state": "succeeded"}, False, False),
    ({"state": "failed"}, False, True),
    ({"state": "missed"}, False, True),
    ({"state": "skipped"}, False, True),
    ({"state": "cancelled"}, False, False),
    ({"state": "running", "tasks": []}, True, False),  # a DAG run
    ({"state": "failed", "tasks": []}, False, True),
    ({"state": "cancelled", "tasks": []}, False, True),
    ({"state": "succeeded", "tasks": []}, False, False),
    ({"state": "running", "task_id": "b", "run_id": "r"}, False, False),  # a task instance
    ({"state": "failed", "task_id": "b", "run_id": "r"}, False, False),
])
def test_which_run_commands_a_run_takes(page: Any, run: dict[str, Any], cancel: bool,
                                        retry: bool) -> None:
    """As api/routes/run_actions.py judges them (PLAIN_CANCELLABLE, may_rerun, DAG_*)."""
    assert page.evaluate("(r) => runCommands(r)", run) == {"cancel": cancel, "retry": retry}


ATTEMPT = {"attempt": 1, "worker": "w1", "started_at": "2026-12-05T08:00:00.000Z",
           "finished_at": "2026-12-05T08:00:00.120Z", "outcome": "http_5xx",
           "status_code": 500, "error": "HTTP 500"}


def test_an_attempts_output_is_shown_under_it_as_text(page: Any) -> None:
    out = html(page, "attemptRows",
               ATTEMPT | {"output": "HTTP/1.1 500 Internal Server Error\n" + HOSTILE})
    assert out["rows"] == 2
    assert "HTTP/1.1 500 Internal Server Error\n" + HOSTILE in out["text"]
    assert out["imgs"] == 0
    assert "<pre>HTTP/1.1 500 Internal Server Error\n&lt;img" in out["html"]
    # No output (a timeout, an attempt from before outputs were kept, an older server).
    assert html(page, "attemptRows", ATTEMPT | {"output": None})["rows"] == 1
    assert html(page, "attemptRows", ATTEMPT)["rows"] == 1
    assert html(page, "attemptRows", ATTEMPT | {"output": ""})["rows"] == 2  # empty, but given
    assert page.evaluate("outputText({partition: 3})") == '{\n  "partition": 3\n}'
    assert page.evaluate("outputText(undefined)") is None


def test_a_dag_tasks_attempts_fold_their_outputs(page: Any) -> None:
    attempts = [{"attempt": 1, "outcome": "http_5xx", "status_code": 500, "error": "HTTP 500",
                 "output": "HTTP/1.1 500 Internal Server Error\n" + HOSTILE},
                {"attempt": 2, "outcome": None, "status_code": None, "error": None,
                 "output": None}]
    cell = html(page, "taskAttempts", attempts)
    assert cell["text"] == ("#1 http_5xx 500; #2 …" + "output"
                            + "#1\nHTTP/1.1 500 Internal Server Error\n" + HOSTILE)
    assert cell["imgs"] == 0 and "<details><summary>output</summary><pre>" in cell["html"]
    assert html(page, "taskAttempts", attempts[1:])["text"] == "#2 …"  # nothing to fold


def dead_letter(**fields: Any) -> dict[str, Any]:
    return {"id": "dl_" + "0" * 32, "kind": "alert", "error_class": "execution_failed",
            "error": "execution failed after 1 attempt(s): HTTP 500",
            "occurred_at": "2026-12-05T08:00:01.000Z", "command": None, "redriven": None,
            "alert": {"event": "failed", "job_id": "j_1", "job_name": "nightly " + HOSTILE,
                      "run_id": "x_1", "task_id": None, "attempt": 1, "state": "failed",
                      "error": "HTTP 500", "output": "HTTP/1.1 500 Internal Server Error\nok",
                      "scheduled_for": "2026-12-05T08:00:00.000Z"}} | fields


def test_a_dead_letter_row_names_its_job_and_run(page: Any) -> None:
    alert = html(page, "deadLetterRow", dead_letter())
    assert alert["imgs"] == 0
    text = alert["text"]
    assert text.startswith("2026-12-05 08:00:01Z" + "alert execution_failed")
    assert "nightly " + HOSTILE in text
    assert "2026-12-05 08:00:00Z #1" in text  # the run, by its slot, and the attempt
    assert "execution failed after 1 attempt(s): HTTP 500" in text
    assert "HTTP/1.1 500 Internal Server Error" in text  # its output, folded
    assert 'href="/ui/jobs/j_1"' in alert["html"] and 'href="/ui/runs/x_1"' in alert["html"]
    assert 'data-dl-id="dl_000' in alert["html"]
    # An alert written before alerts carried their facts: no name, no slot, no attempt.
    old = html(page, "deadLetterRow", dead_letter(alert={
        "event": "failed", "job_id": "j_1", "job_name": None, "run_id": "x_1",
        "task_id": None, "attempt": None, "state": None, "error": "e", "output": None,
        "scheduled_for": None}))
    assert "j_1" in old["text"] and "x_1" in old["text"] and "<details" not in old["html"]
    # A refused command: its name and job; whether it was redriven.
    command = html(page, "deadLetterRow", dead_letter(
        kind="command", error_class="invalid_command", error="cron: bad field", alert=None,
        command={"name": "CreateJob", "job_id": "j_2", "body": {}},
        redriven={"command_id": "c_9", "at": "2026-12-05T08:01:00.000Z"}))
    assert "command invalid_command CreateJob" in command["text"]
    assert 'href="/ui/jobs/j_2"' in command["html"]
    assert "redriven 2026-12-05 08:01:00Z as command c_9" in command["text"]


def test_a_refusals_detail_is_shown_without_its_field(page: Any) -> None:
    res = {"status": 409, "data": {"detail": "run 'x' is succeeded", "field": "run_id"}}
    assert page.evaluate("(r) => problem(r, true)", res) == "run 'x' is succeeded"
    assert page.evaluate("(r) => problem(r)", res) == "run 'x' is succeeded (run_id)"
    assert page.evaluate("problem({status: 502, data: null})") == "HTTP 502"
