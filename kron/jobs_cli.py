"""`kron jobs ...`: the API for people (tables) and scripts (--json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

jobs_app = typer.Typer(help="Create, inspect and control jobs through the kron API.",
                       no_args_is_help=True)

ApiUrl = Annotated[str, typer.Option("--api", envvar="KRON_API_URL",
                                     help="API base URL.")]
ApiKey = Annotated[str | None, typer.Option("--key", envvar="KRON_API_KEY",
                                            help="API key (default: .kron/dev-api-key).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
DEFAULT_URL = "http://127.0.0.1:8000"


def _key(key: str | None) -> str:
    if key:
        return key
    path = Path(".kron/dev-api-key")
    if path.exists():
        return path.read_text().strip()
    typer.secho("error: no API key: pass --key or set KRON_API_KEY", fg="red", err=True)
    raise typer.Exit(2)


def _call(method: str, path: str, api: str, key: str | None, **kw: Any) -> Any:
    try:
        r = httpx.request(method, api.rstrip("/") + path, timeout=30,
                          headers={"X-API-Key": _key(key)}, **kw)
    except httpx.HTTPError as exc:
        typer.secho(f"error: cannot reach {api}: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    if r.status_code >= 400:
        try:
            p = r.json()
            msg = f"{p.get('title')}: {p.get('detail')}" + (
                f" (field: {p['field']})" if p.get("field") else "")
        except ValueError:
            msg = r.text
        typer.secho(f"error {r.status_code}: {msg}", fg="red", err=True)
        raise typer.Exit(1)
    return r.json()


def _show(data: Any, as_json: bool, rows: list[dict[str, Any]] | None = None,
          columns: tuple[str, ...] = ()) -> None:
    if as_json or rows is None:
        sys.stdout.write(json.dumps(data, indent=None if as_json else 2) + "\n")
        return
    table = Table(*columns)
    for row in rows:
        table.add_row(*[str(row.get(c, "") if row.get(c) is not None else "") for c in columns])
    Console().print(table)


JOB_COLUMNS = ("job_id", "name", "status", "next_run_at", "version")
RUN_COLUMNS = ("run_id", "state", "trigger", "scheduled_for", "attempt", "lateness_ms", "error")


@jobs_app.command("create")
def create(
    body: Annotated[str, typer.Argument(help="Job JSON, or @file.json, or - for stdin.")],
    api: ApiUrl = DEFAULT_URL, key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Create a job from its JSON definition (see the API docs at /docs)."""
    raw = sys.stdin.read() if body == "-" else (
        Path(body[1:]).read_text() if body.startswith("@") else body)
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        typer.secho(f"error: the job definition is not JSON: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    data = _call("POST", "/v1/jobs", api, key, json=payload)
    _show(data, as_json, [data], (*JOB_COLUMNS, "upcoming"))


@jobs_app.command("list")
def list_jobs(
    status: Annotated[str | None, typer.Option(help="Only jobs in this status.")] = None,
    name: Annotated[str | None, typer.Option(help="Only names containing this.")] = None,
    api: ApiUrl = DEFAULT_URL, key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """List your jobs."""
    params = {k: v for k, v in {"status": status, "name": name}.items() if v}
    data = _call("GET", "/v1/jobs", api, key, params=params)
    _show(data, as_json, data["jobs"], JOB_COLUMNS)


@jobs_app.command("get")
def get(job_id: str, api: ApiUrl = DEFAULT_URL, key: ApiKey = None,
        as_json: AsJson = False) -> None:
    """Show one job: definition, status, next run and last run."""
    data = _call("GET", f"/v1/jobs/{job_id}", api, key)
    _show(data, as_json)


def _action(job_id: str, action: str, api: str, key: str | None, as_json: bool) -> None:
    data = _call("POST", f"/v1/jobs/{job_id}:{action}", api, key)
    _show(data, as_json, [data], JOB_COLUMNS)


@jobs_app.command("pause")
def pause(job_id: str, api: ApiUrl = DEFAULT_URL, key: ApiKey = None,
          as_json: AsJson = False) -> None:
    """Pause a job: its slots are recorded as skipped until resumed."""
    _action(job_id, "pause", api, key, as_json)


@jobs_app.command("resume")
def resume(job_id: str, api: ApiUrl = DEFAULT_URL, key: ApiKey = None,
           as_json: AsJson = False) -> None:
    """Resume a paused job."""
    _action(job_id, "resume", api, key, as_json)


@jobs_app.command("trigger")
def trigger(job_id: str, api: ApiUrl = DEFAULT_URL, key: ApiKey = None,
            as_json: AsJson = False) -> None:
    """Run a job now, as an extra execution."""
    _action(job_id, "trigger", api, key, as_json)


@jobs_app.command("delete")
def delete(job_id: str, api: ApiUrl = DEFAULT_URL, key: ApiKey = None,
           as_json: AsJson = False) -> None:
    """Delete a job for good."""
    data = _call("DELETE", f"/v1/jobs/{job_id}", api, key)
    _show(data, as_json, [data], JOB_COLUMNS)


@jobs_app.command("runs")
def runs(
    job_id: str,
    status: Annotated[str | None, typer.Option(help="Only runs in this state.")] = None,
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20,
    api: ApiUrl = DEFAULT_URL, key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """A job's runs, newest scheduled slot first; a DAG run's tasks below, in dependency
    order."""
    params: dict[str, Any] = {"limit": limit, **({"status": status} if status else {})}
    data = _call("GET", f"/v1/jobs/{job_id}/runs", api, key, params=params)
    if as_json:
        _show(data, as_json)
        return
    rows = [{**r, "tasks": task_summary(r["tasks"])} if r.get("tasks") else r
            for r in data["runs"]]
    dags = [r for r in data["runs"] if r.get("tasks") is not None]
    _show(data, as_json, rows, (*RUN_COLUMNS, "tasks") if dags else RUN_COLUMNS)
    for run in dags:
        _show_tasks(_call("GET", f"/v1/runs/{run['run_id']}", api, key))


@jobs_app.command("run-get")
def run_get(run_id: str, api: ApiUrl = DEFAULT_URL, key: ApiKey = None,
            as_json: AsJson = False) -> None:
    """Show one run: its attempts with their output, or a DAG run's tasks in dependency
    order."""
    data = _call("GET", f"/v1/runs/{run_id}", api, key)
    if as_json:
        _show(data, as_json)
        return
    _show(data, as_json, [data], RUN_COLUMNS)
    if data.get("tasks") is not None:
        _show_tasks(data)
        return
    _show_attempts(data)


ATTEMPT_COLUMNS = ("attempt", "outcome", "status_code", "started_at", "finished_at", "error")
# A target's output is printed as it came except for what could steer a terminal: control
# characters (escape sequences, a carriage return that overwrites a line) and format
# characters (bidi overrides), shown as escapes instead. Newlines and tabs stay.
_KEPT_CONTROLS = frozenset("\n\t")


def safe_text(text: str) -> str:
    """A target's output made safe to print (`\\x1b`, `\\u202e`, ...)."""
    return "".join(c if c.isprintable() or c in _KEPT_CONTROLS
                   else c.encode("unicode_escape").decode("ascii") for c in text)


def _show_attempts(run: dict[str, Any]) -> None:
    """The run's attempts as a table, then each attempt's output as it came (made safe to
    print), newest last."""
    table = Table(*ATTEMPT_COLUMNS, title=f"run {run['run_id']} attempts")
    for a in run.get("attempts", ()):
        table.add_row(*["" if a.get(c) is None else str(a[c]) for c in ATTEMPT_COLUMNS])
    Console().print(table)
    for a in run.get("attempts", ()):
        if a.get("output") is not None:
            sys.stdout.write(f"--- attempt {a['attempt']} output ---\n"
                             f"{safe_text(a['output'])}\n")


@jobs_app.command("run-cancel")
def run_cancel(
    run_id: str,
    reason: Annotated[str | None, typer.Option(help="Why (the run's reason).")] = None,
    api: ApiUrl = DEFAULT_URL, key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Cancel a running DAG run: running tasks are cancelled, unstarted ones skipped."""
    body = {"json": {"reason": reason}} if reason else {}
    data = _call("POST", f"/v1/runs/{run_id}:cancel", api, key, **body)
    _show(data, as_json, [data], RUN_COMMAND_COLUMNS)


@jobs_app.command("run-retry")
def run_retry(run_id: str, api: ApiUrl = DEFAULT_URL, key: ApiKey = None,
              as_json: AsJson = False) -> None:
    """Retry a failed or cancelled DAG run: what did not succeed runs again."""
    data = _call("POST", f"/v1/runs/{run_id}:retry", api, key)
    _show(data, as_json, [data], RUN_COMMAND_COLUMNS)


RUN_COMMAND_COLUMNS = ("command_id", "action", "run_id", "state", "applied")
TASK_COLUMNS = ("task", "state", "attempts", "last status", "reason")


def task_summary(counts: dict[str, int]) -> str:
    """A DAG run's task counts, the states it has: "3 succeeded, 1 running"."""
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n)


def task_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A DAG run's tasks as TASK_COLUMNS rows, in the API's (dependency) order."""
    rows = []
    for task in run["tasks"]:
        attempts = task["attempts"]
        last = attempts[-1] if attempts else None
        status = None
        if last is not None:
            status = last["status_code"] if last["status_code"] is not None else last["outcome"]
        rows.append({"task": task["task_id"], "state": task["state"],
                     "attempts": len(attempts), "last status": status,
                     "reason": task["reason"] or (last or {}).get("error")})
    return rows


def _show_tasks(run: dict[str, Any]) -> None:
    table = Table(*TASK_COLUMNS, title=f"run {run['run_id']} ({run['state']})")
    for row in task_rows(run):
        table.add_row(*["" if row[c] is None else str(row[c]) for c in TASK_COLUMNS])
    Console().print(table)
