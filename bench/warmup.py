"""Warming the bench's broker before a measurement starts.

The bench starts a new broker for every run, and a new JVM compiles its hot paths while
the run is measured: over the first ~25 s of the broker's life its compiler threads used
0.43-0.46 of a core, then under 0.05 (measured from /proc during `kron bench api`). In a
30 s API window that was 45% of the broker's CPU (6.2 of 13.8 s), taken from the two
cores the floors are judged on. A production broker has run for days, so the bench
first drives a produce-and-fetch load of its own (acks=all, idempotent, small batches
over every partition, as the stack's clients send) until the compiler threads go quiet.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from bench.procfs import CLK_TCK, cpu_ticks, name_of
from kron.settings import Settings
from kron.topics import admin_client

TOPIC = "bench-warmup"
# Quiet: the compiler threads' share of a core over the last window.
QUIET_CORE = 0.05
WINDOW_S = 2.0
# Like the stack's own clients: a few thousand small records a second, many requests.
BATCH = 20
RATE_PER_S = 5000
VALUE = b"w" * 300


@dataclass(frozen=True, kw_only=True, slots=True)
class Warmup:
    seconds: float
    messages: int
    # The compiler threads' share of a core in the last window; None where /proc is not.
    jit_core_last: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"seconds": round(self.seconds, 1), "messages": self.messages,
                "jit_core_last": self.jit_core_last}


def compiler_cpu_s(pid: int, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds the JVM's JIT compiler threads have used, or None if unreadable."""
    ticks = 0
    try:
        for tid in os.listdir(proc / str(pid) / "task"):
            stat = (proc / str(pid) / "task" / tid / "stat").read_text()
            if "Compiler" in name_of(stat):
                ticks += cpu_ticks(stat)
    except (OSError, ValueError):
        return None
    return ticks / CLK_TCK


def warm(settings: Settings, *, broker_pid: int | None, max_s: float) -> Warmup:
    """Produce and fetch until the broker's compiler threads are quiet, at most `max_s`
    (without a broker pid to watch: for `max_s`)."""
    clock = time.monotonic
    admin = admin_client(settings)
    admin.create_topics([NewTopic(TOPIC, settings.partitions, 1)])[TOPIC].result(30)
    servers = {"bootstrap.servers": settings.bootstrap_servers, "log_level": 3}
    producer = Producer({**servers, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 1})
    consumer = Consumer({**servers, "group.id": f"bench-warmup-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(settings.partitions)])
    started = clock()
    window_at, jit_at = started, _jit(broker_pid)
    sent, last = 0, None
    try:
        while clock() - started < max_s:
            for i in range(BATCH):
                producer.produce(TOPIC, key=b"%d" % (sent + i), value=VALUE)
            sent += BATCH
            producer.poll(0)
            consumer.consume(BATCH, 0)
            time.sleep(max(0.0, started + sent / RATE_PER_S - clock()))
            if clock() - window_at >= WINDOW_S:
                now_jit = _jit(broker_pid)
                if now_jit is not None and jit_at is not None:
                    last = round((now_jit - jit_at) / (clock() - window_at), 3)
                    if last < QUIET_CORE:
                        break
                window_at, jit_at = clock(), now_jit
        producer.flush(30)
    finally:
        consumer.close()
    return Warmup(seconds=clock() - started, messages=sent, jit_core_last=last)


def _jit(pid: int | None) -> float | None:
    return None if pid is None else compiler_cpu_s(pid)
