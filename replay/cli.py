"""`kron replay`: audit the recorded history against the design's invariants, or export it.

Both commands read the topics from the first offset to their current end. Progress goes to
stderr, results to stdout.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaException
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from kron.clock import SystemClock
from kron.settings import Settings
from replay.audit import DEFAULT_GRACE_MS, KINDS, AuditReport, audit, iso, tombstone
from replay.export import export
from replay.reader import Entry, read_topic, topic_offsets
from schemas.envelope import make_envelope

JOB_STATE = "kron.state.JobState"
EXECUTION_STATE = "kron.executions.ExecutionState"

replay_app = typer.Typer(
    help="Audit kron's recorded history against its guarantees, export it as JSON lines, or "
         "archive old executions as Parquet.",
    no_args_is_help=True,
    add_completion=False,
)


class TopicName(StrEnum):
    executions = "executions"
    jobs = "jobs"
    commands = "commands"
    dead_letters = "dead-letters"
    all = "all"


class _Rate(ProgressColumn):
    """Records read and records per second (offsets drive the bar, records the rate)."""

    def render(self, task: Task) -> Text:
        records = int(task.fields.get("records", 0))
        elapsed = task.finished_time if task.finished else task.elapsed
        rate = records / elapsed if elapsed else 0.0
        return Text(f"{records:,} rec {rate:,.0f} rec/s", style="progress.data.speed")


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                    _Rate(), TimeElapsedColumn(), console=console, transient=False)


def _read(settings: Settings, name: str, progress: Progress | None) -> Iterator[Entry]:
    """read_topic with a progress bar: the bar follows offsets, so compaction gaps count."""
    topic = settings.topic(name)
    bootstrap = settings  # Settings, not a bare address: the cluster's security applies
    if progress is None:
        yield from read_topic(bootstrap, topic)
        return
    offsets = topic_offsets(bootstrap, topic)
    total = sum(high - low for low, high in offsets.values())
    task = progress.add_task(topic, total=total or None, records=0)
    next_offset = {p: low for p, (low, _high) in offsets.items()}
    count = 0
    done = 0
    for entry in read_topic(bootstrap, topic):
        count += 1
        start = next_offset.get(entry.partition, entry.offset)
        done += max(entry.offset + 1 - start, 1)
        next_offset[entry.partition] = entry.offset + 1
        if count % 512 == 0:
            progress.update(task, completed=done, records=count)
        yield entry
    progress.update(task, completed=total or count, total=total or count, records=count)


def _records(entries: Iterator[Entry], name: str) -> Iterator[dict[str, Any]]:
    for entry in entries:
        if entry.name == name and entry.record is not None:
            yield entry.record


def _executions(entries: Iterator[Entry]) -> Iterator[dict[str, Any]]:
    """Execution records, and a tombstone marker where history retention deleted one."""
    for entry in entries:
        if entry.tombstone and entry.key is not None:
            yield tombstone(entry.key.decode("utf-8", "replace"))
        elif entry.name == EXECUTION_STATE and entry.record is not None:
            yield entry.record


def _print_report(report: AuditReport, console: Console) -> None:
    if report.violations:
        table = Table(title="Violations", show_lines=False)
        for col in ("kind", "job", "exec", "scheduled for", "detail"):
            table.add_column(col, overflow="fold")
        for v in report.violations:
            table.add_row(v.kind, v.job_id, v.exec_id or "-", iso(v.scheduled_for_ms),
                          v.detail)
        console.print(table)
    counts = ", ".join(f"{k}={n}" for k, n in report.counts.items() if n)
    verdict = "[green]OK[/green]" if report.ok else f"[red]FAILED[/red] ({counts})"
    dag = (f"{report.dag_runs:,} DAG runs, {report.task_instances:,} task instances, "
           if report.dag_runs or report.task_instances else "")
    if report.expired:
        dag += f"{report.expired:,} expired by history retention, "
    console.print(f"{report.jobs:,} job records, {report.executions:,} execution records, "
                  f"{dag}{report.slots_checked:,} slots checked: {verdict}")
    for job_id in report.truncated:
        console.print(f"[yellow]note:[/yellow] {job_id}: slot enumeration stopped at the "
                      "per-job limit")
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


@replay_app.command("audit")
def audit_command(
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the report as one JSON object (the last line of stdout).")]
    = False,
    now_ms: Annotated[int | None, typer.Option(
        "--now-ms", help="Judge the history as of this time (epoch ms); default now.")]
    = None,
    grace_ms: Annotated[int, typer.Option(
        "--grace-ms", help="How long a due slot may go unrecorded before it is lost.")]
    = DEFAULT_GRACE_MS,
    history_days: Annotated[float | None, typer.Option(
        "--history-days", help="The history window (default KRON_HISTORY_DAYS): a missing "
                               "record older than it expired, it is not lost; 0: none may.")]
    = None,
) -> None:
    """Check the recorded history against kron's guarantees; exit code 1 on any violation.

    Reads kron.jobs and kron.executions and looks for duplicate triggers, lost slots,
    attempts over the retry policy, stale-token writes and cursors moving back; for DAG
    jobs, tasks started against their trigger rule, finished runs with unfinished tasks,
    two runs for one slot, task attempts started twice, and task instances without a run.
    Executions removed by history retention (tombstoned, or older than the window) are
    counted as expired, not lost.
    """
    settings = Settings()
    history_ms = (settings.history_ms if history_days is None
                  else int(history_days * 86_400_000))
    now = now_ms if now_ms is not None else SystemClock().now_ms()
    err = Console(stderr=True)
    try:
        with _progress(err) as progress:
            # jobs first: an execution written before a job state is then surely read
            report = audit(_records(_read(settings, "jobs", progress), JOB_STATE),
                           _executions(_read(settings, "executions", progress)),
                           now_ms=now, grace_ms=grace_ms, history_ms=history_ms)
    except (KafkaException, TimeoutError, KeyError) as exc:
        err.print(f"[red]error:[/red] reading the topics failed: {exc}")
        raise typer.Exit(code=2) from exc
    if as_json:
        sys.stdout.write(report.to_json() + "\n")
        sys.stdout.flush()
    else:
        _print_report(report, Console())
    raise typer.Exit(code=0 if report.ok else 1)


def _parse_time(value: str | None, option: str) -> int | None:
    """Epoch milliseconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    if value is None:
        return None
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is neither epoch ms nor an ISO 8601 time",
                                 param_hint=option) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _before(value: str, now_ms: int) -> int:
    """--before: `<N>d` (the start of the UTC day N days ago, so every day archived is a
    whole one: what a daily kron job passes), else a time as --since takes it."""
    text = value.strip()
    if text.endswith("d") and text[:-1].isdigit():
        day_ms = 86_400_000
        return (now_ms - int(text[:-1]) * day_ms) // day_ms * day_ms
    parsed = _parse_time(text, "--before")
    assert parsed is not None
    return parsed


