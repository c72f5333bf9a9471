"""A loopback webhook for the alert tests: it keeps every POST whole (head and body, which
bench.receiver does not read) and answers by path:

  /ok/<tag>              200
  /fail/<n>/<tag>        500 to the first n requests on that path, then 200
  /always/<tag>          500
  /hang/<s>/<tag>        waits s seconds, then 503
  /gone/<tag>            410 (a permanent answer: no retry)
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class Delivery:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    status: int
    at: float  # time.time() when it arrived


class Webhook:
    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Webhook:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def to(self, path: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.path == path]

    def _status(self, path: str) -> int:
        parts = path.strip("/").split("/")
        with self._lock:
            self._seen[path] += 1
            seen = self._seen[path]
        if parts[0] == "fail":
            return 500 if seen <= int(parts[1]) else 200
        if parts[0] == "always":
            return 500
        if parts[0] == "hang":
            time.sleep(float(parts[1]))
            return 503
        if parts[0] == "gone":
            return 410
        return 200

    def _handler(self) -> Any:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                at = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = hook._status(self.path)
                with hook._lock:
                    hook.deliveries.append(Delivery(
                        path=self.path, body=body, status=status, at=at,
                        headers={k.lower(): v for k, v in self.headers.items()}))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
