"""`kron bench SCENARIO`: one command per scenario. Heavy imports wait until a command runs,
so `kron worker` (which imports the CLI) does not pay for them."""

from __future__ import annotations

import signal
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

bench_app = typer.Typer(
    help="Measure kron against a real local stack it starts and stops itself: broker on free "
         "ports, `kron worker`s, the API. Prints a table; with --json the last stdout line "
         "is one JSON object.",
    no_args_is_help=True,
    add_completion=False,
)


class Target(StrEnum):
    http = "http"
    kafka = "kafka"


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON line "
                                                       "(the last line of stdout).")]
WorkersOpt = Annotated[int, typer.Option("--workers", min=0, max=8,
                                         help="`kron worker` processes.")]
PartitionsOpt = Annotated[int, typer.Option("--partitions", min=1, max=64,
                                            help="Partitions of every kron topic.")]
PlotOpt = Annotated[Path | None, typer.Option(
    "--plot", help="Write a PNG of lateness over time into this directory (needs "
                   "matplotlib; skipped if it is not installed).")]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(fn: Callable[..., dict[str, Any]], *, as_json: bool, **kwargs: Any) -> None:
    """Runs a scenario; SIGTERM unwinds like Ctrl-C so the stack's tear-down always runs."""
    from bench.report import emit, log, missing_keys
    from kron.errors import SetupError

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = fn(**kwargs)
    except KeyboardInterrupt:
        log("interrupted; everything the bench started is stopped")
        raise typer.Exit(130) from None
    except (SetupError, RuntimeError, TimeoutError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from exc
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not missing_keys(result), missing_keys(result)
    emit(result, as_json=as_json)


@bench_app.command()
def steady(
    rate: Annotated[int, typer.Option(min=1, max=100_000,
                                      help="Executions per second (per-second cron jobs).")]
    = 100,
    duration: Annotated[int, typer.Option(min=1, max=3600, help="Window, seconds.")] = 20,
    target: Annotated[Target, typer.Option(help="Where the jobs call.")] = Target.http,
    find_max: Annotated[bool, typer.Option(
        "--find-max", help="Double the rate, then bisect, until p99 lateness passes "
                           "--limit-ms; report the highest sustained rate.")] = False,
    step_duration: Annotated[int, typer.Option(min=2, max=600,
                                               help="--find-max: window per step.")] = 10,
    max_steps: Annotated[int, typer.Option(min=1, max=12, help="--find-max: steps.")] = 6,
    limit_ms: Annotated[float, typer.Option(help="--find-max: p99 lateness limit.")] = 1000.0,
    jitter: Annotated[float, typer.Option(
        "--jitter", min=0.0, max=60.0,
        help="jitter_s of every job: spreads each second's slots instead of firing them at "
             "once; lateness is then measured from the jittered due time.")] = 0.0,
    workers: WorkersOpt = 1,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
    plot_dir: PlotOpt = None,
) -> None:
    """RATE per-second cron jobs fire for DURATION seconds; achieved rate and lateness."""
    from bench import scenarios

    if workers < 1:
        raise typer.BadParameter("steady needs at least one worker", param_hint="--workers")
    if find_max:
        run(scenarios.find_max, as_json=as_json, start_rate=rate, step_s=step_duration,
            target=target.value, workers=workers, partitions=partitions,
            max_steps=max_steps, limit_ms=limit_ms, jitter_s=jitter, plot_dir=plot_dir)
        return
    run(scenarios.steady, as_json=as_json, rate_per_s=rate, duration_s=duration,
        target=target.value, workers=workers, partitions=partitions, jitter_s=jitter,
        plot_dir=plot_dir)


@bench_app.command()
def burst(
    jobs: Annotated[int, typer.Option(min=1, max=1_000_000, help="One-off jobs.")] = 1000,
    workers: WorkersOpt = 1,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
    plot_dir: PlotOpt = None,
) -> None:
    """JOBS one-off jobs all due in the same second: time until the last one ran."""
    from bench import scenarios

    if workers < 1:
        raise typer.BadParameter("burst needs at least one worker", param_hint="--workers")
    run(scenarios.burst, as_json=as_json, jobs=jobs, workers=workers, partitions=partitions,
        plot_dir=plot_dir)


@bench_app.command()
def timers(
    jobs: Annotated[int, typer.Option(min=1, max=10_000_000, help="Pending one-offs.")]
    = 10_000,
    due_in: Annotated[int, typer.Option(min=60, help="They are due this many seconds out.")]
    = 86_400,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
) -> None:
    """JOBS pending timers: create rate, worker RSS and disk, restart and cold-rebuild times.

    Always one worker: the restart numbers are a single worker's.
    """
    from bench import scenarios

    run(scenarios.timers, as_json=as_json, jobs=jobs, partitions=partitions, due_in_s=due_in)


@bench_app.command()
def api(
    duration: Annotated[int, typer.Option(min=1, max=3600, help="Seconds of load.")] = 15,
    concurrency: Annotated[int, typer.Option(min=1, max=1024, help="Concurrent clients.")]
    = 32,
    workers: WorkersOpt = 1,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
) -> None:
    """Concurrent POST /v1/jobs against `kron api`: requests/s and latency percentiles."""
    from bench import scenarios

    run(scenarios.api, as_json=as_json, duration_s=duration, concurrency=concurrency,
        workers=workers, partitions=partitions)


@bench_app.command()
def failover(
    rate: Annotated[int, typer.Option(min=1, max=100_000, help="Executions per second.")]
    = 200,
    duration: Annotated[int, typer.Option(min=10, max=3600, help="Window, seconds.")] = 40,
    kill_after: Annotated[float | None, typer.Option(
        help="Seconds into the window to kill -9 a worker (default: a third of it).")] = None,
    session_timeout: Annotated[float | None, typer.Option(
        help="KRON_SESSION_TIMEOUT_S of the workers (default: kron's default).")] = None,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
    plot_dir: PlotOpt = None,
) -> None:
    """Two workers at RATE; one is killed with SIGKILL mid-run. Takeover, lateness, loss."""
    from bench import scenarios

    kill = duration / 3 if kill_after is None else kill_after
    if not 0 < kill < duration:
        raise typer.BadParameter("must be inside the window", param_hint="--kill-after")
    run(scenarios.failover, as_json=as_json, rate_per_s=rate, duration_s=duration,
        kill_after_s=kill, partitions=partitions, session_timeout_s=session_timeout,
        plot_dir=plot_dir)
