"""`kron bench SCENARIO`: one command per scenario. Heavy imports wait until a command runs,
so `kron worker` (which imports the CLI) does not pay for them."""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
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
    "--plot", help="Write two PNGs into this directory: a lateness histogram and "
                   "executions/s over time (matplotlib, from the bench extra).")]
ProgressOpt = Annotated[bool, typer.Option(
    "--progress", help="Progress bars on stderr even when it is not a terminal.")]
WorkerEnvOpt = Annotated[list[str] | None, typer.Option(
    "--worker-env", metavar="KEY=VALUE",
    help="An environment variable for the worker processes (repeatable), e.g. a KRON_* "
         "setting; the bench's own KRON_* settings are not passed on otherwise.")]
NoBarrierOpt = Annotated[bool, typer.Option(
    "--no-barrier", help="KRON_DISPATCH_BARRIER=false for the workers: call targets without "
                         "waiting for Kafka's ack of the attempt (A/B the barrier).")]
SaveOpt = Annotated[bool, typer.Option(
    "--save", help="Also write the result and the machine's description to "
                   "bench/results/SCENARIO[-LABEL].json (for `python -m bench.readme`).")]
LabelOpt = Annotated[str | None, typer.Option(
    "--label", help="Names the saved result and the plots: SCENARIO-LABEL.")]
ResultsDirOpt = Annotated[Path | None, typer.Option(
    "--results-dir", help="Where --save writes (default bench/results).")]
RepeatOpt = Annotated[int, typer.Option(
    "--repeat", min=1, max=9,
    help="Run the scenario N times, each on a fresh stack, and report the median run (by "
         "the figure its floor is judged on); lost and duplicates are summed over all runs, "
         "and every run's figures are under `repeats`.")]

BrokerWarmupOpt = Annotated[float, typer.Option(
    "--broker-warmup", min=0.0, max=300.0, metavar="SECONDS",
    help="At most this long, drive the new broker with a produce-and-fetch load until its "
         "JIT compiler threads go quiet, before anything is measured (bench.warmup); 0 "
         "measures a cold broker.")]

ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(kw_only=True)
class Common:
    """The options every scenario shares: where output goes and the workers' environment."""

    as_json: bool = False
    plot_dir: Path | None = None
    progress: bool = False
    save: bool = False
    label: str | None = None
    results_dir: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    repeat: int = 1
    broker_warmup_s: float = 0.0


def fire_ahead_of(env: dict[str, str]) -> float:
    """The workers' fire-ahead window, set or by default: a result records the one it ran
    with, as the default has changed before."""
    from kron.settings import Settings

    default = Settings.model_fields["fire_ahead_s"].default
    return float(env.get("KRON_FIRE_AHEAD_S", default))


def worker_env(pairs: list[str] | None, *, no_barrier: bool) -> dict[str, str]:
    """`--worker-env KEY=VALUE ...` and `--no-barrier` as one dict (--no-barrier wins)."""
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not ENV_KEY.match(key):
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--worker-env")
        env[key] = value
    if no_barrier:
        env["KRON_DISPATCH_BARRIER"] = "false"
    return env


