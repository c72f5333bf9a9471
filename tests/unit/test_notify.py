"""Failure alerts without a broker: the signature, the backoff, which notify applies, the
core's alerts (a failed execution's and a missed slot's) as the notifier reads them, and the
notifier's bounded queue and retries with a fake sender."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from kron.clock import ManualClock
from kron.settings import Settings
from schemas import codec
from streams.alerts import Alert, read_alert
from streams.domain.commands import CommandRegistry
from streams.domain.errors import PermanentError
from streams.domain.ids import exec_id
from streams.domain.notify import Notify, NotifyEvent, parse_notify
from streams.domain.retry import ErrorClass
from streams.domain.tenants import TenantTable
from streams.engine.core import Emit, PartitionCore
from streams.guard import TargetGuard
from streams.metrics_server import Snapshot, families
from streams.notify.backoff import Backoff
from streams.notify.consumer import alert_of
from streams.notify.event import event_body, notify_for
from streams.notify.notifier import Notifier
from streams.notify.signing import HEADER, sign, signature, verify
from streams.targets import AttemptInfo, Outcome
from tests.support.stack import spec
from tests.unit.test_core_scenarios import MIN, SEC, T0, Partition, dispatches

KEY = b"acme-secret"
BODY = b'{"id":"a1","type":"execution.failed"}'


# --- signing ---------------------------------------------------------------------------------


def test_the_signature_header_is_t_and_v1_hmac_of_t_dot_body() -> None:
    header = sign(KEY, BODY, 1_700_000_000)
    assert re.fullmatch(r"t=1700000000,v1=[0-9a-f]{64}", header)
    expected = hmac.new(KEY, b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={expected}"
    assert signature(KEY, BODY, 1_700_000_000) == expected


@pytest.mark.parametrize(("key", "body", "now_s", "ok"), [
    (KEY, BODY, 1_700_000_000, True),
    (KEY, BODY, 1_700_000_300, True),  # within the tolerance
    (KEY, BODY, 1_700_000_301, False),  # an old delivery replayed
    (KEY, BODY, 1_699_999_600, False),
    (b"globex-secret", BODY, 1_700_000_000, False),  # another tenant's key
    (KEY, BODY + b" ", 1_700_000_000, False),  # the body changed
])
def test_verify_takes_only_the_keys_signature_of_that_body_recently(
        key: bytes, body: bytes, now_s: int, ok: bool) -> None:
    assert verify(key, sign(KEY, BODY, 1_700_000_000), body, now_s=now_s) is ok


def test_verify_takes_any_v1_of_several_and_refuses_malformed_headers() -> None:
    t = 1_700_000_000
    both = f"t={t},v1={signature(b'old', BODY, t)},v1={signature(KEY, BODY, t)}"
    assert verify(KEY, both, BODY, now_s=t)
    v1 = signature(KEY, BODY, t)
    for bad in ("", f"v1={v1}", f"t=x,v1={v1}", f"t={t}", f"t={t + 1},v1={v1}"):
        assert not verify(KEY, bad, BODY, now_s=t), bad


# --- backoff ---------------------------------------------------------------------------------


def test_the_default_backoff_is_six_tries_over_about_five_minutes() -> None:
    b = Backoff()
    assert b.schedule() == [10.0, 20.0, 40.0, 80.0, 160.0]
    assert 290 <= sum(b.schedule()) <= 320
    assert [b.delay_s(n, rand=0.0) for n in range(1, 7)] == [5.0, 10.0, 20.0, 40.0, 80.0, None]
    assert b.delay_s(3, rand=0.999) == pytest.approx(40.0, rel=1e-3)
    assert Backoff(attempts=1).delay_s(1) is None


# --- which notify --------------------------------------------------------------------------------


def alert(event: NotifyEvent = NotifyEvent.FAILED, tenant: str = "acme",
          notify: Notify | None = None) -> Alert:
    return Alert(event=event, alert_id="a1", tenant=tenant, job_id="j", job_name="nightly",
                 run_id="r1", task_id=None, attempt=2, error="HTTP 500", output=None,
                 state=str(event), scheduled_for_ms=T0, occurred_at_ms=T0 + SEC,
                 notify=notify)


TENANTS = TenantTable.from_toml(
    '[tenants.acme]\nnotify_webhook = "https://acme.example/default"\n'
    '[tenants.globex]\nnotify_webhook = "https://globex.example/h"\n'
    'notify_on = ["missed"]\n')


def test_a_jobs_own_notify_wins_over_its_tenants_default_which_covers_the_rest() -> None:
    own = Notify(webhook="https://own.example/", on=frozenset({NotifyEvent.FAILED}))
    assert notify_for(alert(notify=own), TENANTS) == own
    default = notify_for(alert(), TENANTS)
    assert default is not None and default.webhook == "https://acme.example/default"
    # The default covers failures only unless the file says otherwise.
    assert notify_for(alert(NotifyEvent.MISSED), TENANTS) is None
    assert notify_for(alert(NotifyEvent.MISSED, "globex"), TENANTS) is not None
    assert notify_for(alert(tenant="globex"), TENANTS) is None
    assert notify_for(alert(tenant="initech"), TENANTS) is None  # no default at all
    # A job's own, even with no events, replaces the default: it silences the job.
    assert notify_for(alert(notify=Notify(webhook="https://x.example/", on=frozenset())),
                      TENANTS) is None


@pytest.mark.parametrize(("raw", "field"), [
    ({"webhook": "ftp://x", "on": []}, "notify.webhook"),
    ({"webhook": 7, "on": []}, "notify.webhook"),
    ({"webhook": "https://x.example/", "on": ["failed", "late"]}, "notify.on[1]"),
    ({"webhook": "https://x.example/", "on": "failed"}, "notify.on"),
    ("https://x.example/", "notify"),
])
def test_a_bad_notify_from_a_direct_producer_names_its_field(raw: Any, field: str) -> None:
    with pytest.raises(PermanentError) as info:
        parse_notify(raw)
    assert info.value.field == field


# --- the core's alerts, as the notifier reads them ------------------------------------------


def alerts_in(effects: list[Any]) -> list[Alert]:
    out = []
    for e in effects:
        if isinstance(e, Emit) and e.topic == "dead-letters":
            found = alert_of(codec.encode(e.name, e.record))
            assert found is not None, e.record
            out.append(found)
    return out


NOTIFY = {"webhook": "https://hooks.example/kron", "on": ["failed", "missed"]}


def test_a_failed_execution_alerts_with_what_the_webhook_gets() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="* * * * *", retry={"max_attempts": 1}, notify=NOTIFY, name="nightly")
    [d] = dispatches(p.tick(T0 + MIN))
    [a] = alerts_in(p.report(d, "permanent", status_code=400))
    assert (a.event, a.tenant, a.job_id, a.job_name, a.run_id, a.attempt, a.state) == (
        NotifyEvent.FAILED, "acme", "j", "nightly", d.exec_id, 1, "failed")
    assert a.error == "failed: permanent" and a.scheduled_for_ms == T0 + MIN
    assert a.notify == Notify(webhook=NOTIFY["webhook"],
                              on=frozenset({NotifyEvent.FAILED, NotifyEvent.MISSED}))


def test_each_missed_slot_alerts_once_and_a_job_without_notify_alerts_too() -> None:
    """The alert is the dead-letters topic's record either way (GET /v1/dead-letters lists
    it); whether a webhook gets it is the notifier's question (the tenant's default)."""
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="*/10 * * * *", lease_s=600.0)
    [first] = dispatches(p.ticks(T0 + 10 * MIN + SEC, 10 * SEC))
    p.report(first, "success")
    missed = alerts_in(p.tick(T0 + 70 * MIN + 30 * SEC))  # five slots coalesced
    assert [a.scheduled_for_ms for a in missed] == [T0 + m * MIN for m in (20, 30, 40, 50, 60)]
    assert {(a.event, a.state, a.attempt, a.notify) for a in missed} == {
        (NotifyEvent.MISSED, "missed", 0, None)}
    assert {a.error for a in missed} == {"coalesced"}
    assert len({a.alert_id for a in missed}) == 5
    assert alerts_in(p.tick(T0 + 70 * MIN + 40 * SEC)) == []


def test_a_dead_letter_that_is_no_alert_is_not_sent() -> None:
    record = {"envelope": {"event_id": "dlq:x", "event_type": "record.dead_lettered",
                           "schema_version": 1, "occurred_at_ms": T0, "tenant": "",
                           "causation_id": None, "correlation_id": None, "producer": None},
              "source_topic": "kron.commands", "source_partition": 0, "source_offset": 1,
              "key": b"j", "value": b"{}", "error": "bad", "error_class": "validation"}
    assert read_alert(record) is None
    assert alert_of(codec.encode("kron.deadletter.DeadLetter", record)) is None
    assert alert_of(b"\x00junk") is None


# --- the notifier --------------------------------------------------------------------------------


class Sender:
    """Answers each try with the next outcome (the last one repeats); `hold` blocks."""

    def __init__(self, *outcomes: Outcome, hold: asyncio.Event | None = None) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[dict[str, Any], AttemptInfo]] = []
        self.hold = hold

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        self.calls.append((target, info))
        if self.hold is not None:
            await self.hold.wait()
        return self.outcomes[min(len(self.calls), len(self.outcomes)) - 1]


OK = Outcome(ok=True, status_code=200)
FAIL = Outcome(ok=False, error_class=ErrorClass.TRANSIENT, status_code=500, error="HTTP 500")
GONE = Outcome(ok=False, error_class=ErrorClass.PERMANENT, status_code=410, error="HTTP 410")
OWN = Notify(webhook="https://own.example/hook", on=frozenset({NotifyEvent.FAILED}))
CLOCK = ManualClock(now_ms=T0 + 2 * SEC)


def notifier(sender: Sender, **kw: Any) -> Notifier:
    kw.setdefault("backoff", Backoff(attempts=4, base_s=0.01))
    return Notifier(sender=sender, keys={"acme": KEY}, tenants=TENANTS, clock=CLOCK,
                    rand=lambda: 0.0, **kw)


async def settle(n: Notifier, sender: Sender, calls: int) -> None:
    for _ in range(500):
        if len(sender.calls) >= calls and n.depth == 0:
            await asyncio.sleep(0.05)
            return
        await asyncio.sleep(0.01)


def test_a_delivery_is_a_signed_post_of_the_event_with_the_alerts_id_as_its_key() -> None:
    async def scenario() -> None:
        sender = Sender(OK)
        n = notifier(sender)
        n.start()
        assert n.offer(alert(notify=OWN))
        await settle(n, sender, 1)
        await n.stop()
        [(target, info)] = sender.calls
        assert (target["method"], target["url"]) == ("POST", OWN.webhook)
        assert target["body"] == event_body(alert(notify=OWN))
        assert verify(KEY, target["headers"][HEADER], target["body"], now_s=T0 // 1000 + 2)
        assert (info.exec_id, info.attempt, info.tenant) == ("a1", 1, "acme")
        assert (n.counts.sent, n.counts.retried, n.counts.failed) == (1, 0, 0)

    asyncio.run(scenario())


def test_a_failing_webhook_is_retried_with_backoff_and_a_permanent_answer_stops() -> None:
    counts: dict[int, tuple[int, int, int]] = {}

    async def scenario() -> None:
        flaky, gone, down = Sender(FAIL, FAIL, OK), Sender(GONE), Sender(FAIL)
        for sender in (flaky, gone, down):
            n = notifier(sender)
            n.start()
            n.offer(alert(notify=OWN))
            await settle(n, sender, {flaky: 3, gone: 1, down: 4}[sender])
            await n.stop()
            counts[id(sender)] = (n.counts.sent, n.counts.retried, n.counts.failed)
        assert [i.attempt for _, i in flaky.calls] == [1, 2, 3]
        assert counts[id(flaky)] == (1, 2, 0)
        assert len(gone.calls) == 1 and counts[id(gone)] == (0, 0, 1)
        assert len(down.calls) == 4 and counts[id(down)] == (0, 3, 1)  # attempts=4

    asyncio.run(scenario())


def test_an_alert_without_its_tenants_key_or_notify_is_not_sent() -> None:
    sender = Sender(OK)
    n = notifier(sender)
    assert not n.offer(alert(tenant="globex"))  # globex's default is missed-only
    assert not n.offer(alert(NotifyEvent.MISSED, tenant="globex"))  # no key: never unsigned
    assert (n.counts.unsigned, n.depth) == (1, 0)


def test_a_full_queue_drops_without_waiting_and_counts_it(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        hold = asyncio.Event()  # a webhook that never answers
        sender = Sender(OK, hold=hold)
        n = notifier(sender, queue_size=3, concurrency=1)
        n.start()
        await asyncio.sleep(0)
        accepted = [n.offer(alert(notify=OWN)) for _ in range(2)]
        await asyncio.sleep(0.01)  # the one runner takes one and hangs on it
        start = asyncio.get_running_loop().time()
        with caplog.at_level(logging.WARNING, logger="kron.notify"):
            accepted += [n.offer(alert(notify=OWN)) for _ in range(10)]
        assert asyncio.get_running_loop().time() - start < 0.05  # offer never waits
        assert accepted == [True] * 4 + [False] * 8
        assert (n.counts.dropped, n.depth, len(sender.calls)) == (8, 3, 1)
        assert "dropped" in caplog.text and "queue is full" in caplog.text
        hold.set()
        await settle(n, sender, 4)
        await n.stop()
        assert n.counts.sent == 4

    asyncio.run(scenario())


def test_the_notifiers_counts_are_metrics() -> None:
    n = notifier(Sender(OK), queue_size=1)
    n.offer(alert(notify=OWN))
    n.offer(alert(notify=OWN))  # dropped: the queue holds one
    snap = Snapshot(alerts=n.outcomes(), alert_queue=n.depth)
    found = {m.name: {tuple(s.labels.values()): s.value for s in m.samples}
             for m in families(snap)}
    assert found["kron_alerts"][("dropped",)] == 1 and found["kron_alerts"][("sent",)] == 0
    assert found["kron_alert_queue_depth"][()] == 1


def test_the_partition_owner_refuses_a_notify_the_guard_or_the_spec_refuses() -> None:
    """A direct producer's command is judged as the API judges it: dead-lettered (the
    PermanentError), nothing written or armed."""
    guard = TargetGuard(commands=CommandRegistry.parse(""), topics=None, allow_private=False)
    p = Partition(T0)
    p.core = PartitionCore(p.store, check_target=guard.check)
    for notify, words in (({"webhook": "http://169.254.169.254/latest", "on": ["failed"]},
                           "private"),
                          ({"webhook": "ftp://hooks.example/", "on": ["failed"]}, "http(s)"),
                          ({"webhook": "https://hooks.example/", "on": ["late"]}, "one of")):
        with pytest.raises(PermanentError) as info:
            p.create("j", cron="* * * * *", notify=notify)
        assert info.value.field in ("notify.webhook", "notify.on[0]") and words in str(
            info.value), info.value
    assert p.store.jobs == {} and p.store.timers == {}
    p.create("j", cron="* * * * *", notify={"webhook": "https://hooks.example/",
                                            "on": ["missed"]})
    assert p.job("j")["spec"]["notify"]["on"] == ["missed"]


def test_notify_keys_are_read_per_tenant_and_never_shown() -> None:
    settings = Settings(notify_keys="acme=top-secret, globex = other-secret")
    assert settings.notify_key_map == {"acme": b"top-secret", "globex": b"other-secret"}
    assert "secret" not in repr(settings) and "secret" not in settings.model_dump_json()
    for bad, words in (("acme=a,acme=b", "two keys for tenant 'acme'"),
                       ("acme", "tenant=key entries"), ("=x", "tenant=key entries")):
        with pytest.raises(ValidationError) as info:
            Settings(notify_keys=bad)
        assert words in str(info.value) and "=b" not in str(info.value)


def test_a_dag_tasks_alert_names_its_run_and_task() -> None:
    p = Partition(T0 + 30 * SEC)
    s = spec(target={"url": "http://unused.invalid"}, cron="* * * * *",
             retry={"max_attempts": 1}, notify=NOTIFY)
    s["target"] = ("kron.DagTarget", {"tasks": [
        {"id": "ingest", "target": ("kron.HttpTarget", {
            "method": "POST", "url": "http://t.invalid/", "headers": {}, "body": None,
            "timeout_s": 5.0}), "depends_on": [], "trigger_rule": "all_success",
         "retry": None, "timeout_s": None}]})
    p.command("CreateJob", "d", spec=s, idempotency_key=None)
    [d] = dispatches(p.tick(T0 + MIN))
    [a] = alerts_in(p.report(d, "permanent", status_code=400))
    assert (a.run_id, a.task_id) == (exec_id("d", T0 + MIN), "ingest")
    assert orjson.loads(event_body(a))["task_id"] == "ingest"
