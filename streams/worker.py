"""The worker process: settings in, Faust worker running the engine out."""

from __future__ import annotations

import logging

from kron.settings import Settings
from kron.topics import create_topics


def run_worker(settings: Settings) -> None:
    import faust

    from streams.app import build_engine

    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    create_topics(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = build_engine(settings)
    worker = faust.Worker(engine.app, loglevel=settings.log_level.lower(),
                          logfile=None, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
