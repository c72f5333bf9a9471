"""api.models: request validation, shorthand, the Avro JobSpec it builds, patches, previews."""

from __future__ import annotations

import copy
import math
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.models import (
    HEADERS_MAX,
    JOB_SPEC,
    BuildContext,
    InvalidField,
    JobRequest,
    build_spec,
    iso,
    merge_patch,
    parse_patch,
    parse_request,
    parse_time,
    request_of,
    spec_fingerprint,
    spec_in,
    upcoming,
)
from schemas.codec import decode, encode
from streams.domain.commands import CommandRegistry
from streams.engine.spec import plan_of
from tests.support.stack import spec as stack_spec


def utc_ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, s, tzinfo=UTC).timestamp()) * 1000


NOW = utc_ms(2026, 6, 1)
DAY = 86_400_000
URL = "https://hooks.example.com/run"


def body(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "nightly",
        "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
        "target": {"type": "http", "url": URL},
    }
    for key, value in overrides.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return base


# The operator's registry these tests create command targets against.
COMMANDS = CommandRegistry.parse("""
[commands."reports.nightly"]
argv = ["/usr/local/bin/nightly", "--day", "{day}"]
tenants = ["acme"]
env = ["REPORT_LOCALE"]
max_timeout_s = 900
[commands."reports.nightly".params.day]
pattern = '[0-9]{4}-[0-9]{2}-[0-9]{2}'
[commands."cleanup"]
argv = ["/usr/local/bin/cleanup"]
tenants = ["*"]
""")
NIGHTLY = {"type": "command", "command": "reports.nightly", "args": {"day": "2026-12-01"}}


def build(raw: dict[str, Any], *, allow_private: bool = False, **kw: Any) -> dict[str, Any]:
    kw.setdefault("commands", COMMANDS)
    kw.setdefault("tenant", "acme")
    return build_spec(parse_request(raw), now_ms=NOW, allow_private=allow_private, **kw)


def invalid(raw: dict[str, Any], **kw: Any) -> InvalidField:
    with pytest.raises(InvalidField) as info:
        build(raw, **kw)
    err = info.value
    assert err.message and err.field
    assert err.errors[0] == (err.field, err.message)
    return err


def envelope(spec: dict[str, Any], idem: str | None = None) -> dict[str, Any]:
    return {
        "envelope": {"event_id": "c-1", "event_type": "job.create_requested",
                     "schema_version": 1, "occurred_at_ms": NOW, "tenant": "acme",
                     "causation_id": None, "correlation_id": None, "producer": "api"},
        "command_id": "c-1", "job_id": "job-1", "idempotency_key": idem, "spec": spec,
    }


# --- shorthand ---------------------------------------------------------------------------------


def test_other_seed_shorthand_normalises_to_canonical() -> None:
    shorthand = {"schedule": "0 2 * * *", "target": {"command": "cleanup"},
                 "retry": {"max": 3, "backoff": "exp"}}
    spec = build(shorthand)
    assert spec == {
        "name": "cleanup",
        "schedule": ("kron.CronSchedule", {"expr": "0 2 * * *", "timezone": "UTC"}),
        "target": ("kron.RegisteredCommandTarget", {"command": "cleanup", "args": {},
                                                    "env": {}, "timeout_s": None}),
        "retry": {"max_attempts": 3, "backoff": "exponential", "base_s": 1.0, "max_s": 300.0},
        "overlap": "allow",
        "misfire": {"kind": "fire_once", "late_by_s": None, "fire_all_cap": 100},
        "dst": {"nonexistent": "shift_forward", "ambiguous": "first"},
        "jitter_s": 0.0, "start_at_ms": None, "end_at_ms": None, "lease_s": 60.0,
        "metadata": {}, "priority": "normal", "notify": None,
    }
    canonical = {"name": "cleanup", "schedule": {"cron": "0 2 * * *", "timezone": "UTC"},
                 "target": {"type": "command", "command": "cleanup", "args": {}},
                 "retry": {"max_attempts": 3, "backoff": "exponential"}}
    assert build(canonical) == spec
    assert spec_fingerprint(build(canonical)) == spec_fingerprint(spec)
    plan_of(spec)
    assert decode(encode("kron.commands.CreateJob", envelope(spec))).record["spec"] == spec


@pytest.mark.parametrize(("target", "record", "expected"), [
    ({"url": URL}, "kron.HttpTarget", {"method": "POST", "url": URL}),
    ({"url": URL, "method": "get"}, "kron.HttpTarget", {"method": "GET"}),
    ({"type": "HTTP", "url": URL}, "kron.HttpTarget", {"url": URL}),
    ({"topic": "reports.requested"}, "kron.KafkaTarget", {"topic": "reports.requested"}),
    ({"command": "cleanup"}, "kron.RegisteredCommandTarget", {"command": "cleanup"}),
    ({"command": "reports.nightly", "args": {"day": "2026-12-01"}},
     "kron.RegisteredCommandTarget", {"args": {"day": "2026-12-01"}, "timeout_s": None}),
])
def test_target_type_is_inferred(target: dict[str, Any], record: str,
                                 expected: dict[str, Any]) -> None:
    name, fields = build(body(target=target))["target"]
    assert name == record
    assert expected.items() <= fields.items()


@pytest.mark.parametrize(("retry", "expected"), [
    ({"max": 5, "backoff": "fixed"}, {"max_attempts": 5, "backoff": "fixed"}),
    ({"max": 1}, {"max_attempts": 1, "backoff": "exponential"}),
    ({"backoff": "exp", "base_s": 2, "max_s": 60}, {"backoff": "exponential", "base_s": 2.0}),
])
def test_retry_shorthand(retry: dict[str, Any], expected: dict[str, Any]) -> None:
    assert expected.items() <= build(body(retry=retry))["retry"].items()


def test_misfire_string_and_object_forms() -> None:
    assert build(body(misfire="fire_all"))["misfire"] == {
        "kind": "fire_all", "late_by_s": None, "fire_all_cap": 100}
    assert build(body(misfire={"kind": "skip_if_late_by", "late_by_s": 90}))["misfire"] == {
        "kind": "skip_if_late_by", "late_by_s": 90.0, "fire_all_cap": 100}


