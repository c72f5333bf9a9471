"""Shared helpers of the fault-injection suite: a gate that never delivers a first request, a
fleet of worker processes, a seeded load, the audit wrapper, the receiver-log judge and the
consumer-lag checker. The target is bench.receiver.Receiver (its /kill-* paths kill the
worker that called); the processes are kron.processes's.

Every process these helpers kill was started by the suite (a WorkerProcess's Popen, or a node
of a cluster the test started); nothing is looked up by name.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.receiver import Hit, KillEvent, Receiver, pid_of_peer
from kron.processes import WorkerProcess
from kron.settings import Settings
from replay.audit import AuditReport, audit
from replay.reader import read_topic
from streams.domain.fencing import EpochFence, epoch_of_headers
from tests.support.stack import Commands, spec, wait_until

JOB_STATE = "kron.state.JobState"
EXECUTION_STATE = "kron.executions.ExecutionState"
TERMINAL = frozenset({"succeeded", "failed", "skipped", "missed", "cancelled"})
SLOT_TRIGGERS = frozenset({"schedule", "misfire", "backfill"})


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def slot_of(hit: Hit) -> int:
    return int(datetime.fromisoformat(hit.headers["X-Kron-Scheduled-For"]).timestamp() * 1000)


# --- a gate in front of the receiver -------------------------------------------------------


class Gate:
    """A TCP front for the receiver that swallows the first connection (the request is never
    delivered: for the target it was never made) and SIGKILLs the process that opened it.
    Later connections are piped through to the receiver."""

    def __init__(self, upstream_port: int, killable: dict[int, str]) -> None:
        self.upstream = upstream_port
        self.killable = killable
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.armed = threading.Event()
        self.kills: list[KillEvent] = []
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> Gate:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        for s in self._held:
            with contextlib.suppress(OSError):
                s.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except OSError:
                return
            if self.armed.is_set():
                self.armed.clear()
                self._held.append(conn)
                pid = pid_of_peer(addr[1], self.sock.getsockname()[1], list(self.killable))
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    self.kills.append(KillEvent(point="before_http", pid=pid, key="",
                                                at_ms=now_ms()))
                continue
            threading.Thread(target=self._pipe, args=(conn,), daemon=True).start()

    def _pipe(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", self.upstream), timeout=30)
        except OSError:
            conn.close()
            return

        def copy(a: socket.socket, b: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := a.recv(65536):
                    b.sendall(data)
            with contextlib.suppress(OSError):
                b.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=copy, args=(up, conn), daemon=True)
        t.start()
        copy(conn, up)
        t.join(60)
        conn.close()
        up.close()


# --- worker fleet ----------------------------------------------------------------------------


class Fleet:
    """The workers of one scenario. Cleans up (SIGKILL by Popen pid) even on failure."""

    def __init__(self, settings: Settings, log_dir: Path,
                 receiver: Receiver | None = None, **env: str) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.receiver = receiver
        self.env = env
        self.workers: dict[str, WorkerProcess] = {}
        self.retired: list[WorkerProcess] = []

    def start(self, name: str, **env: str) -> WorkerProcess:
        old = self.workers.pop(name, None)
        if old is not None:
            old.kill()
            self.retired.append(old)
        w = WorkerProcess(self.settings, name, self.log_dir, env={**self.env, **env}).start()
        self.workers[name] = w
        if self.receiver is not None:
            self.receiver.killable[w.pid] = name
        return w

    def by_worker_id(self, worker_id: str) -> WorkerProcess:
        return self.workers[worker_id]

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers.values() if w.alive()]

    def logs(self, tail: int = 1500) -> str:
        return "\n".join(f"--- {n} ---\n{w.log()[-tail:]}" for n, w in self.workers.items())

    def close(self) -> None:
        for w in [*self.workers.values(), *self.retired]:
            w.kill()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def warm_up(commands: Commands, receiver: Receiver, fleet: Fleet, timeout_s: float = 90) -> None:
    """One job runs end to end: the group has formed and every table is recovered."""
    warm = f"warm-{uuid.uuid4().hex[:8]}"
    commands.send("CreateJob", warm, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                run_at_ms=now_ms()))
    assert receiver.wait_for(warm, 1, timeout_s), fleet.logs()


def wait_for_group(settings: Settings, members: int, timeout_s: float = 60) -> bool:
    """Until the engine's consumer group is stable with this many members."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers, "log_level": 2})

    def stable() -> bool:
        try:
            fut = admin.describe_consumer_groups([settings.app_id], request_timeout=5)
            desc = fut[settings.app_id].result(timeout=10)
        except Exception:
            return False
        return (str(desc.state).endswith("STABLE") and len(desc.members) == members
                and all(m.assignment.topic_partitions for m in desc.members))

    return bool(wait_until(stable, timeout_s, 0.5))


