"""bench.receiver.Receiver, the one loopback HTTP target of the tests, the fault suite and the
bench: its paths' behaviours, what it records, and the kill of a caller it may kill."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from bench.receiver import Receiver

KRON_HEADERS = {"Idempotency-Key": "e1", "X-Kron-Job-Id": "j1", "X-Kron-Attempt": "2",
                "X-Kron-Scheduled-For": "2026-01-01T00:00:00Z"}


@pytest.fixture
def rcv() -> Receiver:
    with Receiver() as r:
        yield r


def test_records_a_kron_call_with_its_headers(rcv: Receiver) -> None:
    before = time.time_ns() // 1_000_000
    with httpx.Client() as c:
        r = c.post(f"{rcv.url}/ok", headers=KRON_HEADERS, content=b"x" * 10_000)
    assert (r.status_code, r.text) == (200, "ok")
    [hit] = rcv.wait_for("j1", 1, 5)
    assert (hit.job_id, hit.key, hit.attempt, hit.path, hit.status) == ("j1", "e1", 2, "/ok", 200)
    assert hit.scheduled_ms == 1_767_225_600_000
    assert before <= hit.received_ms <= time.time_ns() // 1_000_000
    # Header names in any case, as the tests spell them.
    assert hit.headers["X-Kron-Job-Id"] == hit.headers["x-kron-job-id"] == "j1"
    assert hit.headers.get("IDEMPOTENCY-KEY") == "e1" and "X-Kron-Attempt" in hit.headers
    assert rcv.hits_for("j1") == [hit] and rcv.hits_for("other") == []


def test_records_any_request_and_keeps_connections_alive(rcv: Receiver) -> None:
    with httpx.Client() as c:
        for i in range(50):
            assert c.get(f"{rcv.url}/anything/{i}").status_code == 200
    assert len(rcv.hits) == 50 and rcv.hits[0].job_id == "" and rcv.hits[0].scheduled_ms == 0
    assert rcv.hits[-1].path == "/anything/49"


def test_status_codes_in_turn_per_key(rcv: Receiver) -> None:
    with httpx.Client() as c:
        codes = [c.post(f"{rcv.url}/status/503,500,200", headers=KRON_HEADERS).status_code
                 for _ in range(4)]
        other = c.post(f"{rcv.url}/status/503,500,200",
                       headers={**KRON_HEADERS, "Idempotency-Key": "e2"}).status_code
    assert codes == [503, 500, 200, 200] and other == 503
    assert [h.status for h in rcv.hits_for("j1")] == [503, 500, 200, 200, 503]


def test_retry_after_paths(rcv: Receiver) -> None:
    with httpx.Client() as c:
        first = c.post(f"{rcv.url}/retry-after/7", headers=KRON_HEADERS)
        second = c.post(f"{rcv.url}/retry-after/7", headers=KRON_HEADERS)
        ra = [c.post(f"{rcv.url}/status-ra/503,200/3", headers=KRON_HEADERS) for _ in range(2)]
    assert (first.status_code, first.headers["retry-after"]) == (429, "7")
    assert second.status_code == 200 and "retry-after" not in second.headers
    assert (ra[0].status_code, ra[0].headers["retry-after"]) == (503, "3")
    assert ra[1].status_code == 200 and "retry-after" not in ra[1].headers


def test_slow_hold_first_and_hang(rcv: Receiver) -> None:
    with httpx.Client() as c:
        t0 = time.monotonic()
        assert c.get(f"{rcv.url}/slow/0.3").status_code == 200
        assert time.monotonic() - t0 >= 0.3
        t0 = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            c.post(f"{rcv.url}/hold-first/2", headers=KRON_HEADERS, timeout=0.3)
        assert c.post(f"{rcv.url}/hold-first/2", headers=KRON_HEADERS).status_code == 200
        assert time.monotonic() - t0 < 1.5  # the second answered at once
        with pytest.raises(httpx.ReadTimeout):
            c.get(f"{rcv.url}/hang", timeout=0.3)
    assert [h.path for h in rcv.hits][-1] == "/hang"  # recorded on arrival


def test_reset_closes_without_an_answer(rcv: Receiver) -> None:
    with httpx.Client() as c, pytest.raises(httpx.RemoteProtocolError):
        c.post(f"{rcv.url}/reset", headers=KRON_HEADERS)
    assert [h.status for h in rcv.hits_for("j1")] == [0]


def test_kill_paths_answer_200_when_nothing_is_killable(rcv: Receiver) -> None:
    with httpx.Client() as c:
        assert c.post(f"{rcv.url}/kill-after-2xx/x", headers=KRON_HEADERS).status_code == 200
        assert c.post(f"{rcv.url}/kill-on-arrival/0", headers=KRON_HEADERS).status_code == 200
    assert rcv.kills == []


def test_kill_after_2xx_kills_the_caller_it_may_kill(rcv: Receiver) -> None:
    caller = subprocess.Popen([sys.executable, "-c", (
        "import httpx, time\n"
        "c = httpx.Client()\n"  # keeps the connection, as a worker's pool does
        f"r = c.post('{rcv.url}/kill-after-2xx/t', headers={KRON_HEADERS!r})\n"
        "time.sleep(30)\n")])
    try:
        rcv.killable[caller.pid] = "caller"
        assert caller.wait(20) == -signal.SIGKILL
        [kill] = rcv.kills
        assert (kill.point, kill.pid, kill.key) == ("after_2xx", caller.pid, "e1")
    finally:
        caller.kill()
        caller.wait()


def test_stop_ends_a_hanging_connection() -> None:
    rcv = Receiver().start()
    with httpx.Client() as c, pytest.raises(httpx.HTTPError):
        client_gone = c.get(f"{rcv.url}/hang", timeout=0.2)
        del client_gone
    t0 = time.monotonic()
    rcv.stop()
    assert time.monotonic() - t0 < 3
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{rcv.url}/ok", timeout=1)


def test_the_bench_drops_the_heads_and_keeps_what_it_reads() -> None:
    with Receiver(keep_heads=False) as rcv, httpx.Client() as c:
        c.post(f"{rcv.url}/t", headers=KRON_HEADERS)
        [hit] = rcv.wait_for("j1", 1, 5)
    assert (hit.key, hit.attempt, hit.scheduled_ms, hit.path) == ("e1", 2, 1_767_225_600_000,
                                                                 "/t")
    assert hit.head == b"" and hit.headers == {}