@pytest.mark.parametrize(("concurrency", "overlap"), [
    ("allow", "allow"), ("skip_if_running", "skip_if_running"), ("queue", "queue"),
    ("replace", "replace"),
])
def test_concurrency_is_overlap(concurrency: str, overlap: str) -> None:
    assert build(body(concurrency=concurrency))["overlap"] == overlap


@pytest.mark.parametrize(("target", "name"), [
    ({"url": "https://Example.com/a/b?q=1"}, "POST example.com/a/b"),
    ({"topic": "t.x"}, "kafka t.x"),
    ({"command": "cleanup"}, "cleanup"),
])
def test_name_defaults_from_target(target: dict[str, Any], name: str) -> None:
    assert build(body(name=None, target=target))["name"] == name


def test_cron_whitespace_is_normalised() -> None:
    spec = build(body(schedule={"cron": "  0   2 * *  * ", "timezone": "UTC"}))
    assert spec["schedule"] == ("kron.CronSchedule", {"expr": "0 2 * * *", "timezone": "UTC"})


# --- canonical round trip through Avro ---------------------------------------------------------


FULL: dict[str, Any] = {
    "name": "nightly report ☕",
    "schedule": {"cron": "0 3 * * MON-FRI", "timezone": "Europe/Berlin"},
    "target": {"type": "http", "method": "PUT", "url": "https://example.com/hooks?x=1",
               "headers": {"Content-Type": "application/json", "X-Token": "abc"},
               "body": '{"ok":true}', "timeout_s": 12.5},
    "retry": {"max_attempts": 7, "backoff": "fixed", "base_s": 0.25, "max_s": 60},
    "concurrency": "skip_if_running",
    "priority": "batch",
    "misfire": {"kind": "skip_if_late_by", "late_by_s": 90, "fire_all_cap": 5},
    "dst": {"nonexistent": "skip", "ambiguous": "both"},
    "jitter_s": 2.5,
    "start_at": "2026-07-01T00:00:00+02:00",
    "end_at": "2027-07-01T00:00:00Z",
    "lease_s": 120,
    "metadata": {"owner": "data-team", "tier": "gold"},
    "idempotency_key": "create-nightly-1",
}


@pytest.mark.parametrize("raw", [
    FULL,
    body(name="once", schedule=None, run_at="2026-06-02T09:30:00.250-04:00",
         target={"type": "kafka", "topic": "reports.requested", "key": "k", "value": "v",
                 "headers": {"h": "ü"}}),
    body(schedule={"run_at": "2026-06-03T00:00:00Z"}),
    body(target={**NIGHTLY, "env": {"REPORT_LOCALE": "de_DE"}, "timeout_s": 600},
         misfire="fire_all"),
])
def test_canonical_spec_encodes_and_round_trips(raw: dict[str, Any]) -> None:
    spec = build(raw)
    data = encode("kron.commands.CreateJob", envelope(spec, raw.get("idempotency_key")))
    back = decode(data).record
    assert back["spec"] == spec
    assert back["idempotency_key"] == raw.get("idempotency_key")
    assert spec_fingerprint(back["spec"]) == spec_fingerprint(spec)
    # the canonical form rebuilds the same spec
    assert build(request_of(spec)) == spec


def test_full_request_maps_every_field() -> None:
    spec = build(FULL)
    assert spec["target"] == ("kron.HttpTarget", {
        "method": "PUT", "url": "https://example.com/hooks?x=1",
        "headers": {"Content-Type": "application/json", "X-Token": "abc"},
        "body": b'{"ok":true}', "timeout_s": 12.5})
    assert spec["start_at_ms"] == utc_ms(2026, 6, 30, 22)
    assert spec["end_at_ms"] == utc_ms(2027, 7, 1)
    assert spec["overlap"] == "skip_if_running"
    assert spec["dst"] == {"nonexistent": "skip", "ambiguous": "both"}
    assert spec["misfire"] == {"kind": "skip_if_late_by", "late_by_s": 90.0, "fire_all_cap": 5}
    assert spec["metadata"] == {"owner": "data-team", "tier": "gold"}
    assert (spec["jitter_s"], spec["lease_s"]) == (2.5, 120.0)
    assert spec["priority"] == "batch"


def test_stack_example_spec_survives_request_of() -> None:
    spec = stack_spec(target={"url": URL}, cron="*/5 * * * *")
    assert build(request_of(spec)) == spec


def test_non_utf8_bytes_survive_request_of() -> None:
    spec = stack_spec(target={"url": URL, "body": b'{"ok":true}\x00\xff'}, cron="0 * * * *")
    assert build(request_of(spec))["target"][1]["body"] == b'{"ok":true}\x00\xff'


# --- schedule ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cron", [
    "0 2 * *",            # too few fields
    "0 2 * * * * *",      # too many
    "60 * * * *",         # minute out of range
    "0 24 * * *",         # hour out of range
    "*/0 * * * *",        # zero step
    "0 0 30 2 *",         # never fires
    "0 0 31 4 *",         # never fires
    "@reboot",
    "0 0 L * *",
    "fri-mon * * * *",
    "",
])
def test_bad_cron(cron: str) -> None:
    err = invalid(body(schedule={"cron": cron, "timezone": "UTC"}))
    assert err.field == "schedule.cron"
    err = invalid(body(schedule=cron))
    assert err.field == "schedule.cron"


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "local", "", "../../etc/passwd", "EST5"])
def test_bad_timezone(tz: str) -> None:
    err = invalid(body(schedule={"cron": "0 2 * * *", "timezone": tz}))
    assert err.field == "schedule.timezone"
    assert "timezone" in err.message


@pytest.mark.parametrize(("schedule", "extra", "field"), [
    (None, {}, "schedule"),
    ({"timezone": "UTC"}, {}, "schedule.cron"),
    ({"cron": "0 2 * * *"}, {"run_at": "2026-06-02T00:00:00Z"}, "run_at"),
    ({"cron": "0 2 * * *", "run_at": "2026-06-02T00:00:00Z"}, {}, "schedule.cron"),
])
def test_schedule_shape(schedule: Any, extra: dict[str, Any], field: str) -> None:
    assert invalid(body(schedule=schedule, **extra)).field == field