# --- load ---------------------------------------------------------------------------------------


@dataclass
class Load:
    """Jobs made by a seeded generator and the slots each must run."""

    expected: dict[str, list[int]] = field(default_factory=dict)  # job_id -> slot times
    max_attempts: dict[str, int] = field(default_factory=dict)
    created_at: dict[str, int] = field(default_factory=dict)

    @property
    def slots(self) -> int:
        return sum(len(v) for v in self.expected.values())

    def merge(self, other: Load) -> None:
        self.expected.update(other.expected)
        self.max_attempts.update(other.max_attempts)
        self.created_at.update(other.created_at)


def seeded_load(commands: Commands, url: str, seed: int, *, start_ms: int, end_ms: int,
                cron_jobs: int = 4, one_offs: int = 10, periods_s: tuple[int, ...] = (2, 3, 4),
                max_attempts: int = 3, lease_s: float = 4.0, prefix: str = "load",
                timeout_s: float = 5.0) -> Load:
    """Cron jobs with a seconds field bounded to [start_ms, end_ms] (so every slot is known)
    and one-off jobs at random times in that window. Slots are multiples of the period."""
    rng = random.Random(seed)
    load = Load()
    retry = {"max_attempts": max_attempts, "backoff": "exponential", "base_s": 0.2,
             "max_s": 1.0}
    start = start_ms - start_ms % 1000 + 500  # never on a slot boundary
    end = end_ms - end_ms % 1000 + 500
    sent_at = now_ms()
    for i in range(cron_jobs):
        period = rng.choice(periods_s)
        job_id = f"{prefix}-c{i}-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", job_id, now_ms=sent_at, spec=spec(
            target={"url": url, "timeout_s": timeout_s}, cron=f"*/{period} * * * * *",
            start_at_ms=start, end_at_ms=end, retry=retry, lease_s=lease_s))
        p = period * 1000
        first = start + (p - start % p) % p
        load.expected[job_id] = list(range(first, end + 1, p))
        load.max_attempts[job_id] = max_attempts
        load.created_at[job_id] = sent_at
    for i in range(one_offs):
        at = rng.randrange(start, end)
        job_id = f"{prefix}-o{i}-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", job_id, now_ms=sent_at, spec=spec(
            target={"url": url, "timeout_s": timeout_s}, run_at_ms=at, retry=retry,
            lease_s=lease_s))
        load.expected[job_id] = [at]
        load.max_attempts[job_id] = max_attempts
        load.created_at[job_id] = sent_at
    return load


# --- reading history ----------------------------------------------------------------------


