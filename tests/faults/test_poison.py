"""Poison records on kron.commands from "other services": each is dead-lettered with its
topic, partition and offset, the engine group's lag on kron.commands returns to 0, and the
valid commands produced behind them on the same partition still run."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from replay.reader import read_topic
from schemas import codec
from tests.conftest import fresh_settings
from tests.faults.support import (
    Fleet,
    group_lag,
    judge,
    now_ms,
    seeded_load,
    wait_for_group,
    wait_settled,
    wait_until,
    warm_up,
)
from tests.support.stack import Commands, spec

pytestmark = pytest.mark.integration


def test_poison_is_dead_lettered_lag_returns_to_zero_and_valid_commands_run(
        kafka_cluster, tmp_path, fault_receiver, reliability) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0)
    commands = Commands(settings)
    with Fleet(settings, tmp_path, fault_receiver) as fleet:
        fleet.start("w1")
        fleet.start("w2")
        warm_up(commands, fault_receiver, fleet)
        assert wait_for_group(settings, 2), fleet.logs()
        tag = uuid.uuid4().hex[:8]
        good = f"poison-ok-{tag}"
        owned = f"poison-owned-{tag}"
        url = f"{fault_receiver.url}/ok"
        # A job of tenant acme that another tenant's command will try to touch.
        commands.send("CreateJob", owned, spec=spec(target={"url": url},
                                                     run_at_ms=now_ms() + 3_600_000))
        valid = encode_create(good, url)
        poison: dict[str, tuple[bytes, str]] = {
            "garbage bytes": (b"\x00\xffnot avro at all", "decode"),
            "unknown fingerprint": (bytes.fromhex("c301") + b"\x13\x37" * 4 + valid[10:],
                                    "decode"),
            "truncated avro": (valid[: len(valid) // 2], "decode"),
        }
        producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "acks": "all",
                             "partitioner": "murmur2_random"})
        where: dict[str, tuple[int, int]] = {}

        def produce(label: str, key: str, value: bytes) -> None:
            def done(err, msg) -> None:
                assert err is None, err
                where[label] = (msg.partition(), msg.offset())
            producer.produce(settings.topic("commands"), key=key.encode(), value=value,
                             on_delivery=done)
            producer.flush(10)

        for label, (value, _cls) in poison.items():
            produce(label, good, value)  # same key: same partition as the valid create
        # Well-formed but invalid commands, as another service would produce them.
        produce("unknown job", good, encode_cmd("PauseJob", f"nope-{tag}"))
        produce("year-10000 run_at", good, encode_create(
            f"far-{tag}", url, run_at_ms=253_402_300_800_000 + 1))
        produce("tenant mismatch", owned, encode_cmd("PauseJob", owned, tenant="globex"))
        for label in ("unknown job", "year-10000 run_at", "tenant mismatch"):
            poison[label] = (b"", "validation")
        # Valid work behind the poison: one create on the poisoned partition, and a load.
        produce("valid", good, valid)
        start = now_ms() + 2000
        load = seeded_load(commands, url, seed=8, start_ms=start, end_ms=start + 8000,
                           cron_jobs=2, one_offs=6, prefix=f"poison-{tag}")
        load.expected[good] = [VALID_AT[good]]
        load.max_attempts[good] = 3
        settled = wait_settled(settings, load, 60)

        def letters() -> dict[tuple[int, int], dict]:
            return {(e.record["source_partition"], e.record["source_offset"]): e.record
                    for e in read_topic(settings.bootstrap_servers,
                                        settings.topic("dead-letters"))
                    if e.record and e.record.get("source_topic") == settings.topic("commands")}

        want = {where[label] for label in poison}
        found = wait_until(lambda: want <= set(letters()) and letters(), 30) or {}
        lag = wait_until(lambda: (lag := group_lag(settings, "commands"))
                         and not any(lag.values()) and lag, 30) or group_lag(settings,
                                                                             "commands")
        verdict = judge(settings, fault_receiver, load)
        missing = sorted(label for label in poison if where[label] not in found)
        reliability.record(
            scenario="poison records on kron.commands", injected=f"{len(poison)} poison records "
            "(garbage, unknown fingerprint, truncated, unknown job, year 10000, tenant mismatch)",
            lost=len(verdict.lost), duplicates=len(verdict.duplicates),
            max_lateness_ms=verdict.max_lateness_ms, attempts_ok=verdict.attempts_ok,
            notes=f"{len(want) - len(missing)}/{len(want)} dead-lettered with topic/partition/"
                  f"offset; final commands lag {sum(lag.values())}")
        assert settled, fleet.logs()
        assert not missing, (missing, where, sorted(found))
        for label, (_v, cls) in poison.items():
            letter = found[where[label]]
            assert letter["source_topic"] == settings.topic("commands")
            assert letter["error"], label
            assert letter["error_class"] == cls, (label, letter["error"])
        assert not any(lag.values()), f"engine group lag on commands: {lag}"
        assert not verdict.lost and not verdict.duplicates, verdict.summary()
        assert verdict.attempts_ok, verdict.summary()
        # The valid create produced right behind the poison on the same partition ran.
        assert where["valid"][0] == where["garbage bytes"][0]
        assert fault_receiver.hits_for(good)
    commands.close()


VALID_AT: dict[str, int] = {}


def envelope(kind: str, tenant: str = "acme") -> dict:
    cid = uuid.uuid4().hex
    return {"event_id": cid, "event_type": f"job.{kind.removesuffix('Job').lower()}_requested",
            "schema_version": 1, "occurred_at_ms": now_ms(), "tenant": tenant,
            "causation_id": None, "correlation_id": None, "producer": "other-service"}


def encode_cmd(kind: str, job_id: str, tenant: str = "acme", **fields) -> bytes:
    env = envelope(kind, tenant)
    return codec.encode(f"kron.commands.{kind}", {"envelope": env, "command_id": env["event_id"],
                                                  "job_id": job_id, **fields})


def encode_create(job_id: str, url: str, run_at_ms: int | None = None) -> bytes:
    at = run_at_ms if run_at_ms is not None else now_ms() + 1000
    VALID_AT.setdefault(job_id, at)
    return encode_cmd("CreateJob", job_id, idempotency_key=None,
                      spec=spec(target={"url": url}, run_at_ms=at))