@pytest.mark.parametrize("value", [
    "2026-11-30T09:00:00",           # naive
    "2026-11-30 09:00:00",           # naive
    "2026-11-30T09:00:00.123",       # naive
])
def test_naive_times_are_refused(value: str) -> None:
    err = invalid(body(schedule=None, run_at=value))
    assert (err.field, "no UTC offset" in err.message) == ("run_at", True)
    for key in ("start_at", "end_at"):
        err = invalid(body(**{key: value}))
        assert err.field == key and "offset" in err.message
    assert invalid(body(schedule={"run_at": value})).field == "schedule.run_at"


@pytest.mark.parametrize("value", [
    "tomorrow", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-06-01T24:00:00Z",
    "2026-06-01T00:00:60Z", "2026-06-01T00:00:00+24:00", "2026-06-01T00:00:00+01:60",
    "20260601T000000Z", "2026-06-01",
])
def test_malformed_times(value: str) -> None:
    assert invalid(body(schedule=None, run_at=value)).field == "run_at"
    assert invalid(body(start_at=value)).field == "start_at"


@pytest.mark.parametrize("value", [1780000000000, 1.5, True, {"at": "x"}])
def test_times_must_be_strings(value: Any) -> None:
    with pytest.raises(InvalidField) as info:
        parse_request(body(schedule=None, run_at=value))
    assert info.value.field == "run_at"


@pytest.mark.parametrize(("text", "ms"), [
    ("2026-11-30T00:00:00Z", utc_ms(2026, 11, 30)),
    ("2026-11-30t00:00:00z", utc_ms(2026, 11, 30)),
    ("2026-11-30T01:00:00+01:00", utc_ms(2026, 11, 30)),
    ("2026-11-29T19:00:00-05:00", utc_ms(2026, 11, 30)),
    ("2026-11-30T00:00:00.999999999Z", utc_ms(2026, 11, 30) + 999),
    ("2026-11-30 05:30:00+05:30", utc_ms(2026, 11, 30)),
])
def test_parse_time(text: str, ms: int) -> None:
    assert parse_time(text, "run_at") == ms


def test_run_at_in_the_past() -> None:
    past = iso(NOW - 3600_000)
    err = invalid(body(schedule=None, run_at=past))
    assert err.field == "run_at" and "fire_now_if_past" in err.message
    spec = build(body(schedule=None, run_at=past, fire_now_if_past=True))
    assert spec["schedule"] == ("kron.OneOffSchedule", {"run_at_ms": NOW - 3600_000})
    # within the clock-skew allowance
    build(body(schedule=None, run_at=iso(NOW - 30_000)))
    assert invalid(body(schedule=None, run_at=iso(NOW - 30_000)), past_skew_s=10).field == "run_at"
    # a replayed request can skip the now-relative checks
    build(body(schedule=None, run_at=past), check_times=False)


@pytest.mark.parametrize("run_at", ["2040-01-01T00:00:00Z", "5000-06-01T00:00:00+00:00",
                                    "9999-12-31T00:00:00Z"])
def test_run_at_absurdly_far(run_at: str) -> None:
    err = invalid(body(schedule=None, run_at=run_at))
    assert err.field == "run_at" and "days ahead" in err.message
    assert invalid(body(start_at=run_at)).field == "start_at"


def test_far_limit_is_configurable() -> None:
    build(body(schedule=None, run_at="2040-01-01T00:00:00Z"), max_future_days=365 * 20)
    # ... up to the domain's own bound (year 9000 for one-offs)
    err = invalid(body(schedule=None, run_at="9999-12-31T00:00:00Z"), max_future_days=10**7)
    assert err.field == "run_at"


@pytest.mark.parametrize(("extra", "field"), [
    ({"start_at": "2026-08-01T00:00:00Z", "end_at": "2026-07-01T00:00:00Z"}, "end_at"),
    ({"start_at": "2026-08-01T00:00:00Z", "end_at": "2026-08-01T00:00:00Z"}, "end_at"),
    ({"end_at": "2026-05-01T00:00:00Z"}, "end_at"),                       # in the past
    # 02:00 Berlin = 00:00Z in summer; a window from 00:30Z to 23:30Z holds no run
    ({"start_at": "2026-07-01T00:30:00Z", "end_at": "2026-07-01T23:30:00Z"}, "end_at"),
    ({"start_at": "1960-01-01T00:00:00Z"}, "start_at"),
])
def test_start_end_window(extra: dict[str, Any], field: str) -> None:
    assert invalid(body(**extra)).field == field


def test_one_off_outside_window() -> None:
    raw = body(schedule=None, run_at="2026-06-10T00:00:00Z", end_at="2026-06-05T00:00:00Z")
    assert invalid(raw).field == "run_at"


# --- non-finite and out-of-range numbers ------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(("path", "field"), [
    (("jitter_s",), "jitter_s"),
    (("lease_s",), "lease_s"),
    (("retry", "base_s"), "retry.base_s"),
    (("retry", "max_s"), "retry.max_s"),
    (("misfire", "late_by_s"), "misfire.late_by_s"),
    (("target", "timeout_s"), "target.timeout_s"),
])
def test_non_finite_numbers(bad: float, path: tuple[str, ...], field: str) -> None:
    raw = body(retry={"max_attempts": 3}, misfire={"kind": "skip_if_late_by", "late_by_s": 1})
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises(InvalidField) as info:
        parse_request(raw)
    assert info.value.field == field
    assert "finite" in info.value.message