def history(settings: Settings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(JobState records, ExecutionState records) in offset order."""
    bs = settings.bootstrap_servers
    jobs = [e.record for e in read_topic(bs, settings.topic("jobs"))
            if e.name == JOB_STATE and e.record]
    execs = [e.record for e in read_topic(bs, settings.topic("executions"))
             if e.name == EXECUTION_STATE and e.record]
    return jobs, execs


def latest(execs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rec in execs:
        out[rec["exec_id"]] = rec
    return out


def audit_history(settings: Settings, *, at_ms: int | None = None,
                  grace_ms: int = 10_000) -> AuditReport:
    jobs, execs = history(settings)
    return audit(jobs, execs, now_ms=at_ms or now_ms(), grace_ms=grace_ms)


def settled(settings: Settings, load: Load) -> bool:
    """Every expected slot has an execution record in a terminal state."""
    return not unsettled(settings, load)


def unsettled(settings: Settings, load: Load) -> list[tuple[str, int]]:
    """The expected slots without an execution record in a terminal state."""
    _, execs = history(settings)
    done = {(e["job_id"], e["scheduled_for_ms"]) for e in latest(execs).values()
            if e["state"] in TERMINAL and e["trigger"] in SLOT_TRIGGERS}
    return [(j, s) for j, slots in load.expected.items() for s in slots if (j, s) not in done]


def wait_settled(settings: Settings, load: Load, timeout_s: float) -> bool:
    return bool(wait_until(lambda: settled(settings, load), timeout_s, 1.0))


# --- judging ----------------------------------------------------------------------------------


@dataclass
class Verdict:
    lost: list[tuple[str, int]] = field(default_factory=list)
    duplicates: list[tuple[str, int]] = field(default_factory=list)
    over_policy: list[str] = field(default_factory=list)
    not_succeeded: list[tuple[str, int, str]] = field(default_factory=list)
    same_attempt_repeats: int = 0  # one key, one attempt number, called twice
    same_attempt: list[tuple[str, int]] = field(default_factory=list)  # the slots of those
    repeated_calls: int = 0  # calls beyond the first per key (at least once: same key)
    max_lateness_ms: int = 0
    p99_lateness_ms: int = 0
    slots: int = 0
    calls: int = 0
    keys: int = 0  # distinct Idempotency-Keys among the calls
    audit: AuditReport | None = None

    @property
    def attempts_ok(self) -> bool:
        return not self.over_policy

    def summary(self) -> dict[str, Any]:
        a = self.audit.counts if self.audit else {}
        return {"slots": self.slots, "calls": self.calls, "keys": self.keys,
                "lost": self.lost[:5], "duplicates": self.duplicates[:5],
                "same_attempt": self.same_attempt[:5], "over_policy": self.over_policy[:5],
                "not_succeeded": self.not_succeeded[:5], "audit": a,
                "audit_violations": [v.detail for v in (self.audit.violations if self.audit
                                                        else ())][:5],
                "repeated_calls": self.repeated_calls,
                "same_attempt_repeats": self.same_attempt_repeats,
                "max_lateness_ms": self.max_lateness_ms}


def judge(settings: Settings, receiver: Receiver, load: Load, *,
          require_success: bool = True, audit_grace_ms: int = 10_000) -> Verdict:
    """Receiver log + recorded history + the replay audit against the expected slots.

    lost:        an expected slot without a 2xx at the receiver (or, with require_success
                 False, without a terminal record), or one the audit calls lost
    duplicates:  one (job, slot) reached the receiver under two Idempotency-Keys, or the
                 audit found a duplicate trigger
    over_policy: a key called with X-Kron-Attempt above the job's max_attempts (the load's,
                 else the retry policy of the job's latest state in kron.jobs), or the audit
                 found attempts over the policy
    same_attempt: one Idempotency-Key called twice with one X-Kron-Attempt (counted in
                 same_attempt_repeats; not in duplicates, which a caller may add them to)
    """
    v = Verdict()
    jobs, execs = history(settings)
    v.audit = audit(jobs, execs, now_ms=now_ms(), grace_ms=audit_grace_ms)
    final = latest(execs)
    policy = {j["job_id"]: j["spec"]["retry"]["max_attempts"] for j in jobs
              if j["job_id"] in load.expected and (j.get("spec") or {}).get("retry")}
    by_slot: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in final.values():
        if e["trigger"] in SLOT_TRIGGERS:
            by_slot[(e["job_id"], e["scheduled_for_ms"])].append(e)
    keys, ok_at = _count_calls(v, receiver, load, policy)
    lateness = _judge_expected(v, load, by_slot, keys, ok_at, require_success=require_success)
    _add_audit(v, load)
    if lateness:
        lateness.sort()
        v.max_lateness_ms = lateness[-1]
        v.p99_lateness_ms = lateness[min(len(lateness) - 1, int(len(lateness) * 0.99))]
    return v


def _count_calls(v: Verdict, receiver: Receiver, load: Load, policy: dict[str, int]
                 ) -> tuple[dict[tuple[str, int], set[str]], dict[tuple[str, int], int]]:
    """The receiver's calls of the load's jobs: keys per slot, the first 2xx per slot, and
    into the verdict the call counts, repeats per key and per (key, attempt), and attempts
    over the policy."""
    hits = [h for h in list(receiver.hits) if h.headers.get("X-Kron-Job-Id") in load.expected]
    v.calls = len(hits)
    keys: dict[tuple[str, int], set[str]] = defaultdict(set)
    ok_at: dict[tuple[str, int], int] = {}
    per_key_attempt: dict[tuple[str, str], int] = defaultdict(int)
    slot_of_key: dict[str, tuple[str, int]] = {}
    per_key: dict[str, int] = defaultdict(int)
    for h in hits:
        job = h.headers["X-Kron-Job-Id"]
        slot = slot_of(h)
        key = h.headers["Idempotency-Key"]
        keys[(job, slot)].add(key)
        slot_of_key[key] = (job, slot)
        per_key[key] += 1
        per_key_attempt[(key, h.headers.get("X-Kron-Attempt", ""))] += 1
        allowed = load.max_attempts.get(job) or policy.get(job) or 10**6
        if int(h.headers.get("X-Kron-Attempt", "0")) > allowed:
            v.over_policy.append(f"{job}@{slot}: attempt {h.headers.get('X-Kron-Attempt')}")
        if 200 <= h.status < 300:
            ok_at[(job, slot)] = min(ok_at.get((job, slot), h.received_ms), h.received_ms)
    for (job, slot), ks in keys.items():
        if len(ks) > 1:
            print(f"{job}@{slot} called with keys {sorted(ks)}")  # shown when a test fails
    v.keys = len(per_key)
    v.repeated_calls = sum(n - 1 for n in per_key.values())
    v.same_attempt_repeats = sum(n - 1 for n in per_key_attempt.values())
    for (key, attempt), n in per_key_attempt.items():
        if n > 1:
            print(f"{slot_of_key[key]} key {key} attempt {attempt} called {n} times")
            if slot_of_key[key] not in v.same_attempt:
                v.same_attempt.append(slot_of_key[key])
    return keys, ok_at


def _judge_expected(v: Verdict, load: Load,
                    by_slot: dict[tuple[str, int], list[dict[str, Any]]],
                    keys: dict[tuple[str, int], set[str]], ok_at: dict[tuple[str, int], int],
                    *, require_success: bool) -> list[int]:
    """Each expected slot: lost, not succeeded, duplicated; returns the lateness of each
    slot's first 2xx."""
    lateness: list[int] = []
    for job, slots in load.expected.items():
        for s in slots:
            v.slots += 1
            recs = by_slot.get((job, s), [])
            if require_success:
                if (job, s) not in ok_at:
                    v.lost.append((job, s))
                else:
                    lateness.append(ok_at[(job, s)] - s)
            elif not any(r["state"] in TERMINAL for r in recs):
                v.lost.append((job, s))
            v.not_succeeded.extend((job, s, r["state"]) for r in recs
                                   if r["state"] != "succeeded")
            if len(recs) > 1:
                print(f"{job}@{s} has executions "
                      f"{[(r['exec_id'], r['trigger'], r['state']) for r in recs]}")
            if len(recs) > 1 or len(keys.get((job, s), ())) > 1:
                v.duplicates.append((job, s))
    return lateness


def _add_audit(v: Verdict, load: Load) -> None:
    """The audit's findings on the load's jobs, folded into the verdict."""
    assert v.audit is not None
    mine = [x for x in v.audit.violations if x.job_id in load.expected]
    for x in mine:
        print(f"audit: {x.kind} {x.job_id}@{x.scheduled_for_ms} {x.exec_id}: {x.detail}")
    for x in mine:
        if x.kind == "lost_slot" and (x.job_id, x.scheduled_for_ms) not in v.lost:
            v.lost.append((x.job_id, x.scheduled_for_ms or 0))
        elif x.kind == "duplicate_trigger" and (x.job_id, x.scheduled_for_ms) not in \
                v.duplicates:
            v.duplicates.append((x.job_id, x.scheduled_for_ms or 0))
        elif x.kind == "attempts_over_policy":
            v.over_policy.append(f"audit: {x.detail}")


def audit_problems(report: AuditReport, jobs: set[str] | None = None) -> list[str]:
    """Violations of the kinds that are never acceptable (restricted to `jobs` if given)."""
    return [f"{x.kind}: {x.job_id} {x.detail}" for x in report.violations
            if jobs is None or x.job_id in jobs]


class Tail:
    """Follows a topic from its current end, decoding records (to react within ms)."""

    def __init__(self, settings: Settings, topic_name: str) -> None:
        from schemas import codec

        self._codec = codec
        topic = settings.topic(topic_name)
        self.c = Consumer({"bootstrap.servers": settings.bootstrap_servers,
                           "group.id": f"fault-tail-{uuid.uuid4().hex}",
                           "enable.auto.commit": False, "log_level": 2,
                           "fetch.wait.max.ms": 10})
        md = self.c.list_topics(topic, timeout=10)
        tps = []
        for p in sorted(md.topics[topic].partitions):
            _low, high = self.c.get_watermark_offsets(TopicPartition(topic, p), 10)
            tps.append(TopicPartition(topic, p, high))
        self.c.assign(tps)

    def wait(self, predicate: Callable[[dict[str, Any]], bool],
             timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = self.c.poll(0.05)
            if msg is None or msg.error() or msg.value() is None:
                continue
            try:
                rec = self._codec.decode(msg.value()).record
            except Exception:
                continue
            if predicate(rec):
                return rec
        return None

    def close(self) -> None:
        self.c.close()


# --- consumer lag -----------------------------------------------------------------------------


def group_lag(settings: Settings, topic_name: str, group: str | None = None) -> dict[int, int]:
    """partition -> high watermark minus the engine group's committed offset."""
    topic = settings.topic(topic_name)
    c = Consumer({"bootstrap.servers": settings.bootstrap_servers,
                  "group.id": group or settings.app_id, "enable.auto.commit": False,
                  "log_level": 2})
    try:
        md = c.list_topics(topic, timeout=10)
        parts = sorted(md.topics[topic].partitions)
        committed = c.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        out: dict[int, int] = {}
        for tp in committed:
            _low, high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), 10)
            done = tp.offset if tp.offset >= 0 else 0
            out[tp.partition] = max(0, high - done)
        return out
    finally:
        c.close()


