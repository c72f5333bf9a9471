"""A real HTTP target on loopback that records every request it receives.

Paths choose the behaviour:
  /ok                     200
  /status/503,503,200     answers the listed codes in turn, per Idempotency-Key
  /slow/<seconds>         sleeps, then 200
  /hang                   sleeps 60 s (longer than any test's timeout_s)
  /retry-after/<seconds>  429 with Retry-After once per key, then 200
  /hold-first/<seconds>   holds the first request per key that long, answers others at once
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5. When a broker outage ends, the calls held
    # back go out at once. With the CPU busy (two burners and a fault test), 100 requests
    # connecting together to a backlog of 5: 22 had no answer within 40 s (the handshake
    # completes on the client's side, then a full accept queue drops it), others took up
    # to 28 s; with 1,024, 300 together took at most 0.34 s. The broker-restart fault test
    # lost five jobs whose first call timed out (30 s) with no hit here. Real servers
    # listen with hundreds or thousands.
    request_queue_size = 1024


@dataclass(frozen=True)
class Hit:
    path: str
    headers: dict[str, str]
    received_ms: int
    status: int


class Receiver:
    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = defaultdict(int)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                receiver._handle(self)

            do_GET = do_POST

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _status_for(self, path: str, key: str) -> tuple[int, float, dict[str, str]]:
        with self._lock:
            n = self._counts[(path, key)]
            self._counts[(path, key)] += 1
        parts = path.strip("/").split("/")
        if parts[0] == "status":
            codes = [int(c) for c in parts[1].split(",")]
            return codes[min(n, len(codes) - 1)], 0.0, {}
        if parts[0] == "slow":
            return 200, float(parts[1]), {}
        if parts[0] == "hang":
            return 200, 60.0, {}
        if parts[0] == "hold-first":
            return 200, (float(parts[1]) if n == 0 else 0.0), {}
        if parts[0] == "retry-after":
            return (429, 0.0, {"Retry-After": parts[1]}) if n == 0 else (200, 0.0, {})
        return 200, 0.0, {}

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        received = time.time_ns() // 1_000_000
        length = int(req.headers.get("Content-Length") or 0)
        if length:
            req.rfile.read(length)
        headers = {k: v for k, v in req.headers.items()}
        status, delay, extra = self._status_for(req.path, headers.get("Idempotency-Key", ""))
        with self._lock:
            self.hits.append(Hit(path=req.path, headers=headers, received_ms=received,
                                 status=status))
        if delay:
            time.sleep(delay)
        body = b"ok"
        try:
            req.send_response(status)
            for k, v in extra.items():
                req.send_header(k, v)
            req.send_header("Content-Length", str(len(body)))
            req.end_headers()
            req.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def hits_for(self, job_id: str) -> list[Hit]:
        with self._lock:
            return [h for h in self.hits if h.headers.get("X-Kron-Job-Id") == job_id]

    def wait_for(self, job_id: str, count: int, timeout_s: float) -> list[Hit]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hits = self.hits_for(job_id)
            if len(hits) >= count:
                return hits
            time.sleep(0.05)
        return self.hits_for(job_id)
