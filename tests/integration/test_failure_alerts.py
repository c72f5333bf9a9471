"""Failure alerts through the real path: `kron api`, the broker, a worker (whose notifier
consumes kron.dead-letters), the loopback target and a loopback webhook that keeps bodies.

A job whose target fails for good, with notify, gets one signed POST (verified with its
tenant's key, not another's); a webhook that fails twice gets a third try; one that hangs
and fails delays no execution; a tenant's default webhook (tenants file) takes the alerts
of its jobs without their own, a missed slot's too; GET /v1/dead-letters shows a tenant
its own and nothing of another's; a direct producer's refused create is redriven mended.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest

from bench.receiver import Receiver
from kron.localkafka import free_ports
from kron.processes import ApiProcess, WorkerProcess
from kron.settings import Settings
from streams.domain.ids import exec_id
from streams.notify.signing import verify
from tests.conftest import fresh_settings
from tests.support.stack import Commands, spec, wait_until
from tests.support.webhook import Delivery, Webhook

pytestmark = pytest.mark.integration

KEYS = {"acme": b"acme-secret", "globex": b"globex-secret"}
SIGNATURE = re.compile(r"t=\d+,v1=[0-9a-f]{64}")
NO_RETRY = {"max_attempts": 1}


@dataclass
class AlertStack:
    settings: Settings
    receiver: Receiver
    webhook: Webhook
    worker: WorkerProcess
    api: ApiProcess

    def client(self, key: str = "key-acme") -> httpx.Client:
        return httpx.Client(base_url=self.api.url, headers={"X-API-Key": key}, timeout=20)


@pytest.fixture(scope="module")
def alerts(kafka_cluster: Any, tmp_path_factory: Any) -> Iterator[AlertStack]:
    tmp = tmp_path_factory.mktemp("alerts")
    with Receiver() as receiver, Webhook() as webhook:
        tenants = tmp / "tenants.toml"
        tenants.write_text(f'[tenants.globex]\nnotify_webhook = "{webhook.url}/ok/globex"\n'
                           f'notify_on = ["failed", "missed"]\n', encoding="utf-8")
        settings = fresh_settings(kafka_cluster, tmp / "data", tenant_burst=1000,
                                  tenants_file=tenants)
        worker = WorkerProcess(settings, "w1", tmp, env={
            "KRON_NOTIFY_KEYS": ",".join(f"{t}={k.decode()}" for t, k in KEYS.items()),
            "KRON_NOTIFY_BACKOFF_S": "0.3", "KRON_NOTIFY_ATTEMPTS": "4",
            "KRON_NOTIFY_CONCURRENCY": "4"}).start()
        api = ApiProcess(settings, tmp, free_ports(1)[0])
        try:
            api.start()
            stack = AlertStack(settings=settings, receiver=receiver, webhook=webhook,
                               worker=worker, api=api)
            with stack.client() as c:
                job_id = create(c, target=f"{receiver.url}/ok")
            assert receiver.wait_for(job_id, 1, 90), worker.log()[-3000:]
            yield stack
        finally:
            api.stop()
            worker.stop()


def iso(dt: datetime) -> str:
    return dt.isoformat()


def create(c: httpx.Client, *, target: str, at: datetime | None = None,
           **fields: Any) -> str:
    body = {"name": f"job-{uuid.uuid4().hex[:6]}", "run_at": iso(at or datetime.now(UTC)),
            "target": {"type": "http", "method": "POST", "url": target}, **fields}
    r = c.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"])


def deliveries(stack: AlertStack, path: str, count: int, timeout_s: float = 60
               ) -> list[Delivery]:
    got = wait_until(lambda: len(stack.webhook.to(path)) >= count and stack.webhook.to(path),
                     timeout_s)
    assert got, ([(d.path, d.status) for d in stack.webhook.deliveries],
                 stack.worker.log()[-3000:])
    return list(got)


def signed_by(d: Delivery, tenant: str) -> bool:
    return verify(KEYS[tenant], d.headers["x-kron-signature"], d.body,
                  now_s=int(time.time()))


def tag() -> str:
    return uuid.uuid4().hex[:8]


def test_a_job_failing_for_good_sends_one_alert_signed_with_its_tenants_key(
        alerts: AlertStack) -> None:
    path = f"/ok/{tag()}"
    slot = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    with alerts.client() as c:
        job_id = create(c, target=f"{alerts.receiver.url}/status/500", at=slot,
                        retry=NO_RETRY, notify={"webhook": alerts.webhook.url + path})
    [d] = deliveries(alerts, path, 1)
    time.sleep(2)  # no second one follows
    assert len(alerts.webhook.to(path)) == 1
    assert SIGNATURE.fullmatch(d.headers["x-kron-signature"]), d.headers
    assert signed_by(d, "acme") and not signed_by(d, "globex")
    assert d.headers["content-type"] == "application/json"
    event = orjson.loads(d.body)
    run_id = exec_id(job_id, int(slot.timestamp() * 1000))
    assert {k: event[k] for k in ("type", "tenant", "job_id", "run_id", "attempt", "state")} == {
        "type": "execution.failed", "tenant": "acme", "job_id": job_id, "run_id": run_id,
        "attempt": 1, "state": "failed"}
    assert event["job_name"].startswith("job-") and "500" in event["error"]
    assert event["scheduled_for"] == slot.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert event["occurred_at"] >= event["scheduled_for"] and "output" in event
    assert d.headers["idempotency-key"] == event["id"]


def test_a_webhook_failing_twice_is_tried_again_until_it_takes_the_alert(
        alerts: AlertStack) -> None:
    path = f"/fail/2/{tag()}"
    with alerts.client() as c:
        create(c, target=f"{alerts.receiver.url}/status/404",
               notify={"webhook": alerts.webhook.url + path, "on": ["failed"]})
    tries = deliveries(alerts, path, 3)
    time.sleep(2)
    tries = alerts.webhook.to(path)
    assert [d.status for d in tries] == [500, 500, 200]
    assert len({orjson.loads(d.body)["id"] for d in tries}) == 1
    assert [d.headers["x-kron-attempt"] for d in tries] == ["1", "2", "3"]
    assert all(signed_by(d, "acme") for d in tries)
    gaps = [b.at - a.at for a, b in itertools.pairwise(tries)]
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2, gaps  # 0.3 s, then 0.6 s, each x [0.5, 1]


def test_a_webhook_that_hangs_and_fails_delays_no_execution(alerts: AlertStack) -> None:
    hang = f"/hang/3/{tag()}"
    with alerts.client() as c:
        for _ in range(8):  # more alerts than the notifier has runners (4)
            create(c, target=f"{alerts.receiver.url}/status/404", retry=NO_RETRY,
                   notify={"webhook": alerts.webhook.url + hang})
        deliveries(alerts, hang, 4)  # the runners are all held now
        due = datetime.now(UTC) + timedelta(seconds=2)
        others = [create(c, target=f"{alerts.receiver.url}/ok", at=due) for _ in range(5)]
    for job_id in others:
        [hit] = alerts.receiver.wait_for(job_id, 1, 30)
        assert hit.recv_ms - hit.scheduled_ms < 1500, (hit, alerts.worker.log()[-2000:])
    assert alerts.webhook.to(hang)[-1].at > time.time() - 10  # still being tried


def test_a_tenant_default_takes_the_alerts_of_jobs_without_their_own(
        alerts: AlertStack) -> None:
    """globex's tenants-file default; acme has none, so its job without notify sends
    nothing. (A missed slot's alert is the same path: tests/unit/test_notify.py.)"""
    path = "/ok/globex"
    before = len(alerts.webhook.to(path))
    with alerts.client("key-globex") as globex, alerts.client() as acme:
        failed = create(globex, target=f"{alerts.receiver.url}/status/404")
        silent = create(acme, target=f"{alerts.receiver.url}/status/404")
        quiet = create(globex, target=f"{alerts.receiver.url}/status/404",
                       notify={"webhook": f"{alerts.webhook.url}/ok/never", "on": []})
        for job_id in (silent, quiet):
            assert wait_until(lambda j=job_id: [d for d in listed(c_of(acme, globex, j))
                                                if d["alert"] and d["alert"]["job_id"] == j],
                              30)
    [d] = deliveries(alerts, path, before + 1)[before:]
    event = orjson.loads(d.body)
    assert (event["type"], event["job_id"], event["tenant"]) == (
        "execution.failed", failed, "globex")
    assert signed_by(d, "globex") and not signed_by(d, "acme")
    time.sleep(1)
    assert len(alerts.webhook.to(path)) == before + 1 and not alerts.webhook.to("/ok/never")


def c_of(acme: httpx.Client, globex: httpx.Client, job_id: str) -> httpx.Client:
    return acme if acme.get(f"/v1/jobs/{job_id}").status_code == 200 else globex


def listed(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    r = c.get("/v1/dead-letters", params=params)
    assert r.status_code == 200, r.text
    return list(r.json()["dead_letters"])


def test_dead_letters_show_a_tenant_its_own_alerts_and_no_other_tenants(
        alerts: AlertStack) -> None:
    with alerts.client() as acme, alerts.client("key-globex") as globex:
        job_id, other = (create(acme, target=f"{alerts.receiver.url}/status/404")
                         for _ in range(2))
        assert wait_until(lambda: [d for d in listed(acme) if d["alert"]
                                   and d["alert"]["job_id"] == other], 30)
        mine = wait_until(lambda: [d for d in listed(acme) if d["alert"]
                                   and d["alert"]["job_id"] == job_id], 30)
        assert mine, listed(acme)
        [dl] = mine
        assert (dl["kind"], dl["error_class"], dl["alert"]["state"]) == (
            "alert", "execution_failed", "failed")
        assert all(d["alert"] is None or d["alert"]["job_id"] != job_id for d in listed(globex))
        r = globex.post(f"/v1/dead-letters/{dl['id']}:redrive", json={})
        assert r.status_code == 404, r.text
        page = acme.get("/v1/dead-letters", params={"limit": 1}).json()
        assert len(page["dead_letters"]) == 1 and page["next_cursor"]
        rest = listed(acme, cursor=page["next_cursor"])
        assert page["dead_letters"][0]["id"] not in {d["id"] for d in rest}


def test_a_refused_create_is_redriven_mended_once(alerts: AlertStack) -> None:
    job_id = f"j-{tag()}"
    bad = spec(target={"url": f"{alerts.receiver.url}/ok"},
               run_at_ms=int(time.time() * 1000) + 3_600_000)
    bad["notify"] = {"webhook": "ftp://hooks.example/x", "on": ["failed"]}
    commands = Commands(alerts.settings)
    try:
        commands.send("CreateJob", job_id, spec=bad, idempotency_key=None)
    finally:
        commands.close()
    with alerts.client() as acme, alerts.client("key-globex") as globex:
        found = wait_until(lambda: [d for d in listed(acme) if d["command"]
                                    and d["command"]["job_id"] == job_id], 60)
        assert found, alerts.worker.log()[-3000:]
        [dl] = found
        assert dl["command"]["name"] == "CreateJob" and "notify.webhook" in dl["error"]
        assert not [d for d in listed(globex) if d["id"] == dl["id"]]
        mended = {"name": "mended", "run_at": iso(datetime.now(UTC) + timedelta(hours=1)),
                  "target": {"url": f"{alerts.receiver.url}/ok"},
                  "notify": {"webhook": "ftp://still-bad"}}
        r = acme.post(f"/v1/dead-letters/{dl['id']}:redrive", json=mended)
        assert r.status_code == 422 and r.json()["field"] == "notify.webhook", r.text
        mended["notify"] = {"webhook": f"{alerts.webhook.url}/ok/mended"}
        r = globex.post(f"/v1/dead-letters/{dl['id']}:redrive", json=mended)
        assert r.status_code == 404, r.text
        r = acme.post(f"/v1/dead-letters/{dl['id']}:redrive", json=mended)
        assert r.status_code == 202, r.text
        assert r.json()["job_id"] == job_id
        job = wait_until(lambda: (g := acme.get(f"/v1/jobs/{job_id}")).status_code == 200
                         and g.json()["version"] == 1 and g.json(), 30)
        assert job and job["definition"]["notify"]["webhook"].endswith("/ok/mended"), job
        again = acme.post(f"/v1/dead-letters/{dl['id']}:redrive", json=mended)
        assert again.status_code == 409, again.text
        [shown] = [d for d in listed(acme) if d["id"] == dl["id"]]
        assert shown["redriven"]["command_id"] == r.json()["command_id"]
