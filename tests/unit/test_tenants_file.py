"""KRON_TENANTS_FILE (issue 39): the file's quotas and their defaults, every kind of
malformed file refused naming its file and line (and stopping start-up), the launchers
passing the file down, and the API's per-tenant limits: a tenant's own write rate and
active-jobs cap, and /v1/stats' running and queued counts."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.projection import Batch, Projector, Views, apply_execution
from api.routes import responses, service
from api.server import Components, create_app
from kron.clock import ManualClock
from kron.processes import settings_env
from kron.settings import Settings
from streams.domain.notify import NotifyEvent
from streams.domain.tenants import FILE_KEYS, RULES, TenantQuotas, TenantTable
from tests.unit.test_api_routes import Probe, Publisher, conforms, problem
from tests.unit.test_dag_query import execution

GOOD = """\
[defaults]            # for tenants not listed; every key optional
weight = 1            # share of each decision and dispatch round (int 1..1000)
max_running = 0
dispatch_rate_per_s = 0   # 0 = unlimited
create_rate_per_s = 200
create_burst = 400
max_active_jobs = 100000

[tenants.acme]
weight = 4
max_running = 50

[tenants."eu.globex"]
dispatch_rate_per_s = 2.5
create_rate_per_s = 5     # no create_burst: twice the rate
"""


def settings(tmp_path: Path, **fields: Any) -> Settings:
    return Settings(bootstrap_servers="127.0.0.1:1", data_dir=tmp_path, **fields)


def write(tmp_path: Path, text: str, name: str = "tenants.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- the file --------------------------------------------------------------------------------


def test_a_good_file_gives_each_listed_tenant_its_section_over_the_defaults() -> None:
    table = TenantTable.from_toml(GOOD, "tenants.toml")
    assert table.quotas("acme") == TenantQuotas(
        weight=4, max_running=50, dispatch_rate_per_s=0.0, create_rate_per_s=200.0,
        create_burst=400, max_active_jobs=100_000)
    assert table.quotas("eu.globex") == dataclasses.replace(
        table.defaults, dispatch_rate_per_s=2.5, create_rate_per_s=5.0, create_burst=10)
    assert table.quotas("anyone else") is table.defaults == TenantQuotas()
    assert sorted(table.tenants) == ["acme", "eu.globex"] and table.source == "tenants.toml"
    # Rates are floats whatever TOML wrote; counts stay ints.
    assert isinstance(table.quotas("eu.globex").create_rate_per_s, float)
    assert isinstance(table.quotas("acme").weight, int)


def test_the_quotas_are_the_files_keys_in_order() -> None:
    assert list(FILE_KEYS) == [f.name for f in dataclasses.fields(TenantQuotas)]
    assert [f.name for f in dataclasses.fields(TenantQuotas)] == [
        "weight", "max_running", "dispatch_rate_per_s", "create_rate_per_s", "create_burst",
        "max_active_jobs", "notify_webhook", "notify_on"]


def test_a_tenant_default_notify_is_inherited_and_replaced_whole() -> None:
    table = TenantTable.from_toml(
        '[defaults]\nnotify_webhook = "https://hooks.example/all"\n'
        '[tenants.acme]\nnotify_on = ["missed", "failed"]\n'
        '[tenants.globex]\nnotify_webhook = "https://globex.example/h"\n')
    acme, globex, other = (table.quotas(t).notify for t in ("acme", "globex", "x"))
    assert acme is not None and acme.webhook == "https://hooks.example/all"
    assert acme.on == {NotifyEvent.FAILED, NotifyEvent.MISSED}
    assert globex is not None and globex.on == {NotifyEvent.FAILED}  # the default events
    assert other is not None and other.on == {NotifyEvent.FAILED}
    assert TenantTable.from_toml("").quotas("x").notify is None


@pytest.mark.parametrize(("text", "message"), [
    ('[tenants.acme]\nweight = 2\nnotify_webhook = "ftp://x"\n',
     "<tenants>, line 3: tenants.acme.notify_webhook must be an http(s) URL"),
    ('[defaults]\nnotify_webhook = 7\n',
     "<tenants>, line 2: defaults.notify_webhook must be an http(s) URL"),
    ('[defaults]\n\nnotify_on = ["failed", "late"]\n',
     "<tenants>, line 3: defaults.notify_on[1] must be one of: failed, missed; got 'late'"),
    ('[defaults]\nnotify_on = "failed"\n',
     "<tenants>, line 2: defaults.notify_on must be a list of: failed, missed"),
    ('[defaults]\nnotify_hook = "https://x.example"\n',
     "did you mean 'notify_webhook'?"),
])
def test_a_bad_notify_key_names_its_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        TenantTable.from_toml(text)


def test_what_defaults_omit_comes_from_the_base_and_tenants_inherit_the_defaults() -> None:
    base = TenantQuotas(create_rate_per_s=7.0, create_burst=9, max_active_jobs=11)
    table = TenantTable.from_toml("[defaults]\nweight = 2\n[tenants.a]\nmax_running = 3\n"
                                  "[tenants.b]\ncreate_burst = 1\n", base=base)
    assert table.defaults == dataclasses.replace(base, weight=2)
    assert table.quotas("a") == dataclasses.replace(base, weight=2, max_running=3)
    assert table.quotas("b") == dataclasses.replace(base, weight=2, create_burst=1)
    # A section's own rate without a burst: twice its rate (at least 1), the defaults' too.
    table = TenantTable.from_toml("[defaults]\ncreate_rate_per_s = 0.2\n"
                                  "[tenants.a]\ncreate_rate_per_s = 30.25\n", base=base)
    assert (table.defaults.create_rate_per_s, table.defaults.create_burst) == (0.2, 1)
    assert (table.quotas("a").create_rate_per_s, table.quotas("a").create_burst) == (30.25, 61)
    # An empty file, or no file: the base for everyone.
    assert TenantTable.from_toml("", base=base).quotas("x") == base
    assert TenantTable.load(None, base=base) == TenantTable(defaults=base)


def test_dotted_keys_and_inline_tables_are_toml_like_any_other() -> None:
    table = TenantTable.from_toml('defaults.weight = 2\ntenants.acme.weight = 3\n')
    assert (table.defaults.weight, table.quotas("acme").weight) == (2, 3)
    table = TenantTable.from_toml('[tenants]\nb = {max_running = 2, weight = 5}\n')
    assert (table.quotas("b").max_running, table.quotas("b").weight) == (2, 5)


BAD = [
    # (text, line, what the message names)
    ("[defaults]\nweight = 1\nmax_running = [1,\n\n", 3, "invalid TOML at the end"),
    ("[defaults]\nweight = \n", 2, "invalid TOML"),
    ("[defaults]\nweight = 1\n[defaults]\nweight = 2\n", 3, "invalid TOML"),
    ("[defaults]\nweight = 1\n\n[tenants.acme]\nmax_running = 5\nwieght = 4\n", 6,
     "tenants.acme: unknown key 'wieght'"),
    ("[defaults]\nmax_running = 5\nweight = \"4\"\n", 3,
     "defaults.weight must be an integer in 1..1000; got '4'"),
    ("[defaults]\nmax_running = true\n", 2, "defaults.max_running must be an integer"),
    ("[defaults]\nweight = 1.5\n", 2, "defaults.weight must be an integer"),
    ("[defaults]\ncreate_rate_per_s = \"fast\"\n", 2,
     "defaults.create_rate_per_s must be a number"),
    ("[defaults]\nmax_active_jobs = 1970-01-01\n", 2, "got a date or time"),
    ("[defaults]\nweight = 0\n", 2, "defaults.weight must be an integer in 1..1000; got 0"),
    ("\n[tenants.acme]\nweight = 1001\n", 3, "tenants.acme.weight must be an integer in 1..1000"),
    ("[tenants.acme]\nmax_running = -1\n", 2, "tenants.acme.max_running"),
    ("[tenants.acme]\ndispatch_rate_per_s = -1\n", 2,
     "dispatch_rate_per_s must be a number in 0.."),
    ("[tenants.acme]\ncreate_rate_per_s = 0\n", 2, "create_rate_per_s must be a number in (0, "),
    ("[tenants.acme]\ncreate_rate_per_s = nan\n", 2, "got nan"),
    ("[tenants.acme]\ncreate_burst = 0\n", 2, "tenants.acme.create_burst"),
    ("[defaults]\nweight = 2\n\n[limits]\nweight = 2\n", 4, "unknown section 'limits'"),
    ("# quotas\nweight = 2\n", 2, "unknown key 'weight' at the top level"),
    ("[default]\nweight = 2\n", 1, "did you mean 'defaults'?"),
    ("[tenants]\nacme = 4\n", 2, "tenants.acme must be a table"),
    ("defaults = 3\n", 1, "defaults must be a table"),
    ("[[tenants]]\nweight = 2\n", 1, "tenants must be a table"),
    ("[tenants.acme.limits]\nx = 1\n", 1, "tenants.acme: unknown key 'limits'"),
    ("[tenants]\nb = {max_running = 2, weight = 0}\n", 2, "tenants.b.weight"),
    ("[tenants.a]\nweight = 2\n[tenants]\nb.weight = 2\n\nc.weight = 0\n", 6,
     "tenants.c.weight"),
    ("[tenants.a]\nweight = 2\n[tenants.b]\nweight = 2\n\ntenants.c.weight = 0\n", 6,
     "tenants.b: unknown key 'tenants'"),
    ('[tenants."eu acme"]\nweight = 2\nmax_running = -3\n', 3,
     'tenants."eu acme".max_running'),
    ("[tenants.\"\"]\nweight = 2\n", 1, "name can't be blank"),
    ("[defaults]\nweight = 3\nmax_running = [\n  1,\n  2,\n]\n", 3,
     "defaults.max_running must be an integer"),
]


@pytest.mark.parametrize(("text", "line", "names"), BAD)
def test_a_malformed_file_names_the_file_and_the_line(tmp_path: Path, text: str, line: int,
                                                      names: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as refused:
        TenantTable.from_file(path)
    message = str(refused.value)
    assert message.startswith(f"KRON_TENANTS_FILE {path}, line {line}"), message
    assert names in message, message
    # from_toml says the same with its source.
    with pytest.raises(ValueError, match=f"^tenants.toml, line {line}[,:]"):
        TenantTable.from_toml(text, "tenants.toml")


def test_an_unreadable_file_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ValueError, match=f"KRON_TENANTS_FILE {missing}: "):
        TenantTable.from_file(missing)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[defaults]")
    with pytest.raises(ValueError, match=r"KRON_TENANTS_FILE .*binary\.toml"):
        TenantTable.from_file(binary)


# --- the settings ----------------------------------------------------------------------------


def test_without_a_file_every_tenant_has_the_settings_limits(tmp_path: Path) -> None:
    s = settings(tmp_path, tenant_rate_per_s=3.5, tenant_burst=8, tenant_max_active_jobs=9)
    assert s.tenants_file is None
    assert s.tenants.quotas("acme") == TenantQuotas(create_rate_per_s=3.5, create_burst=8,
                                                     max_active_jobs=9)
    assert s.tenants is s.tenants  # read once


def test_the_settings_limits_are_the_defaults_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "[defaults]\nweight = 2\n[tenants.acme]\nmax_active_jobs = 5\n"
                           "[tenants.globex]\ncreate_rate_per_s = 1\n")
    s = settings(tmp_path, tenants_file=path, tenant_rate_per_s=3.5, tenant_burst=8,
                 tenant_max_active_jobs=9)
    assert s.tenants.quotas("other") == TenantQuotas(weight=2, create_rate_per_s=3.5,
                                                      create_burst=8, max_active_jobs=9)
    assert s.tenants.quotas("acme").max_active_jobs == 5
    assert (s.tenants.quotas("globex").create_rate_per_s,
            s.tenants.quotas("globex").create_burst) == (1.0, 2)
    # The file's [defaults] win over the settings.
    path = write(tmp_path, "[defaults]\ncreate_rate_per_s = 50\nmax_active_jobs = 7\n", "b.toml")
    s = settings(tmp_path, tenants_file=path, tenant_rate_per_s=3.5, tenant_burst=8)
    assert s.tenants.quotas("x") == TenantQuotas(create_rate_per_s=50.0, create_burst=100,
                                                  max_active_jobs=7)


def test_a_malformed_file_stops_the_settings_naming_file_and_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "[tenants.acme]\nweight = 1\nmax_running = -1\n")
    with pytest.raises(ValidationError, match=f"KRON_TENANTS_FILE {path}, line 3: "
                                              "tenants.acme.max_running"):
        settings(tmp_path, tenants_file=path)
    # As a process reads it: KRON_TENANTS_FILE from the environment.
    monkeypatch.setenv("KRON_TENANTS_FILE", str(path))
    with pytest.raises(ValidationError, match="line 3"):
        Settings()
    monkeypatch.setenv("KRON_TENANTS_FILE", "")  # empty is unset
    assert Settings().tenants_file is None


def test_the_launchers_pass_the_file_down(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert settings_env(settings(tmp_path, tenants_file=path))["KRON_TENANTS_FILE"] == str(path)
    # Unset goes down as "" (unset), over an inherited value.
    assert settings_env(settings(tmp_path))["KRON_TENANTS_FILE"] == ""


# --- the API ---------------------------------------------------------------------------------


API_TENANTS = """\
[defaults]
create_rate_per_s = 1000
max_active_jobs = 1000
[tenants.slow]
create_rate_per_s = 1
create_burst = 2
[tenants.small]
max_active_jobs = 2
"""
KEYS = "fast=key-fast,slow=key-slow,small=key-small,big=key-big"
RUN_AT = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
JOB = {"run_at": RUN_AT, "target": {"url": "http://x.test/"}}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(now_ms=int(time.time() * 1000), monotonic=1_000.0)


@pytest.fixture
def views(tmp_path: Path) -> Iterator[Views]:
    v = Views(tmp_path / "views")
    yield v
    v.close()


@pytest.fixture
def api(tmp_path: Path, views: Views, clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setattr(service, "READ_YOUR_WRITES_S", 0.01)  # no worker applies anything
    s = settings(tmp_path, api_create_batch=1, api_keys=KEYS, allow_private_targets=True,
                 tenants_file=write(tmp_path, API_TENANTS))
    parts = Components(settings=s, views=views, projector=Projector(s, views),
                       publisher=Publisher(), probe=Probe())  # type: ignore[arg-type]
    return TestClient(create_app(s, components=parts, clock=clock))


def key(tenant: str) -> dict[str, str]:
    return {"X-API-Key": f"key-{tenant}"}


def test_a_tenants_own_write_rate_limits_it_and_no_other(api: TestClient,
                                                        clock: ManualClock) -> None:
    for _ in range(2):  # its burst
        conforms(responses.CreatedJob, api.post("/v1/jobs", json=JOB, headers=key("slow")), 201)
    limited = api.post("/v1/jobs", json=JOB, headers=key("slow"))
    problem(limited, 429, "rate-limited")
    assert int(limited.headers["retry-after"]) in (1, 2)  # a token a second
    # The defaults' rate for a tenant the file does not list: not limited.
    for _ in range(10):
        conforms(responses.CreatedJob, api.post("/v1/jobs", json=JOB, headers=key("fast")), 201)
    # Reads take no token; a second later the slow tenant has one again.
    assert api.get("/v1/jobs", headers=key("slow")).status_code == 200
    clock.advance(1.0)
    conforms(responses.CreatedJob, api.post("/v1/jobs", json=JOB, headers=key("slow")), 201)
    problem(api.post("/v1/jobs", json=JOB, headers=key("slow")), 429, "rate-limited")


def test_a_tenants_own_active_jobs_cap_refuses_its_creates_only(api: TestClient) -> None:
    for _ in range(2):
        conforms(responses.CreatedJob, api.post("/v1/jobs", json=JOB, headers=key("small")),
                 201)
    refused = problem(api.post("/v1/jobs", json=JOB, headers=key("small")), 429,
                      "quota-exceeded")
    assert "2 active jobs" in refused["detail"]
    for _ in range(3):  # the defaults' cap (1000) for the others
        conforms(responses.CreatedJob, api.post("/v1/jobs", json=JOB, headers=key("big")), 201)


def feed(views: Views, *records: dict[str, Any]) -> None:
    for rec in records:
        batch = Batch(views)
        apply_execution(batch, rec, b"")
        batch.commit()


def of(tenant: str, rec: dict[str, Any]) -> dict[str, Any]:
    return {**rec, "envelope": {**rec["envelope"], "tenant": tenant}}


def test_stats_count_the_callers_running_and_queued_executions(api: TestClient,
                                                              views: Views) -> None:
    feed(views,
         of("big", execution("r1", "execution.started", "running")),
         of("big", execution("r2", "execution.queued", "queued", slot=2)),
         of("big", execution("r3", "execution.queued", "queued", slot=3)),
         of("big", execution("r3", "execution.started", "running", slot=3, at=1)),
         of("big", execution("r4", "execution.succeeded", "succeeded", slot=4)),
         of("big", execution("t1", "execution.started", "running", run_id="run-x",
                             task_id="a")),
         of("big", execution("t2", "execution.queued", "queued", run_id="run-x",
                             task_id="b")),
         of("small", execution("s1", "execution.started", "running", job_id="other")))
    body = conforms(responses.Stats, api.get("/v1/stats", headers=key("big")), 200)
    assert (body["tenant"], body["running"], body["queued"]) == ("big", 3, 2)
    assert body["runs_by_state"]["running"] == 2 and body["runs_by_state"]["queued"] == 1
    assert body["runs_by_state"]["succeeded"] == 1
    quotas = dataclasses.asdict(TenantQuotas(create_rate_per_s=1000.0, create_burst=2000,
                                             max_active_jobs=1000))
    assert body["quotas"] == {k: v for k, v in quotas.items() if k in RULES}
    small = conforms(responses.Stats, api.get("/v1/stats", headers=key("small")), 200)
    assert (small["running"], small["queued"], small["quotas"]["max_active_jobs"]) == (1, 0, 2)
    nobody = conforms(responses.Stats, api.get("/v1/stats", headers=key("fast")), 200)
    assert (nobody["running"], nobody["queued"]) == (0, 0)