def common(*, as_json: bool, plot_dir: Path | None, progress: bool, save: bool,
           label: str | None, results_dir: Path | None, env: list[str] | None,
           no_barrier: bool, repeat: int = 1, broker_warmup_s: float = 0.0) -> Common:
    from bench.results import LABEL

    if label is not None and not LABEL.match(label):
        raise typer.BadParameter("letters, digits, '.', '_' and '-' only", param_hint="--label")
    if plot_dir is not None and repeat > 1:
        raise typer.BadParameter("plots draw one run: not with --repeat", param_hint="--plot")
    if plot_dir is not None:
        try:  # fail now, not after a run of many minutes
            import matplotlib  # noqa: F401
        except ImportError:
            raise typer.BadParameter("needs matplotlib (the bench extra of pyproject.toml)",
                                     param_hint="--plot") from None
    return Common(as_json=as_json, plot_dir=plot_dir, progress=progress, save=save,
                  label=label, results_dir=results_dir,
                  worker_env=worker_env(env, no_barrier=no_barrier), repeat=repeat,
                  broker_warmup_s=broker_warmup_s)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(fn: Callable[..., dict[str, Any]], opts: Common, **kwargs: Any) -> None:
    """Runs a scenario; SIGTERM unwinds like Ctrl-C so the stack's tear-down always runs."""
    from bench import progress, results
    from bench.repeat import combine
    from bench.report import emit, log, missing_keys
    from kron.errors import SetupError

    progress.force(opts.progress)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        runs = []
        for i in range(opts.repeat):
            if opts.repeat > 1:
                log(f"run {i + 1} of {opts.repeat}")
            runs.append(fn(plot_dir=opts.plot_dir, label=opts.label,
                           worker_env=opts.worker_env, broker_warmup_s=opts.broker_warmup_s,
                           **kwargs))
        result = runs[0] if opts.repeat == 1 else combine(runs)
    except KeyboardInterrupt:
        log("interrupted; everything the bench started is stopped")
        raise typer.Exit(130) from None
    except (SetupError, RuntimeError, TimeoutError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from exc
    finally:
        signal.signal(signal.SIGTERM, previous)
    result.update(worker_env=opts.worker_env, command=results.command_of(sys.argv),
                  fire_ahead_s=fire_ahead_of(opts.worker_env))
    assert not missing_keys(result), missing_keys(result)
    emit(result, as_json=opts.as_json)
    if opts.save:
        path = results.save(result, label=opts.label,
                            results_dir=opts.results_dir or results.RESULTS_DIR)
        log(f"saved {path}")


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
    progress: ProgressOpt = False,
    env: WorkerEnvOpt = None,
    no_barrier: NoBarrierOpt = False,
    save: SaveOpt = False,
    label: LabelOpt = None,
    results_dir: ResultsDirOpt = None,
    repeat: RepeatOpt = 1,
    broker_warmup: BrokerWarmupOpt = 30.0,
) -> None:
    """RATE per-second cron jobs fire for DURATION seconds; achieved rate and lateness."""
    from bench import scenarios

    opts = common(as_json=as_json, plot_dir=plot_dir, progress=progress, save=save,
                  label=label, results_dir=results_dir, env=env, no_barrier=no_barrier,
                  repeat=repeat, broker_warmup_s=broker_warmup)
    if workers < 1:
        raise typer.BadParameter("steady needs at least one worker", param_hint="--workers")
    if find_max:
        run(scenarios.find_max, opts, start_rate=rate, step_s=step_duration,
            target=target.value, workers=workers, partitions=partitions,
            max_steps=max_steps, limit_ms=limit_ms, jitter_s=jitter)
        return
    run(scenarios.steady, opts, rate_per_s=rate, duration_s=duration, target=target.value,
        workers=workers, partitions=partitions, jitter_s=jitter)


@bench_app.command()
def burst(
    jobs: Annotated[int, typer.Option(min=1, max=1_000_000, help="One-off jobs.")] = 1000,
    workers: WorkersOpt = 1,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
    plot_dir: PlotOpt = None,
    progress: ProgressOpt = False,
    env: WorkerEnvOpt = None,
    no_barrier: NoBarrierOpt = False,
    save: SaveOpt = False,
    label: LabelOpt = None,
    results_dir: ResultsDirOpt = None,
    repeat: RepeatOpt = 1,
    broker_warmup: BrokerWarmupOpt = 30.0,
) -> None:
    """JOBS one-off jobs all due in the same second: time until the last one ran."""
    from bench import scenarios

    opts = common(as_json=as_json, plot_dir=plot_dir, progress=progress, save=save,
                  label=label, results_dir=results_dir, env=env, no_barrier=no_barrier,
                  repeat=repeat, broker_warmup_s=broker_warmup)
    if workers < 1:
        raise typer.BadParameter("burst needs at least one worker", param_hint="--workers")
    run(scenarios.burst, opts, jobs=jobs, workers=workers, partitions=partitions)