@pytest.mark.parametrize(("override", "field"), [
    ({"retry": {"max_attempts": 0}}, "retry.max_attempts"),
    ({"retry": {"max_attempts": 101}}, "retry.max_attempts"),
    ({"retry": {"max": -1}}, "retry.max_attempts"),
    ({"retry": {"base_s": 0}}, "retry.base_s"),
    ({"retry": {"base_s": 3601}}, "retry.base_s"),
    ({"retry": {"base_s": 10, "max_s": 5}}, "retry.max_s"),
    ({"retry": {"max_s": 86_401}}, "retry.max_s"),
    ({"misfire": "skip_if_late_by"}, "misfire.late_by_s"),
    ({"misfire": {"kind": "fire_once", "late_by_s": 5}}, "misfire.late_by_s"),
    ({"misfire": {"kind": "fire_all", "fire_all_cap": 0}}, "misfire.fire_all_cap"),
    ({"misfire": {"kind": "fire_all", "fire_all_cap": 10_001}}, "misfire.fire_all_cap"),
    ({"jitter_s": -1}, "jitter_s"),
    ({"jitter_s": 3601}, "jitter_s"),
    ({"lease_s": 0.5}, "lease_s"),
    ({"lease_s": 86_401}, "lease_s"),
    ({"target": {"url": URL, "timeout_s": 0}}, "target.timeout_s"),
    ({"target": {"url": URL, "timeout_s": 3601}}, "target.timeout_s"),
    ({"target": {**NIGHTLY, "timeout_s": 901}}, "target.timeout_s"),
    ({"target": {**NIGHTLY, "timeout_s": 0}}, "target.timeout_s"),
])
def test_out_of_range(override: dict[str, Any], field: str) -> None:
    assert invalid(body(**override)).field == field


@pytest.mark.parametrize(("override", "field"), [
    ({"retry": {"max_attempts": True}}, "retry.max_attempts"),
    ({"retry": {"max_attempts": "3"}}, "retry.max_attempts"),
    ({"retry": {"max_attempts": 2.5}}, "retry.max_attempts"),
    ({"retry": {"backoff": "linear"}}, "retry.backoff"),
    ({"retry": {"max": 3, "max_attempts": 3}}, "retry"),
    ({"concurrency": "parallel"}, "concurrency"),
    ({"misfire": "fire_twice"}, "misfire.kind"),
    ({"dst": {"nonexistent": "later"}}, "dst.nonexistent"),
    ({"dst": {"ambiguous": "all"}}, "dst.ambiguous"),
    ({"jitter_s": "1"}, "jitter_s"),
    ({"fire_now_if_past": "yes"}, "fire_now_if_past"),
    ({"target": {"url": URL, "method": "TRACE"}}, "target.method"),
    ({"target": {"type": "ftp", "url": URL}}, "target"),
    ({"target": {"timeout_s": 3}}, "target"),
    ({"target": None}, "target"),
])
def test_type_errors(override: dict[str, Any], field: str) -> None:
    raw = body()
    raw.update(override)
    with pytest.raises(InvalidField) as info:
        parse_request(raw)
    assert info.value.field == field


# --- unknown fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "field", "hint"), [
    ({**body(), "nmae": "x"}, "nmae", None),
    ({**body(name=None), "nmae": "x"}, "nmae", "name"),
    ({**body(), "concurency": "queue"}, "concurency", "concurrency"),
    (body(retry={"max_attempt": 3}), "retry.max_attempt", "retry.max_attempts"),
    (body(target={"url": URL, "header": {}}), "target.header", "target.headers"),
    (body(schedule={"cron": "* * * * *", "tz": "UTC"}), "schedule.tz", None),
    (body(dst={"nonexistant": "skip"}), "dst.nonexistant", "dst.nonexistent"),
])
def test_unknown_fields_are_named(raw: dict[str, Any], field: str, hint: str | None) -> None:
    with pytest.raises(InvalidField) as info:
        parse_request(raw)
    assert info.value.field == field
    assert "unknown field" in info.value.message
    if hint is not None:
        assert f"did you mean {hint!r}" in info.value.message


# --- http targets ------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "ftp://example.com/x", "javascript:alert(1)", "file:///etc/passwd", "example.com/hook",
    "http://", "http:///path", "https://exa mple.com/", "http://example.com\\@127.0.0.1/",
    "http://user:pw@example.com/", "http://evil.com@example.com/",
    "http://example.com:99999/", "http://example.com:port/", "http://[::1/",
    "http://exa\x00mple.com/", "http://example.com/\r\nX: y", "http://a..b.com/",
    "http://-bad-.com/", "http://ex%61mple.com/",
])
def test_invalid_urls(url: str) -> None:
    err = invalid(body(target={"url": url}))
    assert err.field == "target.url"
    # allow_private is no excuse for a malformed URL
    assert invalid(body(target={"url": url}), allow_private=True).field == "target.url"


PRIVATE_URLS = [
    "http://localhost/", "http://LOCALHOST:8080/", "http://localhost./", "http://app.localhost/",
    "http://127.0.0.1/", "http://127.1/", "http://127.0.0.1./", "http://0x7f000001/",
    "http://0x7f.0.0.1/", "http://2130706433/", "http://017700000001/", "http://0177.0.0.1/",
    "http://[::1]/", "http://[0:0:0:0:0:0:0:1]/", "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/", "http://[::127.0.0.1]/", "http://[2002:7f00:1::]/",
    "http://[64:ff9b::a9fe:a9fe]/", "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/", "http://0xa9fea9fe/", "http://2852039166/",
    "http://metadata.google.internal/", "http://metadata/", "http://instance-data/",
    "http://100.100.100.200/", "http://10.0.0.1/", "http://172.16.5.4/", "http://192.168.0.1/",
    "http://[fd00:ec2::254]/", "http://[fe80::1%25eth0]/", "http://0/", "http://0.0.0.0/",
    "http://[::]/", "http://224.0.0.1/", "http://255.255.255.255/", "http://db:5432/",
    "http://printer.local/", "http://svc.internal/", "http://①②⑦。0。0。1/",
    "https://\uff11\uff12\uff17.\uff10.\uff10.\uff11/",  # fullwidth digits
]


@pytest.mark.parametrize("url", PRIVATE_URLS)
def test_private_targets_are_refused(url: str) -> None:
    err = invalid(body(target={"url": url}))
    assert err.field == "target.url"
    assert "private" in err.message or "non-public" in err.message or "internal" in err.message


