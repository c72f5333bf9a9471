"""The API process: builds its objects from Settings, then serves with uvicorn."""

from __future__ import annotations

import asyncio
import logging

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kron.settings import Settings
from kron.topics import admin_client

log = logging.getLogger("kron.api")


class BrokerProbe:
    """Answers "can we reach Kafka?" with a real metadata request, bounded in time."""

    def __init__(self, settings: Settings) -> None:
        self._admin = admin_client(settings)
        self._topic = settings.topic("commands")

    def check(self, timeout_s: float = 2.0) -> dict[str, object]:
        try:
            md = self._admin.list_topics(timeout=timeout_s)
        except Exception as exc:  # KafkaException while the broker is unreachable
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "brokers": len(md.brokers), "commands_topic": self._topic in md.topics}


def create_app(settings: Settings) -> FastAPI:
    app = FastAPI(title="kron", version="0.1.0",
                  description="Schedule jobs once or on cron; read their runs.")
    probe = BrokerProbe(settings)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> JSONResponse:
        broker = await asyncio.to_thread(probe.check)
        status = 200 if broker["ok"] else 503
        return JSONResponse({"status": "ok" if status == 200 else "degraded",
                             "broker": broker}, status_code=status)

    return app


def run_api(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level, format="%(message)s")
    uvicorn.run(create_app(settings), host=settings.api_host, port=settings.api_port,
                log_level=settings.log_level.lower())