@replay_app.command("archive")
def archive_command(
    before: Annotated[str, typer.Option(
        "--before", help="Archive executions that ended before this: ISO 8601 (a date is "
                         "its UTC midnight), epoch ms, or Nd (UTC midnight N days ago).")],
    to: Annotated[Path, typer.Option("--to", help="The archive's root directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line for scripts.")] = False,
) -> None:
    """Write the executions that ended before --before as Parquet, one file per day (the
    UTC date each ended on) and partition of kron.executions:
    DIR/date=YYYY-MM-DD/partition=N.parquet. A rerun merges into the same files, so it is
    idempotent; run it daily (as a kron job: docs/operations.md) with --before shorter
    than KRON_HISTORY_DAYS, so every execution is archived before retention drops it."""
    from replay.archive import archive

    before_ms = _before(before, SystemClock().now_ms())
    settings = Settings()
    err = Console(stderr=True)
    try:
        with _progress(err) as progress:
            files = archive(_read(settings, "executions", progress), before_ms=before_ms,
                            root=to)
    except (KafkaException, TimeoutError, KeyError) as exc:
        err.print(f"[red]error:[/red] reading the topics failed: {exc}")
        raise typer.Exit(code=2) from exc
    summary = {"before": iso(before_ms), "root": str(to), "files": len(files),
               "rows": sum(f.rows for f in files), "days": sorted({f.day for f in files})}
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        Console().print(f"archived {summary['rows']:,} executions in {len(files)} files "
                        f"under {to} (ended before {summary['before']})")


EXPORT_ORDER = ("executions", "jobs", "commands", "dead-letters")


