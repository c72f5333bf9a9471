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
runs_app = typer.Typer(help="List, retry and cancel runs across your jobs.",
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
RUN_COLUMNS = ("run_id", "state", "reason", "trigger", "scheduled_for", "attempt", "lateness_ms",
               "error")


# Flags that write a job's definition (`kron jobs create` and `update`): each sets the JSON
# field its help names, over a JSON body if one is given too.
Name = Annotated[str | None, typer.Option(help="The job's name (\"name\").")]
Cron = Annotated[str | None, typer.Option(
    help="A cron schedule: 5 fields, or 6 with leading seconds (\"schedule.cron\").")]
Tz = Annotated[str | None, typer.Option(
    "--tz", help="The cron schedule's IANA time zone, e.g. Asia/Kolkata (\"schedule.timezone\").")]
At = Annotated[str | None, typer.Option(
    help="Run once at this RFC 3339 time with an offset, e.g. 2026-12-24T18:00:00Z "
         "(\"run_at\").")]
Url = Annotated[str | None, typer.Option(help="Call this URL (an HTTP target).")]
Method = Annotated[str | None, typer.Option(help="The HTTP method (default POST).")]
Topic = Annotated[str | None, typer.Option(help="Produce a record to this Kafka topic.")]
Retries = Annotated[int | None, typer.Option(
    help="Retries after a failed first attempt: \"retry.max_attempts\" is this plus one.")]
Priority = Annotated[str | None, typer.Option(help="critical, normal or batch.")]
Concurrency = Annotated[str | None, typer.Option(
    help="allow, skip_if_running, queue or replace (when a slot comes while one runs).")]


class FlagError(ValueError):
    """Flags that can't make a job: the CLI says why and exits 2."""


def spec_of_flags(*, name: str | None = None, cron: str | None = None, tz: str | None = None,
                  at: str | None = None, url: str | None = None, method: str | None = None,
                  topic: str | None = None, retries: int | None = None,
                  priority: str | None = None, concurrency: str | None = None,
                  ) -> dict[str, Any]:
    """The JSON fields the flags set (a create's body, or a merge patch for an update).
    Checks only what the flags say together; the API judges the values."""
    if cron is not None and at is not None:
        raise FlagError("--cron and --at both give the schedule: a job is a cron job or a "
                        "one-off")
    if url is not None and topic is not None:
        raise FlagError("--url and --topic both give the target: pick one")
    if method is not None and url is None:
        raise FlagError("--method needs --url (it is the HTTP target's)")
    if retries is not None and not 0 <= retries <= 99:
        raise FlagError(f"--retries must be in 0..99 (max_attempts 1..100), not {retries}")
    out: dict[str, Any] = {}
    if name is not None:
        out["name"] = name
    schedule = {k: v for k, v in (("cron", cron), ("timezone", tz)) if v is not None}
    if schedule:
        out["schedule"] = schedule
    if at is not None:
        if tz is not None:
            raise FlagError("--tz is a cron schedule's zone; give --at with its own offset "
                            "(2026-12-24T18:00:00+05:30)")
        out["run_at"] = at
    if url is not None:
        out["target"] = {"type": "http", "url": url, **({"method": method} if method else {})}
    if topic is not None:
        out["target"] = {"type": "kafka", "topic": topic}
    if retries is not None:
        out["retry"] = {"max_attempts": retries + 1}
    out.update({k: v for k, v in (("priority", priority), ("concurrency", concurrency))
                if v is not None})
    return out


def _flags(**flags: Any) -> dict[str, Any]:
    try:
        return spec_of_flags(**flags)
    except FlagError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc


def _body(body: str | None) -> dict[str, Any]:
    """A job definition given as JSON inline, @file.json or - (stdin); {} for none."""
    if body is None:
        return {}
    try:
        raw = sys.stdin.read() if body == "-" else (
            Path(body[1:]).read_text() if body.startswith("@") else body)
        payload = json.loads(raw)
    except (OSError, json.JSONDecodeError) as exc:
        typer.secho(f"error: the job definition is not readable JSON: {exc}", fg="red",
                    err=True)
        raise typer.Exit(2) from exc
    if not isinstance(payload, dict):
        typer.secho("error: the job definition must be a JSON object", fg="red", err=True)
        raise typer.Exit(2)
    return payload


def _overlay(payload: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """The body with the flags' fields over it: a flag's schedule replaces the body's
    (run_at or schedule), its target the body's target."""
    if "schedule" in fields or "run_at" in fields:
        payload = {k: v for k, v in payload.items() if k not in ("schedule", "run_at")}
    return {**payload, **fields}


@jobs_app.command("create")
def create(
    body: Annotated[str | None, typer.Argument(
        help="Job JSON, or @file.json, or - for stdin; flags set fields over it.")] = None,
    name: Name = None, cron: Cron = None, tz: Tz = None, at: At = None, url: Url = None,
    method: Method = None, topic: Topic = None, retries: Retries = None,
    priority: Priority = None, concurrency: Concurrency = None,
    api: ApiUrl = DEFAULT_URL, key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Create a job from its JSON definition (see the API docs at /docs), from flags
    (--cron '0 2 * * *' --tz Asia/Kolkata --url https://... --retries 5, or --at
    2026-12-24T18:00:00Z --topic team.events), or both."""
    fields = _flags(name=name, cron=cron, tz=tz, at=at, url=url, method=method, topic=topic,
                    retries=retries, priority=priority, concurrency=concurrency)
    payload = _overlay(_body(body), fields)
    if body is None and ("target" not in payload or not (
            "schedule" in payload or "run_at" in payload)):
        typer.secho("error: a job needs a schedule (--cron or --at) and a target (--url or "
                    "--topic), or a JSON definition", fg="red", err=True)
        raise typer.Exit(2)
    data = _call("POST", "/v1/jobs", api, key, json=payload)
    _show(data, as_json, [data], (*JOB_COLUMNS, "upcoming"))


@jobs_app.command("update")
def update(
    job_id: str,
    patch: Annotated[str | None, typer.Argument(
        help="A JSON merge patch, or @file.json, or - for stdin; flags set fields over it.")
    ] = None,
    name: Name = None, cron: Cron = None, tz: Tz = None, at: At = None, url: Url = None,
    method: Method = None, topic: Topic = None, retries: Retries = None,
    priority: Priority = None, concurrency: Concurrency = None,
    api: ApiUrl = DEFAULT_URL, key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Change a job: a JSON merge patch over its definition, or flags (--tz alone keeps
    the cron expression; --at makes it a one-off, --cron a cron job)."""
    fields = _flags(name=name, cron=cron, tz=tz, at=at, url=url, method=method, topic=topic,
                    retries=retries, priority=priority, concurrency=concurrency)
    payload = {**_body(patch), **fields}
    if not payload:
        typer.secho("error: nothing to change: give a JSON patch or flags", fg="red", err=True)
        raise typer.Exit(2)
    data = _call("PATCH", f"/v1/jobs/{job_id}", api, key, json=payload)
    _show(data, as_json, [data], JOB_COLUMNS)


@jobs_app.command("backfill")
def backfill(
    job_id: str,
    from_: Annotated[str, typer.Option("--from", help="The first slot's time (RFC 3339).")],
    to: Annotated[str, typer.Option(help="The last slot's time (RFC 3339, in the past).")],
    max_per_s: Annotated[float | None, typer.Option(
        help="Slots started per second (default 10).")] = None,
    rerun: Annotated[bool, typer.Option(
        help="Run slots whose run failed, missed or was skipped again.")] = False,
    api: ApiUrl = DEFAULT_URL, key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Run a job's own slots in [--from, --to] again, paced (docs/semantics.md, Backfill)."""
    payload: dict[str, Any] = {"from": from_, "to": to, "rerun": rerun}
    if max_per_s is not None:
        payload["max_per_s"] = max_per_s
    data = _call("POST", f"/v1/jobs/{job_id}:backfill", api, key, json=payload)
    if as_json:
        _show(data, as_json)
        return
    _show(data, as_json, [{**data, **data.get("backfill", {})}],
          (*JOB_COLUMNS[:3], "slots", "armed", "already_recorded", "rerun"))


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


@runs_app.command("list")
def runs_list(
    state: Annotated[str | None, typer.Option(help="Only runs in this state (failed...).")
                     ] = None,
    since: Annotated[str | None, typer.Option(
        help="Only slots at or after this RFC 3339 time, e.g. 2026-12-01T00:00:00Z.")] = None,
    limit: Annotated[int, typer.Option(help="How many, newest slot first.")] = 20,
    cursor: Annotated[str | None, typer.Option(help="The next page's cursor.")] = None,
    api: ApiUrl = DEFAULT_URL, key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Your runs across all your jobs (deleted jobs' too), newest slot first."""
    params: dict[str, Any] = {"limit": limit, **{k: v for k, v in (
        ("state", state), ("since", since), ("cursor", cursor)) if v is not None}}
    data = _call("GET", "/v1/runs", api, key, params=params)
    _show(data, as_json, data["runs"], ("job_id", *RUN_COLUMNS))
    if not as_json and data["next_cursor"]:
        typer.echo(f"more: --cursor {data['next_cursor']}")


@runs_app.command("get")
def runs_get(run_id: str, api: ApiUrl = DEFAULT_URL, key: ApiKey = None,
             as_json: AsJson = False) -> None:
    """Show one run: its attempts, or a DAG run's tasks in dependency order."""
    run_get(run_id, api, key, as_json)


@runs_app.command("retry")
def runs_retry(run_id: str, api: ApiUrl = DEFAULT_URL, key: ApiKey = None,
               as_json: AsJson = False) -> None:
    """Run a failed, missed or skipped run again as its next attempt (the same
    Idempotency-Key); a failed or cancelled DAG run's tasks that did not succeed."""
    run_retry(run_id, api, key, as_json)


@runs_app.command("cancel")
def runs_cancel(
    run_id: str,
    reason: Annotated[str | None, typer.Option(help="Why (the run's reason).")] = None,
    api: ApiUrl = DEFAULT_URL, key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Cancel a running run: its attempt is stopped and fenced (a late result is
    rejected); a DAG run's running tasks too, its unstarted ones skipped."""
    run_cancel(run_id, reason, api, key, as_json)


@jobs_app.command("run-cancel")
def run_cancel(
    run_id: str,
    reason: Annotated[str | None, typer.Option(help="Why (the run's reason).")] = None,
    api: ApiUrl = DEFAULT_URL, key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Cancel a running run (as `kron runs cancel`)."""
    body = {"json": {"reason": reason}} if reason else {}
    data = _call("POST", f"/v1/runs/{run_id}:cancel", api, key, **body)
    _show(data, as_json, [data], RUN_COMMAND_COLUMNS)


@jobs_app.command("run-retry")
def run_retry(run_id: str, api: ApiUrl = DEFAULT_URL, key: ApiKey = None,
              as_json: AsJson = False) -> None:
    """Retry a run (as `kron runs retry`)."""
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