@pytest.mark.parametrize("url", [u for u in PRIVATE_URLS if u.isascii()])
def test_private_targets_allowed_when_configured(url: str) -> None:
    build(body(target={"url": url}), allow_private=True)


@pytest.mark.parametrize("url", [
    URL, "http://93.184.216.34/x", "https://[2606:4700:4700::1111]/", "HTTPS://Example.COM/",
    "https://example.com:8443/a?b=c#d", "https://bücher.example/", "https://my_host.example.com/",
])
def test_public_targets(url: str) -> None:
    assert build(body(target={"url": url}))["target"][1]["url"] == url


@pytest.mark.parametrize(("headers", "field"), [
    ({"X-A": "1\r\nX-B: 2"}, "target.headers.X-A"),
    ({"X-A": "1\n"}, "target.headers.X-A"),
    ({"X-A": "a\x00b"}, "target.headers.X-A"),
    ({"X-A\r\nX-B": "1"}, "target.headers.X-A\\r\\nX-B"),
    ({"X A": "1"}, "target.headers.X A"),
    ({"X:A": "1"}, "target.headers.X:A"),
    ({"": "1"}, "target.headers."),
    ({"X-Ü": "1"}, "target.headers.X-Ü"),
    ({"X-A": "\x01"}, "target.headers.X-A"),
    ({"X-A": "ü"}, "target.headers.X-A"),
    ({"X-A": "v" * 8193}, "target.headers.X-A"),
    ({"Idempotency-Key": "mine"}, "target.headers.Idempotency-Key"),
    ({"x-kron-attempt": "9"}, "target.headers.x-kron-attempt"),
    ({"Content-Length": "5"}, "target.headers.Content-Length"),
    ({"Transfer-Encoding": "chunked"}, "target.headers.Transfer-Encoding"),
    ({"Host": "internal"}, "target.headers.Host"),
    ({"X-A": "1", "x-a": "2"}, "target.headers.x-a"),
    ({f"X-{i}": "1" for i in range(HEADERS_MAX + 1)}, "target.headers"),
    ({f"X-{i}": "v" * 8000 for i in range(5)}, "target.headers"),
])
def test_bad_http_headers(headers: dict[str, str], field: str) -> None:
    err = invalid(body(target={"url": URL, "headers": headers}))
    assert err.field == field


def test_good_http_headers() -> None:
    headers = {"Authorization": "Bearer abc", "X-Tab": "a\tb", **{f"X-{i}": "1" for i in range(48)}}
    assert build(body(target={"url": URL, "headers": headers}))["target"][1]["headers"] == headers


@pytest.mark.parametrize(("headers", "field"), [
    ({"h": "a\nb"}, "target.headers.h"),
    ({"Idempotency-Key": "x"}, "target.headers.Idempotency-Key"),
    ({f"h{i}": "1" for i in range(HEADERS_MAX + 1)}, "target.headers"),
])
def test_bad_kafka_headers(headers: dict[str, str], field: str) -> None:
    assert invalid(body(target={"topic": "t", "headers": headers})).field == field


# --- kafka and command targets -----------------------------------------------------------------


@pytest.mark.parametrize(("target", "field"), [
    ({"topic": ""}, "target.topic"),
    ({"topic": "a b"}, "target.topic"),
    ({"topic": ".."}, "target.topic"),
    ({"topic": "x" * 250}, "target.topic"),
    ({"topic": "kron.commands"}, "target.topic"),
    ({"topic": "kron-engine-jobs-changelog"}, "target.topic"),
    ({"topic": "__consumer_offsets"}, "target.topic"),
    ({"topic": "t", "value": "v" * (256 * 1024 + 1)}, "target.value"),
    ({"topic": "t", "key": "k" * (16 * 1024 + 1)}, "target.key"),
])
def test_bad_kafka_targets(target: dict[str, Any], field: str) -> None:
    assert invalid(body(target=target)).field == field


def test_internal_topic_prefix_follows_settings() -> None:
    build(body(target={"topic": "kron.commands"}), topic_prefix="prod")
    assert invalid(body(target={"topic": "prod.commands"}), topic_prefix="prod").field == (
        "target.topic")


@pytest.mark.parametrize(("target", "field"), [
    ({"type": "command"}, "target.command"),
    ({"command": ""}, "target.command"),
    ({"command": "rm -rf /"}, "target.command"),
    ({"command": "unknown.cmd"}, "target.command"),
    ({"argv": ["/bin/sh", "-c", "env"]}, "target.argv"),
    ({"command": "cleanup", "argv": ["/bin/sh"]}, "target.argv"),
    ({"image": "alpine"}, "target.image"),
    ({"command": "cleanup", "cwd": "/"}, "target.cwd"),
    ({"command": "reports.nightly"}, "target.args.day"),
    ({"command": "reports.nightly", "args": {"day": "2026-12-01; rm -rf /"}}, "target.args.day"),
    ({"command": "reports.nightly", "args": {"day": "2026-12-01\n"}}, "target.args.day"),
    ({**NIGHTLY, "args": {"day": "2026-12-01", "extra": "x"}}, "target.args.extra"),
    ({**NIGHTLY, "env": {"LD_PRELOAD": "/tmp/x.so"}}, "target.env.LD_PRELOAD"),
    ({**NIGHTLY, "env": {"PATH": "/tmp"}}, "target.env.PATH"),
    ({**NIGHTLY, "env": {"REPORT_LOCALE": "a\x00"}}, "target.env.REPORT_LOCALE"),
])
def test_bad_command_targets(target: dict[str, Any], field: str) -> None:
    err = invalid(body(target=target))
    assert err.field == field
    assert field in err.message


def test_command_targets_are_per_tenant_and_off_without_a_registry() -> None:
    assert build(body(target={"command": "cleanup"}), tenant="globex")
    err = invalid(body(target=NIGHTLY), tenant="globex")
    assert err.field == "target.command" and "not granted to tenant 'globex'" in err.message
    off = invalid(body(target={"command": "cleanup"}), commands=CommandRegistry())
    assert off.field == "target.command" and "KRON_COMMANDS_FILE" in off.message


