"""An answer given before the body ended (a 413 over max_body_bytes, a 401, a read key's 403)
reaches a client that sends all its body before it reads, as urllib.request does, through
the real `kron api` process (uvicorn on loopback) and a real broker. Before, such a client
got a connection reset: urllib asks for `Connection: close`, and uvicorn closed the socket
with the rest of the body unread."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from kron.localkafka import free_ports
from kron.processes import ApiProcess
from kron.settings import Settings

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
BIG = b"x" * 5_000_000


@pytest.fixture
def api(kafka_settings: Settings, tmp_path) -> Iterator[ApiProcess]:
    proc = ApiProcess(kafka_settings, tmp_path, free_ports(1)[0])
    proc.env["KRON_API_KEYS"] = "acme=key-acme,acme:read=key-acme-read"
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def post(api: ApiProcess, body: bytes, **headers: str) -> tuple[int, str, dict]:
    req = urllib.request.Request(f"{api.url}/v1/jobs", data=body, method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers["content-type"], json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers["content-type"], json.loads(e.read())


def serves_the_next_request(api: ApiProcess) -> bool:
    req = urllib.request.Request(f"{api.url}/v1/jobs", headers={"X-API-Key": "key-acme"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status == 200 and "jobs" in json.loads(r.read())


def test_a_5_mb_body_gets_its_413_problem(api: ApiProcess) -> None:
    for _ in range(2):  # and again, on a server that answered one already
        status, ctype, problem = post(api, BIG, **{"X-API-Key": "key-acme"})
        assert status == 413
        assert ctype == PROBLEM
        assert problem["status"] == 413 and problem["type"].endswith("/body-too-large")
        assert serves_the_next_request(api)


def test_answers_before_the_body_is_read_reach_the_client_too(api: ApiProcess) -> None:
    status, ctype, problem = post(api, BIG)  # no key
    assert (status, ctype, problem["status"]) == (401, PROBLEM, 401)
    status, ctype, problem = post(api, BIG, **{"X-API-Key": "key-acme-read"})
    assert (status, ctype, problem["status"]) == (403, PROBLEM, 403)
    assert problem["type"].endswith("/read-only-key")
    assert serves_the_next_request(api)


def test_a_body_past_the_drain_bound_does_not_hold_the_server(api: ApiProcess) -> None:
    """Past 16 MiB the server stops reading and closes: this client may see a reset (its
    answer went out long before), but the server is not kept busy and serves on."""
    start = time.monotonic()
    with contextlib.suppress(urllib.error.URLError, ConnectionError):  # the reset past it
        assert post(api, b"x" * 64_000_000, **{"X-API-Key": "key-acme"})[0] == 413
    assert time.monotonic() - start < 10
    assert serves_the_next_request(api)
