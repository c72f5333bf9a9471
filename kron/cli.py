"""The `kron` command line. Each sub-command builds its own objects from one Settings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from kron.errors import SetupError
from kron.jobs_cli import jobs_app, runs_app
from kron.settings import Settings
from replay.cli import replay_app

app = typer.Typer(
    name="kron",
    help="kron: a distributed job scheduler, event-sourced on Apache Kafka.",
    no_args_is_help=True,
    add_completion=False,
)
topics_app = typer.Typer(help="Manage kron's Kafka topics.", no_args_is_help=True)
dev_app = typer.Typer(help="Local development stack: broker, worker and API.",
                      no_args_is_help=True)
app.add_typer(topics_app, name="topics")
app.add_typer(dev_app, name="dev")
app.add_typer(jobs_app, name="jobs")
app.add_typer(runs_app, name="runs")
app.add_typer(replay_app, name="replay")
keys_app = typer.Typer(help="API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


def _fail(exc: Exception) -> None:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


BENCH_MISSING = (
    "`kron bench` is not part of this installation: it needs the repository's bench/ "
    "package, which the container image (Dockerfile) does not copy. Run it from a checkout: "
    "`make setup`, then `.venv/bin/kron bench --help`."
)


def _add_bench(parent: typer.Typer) -> None:
    """Register `kron bench` from bench/ when it is installed (a checkout, `make setup`).

    The image copies only kron, streams, schemas, api and replay, so there `kron bench` is a
    stub that says where to find it: every other command must start without bench/.
    """
    try:
        from bench.cli import bench_app
    except ModuleNotFoundError as exc:
        if exc.name != "bench":
            raise  # bench/ is there but broken: show it, don't hide it behind the stub
    else:
        parent.add_typer(bench_app, name="bench")
        return

    @parent.command(
        "bench", add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def bench_missing() -> None:
        """Not in this installation: needs the repository's bench/ (run it from a checkout)."""
        _fail(RuntimeError(BENCH_MISSING))


_add_bench(app)


@app.command()
def worker(
    data_dir: Annotated[Path | None, typer.Option(help="Local RocksDB state (KRON_DATA_DIR).")]
    = None,
) -> None:
    """Run a scheduler worker: owns partitions, fires timers and executes jobs.

    Start as many as you like; Kafka's consumer group spreads the partitions among them.
    """
    from streams.worker import run_worker

    try:
        run_worker(Settings(data_dir=data_dir) if data_dir else Settings())
    except SetupError as exc:
        _fail(exc)


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="Listen address (KRON_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (KRON_API_PORT).")] = None,
) -> None:
    """Run the HTTP API (OpenAPI docs at /docs)."""
    from api.server import run_api

    overrides: dict[str, object] = {}
    if host:
        overrides["api_host"] = host
    if port is not None:
        overrides["api_port"] = port
    try:
        run_api(Settings(**overrides))  # type: ignore[arg-type]
    except SetupError as exc:
        _fail(exc)


@topics_app.command("create")
def topics_create() -> None:
    """Create every kron topic that is missing (partitions, compaction, retention)."""
    from kron.topics import create_topics, topic_specs

    settings = Settings()
    try:
        created = create_topics(settings)
    except SetupError as exc:
        _fail(exc)
        return
    for spec in topic_specs(settings):
        mark = "created" if spec.name in created else "exists"
        typer.echo(f"{mark:8} {spec.name} partitions={spec.partitions} "
                   f"cleanup={spec.config['cleanup.policy']}")


@dev_app.command("up")
def dev_up(
    nodes: Annotated[int, typer.Option(help="Broker nodes: 1, or 3 for RF 3 / min ISR 2.")] = 1,
) -> None:
    """Start broker, topics, a worker and the API in the foreground; Ctrl-C stops them all."""
    from kron.devstack import up

    try:
        up(nodes=nodes)
    except SetupError as exc:
        _fail(exc)


@dev_app.command("down")
def dev_down() -> None:
    """Stop anything `kron dev up` left running (by the PIDs it recorded)."""
    from kron.devstack import down

    down()


@dev_app.command("jars")
def dev_jars() -> None:
    """Fetch the Kafka broker jars from Maven Central (once)."""
    from kron.localkafka import ensure_jars

    try:
        typer.echo(str(ensure_jars()))
    except SetupError as exc:
        _fail(exc)


@dev_app.command("reset")
def dev_reset() -> None:
    """Delete the local broker's data and kron's local state (after `make down`)."""
    from kron.devstack import reset

    reset()


@keys_app.command("hash")
def keys_hash(
    key: Annotated[str, typer.Argument(help="The key; '-' reads it from stdin (keeps it out "
                                            "of shell history).")],
) -> None:
    """Print a key's stored form (sha256:<hex>) for KRON_API_KEYS=tenant=sha256:<hex>."""
    from kron.settings import hash_api_key

    typer.echo(hash_api_key(sys.stdin.readline().strip() if key == "-" else key))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