# --- worker logs ------------------------------------------------------------------------------


REBALANCE_MARKERS = ("rebalanc", "Assigned partitions", "revoke", "MemberIdRequired",
                     "heartbeat failed", "session timeout", "left the group")


def rebalance_lines(log: str, since_line: int = 0) -> list[str]:
    lines = log.splitlines()[since_line:]
    return [ln for ln in lines if any(m.lower() in ln.lower() for m in REBALANCE_MARKERS)]


@contextlib.contextmanager
def dead_port() -> Iterator[int]:
    """A loopback port with nothing listening (connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    yield port


# --- a proxy that loses answers ---------------------------------------------------------------


@dataclass
class Withheld:
    status: int
    body: bytes
    at_ms: int


class AnswerEatingProxy:
    """A loopback TCP proxy in front of `upstream_port` that forwards every request and never
    forwards an answer: it reads the upstream's response (kept in `withheld`), then holds the
    client's connection open, silent, until the client gives up and closes it. So the server
    did the work and answered, and the client only sees its own timeout: the response was
    lost after the fact, which is what an idempotent retry must survive.

    One request per connection (a client that timed out does not reuse the connection)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.withheld: list[Withheld] = []
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
                with self._lock:
                    self._socks += [client, upstream]
                threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
                threading.Thread(target=self._swallow, args=(upstream,), daemon=True).start()

    @staticmethod
    def _pump(client: socket.socket, upstream: socket.socket) -> None:
        """Client -> upstream until the client closes; then the upstream side goes too."""
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                upstream.sendall(data)
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _swallow(self, upstream: socket.socket) -> None:
        """Read one whole response (head + Content-Length body) and keep it, unsent."""
        buf = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in buf or len(buf) < self._length(buf):
                data = upstream.recv(65536)
                if not data:
                    break
                buf += data
        if b"\r\n\r\n" in buf:
            head, body = buf.split(b"\r\n\r\n", 1)
            with self._lock:
                self.withheld.append(Withheld(status=int(head.split(b" ", 2)[1]), body=body,
                                              at_ms=now_ms()))

    @staticmethod
    def _length(buf: bytes) -> int:
        head = buf.split(b"\r\n\r\n", 1)[0]
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                return len(head) + 4 + int(value)
        return len(buf)  # no length: whatever has come is the response

    def close(self) -> None:
        with self._lock:
            socks, self._socks = [self._listener, *self._socks], []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def __enter__(self) -> AnswerEatingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def explain_slots(settings: Settings, slots: list[tuple[str, int]], limit: int = 3) -> str:
    """What the state topics hold for a few (job, slot) pairs, raw and in log order, with
    each write's epoch and whether a fresh fence admits it: the evidence a failed
    duplicate, lost-slot or never-settled check needs. Matches keys or values that name the
    job or the slot's exec_id (lease timers name only the exec_id)."""
    from replay.reader import _consumer
    from streams.domain.ids import exec_id

    if not slots:
        return ""  # nothing to explain: no topic reads on a passing run
    wanted = sorted({job for job, _ in slots[:limit]})
    needles = [j.encode() for j in wanted] + [
        exec_id(j, s).encode() for j, s in slots[:limit]]
    lines: list[str] = [f"explaining {slots[:limit]}"]
    for name in ("jobs", "executions", "timers"):
        topic = settings.topic(name)
        consumer = _consumer(settings.bootstrap_servers)
        fence = EpochFence()
        try:
            parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
            ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
                    for p in parts}
            ends = {p: e for p, e in ends.items() if e > 0}
            consumer.assign([TopicPartition(topic, p, 0) for p in ends])
            while ends:
                msg = consumer.poll(10)
                if msg is None:
                    break
                if msg.error():
                    continue
                p, off = msg.partition(), msg.offset()
                if off + 1 >= ends.get(p, 0):
                    ends.pop(p, None)
                epoch = epoch_of_headers(msg.headers())
                admitted = fence.admit(p, epoch, msg.timestamp()[1])
                key, value = msg.key() or b"", msg.value()
                if not any(n in key or (value is not None and n in value) for n in needles):
                    continue
                lines.append(_explain_line(name, p, off, msg.timestamp()[1], epoch, admitted,
                                           key, value))
        finally:
            consumer.close()
    text = "\n".join(lines)
    print(text)  # shown in full under "Captured stdout" when the test fails
    return text