# --- body, metadata, name, idempotency key -----------------------------------------------------


@pytest.mark.parametrize(("override", "field"), [
    ({"target": {"url": URL, "body": "x" * (256 * 1024 + 1)}}, "target.body"),
    ({"target": {"url": URL, "body": "é" * (128 * 1024 + 1)}}, "target.body"),  # bytes count
    ({"target": {"url": URL, "body": "\ud800"}}, "target.body"),
    ({"metadata": {f"k{i}": "v" for i in range(65)}}, "metadata"),
    ({"metadata": {"k": "v" * 1025}}, "metadata.k"),
    ({"metadata": {"k" * 129: "v"}}, "metadata." + "k" * 129),
    ({"metadata": {"": "v"}}, "metadata."),
    ({"metadata": {"a\nb": "v"}}, "metadata.a\\nb"),
    ({"metadata": {"k": "a\x00"}}, "metadata.k"),
    ({"metadata": {"k": "\udc80"}}, "metadata.k"),
    ({"metadata": {f"k{i}": "v" * 1000 for i in range(20)}}, "metadata"),
    ({"target": {"url": URL, "headers": {"X-A": "\ud83d"}}}, "target.headers.X-A"),
])
def test_size_and_text_bounds(override: dict[str, Any], field: str) -> None:
    assert invalid(body(**override)).field == field


@pytest.mark.parametrize(("override", "field"), [
    ({"name": ""}, "name"),
    ({"name": "   "}, "name"),
    ({"name": "x" * 201}, "name"),
    ({"name": "a\nb"}, "name"),
    ({"idempotency_key": ""}, "idempotency_key"),
    ({"idempotency_key": "k" * 201}, "idempotency_key"),
    ({"idempotency_key": "a\tb"}, "idempotency_key"),
])
def test_name_and_idempotency_key(override: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidField) as info:
        parse_request(body(**override))
    assert info.value.field == field


def test_idempotency_key_is_not_part_of_the_spec() -> None:
    a = build(body(idempotency_key="k1"))
    b = build(body(idempotency_key="k2"))
    assert a == b and spec_fingerprint(a) == spec_fingerprint(b)


def test_several_errors_are_reported() -> None:
    with pytest.raises(InvalidField) as info:
        parse_request({**body(), "nmae": "x", "jitter_s": math.nan, "retry": {"max": "3"}})
    fields = [f for f, _ in info.value.errors]
    assert fields[0] == "nmae"
    assert {"jitter_s", "retry.max_attempts"} <= set(fields)


# --- fingerprint -------------------------------------------------------------------------------


SPECS = [build(FULL), build(body()), build(body(schedule=None, run_at="2026-06-02T00:00:00Z",
                                                 target={"topic": "t", "value": "v"})),
         build({"schedule": "0 2 * * *", "target": NIGHTLY})]


def shuffled(value: Any, rnd: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, tuple):
        return (value[0], shuffled(value[1], rnd))
    return value


@given(st.sampled_from(range(len(SPECS))), st.randoms(use_true_random=False))
def test_fingerprint_ignores_key_order(index: int, rnd: random.Random) -> None:
    spec = SPECS[index]
    other = shuffled(spec, rnd)
    assert other == spec
    assert spec_fingerprint(other) == spec_fingerprint(spec)


def leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        out = [(*path, k) for k, v in value.items() if not isinstance(v, dict | tuple | list)]
        for k, v in value.items():
            if isinstance(v, dict | tuple | list):
                out += leaves(v, (*path, k)) or [(*path, k)]
        return out
    if isinstance(value, tuple):
        return leaves(value[1], (*path, 1))
    if isinstance(value, list):
        return [(*path, i) for i in range(len(value))] or [path]
    return [path]


def changed(value: Any) -> Any:
    if value is None:
        return 1
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, bytes):
        return value + b"x"
    if isinstance(value, dict):
        return {**value, "extra": "x"}
    if isinstance(value, list):
        return [*value, "x"]
    raise AssertionError(value)


def set_at(spec: Any, path: tuple[Any, ...]) -> Any:
    spec = copy.deepcopy(spec)
    node = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = changed(node[path[-1]])
    return spec