@bench_app.command()
def timers(
    jobs: Annotated[int, typer.Option(min=1, max=10_000_000, help="Pending one-offs.")]
    = 10_000,
    due_in: Annotated[int, typer.Option(min=60, help="They are due this many seconds out.")]
    = 86_400,
    batch: Annotated[int, typer.Option(
        min=1, max=500, help="Jobs per command: 1 sends CreateJob, more send CreateJobs "
        "records of up to this many jobs of one partition.")] = 1,
    workers: WorkersOpt = 1,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
    plot_dir: PlotOpt = None,
    progress: ProgressOpt = False,
    env: WorkerEnvOpt = None,
    no_barrier: NoBarrierOpt = False,
    save: SaveOpt = False,
    label: LabelOpt = None,
    results_dir: ResultsDirOpt = None,
    repeat: RepeatOpt = 1,
    broker_warmup: BrokerWarmupOpt = 30.0,
) -> None:
    """JOBS pending timers: create rate, worker RSS and disk, restart and cold-rebuild times.

    With several workers the RSS is the largest worker's, the disk all of theirs, and the
    restarts restart them all. Nothing fires, so --plot draws the creates' produce-to-ack
    latency and acks per second.
    """
    from bench import scenarios

    opts = common(as_json=as_json, plot_dir=plot_dir, progress=progress, save=save,
                  label=label, results_dir=results_dir, env=env, no_barrier=no_barrier,
                  repeat=repeat, broker_warmup_s=broker_warmup)
    if workers < 1:
        raise typer.BadParameter("timers needs at least one worker", param_hint="--workers")
    run(scenarios.timers, opts, jobs=jobs, partitions=partitions, due_in_s=due_in,
        batch=batch, workers=workers)


@bench_app.command()
def api(
    duration: Annotated[int, typer.Option(min=1, max=3600, help="Seconds of load.")] = 15,
    concurrency: Annotated[int, typer.Option(min=1, max=1024, help="Concurrent clients.")]
    = 32,
    workers: WorkersOpt = 1,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
    plot_dir: PlotOpt = None,
    progress: ProgressOpt = False,
    env: WorkerEnvOpt = None,
    no_barrier: NoBarrierOpt = False,
    save: SaveOpt = False,
    label: LabelOpt = None,
    results_dir: ResultsDirOpt = None,
    repeat: RepeatOpt = 1,
    broker_warmup: BrokerWarmupOpt = 30.0,
) -> None:
    """Concurrent POST /v1/jobs against `kron api`: requests/s and latency percentiles.

    --plot draws request latency and answered requests per second.
    """
    from bench import scenarios

    opts = common(as_json=as_json, plot_dir=plot_dir, progress=progress, save=save,
                  label=label, results_dir=results_dir, env=env, no_barrier=no_barrier,
                  repeat=repeat, broker_warmup_s=broker_warmup)
    run(scenarios.api, opts, duration_s=duration, concurrency=concurrency, workers=workers,
        partitions=partitions)


@bench_app.command()
def failover(
    rate: Annotated[int, typer.Option(min=1, max=100_000, help="Executions per second.")]
    = 200,
    duration: Annotated[int, typer.Option(min=10, max=3600, help="Window, seconds.")] = 40,
    kill_after: Annotated[float | None, typer.Option(
        help="Seconds into the window to kill -9 a worker (default: a third of it).")] = None,
    session_timeout: Annotated[float | None, typer.Option(
        help="KRON_SESSION_TIMEOUT_S of the workers (default: kron's default).")] = None,
    workers: WorkersOpt = 2,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
    plot_dir: PlotOpt = None,
    progress: ProgressOpt = False,
    env: WorkerEnvOpt = None,
    no_barrier: NoBarrierOpt = False,
    save: SaveOpt = False,
    label: LabelOpt = None,
    results_dir: ResultsDirOpt = None,
    repeat: RepeatOpt = 1,
    broker_warmup: BrokerWarmupOpt = 30.0,
) -> None:
    """WORKERS (two) at RATE; one is killed with SIGKILL mid-run. Takeover, lateness, loss."""
    from bench import scenarios

    opts = common(as_json=as_json, plot_dir=plot_dir, progress=progress, save=save,
                  label=label, results_dir=results_dir, env=env, no_barrier=no_barrier,
                  repeat=repeat, broker_warmup_s=broker_warmup)
    kill = duration / 3 if kill_after is None else kill_after
    if not 0 < kill < duration:
        raise typer.BadParameter("must be inside the window", param_hint="--kill-after")
    if workers < 2:
        raise typer.BadParameter("failover needs at least two workers", param_hint="--workers")
    run(scenarios.failover, opts, rate_per_s=rate, duration_s=duration, kill_after_s=kill,
        partitions=partitions, session_timeout_s=session_timeout, workers=workers)