@replay_app.command("export")
def export_command(
    job: Annotated[str | None, typer.Option("--job", help="Only records of this job_id.")]
    = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's records.")]
    = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="From this time (epoch ms or ISO 8601), inclusive.")] = None,
    until: Annotated[str | None, typer.Option(
        "--until", help="Up to this time (epoch ms or ISO 8601), exclusive.")] = None,
    topic: Annotated[TopicName, typer.Option("--topic", help="Which topic to export.")]
    = TopicName.executions,
) -> None:
    """Write the records of a kron topic to stdout as JSON lines, oldest first per partition."""
    since_ms = _parse_time(since, "--since")
    until_ms = _parse_time(until, "--until")
    settings = Settings()
    names = EXPORT_ORDER if topic == TopicName.all else (topic.value,)
    out = sys.stdout
    try:
        for name in names:
            for row in export(_read(settings, name, None), job_id=job, tenant=tenant,
                              since_ms=since_ms, until_ms=until_ms):
                out.write(json.dumps(row, separators=(",", ":"), ensure_ascii=False) + "\n")
    except (KafkaException, TimeoutError, KeyError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] reading the topics failed: {exc}")
        raise typer.Exit(code=2) from exc
    except BrokenPipeError:  # `| head`
        raise typer.Exit(code=0) from None
    out.flush()


__all__ = ["KINDS", "replay_app"]


@replay_app.command("rebuild")
def rebuild_command(
    target: Annotated[str | None, typer.Option(
        help="Views directory to replace (default: <KRON_DATA_DIR>/api-views).")] = None,
    since: Annotated[str | None, typer.Option(
        help="Start at this time (epoch ms or ISO 8601) instead of offset 0.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line for scripts.")] = False,
) -> None:
    """Rebuild the API's projections from offset 0 (or --since) into a fresh store, then
    swap it in.

    Stop the API first: it holds the views open. The old views are kept as <dir>.old.
    """
    import shutil
    import time

    from api.projection import rebuild

    settings = Settings()
    final = Path(target) if target else settings.data_dir / "api-views"
    fresh = final.with_name(final.name + ".rebuild")
    shutil.rmtree(fresh, ignore_errors=True)
    console = Console(stderr=True)
    started = time.monotonic()
    with _progress(console) as progress:
        task = progress.add_task("records", total=None)
        views = rebuild(settings, fresh, since_ms=_parse_time(since, "--since"),
                        progress=lambda n: progress.update(task, completed=n))
        entries = len(views.dump())
        views.close()
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    fresh.rename(final)
    result = {"views": str(final), "entries": entries,
              "seconds": round(time.monotonic() - started, 3)}
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        console.print(f"rebuilt {entries} view entries into {final} in {result['seconds']} s")


@replay_app.command("backfill")
def backfill_command(
    job_id: Annotated[str, typer.Argument(help="The cron job to backfill.")],
    from_: Annotated[str, typer.Option("--from", help="First slot (epoch ms or ISO 8601).")],
    to: Annotated[str, typer.Option("--to", help="Last slot (epoch ms or ISO 8601).")],
    rate: Annotated[float, typer.Option(help="Executions per second, at most.")] = 10.0,
    tenant: Annotated[str, typer.Option(help="The job's tenant.")] = "dev",
    rerun: Annotated[bool, typer.Option(
        "--rerun", help="Run slots that ended failed, missed or skipped again (a new attempt "
                        "of the same execution).")] = False,
) -> None:
    """Run a cron job's past slots through the engine, paced: every slot of the range, page
    by page. Slots keep their live ids, so running the same backfill twice creates nothing
    new; a slot already recorded stays as it is unless --rerun asks otherwise."""
    import uuid

    from api.publisher import BrokerUnavailable, CommandPublisher

    start = _parse_time(from_, "--from")
    end = _parse_time(to, "--to")
    if start is None or end is None or end < start or not 0 < rate <= 1000:
        typer.secho("error: need --from <= --to and 0 < --rate <= 1000", fg="red", err=True)
        raise typer.Exit(2)
    settings = Settings()
    publisher = CommandPublisher(settings)
    command_id = uuid.uuid4().hex
    record = {
        "envelope": make_envelope(event_id=command_id, event_type="job.backfill_requested",
                                  occurred_at_ms=SystemClock().now_ms(), tenant=tenant,
                                  producer="kron-replay"),
        "command_id": command_id, "job_id": job_id, "from_ms": start, "to_ms": end,
        "max_per_s": rate, "rerun": rerun,
    }
    try:
        partition, offset = publisher.publish_sync("kron.commands.BackfillJob", record,
                                                   key=job_id)
    except BrokerUnavailable as exc:
        typer.secho(f"error: Kafka did not acknowledge: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    finally:
        publisher.close()
    typer.echo(json.dumps({"command_id": command_id, "partition": partition,
                           "offset": offset}))