def thaw(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [value[0], thaw(value[1])]
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value


def freeze(value: Any, like: Any) -> Any:
    if isinstance(like, dict):
        return {k: freeze(value[k], like[k]) if k in like else value[k] for k in value}
    if isinstance(like, tuple):
        return (value[0], freeze(value[1], like[1]))
    return value


@settings(max_examples=200)
@given(st.data())
def test_fingerprint_changes_with_any_field(data: st.DataObject) -> None:
    spec = data.draw(st.sampled_from(SPECS))
    path = data.draw(st.sampled_from(leaves(spec)))
    # Tuples can't be assigned into, so mutate a thawed copy and restore the union tuples.
    mutated = freeze(set_at(thaw(spec), path), spec)
    assert mutated != spec
    assert spec_fingerprint(mutated) != spec_fingerprint(spec)


def test_fingerprint_distinguishes_union_branch_and_bytes() -> None:
    spec = SPECS[1]
    other = {**spec, "schedule": ("kron.OtherSchedule", spec["schedule"][1])}
    assert spec_fingerprint(other) != spec_fingerprint(spec)
    assert spec_fingerprint({**spec, "name": b"nightly"}) != spec_fingerprint(spec)
    assert spec_fingerprint({**spec, "jitter_s": 0}) == spec_fingerprint(spec)  # 0 == 0.0


def test_fingerprint_of_equivalent_requests() -> None:
    a = build(body(target={"url": URL, "method": "post"}, schedule="0  2 * * *"))
    b = build(body(target={"type": "http", "method": "POST", "url": URL},
                   schedule={"cron": "0 2 * * *", "timezone": "UTC"}))
    assert spec_fingerprint(a) == spec_fingerprint(b)
    assert len(spec_fingerprint(a)) == 64


# --- merge_patch -------------------------------------------------------------------------------


def patch(existing: dict[str, Any], raw: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return merge_patch(existing, parse_patch(raw), now_ms=NOW, allow_private=False, **kw)


def patch_error(existing: dict[str, Any], raw: dict[str, Any]) -> InvalidField:
    with pytest.raises(InvalidField) as info:
        patch(existing, raw)
    return info.value


def test_patch_merges_only_given_fields() -> None:
    spec = build(FULL)
    out = patch(spec, {"retry": {"max_attempts": 9}, "metadata": {"tier": None, "new": "1"}})
    assert out["retry"] == {**spec["retry"], "max_attempts": 9}
    assert out["metadata"] == {"owner": "data-team", "new": "1"}
    assert {k: v for k, v in out.items() if k not in ("retry", "metadata")} == {
        k: v for k, v in spec.items() if k not in ("retry", "metadata")}
    assert patch(spec, {}) == spec


def test_patch_schedule() -> None:
    spec = build(FULL)
    tz_only = patch(spec, {"schedule": {"timezone": "Asia/Tokyo"}})
    assert tz_only["schedule"] == ("kron.CronSchedule",
                                   {"expr": "0 3 * * MON-FRI", "timezone": "Asia/Tokyo"})
    cron_only = patch(spec, {"schedule": "*/5 * * * *"})
    assert cron_only["schedule"] == ("kron.CronSchedule",
                                     {"expr": "*/5 * * * *", "timezone": "Europe/Berlin"})
    one_off = patch(spec, {"run_at": "2026-07-02T00:00:00Z"})
    assert one_off["schedule"] == ("kron.OneOffSchedule", {"run_at_ms": utc_ms(2026, 7, 2)})
    back = patch(one_off, {"schedule": {"cron": "0 1 * * *"}})
    assert back["schedule"] == ("kron.CronSchedule", {"expr": "0 1 * * *", "timezone": "UTC"})
    assert patch_error(spec, {"schedule": {"cron": "61 * * * *"}}).field == "schedule.cron"
    assert patch_error(spec, {"schedule": {"timezone": "Nowhere/Land"}}).field == (
        "schedule.timezone")
    assert patch_error(one_off, {"schedule": {"timezone": "UTC"}}).field == "schedule.cron"
    assert patch_error(spec, {"schedule": None}).field == "schedule"
    assert patch_error(spec, {"schedule": "* * * * *", "run_at": iso(NOW + DAY)}).field == (
        "run_at")


def test_patch_time_checks_only_touched_times() -> None:
    old = build(body(schedule=None, run_at=iso(NOW + 60_000)))
    later = NOW + 3 * DAY  # the job has run; renaming it must still work
    renamed = merge_patch(old, parse_patch({"name": "renamed"}), now_ms=later,
                          allow_private=False)
    assert renamed["name"] == "renamed"
    with pytest.raises(InvalidField) as info:
        merge_patch(old, parse_patch({"run_at": iso(NOW)}), now_ms=later, allow_private=False)
    assert info.value.field == "run_at"
    moved = merge_patch(old, parse_patch({"run_at": iso(NOW), "fire_now_if_past": True}),
                        now_ms=later, allow_private=False)
    assert moved["schedule"] == ("kron.OneOffSchedule", {"run_at_ms": NOW})
    assert patch_error(build(FULL), {"end_at": "2026-01-01T00:00:00Z"}).field == "end_at"


def test_patch_target() -> None:
    spec = build(FULL)
    out = patch(spec, {"target": {"headers": {"X-Token": None, "X-New": "1"}, "body": None}})
    assert out["target"][1]["headers"] == {"Content-Type": "application/json", "X-New": "1"}
    assert out["target"][1]["body"] is None
    assert out["target"][1]["url"] == FULL["target"]["url"]
    swapped = patch(spec, {"target": {"type": "kafka", "topic": "reports"}})
    assert swapped["target"] == ("kron.KafkaTarget", {"topic": "reports", "key": None,
                                                      "value": None, "headers": {}})
    inferred = patch(spec, {"target": {"command": "cleanup"}}, commands=COMMANDS,
                     tenant="acme")
    assert inferred["target"][0] == "kron.RegisteredCommandTarget"
    args = patch(build(body(target=NIGHTLY)), {"target": {"args": {"day": "2027-01-02"}}},
                 commands=COMMANDS, tenant="acme")
    assert args["target"][1]["args"] == {"day": "2027-01-02"}
    assert patch_error(spec, {"target": {"argv": ["/bin/true"]}}).field == "target.argv"
    assert patch_error(spec, {"target": {"url": "http://127.0.0.1/"}}).field == "target.url"
    assert patch_error(spec, {"target": {"topic": "x", "type": "http"}}).field == "target.topic"
    assert patch_error(spec, {"target": {"urll": URL}}).field == "target.urll"
    assert patch_error(spec, {"target": {"url": None}}).field == "target.url"


def test_patch_policies() -> None:
    spec = build(FULL)  # misfire skip_if_late_by 90s
    out = patch(spec, {"misfire": "fire_all", "concurrency": "queue", "dst": {"ambiguous": "last"}})
    assert out["misfire"] == {"kind": "fire_all", "late_by_s": None, "fire_all_cap": 5}
    assert out["overlap"] == "queue"
    assert out["dst"] == {"nonexistent": "skip", "ambiguous": "last"}
    reset = patch(spec, {"retry": None, "end_at": None, "jitter_s": None})
    assert reset["retry"] == {"max_attempts": 3, "backoff": "exponential", "base_s": 1.0,
                              "max_s": 300.0}
    assert (reset["end_at_ms"], reset["jitter_s"]) == (None, 0.0)
    assert patch(spec, {"retry": {"max": 2, "backoff": "exp"}})["retry"]["backoff"] == (
        "exponential")
    assert patch_error(spec, {"retry": {"base_s": 100}}).field == "retry.max_s"
    assert patch_error(spec, {"lease_s": math.inf}).field == "lease_s"


def test_patch_rejects_unknown_and_non_patchable_fields() -> None:
    for raw, field in [({"nmae": "x"}, "nmae"), ({"idempotency_key": "k"}, "idempotency_key"),
                       ({"retry": {"tries": 3}}, "retry.tries")]:
        with pytest.raises(InvalidField) as info:
            parse_patch(raw)
        assert info.value.field == field


# --- upcoming ----------------------------------------------------------------------------------


NY = "America/New_York"


@pytest.mark.parametrize(("cron", "dst", "expected"), [
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist.
    ("30 2 * * *", {"nonexistent": "shift_forward"},
     [utc_ms(2026, 3, 7, 7, 30), utc_ms(2026, 3, 8, 7, 30), utc_ms(2026, 3, 9, 6, 30)]),
    ("30 2 * * *", {"nonexistent": "skip"},
     [utc_ms(2026, 3, 7, 7, 30), utc_ms(2026, 3, 9, 6, 30), utc_ms(2026, 3, 10, 6, 30)]),
])
def test_upcoming_spring_forward(cron: str, dst: dict[str, str], expected: list[int]) -> None:
    spec = build(body(schedule={"cron": cron, "timezone": NY}, dst=dst))
    assert upcoming(spec, now_ms=utc_ms(2026, 3, 7), count=3) == expected


@pytest.mark.parametrize(("ambiguous", "expected"), [
    # 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice.
    ("first", [utc_ms(2026, 10, 31, 5, 30), utc_ms(2026, 11, 1, 5, 30),
               utc_ms(2026, 11, 2, 6, 30)]),
    ("last", [utc_ms(2026, 10, 31, 5, 30), utc_ms(2026, 11, 1, 6, 30),
              utc_ms(2026, 11, 2, 6, 30)]),
    ("both", [utc_ms(2026, 10, 31, 5, 30), utc_ms(2026, 11, 1, 5, 30),
              utc_ms(2026, 11, 1, 6, 30)]),
])
def test_upcoming_fall_back(ambiguous: str, expected: list[int]) -> None:
    spec = build(body(schedule={"cron": "30 1 * * *", "timezone": NY},
                      dst={"ambiguous": ambiguous}))
    assert upcoming(spec, now_ms=utc_ms(2026, 10, 31), count=3) == expected


def test_upcoming_honours_start_and_end() -> None:
    spec = build(body(schedule={"cron": "0 12 * * *", "timezone": "UTC"},
                      start_at="2026-06-10T00:00:00Z", end_at="2026-06-12T12:00:00Z"))
    assert upcoming(spec, now_ms=NOW, count=5) == [
        utc_ms(2026, 6, 10, 12), utc_ms(2026, 6, 11, 12), utc_ms(2026, 6, 12, 12)]
    assert upcoming(spec, now_ms=utc_ms(2026, 6, 11, 12), count=1) == [utc_ms(2026, 6, 11, 12)]
    assert upcoming(spec, now_ms=utc_ms(2026, 7, 1), count=5) == []
    assert upcoming(spec, now_ms=NOW, count=0) == []


def test_upcoming_one_off() -> None:
    spec = build(body(schedule=None, run_at="2026-06-02T09:30:00+02:00"))
    assert upcoming(spec, now_ms=NOW) == [utc_ms(2026, 6, 2, 7, 30)]
    assert upcoming(spec, now_ms=NOW + 30 * DAY) == [utc_ms(2026, 6, 2, 7, 30)]


@pytest.mark.parametrize("count", [-1, 101, True])
def test_upcoming_count_bounds(count: Any) -> None:
    with pytest.raises(InvalidField):
        upcoming(SPECS[1], now_ms=NOW, count=count)


# --- iso ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ms", "text"), [
    (0, "1970-01-01T00:00:00.000Z"),
    (utc_ms(2026, 11, 30), "2026-11-30T00:00:00.000Z"),
    (utc_ms(2026, 11, 30) + 7, "2026-11-30T00:00:00.007Z"),
    (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
])
def test_iso(ms: int, text: str) -> None:
    assert iso(ms) == text
    assert parse_time(text, "t") == ms


@given(st.integers(min_value=0, max_value=253_402_300_799_999))
def test_iso_round_trips(ms: int) -> None:
    assert parse_time(iso(ms), "t") == ms


def test_request_model_is_exported_for_fastapi() -> None:
    schema = JobRequest.model_json_schema()
    # a target or (issue 38) a dag: neither is required alone
    assert "target" not in schema.get("required", [])
    assert schema["anyOf"] == [{"required": ["target"]}, {"required": ["dag"]}]
    assert schema["additionalProperties"] is False


# --- the context checks as pydantic validators -------------------------------------------------


def test_job_spec_validates_a_body_in_a_build_context() -> None:
    """JOB_SPEC.validate_python(body, context=BuildContext(...)) is build_spec in one pass,
    from a body or from a request FastAPI parsed (then only the context's checks run)."""
    context = BuildContext(now_ms=NOW, allow_private=False, tenant="acme", commands=COMMANDS)
    assert spec_in(FULL, context) == build(FULL)
    assert JOB_SPEC.validate_python(parse_request(FULL), context=context) == build(FULL)
    with pytest.raises(InvalidField) as info:
        spec_in(body(target={"url": "http://127.0.0.1/"}), context)
    assert info.value.field == "target.url" and "private" in info.value.message
    # a later context judges the same parsed request again
    req = parse_request(body(schedule=None, run_at=iso(NOW + 60_000)))
    spec_in(req, context)
    with pytest.raises(InvalidField) as info:
        spec_in(req, BuildContext(now_ms=NOW + DAY, allow_private=False))
    assert info.value.field == "run_at"
    assert spec_in(req, BuildContext(now_ms=NOW + DAY, allow_private=False, times=frozenset()))


def test_a_context_check_keeps_its_problem_type_and_title() -> None:
    err = invalid(body(target={"url": URL, "body": "x" * (256 * 1024 + 1)}))
    assert (err.field, err.kind, err.title) == (
        "target.body", "target-body-too-large", "Target body too large")
    assert err.errors == [(err.field, err.message)]


def test_job_spec_needs_a_build_context() -> None:
    with pytest.raises(TypeError):
        JOB_SPEC.validate_python(body())