def _explain_line(name: str, p: int, off: int, ts: int, epoch: int | None, admitted: bool,
                  key: bytes, value: bytes | None) -> str:
    from schemas import codec

    head = f"{name}[{p}]@{off} t={ts} epoch={epoch}{'' if admitted else ' FENCED'}"
    if value is None:
        return f"{head} key={key!r} TOMBSTONE"
    if name == "timers":
        from streams.domain.timer import decode_timer_key
        try:
            tk = decode_timer_key(key)
        except ValueError:
            return f"{head} key={key!r} value={value!r}"
        return (f"{head} due={tk.due_ms} lane={tk.lane.tier}/{tk.lane.tenant} "
                f"{tk.kind.name} job={tk.job_id!r} ref={tk.ref!r} value={value!r}")
    try:
        rec = codec.decode(value).record
    except Exception as exc:  # a diagnostic: show what is there
        return f"{head} key={key!r} undecodable {exc!r}"
    env = rec.get("envelope") or {}
    return (f"{head} {rec.get('job_id')} {env.get('event_type')} by={env.get('causation_id')} "
            f"state={rec.get('state')} status={rec.get('status')} "
            f"next={rec.get('next_run_at_ms')} slot={rec.get('scheduled_for_ms')} "
            f"attempt={rec.get('attempt')} worker={rec.get('worker')}")
