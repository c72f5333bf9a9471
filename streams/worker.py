"""The worker process: settings in, Faust worker running the engine out."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from kron.logs import JsonFormatter
from kron.settings import Settings
from kron.topics import create_topics
from streams import localstate

# Longer than a clean stop takes (executor drain, producer flushes: a few seconds), shorter
# than a group's patience.
STOP_GRACE_S = 25.0
# sysexits' EX_TEMPFAIL: stopped, but not cleanly.
EXIT_STOP_TIMEOUT = 75


def run_worker(settings: Settings) -> None:
    import mode.loop

    from streams.app import build_engine

    # uvloop's socket writes cost about half of asyncio's under load (py-spy, steady 250/s).
    mode.loop.use("uvloop")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=settings.log_level, handlers=[handler])
    # httpx logs every request at INFO: 2.4% of worker time at 250 executions/s.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    create_topics(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = build_engine(settings)
    localstate.prepare(settings.data_dir, Path(engine.app.conf.tabledir))
    _restore_stores(settings, engine)
    if engine.metrics is not None:
        from streams.metrics_server import serve

        serve(engine.metrics, host=settings.metrics_host, port=settings.metrics_port,
              data_dir=settings.data_dir)
    worker = _bounded_stop_worker_class()(
        engine.app, loglevel=settings.log_level.lower(), logfile=None, quiet=True,
        redirect_stdouts=False, override_logging=False)  # keep the JSON log handler
    worker.execute_from_commandline()


def _restore_stores(settings: Settings, engine: Any) -> None:
    """Before Faust starts: missing or stale stores read their changelogs in bulk
    (streams.restore)."""
    import rocksdict

    from kron.kafka_security import confluent_config
    from streams.restore import StoreSpec, restore_stores

    specs = []
    for table in (engine.jobs, engine.executions, engine.timers):
        store = table.data  # Faust's store object: same paths and options as Faust opens
        specs.append(StoreSpec(name=table.name, topic=settings.topic(table.name),
                               path_of=store.partition_path,
                               open_db=store.rocksdb_options.open, fence=table.fence))
    try:
        restore_stores(specs, partitions=settings.partitions, batch_module=rocksdict,
                       consumer_config=confluent_config(settings, {
                           "group.id": f"{settings.app_id}-restore",
                           "client.id": f"kron-{settings.worker_id}-restore"}))
    except Exception:
        # Only a shortcut: every batch wrote its records and offset atomically, so Faust's
        # own recovery continues from what is there (or from the start).
        logging.getLogger("kron.restore").warning(
            "bulk restore failed; Faust's recovery restores the rest", exc_info=True)


def _bounded_stop_worker_class() -> Any:
    """A graceful stop that hangs must not keep the group waiting for this member: a
    rebalance storm test once saw a stopping worker hang and the survivors idle for two
    minutes. After STOP_GRACE_S the process exits hard; its local state is not marked
    clean, so the next start rebuilds it from Kafka."""
    from streams.runtime.stop import bounded_stop_worker_class

    return bounded_stop_worker_class(STOP_GRACE_S, _hard_exit)


def _hard_exit() -> None:
    logging.getLogger("kron.worker").error(
        "graceful stop took over %.0f s; exiting without marking local state clean",
        STOP_GRACE_S)
    logging.shutdown()
    os._exit(EXIT_STOP_TIMEOUT)
