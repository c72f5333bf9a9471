"""streams.domain.topics: which Kafka topics a tenant's jobs may publish to, and the two places
it is enforced without a broker (the API's spec builder and the worker's Kafka runner)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import ValidationError

from api import models
from kron.settings import Settings
from streams.domain.errors import PermanentError
from streams.domain.retry import ErrorClass
from streams.domain.topics import TopicGrants, is_valid_topic
from streams.targets import AttemptInfo, KafkaRunner

NAME = st.text("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_-", min_size=1, max_size=12)
TAIL = st.text("abcxyz0123456789._-", min_size=1, max_size=20)
NONE = TopicGrants(own_prefix="kron")


def refusal(grants: TopicGrants, tenant: str, topic: str) -> PermanentError:
    with pytest.raises(PermanentError) as info:
        grants.check(tenant, topic)
    assert info.value.field == "target.topic"
    return info.value


# --- the rules, as properties -----------------------------------------------------------------


@given(tenant=NAME, tail=TAIL)
def test_a_tenant_may_publish_to_its_own_topics(tenant: str, tail: str) -> None:
    assume(tenant != "kron" and not tenant.startswith(("__", "kron-")))
    NONE.check(tenant, f"{tenant}.{tail}")


@given(tenant=NAME, other=NAME, tail=TAIL)
def test_another_tenants_topics_are_refused(tenant: str, other: str, tail: str) -> None:
    assume(not f"{other}.{tail}".startswith(f"{tenant}."))
    assume(not NONE.reserved(f"{other}.{tail}"))  # refused for that reason: see below
    error = refusal(NONE, tenant, f"{other}.{tail}")
    # The message says what the tenant may use and how an operator grants more.
    assert f"'{tenant}.<anything>'" in error.message
    assert "KRON_KAFKA_TARGET_TOPICS" in error.message


@given(prefix=NAME, tenant=NAME, sep=st.sampled_from([".", "-"]), tail=TAIL)
def test_krons_own_topics_are_refused_even_when_granted(prefix: str, tenant: str, sep: str,
                                                        tail: str) -> None:
    topic = f"{prefix}{sep}{tail}"
    grants = TopicGrants.parse(f"{tenant}={prefix}.*|{topic}|{prefix}{sep}{tail[:1]}.*",
                               own_prefix=prefix)
    assert "internal topic" in refusal(grants, tenant, topic).message
    # A tenant named like kron's prefix has no namespace of its own either.
    refusal(grants, prefix, f"{prefix}.{tail}")


@given(tenant=NAME, tail=TAIL)
def test_kafkas_internal_topics_are_refused_even_when_granted(tenant: str, tail: str) -> None:
    grants = TopicGrants.parse(f"{tenant}=__{tail}|__x.*", own_prefix="kron")
    refusal(grants, tenant, f"__{tail}")
    refusal(grants, tenant, "__x.y")
    refusal(grants, tenant, "__consumer_offsets")


@given(tenant=NAME, stem=NAME, tail=TAIL)
def test_a_prefix_grant_allows_the_names_under_it_and_only_those(tenant: str, stem: str,
                                                                   tail: str) -> None:
    topic = f"shared.{stem}"
    assume(not topic.startswith(f"{tenant}."))
    grants = TopicGrants.parse(f"{tenant}=shared.{stem}.*", own_prefix="kron")
    grants.check(tenant, f"{topic}.{tail}")
    refusal(grants, tenant, topic)  # the prefix is "shared.<stem>.", the stem alone is not in
    refusal(grants, tenant, f"{topic}x{tail}")  # nor a longer stem
    refusal(grants, f"{tenant}x", f"{topic}.{tail}")  # nor another tenant


@given(tenant=NAME, topic=TAIL)
def test_an_exact_grant_allows_that_topic_only(tenant: str, topic: str) -> None:
    topic = f"exact{topic}"
    assume(is_valid_topic(topic) and not topic.startswith((f"{tenant}.", f"{tenant}x.")))
    grants = TopicGrants.parse(f"{tenant}={topic}", own_prefix="kron")
    grants.check(tenant, topic)
    refusal(grants, tenant, f"{topic}x")
    refusal(grants, tenant, f"{topic}.x")
    refusal(grants, f"{tenant}x", topic)


def test_the_message_lists_the_tenants_grants() -> None:
    grants = TopicGrants.parse("acme=shared.*|audit-log", own_prefix="kron")
    message = refusal(grants, "acme", "globex.events").message
    assert message == (
        "target.topic 'globex.events' is not a topic tenant 'acme' may publish to: a tenant's "
        "Kafka targets are its own topics, named 'acme.<anything>', and 'shared.*', "
        "'audit-log' granted to it. An operator can grant more with "
        "KRON_KAFKA_TARGET_TOPICS=\"acme=<prefix>.*|<topic>\"")


@pytest.mark.parametrize("topic", ["", ".", "..", "a b", "x" * 250, "acme.é"])
def test_invalid_names_are_refused(topic: str) -> None:
    assert "not a valid Kafka topic name" in refusal(NONE, "acme", topic).message


def test_no_tenant_has_no_namespace() -> None:
    refusal(NONE, "", ".x")


# --- parsing ----------------------------------------------------------------------------------


def test_parse() -> None:
    grants = TopicGrants.parse(" acme = shared.* | audit-log ,globex=p.globex.*,acme=z.*,",
                               own_prefix="prod")
    assert grants.own_prefix == "prod"
    assert dict(grants.grants) == {"acme": ("shared.*", "audit-log", "z.*"),
                                   "globex": ("p.globex.*",)}
    assert grants.patterns_for("acme") == ("acme.*", "shared.*", "audit-log", "z.*")
    assert grants.patterns_for("initech") == ("initech.*",)
    assert TopicGrants.parse("", own_prefix="kron").grants == {}


@pytest.mark.parametrize(("raw", "entry"), [
    ("acme", "'acme'"),
    ("=x.*", "'=x.*'"),
    ("acme=", "'acme='"),
    ("acme=x.*|", "'acme=x.*|'"),
    ("acme=x.*,globex=*", "'globex=*'"),
    ("acme=x*", "'acme=x*'"),
    ("acme=.*", "'acme=.*'"),
    ("acme=a b", "'acme=a b'"),
    ("acme=x.*.*", "'acme=x.*.*'"),
])
def test_a_malformed_entry_is_named(raw: str, entry: str) -> None:
    with pytest.raises(ValueError, match="KRON_KAFKA_TARGET_TOPICS entry") as info:
        TopicGrants.parse(raw, own_prefix="kron")
    assert entry in str(info.value)


def test_settings_parse_the_grants_at_start() -> None:
    s = Settings(kafka_target_topics="acme=shared.*", topic_prefix="prod")
    assert s.topic_grants == TopicGrants.parse("acme=shared.*", own_prefix="prod")
    with pytest.raises(ValidationError, match="entry 'globex=bad name'"):
        Settings(kafka_target_topics="acme=shared.*,globex=bad name")


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRON_KAFKA_TARGET_TOPICS", "acme=audit-log")
    Settings().topic_grants.check("acme", "audit-log")


# --- the API's spec builder -------------------------------------------------------------------


def _spec(topic: str, tenant: str | None, grants: TopicGrants | None) -> dict[str, Any]:
    req = models.parse_request({"schedule": "0 2 * * *", "target": {"topic": topic}})
    return models.build_spec(req, now_ms=1_780_000_000_000, allow_private=False,
                             tenant=tenant, topic_grants=grants)


def test_build_spec_checks_the_tenants_topics() -> None:
    grants = TopicGrants.parse("acme=shared.*", own_prefix="kron")
    assert _spec("acme.reports", "acme", grants)["target"][1]["topic"] == "acme.reports"
    assert _spec("shared.reports", "acme", grants)["target"][1]["topic"] == "shared.reports"
    with pytest.raises(models.InvalidField) as info:
        _spec("shared.reports", "globex", grants)
    assert info.value.field == "target.topic"
    assert "'globex.<anything>'" in info.value.message


def test_merge_patch_checks_a_new_topic() -> None:
    grants = TopicGrants(own_prefix="kron")
    spec = _spec("acme.a", "acme", grants)
    patch = models.parse_patch({"target": {"topic": "globex.a"}})
    with pytest.raises(models.InvalidField) as info:
        models.merge_patch(spec, patch, now_ms=1_780_000_000_000, allow_private=False,
                           tenant="acme", topic_grants=grants)
    assert info.value.field == "target.topic"
    ok = models.merge_patch(spec, models.parse_patch({"target": {"topic": "acme.b"}}),
                            now_ms=1_780_000_000_000, allow_private=False, tenant="acme",
                            topic_grants=grants)
    assert ok["target"][1]["topic"] == "acme.b"


# --- the worker's Kafka runner ----------------------------------------------------------------


def _info(tenant: str) -> AttemptInfo:
    return AttemptInfo(exec_id="e1", job_id="j1", tenant=tenant,
                       scheduled_for_iso="2026-01-01T00:00:00Z", attempt=1, fencing_token=1,
                       now_ms=0)


def test_the_runner_refuses_a_topic_outside_the_tenants_and_publishes_nothing() -> None:
    sent: list[tuple[Any, ...]] = []

    async def send(*args: Any) -> None:
        sent.append(args)

    runner = KafkaRunner(send, TopicGrants.parse("acme=shared.*", own_prefix="kron"))
    target = {"topic": "globex.events", "key": None, "value": b"v", "headers": {}}
    out = asyncio.run(runner.run(target, _info("acme")))
    assert not out.ok and out.error_class is ErrorClass.PERMANENT
    assert out.error.startswith("publish refused: target.topic 'globex.events' is not a topic")
    out = asyncio.run(runner.run({**target, "topic": "kron.commands"}, _info("acme")))
    assert out.error_class is ErrorClass.PERMANENT and "internal topic" in out.error
    assert sent == []
    for topic in ("acme.events", "shared.events"):
        assert asyncio.run(runner.run({**target, "topic": topic}, _info("acme"))).ok
    assert [s[0] for s in sent] == ["acme.events", "shared.events"]