@bench_app.command()
def dag(
    runs: Annotated[int, typer.Option(min=1, max=100_000,
                                      help="One-off DAG jobs (one run each), all due at "
                                           "the same second.")] = 200,
    fanout: Annotated[int, typer.Option(min=1, max=498,
                                        help="Tasks between the root and the fan-in task: "
                                             "1 -> FANOUT -> 1.")] = 20,
    workers: WorkersOpt = 1,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
    plot_dir: PlotOpt = None,
    progress: ProgressOpt = False,
    env: WorkerEnvOpt = None,
    no_barrier: NoBarrierOpt = False,
    save: SaveOpt = False,
    label: LabelOpt = None,
    results_dir: ResultsDirOpt = None,
    repeat: RepeatOpt = 1,
    broker_warmup: BrokerWarmupOpt = 30.0,
) -> None:
    """RUNS DAG runs of 1 -> FANOUT -> 1 HTTP tasks due together: release latency (parent
    answered -> child called), runs/s, worker CPU per run and per task call, lost and
    duplicated task calls.

    --plot draws the release latency and task calls per second.
    """
    from bench import dag as scenario

    opts = common(as_json=as_json, plot_dir=plot_dir, progress=progress, save=save,
                  label=label, results_dir=results_dir, env=env, no_barrier=no_barrier,
                  repeat=repeat, broker_warmup_s=broker_warmup)
    if workers < 1:
        raise typer.BadParameter("dag needs at least one worker", param_hint="--workers")
    run(scenario.dag, opts, runs=runs, fanout=fanout, workers=workers, partitions=partitions)


@bench_app.command()
def noisy(
    a_jobs: Annotated[int, typer.Option(
        "--a-jobs", min=1, max=1_000_000,
        help="Tenant A's one-offs, all due at the same second T.")] = 100_000,
    b_jobs: Annotated[int, typer.Option(
        "--b-jobs", min=1, max=10_000,
        help="Tenant B's critical one-offs due at T, and as many normal ones at T + 1 s.")]
    = 100,
    steady: Annotated[bool, typer.Option(
        "--steady", help="Per-second cron jobs instead: A at --a-rate and B at --b-rate "
                         "(half critical, half normal) for --seconds.")] = False,
    seconds: Annotated[int, typer.Option(min=2, max=3600, help="--steady: the window.")] = 60,
    a_rate: Annotated[int, typer.Option("--a-rate", min=1, max=100_000,
                                        help="--steady: tenant A's executions a second.")]
    = 3000,
    b_rate: Annotated[int, typer.Option("--b-rate", min=1, max=10_000,
                                        help="--steady: tenant B's executions a second.")]
    = 50,
    workers: WorkersOpt = 1,
    partitions: PartitionsOpt = 8,
    as_json: JsonOpt = False,
    plot_dir: PlotOpt = None,
    progress: ProgressOpt = False,
    env: WorkerEnvOpt = None,
    no_barrier: NoBarrierOpt = False,
    save: SaveOpt = False,
    label: LabelOpt = None,
    results_dir: ResultsDirOpt = None,
    repeat: RepeatOpt = 1,
    broker_warmup: BrokerWarmupOpt = 30.0,
) -> None:
    """A noisy neighbour: tenant B's critical and normal one-offs beside tenant A's flood
    (A_JOBS due at one second), or with --steady beside A's steady load; B's lateness per
    tier with A and, in the same command, without it (the `alone` phase, its own tenants).
    Lost and duplicated calls counted at the receiver by Idempotency-Key.

    --plot draws B's lateness beside A and all calls per second.
    """
    from bench import noisy as scenario

    opts = common(as_json=as_json, plot_dir=plot_dir, progress=progress, save=save,
                  label=label, results_dir=results_dir, env=env, no_barrier=no_barrier,
                  repeat=repeat, broker_warmup_s=broker_warmup)
    if workers < 1:
        raise typer.BadParameter("noisy needs at least one worker", param_hint="--workers")
    run(scenario.noisy, opts, a_jobs=a_jobs, b_jobs=b_jobs, steady=steady, seconds=seconds,
        a_rate=a_rate, b_rate=b_rate, workers=workers, partitions=partitions)
