"""The stack a bench runs against: a broker on free ports, `kron worker`s, optionally the API.

Everything lives under `.kron/bench-<pid>/` and is stopped and deleted on the way out,
including on Ctrl-C and on errors (`Stack` is a context manager; tear-down ignores a second
Ctrl-C so it can finish). Workers and the API run in their own sessions so a terminal's
Ctrl-C reaches only the bench, which then stops them in order: API, workers, broker.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from bench.hostspeed import HostSpeed
from bench.jobs import CommandSink, http_target, job_spec
from bench.procfs import CLK_TCK, cpu_ticks, reaped_children_ticks, state_of
from bench.receiver import Receiver
from bench.report import log
from bench.results import create_probe_us, speed_probe_ms
from bench.warmup import Warmup, warm
from kron import localkafka
from kron.errors import SetupError
from kron.processes import (
    ApiProcess,
    KronProcess,
    WorkerProcess,
    clean_environ,
    stop_all,
)
from kron.settings import Settings
from kron.topics import admin_client, create_topics
from replay.audit import AuditReport, audit
from replay.reader import Entry, read_topic

REPO = localkafka.REPO_ROOT
# kron's own topics (kron.*), apart from the bench tenant's: its Kafka target is bench.*.
PREFIX = "kron"
JOB_STATE = "kron.state.JobState"
EXECUTION_STATE = "kron.executions.ExecutionState"
SAMPLE_S = 0.5


# --- sampling -------------------------------------------------------------------------------


@dataclass(slots=True)
class Usage:
    """One process name's RSS peak and CPU, its child processes included; a restarted
    process keeps adding to its name."""

    pid: int
    peak_kb: int = 0
    last_kb: int = 0
    cpu_done: int = 0  # ticks of earlier pids under this name
    cpu_now: int = 0  # ticks of the current pid
    cpu_base: int = 0  # ticks at the last mark()

    @property
    def cpu_s(self) -> float:
        return (self.cpu_done + self.cpu_now - self.cpu_base) / CLK_TCK


@dataclass(slots=True)
class Loop:
    """A process's main thread, where a worker's event loop and agents run, through the
    load window: its CPU ticks at the window's first and latest samples. One thread
    bounds a worker, so its busy share says whether the worker was saturated; the
    process's CPU does not (librdkafka's and RocksDB's threads add to it)."""

    pid: int
    first_ticks: int
    first_t: float
    last_ticks: int
    last_t: float

    def busy(self) -> float | None:
        """CPU seconds per second of the window: 1.0 is a saturated thread."""
        span = self.last_t - self.first_t
        if span <= 0:
            return None
        return round((self.last_ticks - self.first_ticks) / CLK_TCK / span, 2)


def main_thread_ticks(pid: int) -> int | None:
    """utime+stime ticks of a process's main thread (the task whose id is the pid); None
    once it has exited, reaped or not (a zombie's stat stays readable, its ticks frozen)."""
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except OSError:
        return None
    return None if state_of(stat) in ("Z", "X") else cpu_ticks(stat)


def read_proc(pid: int) -> tuple[int, int] | None:
    """(VmRSS kB, CPU ticks) of a live process and its child processes (a worker's
    changelog writer is part of the worker), from /proc. The CPU is the process's, its
    children's that it waited for, and its unwaited children's (live or zombie)."""
    got = _rss_and_ticks(pid)
    if got is None:
        return None
    rss, ticks, stat = got
    ticks += reaped_children_ticks(stat)
    for child in children_of(pid):
        if (more := _rss_and_ticks(child)) is not None:
            rss, ticks = rss + more[0], ticks + more[1]
    return rss, ticks


def _rss_and_ticks(pid: int) -> tuple[int, int, str] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rss = next((int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmRSS:")), 0)  # a zombie has none
    return rss, cpu_ticks(stat), stat


def children_of(pid: int) -> list[int]:
    """The child processes of a process's main thread (the ones it started)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Sampler:
    """Samples /proc every 0.5 s in a thread; peak RSS and CPU seconds per process name,
    and each process's main-thread busy share through the load window (mark to
    mark_end). A process started or restarted inside the window is not in that share."""

    def __init__(self, *, main_ticks: Callable[[int], int | None] = main_thread_ticks,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.usage: dict[str, Usage] = {}
        self.loops: dict[str, Loop] = {}
        self._window_open = False
        self._main_ticks = main_ticks
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def track(self, name: str, pid: int) -> None:
        with self._lock:
            u = self.usage.get(name)
            if u is None:
                self.usage[name] = Usage(pid=pid)
            elif u.pid != pid:
                u.cpu_done += u.cpu_now
                u.cpu_now, u.pid = 0, pid
        self.sample()

    def sample(self) -> None:
        with self._lock:
            for u in self.usage.values():
                got = read_proc(u.pid)
                if got is not None:
                    u.last_kb, u.cpu_now = got
                    u.peak_kb = max(u.peak_kb, got[0])
            if self._window_open:
                self._sample_loops(start=False)

    def _sample_loops(self, *, start: bool) -> None:
        """`start`: the window opens, and the processes alive now are the ones it follows."""
        for name, u in self.usage.items():
            loop = self.loops.get(name)
            if loop is None and not start:
                continue  # started inside the window, or not alive when it opened
            if loop is not None and loop.pid != u.pid:
                continue  # restarted inside the window: the first process's share stands
            ticks = self._main_ticks(u.pid)
            if ticks is None:
                continue  # gone (killed): its share runs to its last sample
            now = self._clock()
            if loop is None:
                self.loops[name] = Loop(pid=u.pid, first_ticks=ticks, first_t=now,
                                        last_ticks=ticks, last_t=now)
            else:
                loop.last_ticks, loop.last_t = ticks, now

    def mark(self) -> None:
        """Start of the measurement: CPU counts from here, and the load window opens."""
        self.sample()
        with self._lock:
            for u in self.usage.values():
                u.cpu_base = u.cpu_done + u.cpu_now
            self.loops.clear()
            self._window_open = True
            self._sample_loops(start=True)

    def mark_end(self) -> None:
        """The load window closes (CPU still counts on, through the audit)."""
        self.sample()
        with self._lock:
            self._window_open = False

    def loop_busy(self, names: Iterable[str]) -> dict[str, float]:
        """Per process name, its main thread's CPU seconds per second of the window."""
        with self._lock:
            shares = {n: loop.busy() for n in names if (loop := self.loops.get(n))}
        return {n: share for n, share in shares.items() if share is not None}

    def rss_mb(self, names: Iterable[str], *, peak: bool = True) -> dict[str, float]:
        return {n: round((u.peak_kb if peak else u.last_kb) / 1024, 1)
                for n in names if (u := self.usage.get(n))}

    def cpu_s(self, names: Iterable[str]) -> dict[str, float]:
        return {n: round(u.cpu_s, 2) for n in names if (u := self.usage.get(n))}

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()


# --- processes ------------------------------------------------------------------------------


def du_bytes(path: Path) -> int:
    """Disk used under path, as du counts it (allocated blocks)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total


# --- the stack ------------------------------------------------------------------------------


@dataclass(slots=True)
class History:
    """What the run recorded: the audit's verdict and the raw execution records."""

    report: AuditReport
    executions: list[Entry] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return len(self.report.lost_slots)

    @property
    def duplicates(self) -> int:
        return len(self.report.duplicate_triggers)

    def latest(self) -> dict[str, dict[str, Any]]:
        """exec_id -> its latest ExecutionState."""
        out: dict[str, dict[str, Any]] = {}
        for e in self.executions:
            assert e.record is not None
            out[e.record["exec_id"]] = e.record
        return out


def executor_of(rec: dict[str, Any]) -> str | None:
    """The worker that wrote an execution record: its `worker` field, else the envelope's."""
    return rec.get("worker") or (rec.get("envelope") or {}).get("producer")


class Stack:
    def __init__(self, *, partitions: int = 8, session_timeout_s: float | None = None,
                 worker_env: dict[str, str] | None = None,
                 broker_warmup_s: float = 0.0) -> None:
        self.root = REPO / ".kron" / f"bench-{os.getpid()}"
        self.partitions = partitions
        self.session_timeout_s = session_timeout_s
        # `--worker-env`/`--no-barrier`: set on workers only, after (so over) the bench's own.
        self.worker_env = dict(worker_env or {})
        self.api_key = secrets.token_urlsafe(16)
        self.workers: dict[str, WorkerProcess] = {}
        self.api: ApiProcess | None = None
        self.api_url = ""
        self.cluster: localkafka.Cluster | None = None
        self.sampler = Sampler()
        self.host_speed = HostSpeed()
        self.receiver = Receiver(keep_heads=False)
        self._sink: CommandSink | None = None
        self._wm: Consumer | None = None
        self._probe_round = 0
        self.last_probe_ids: list[str] = []
        # Other load on the machine skews every number; the result records how much there was.
        self.load_before = os.getloadavg()[0]
        # And how fast a core is just now (bench.results.speed_probe_ms), before the stack
        # starts: a run on a slow stretch of a shared machine says so.
        self.probe_ms_before = speed_probe_ms()
        self.create_us_before = create_probe_us()
        self.broker_warmup_s = broker_warmup_s
        self.warmup: Warmup | None = None

    # lifecycle

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException as exc:
            self.close(failed=not isinstance(exc, KeyboardInterrupt))
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        # Logs are worth showing after an error, not after the user's own Ctrl-C.
        self.close(failed=exc_type is not None and not issubclass(exc_type, KeyboardInterrupt))

    def _start(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        self.cluster = localkafka.Cluster.plan_free_ports(root=self.root / "broker", size=1)
        log(f"starting a Kafka broker on {self.cluster.bootstrap_servers} ...")
        localkafka.start(self.cluster)
        extra: dict[str, Any] = {}
        if self.session_timeout_s is not None:
            extra["session_timeout_s"] = self.session_timeout_s
        self.settings = Settings(
            bootstrap_servers=self.cluster.bootstrap_servers, topic_prefix=PREFIX,
            partitions=self.partitions, data_dir=self.root / "data",
            api_keys=f"bench={self.api_key}", allow_private_targets=True, **extra)
        create_topics(self.settings)
        self.sampler.start()
        self.sampler.track("bench", os.getpid())
        broker_pid = int(self.cluster.nodes[0].pid_file.read_text().strip())
        self.sampler.track("broker", broker_pid)
        if self.broker_warmup_s > 0:
            log(f"warming the broker (at most {self.broker_warmup_s:g}s) ...")
            self.warmup = warm(self.settings, broker_pid=broker_pid,
                               max_s=self.broker_warmup_s)
            log(f"broker warm after {self.warmup.seconds:.1f}s "
                f"({self.warmup.messages} messages)")
        self.receiver.start()
        self._sink = CommandSink(self.settings)
        self._wm = Consumer({"bootstrap.servers": self.settings.bootstrap_servers,
                             "group.id": f"bench-wm-{uuid.uuid4()}", "log_level": 3})

    def close(self, *, failed: bool = False) -> None:
        """Stop everything started, in order; never raises.

        Ctrl-C and SIGTERM are ignored meanwhile: an interrupt half-way through would leave
        the broker running. Every step is bounded (SIGKILL after a grace period).
        """
        in_main = threading.current_thread() is threading.main_thread()
        previous = ({s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
                    if in_main else {})
        try:
            procs: list[KronProcess] = [*([self.api] if self.api else []),
                                        *self.workers.values()]
            if failed:
                for p in procs:
                    log(f"--- last lines of {p.name}'s log ---\n{p.tail(2000)}")
            steps = [lambda: stop_all(procs), self.receiver.stop, self.sampler.stop,
                     self.host_speed.stop]
            if self._sink is not None:
                steps.append(self._sink.close)
            if self._wm is not None:
                steps.append(self._wm.close)
            if self.cluster is not None:
                cluster = self.cluster
                steps.append(lambda: localkafka.stop(cluster))
            steps.append(lambda: shutil.rmtree(self.root, ignore_errors=True))
            for step in steps:
                try:
                    step()
                except BaseException as exc:  # keep going: the broker must stop regardless
                    log(f"tear-down step failed: {exc!r}")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @property
    def sink(self) -> CommandSink:
        assert self._sink is not None
        return self._sink

    # processes

    def worker_dir(self, name: str) -> Path:
        return self.root / f"{name}-state"

    # Every process gets the caller's environment without any KRON_* variable of its own (they
    # must not leak in), then the bench's settings (kron.processes.settings_env).

    def worker_process(self, name: str) -> WorkerProcess:
        # `--worker-env`/`--no-barrier`: set on workers only, after (so over) the bench's own.
        return WorkerProcess(self.settings, name, self.root, base_env=clean_environ(),
                             new_session=True, env=self.worker_env)

    def worker_process_env(self, name: str) -> dict[str, str]:
        return self.worker_process(name).env

    def start_worker(self, name: str) -> WorkerProcess:
        old = self.workers.get(name)
        if old is not None and old.alive():
            raise RuntimeError(f"worker {name} is already running")
        proc = self.worker_process(name).start()
        self.workers[name] = proc
        self.sampler.track(name, proc.pid)
        return proc

    def api_process(self) -> ApiProcess:
        return ApiProcess(
            self.settings, self.root, localkafka.free_ports(1)[0], base_env=clean_environ(),
            new_session=True,
            # The bench measures the API's own cost, not the per-tenant limits.
            env={"KRON_TENANT_RATE_PER_S": "1000000", "KRON_TENANT_BURST": "1000000",
                 "KRON_TENANT_MAX_ACTIVE_JOBS": "100000000"})

    def start_api(self, timeout_s: float = 90.0) -> str:
        self.api = self.api_process()
        self.api.start(wait_path=None)
        self.sampler.track("api", self.api.pid)
        self.api.wait_http(f"{self.api.url}/readyz", timeout_s)
        self.api_url = self.api.url
        return self.api_url

    def worker_names(self) -> list[str]:
        return list(self.workers)

    # Kafka

    def create_target_topic(self, name: str) -> None:
        """The Kafka target's topic. Broker time stamps give a second receive clock."""
        admin = admin_client(self.settings)
        futures = admin.create_topics([NewTopic(
            name, num_partitions=self.partitions, replication_factor=1,
            config={"message.timestamp.type": "LogAppendTime"})], request_timeout=30)
        for fut in futures.values():
            fut.result(30)

    def count(self, name: str) -> int:
        """Records ever written to a kron topic (sum of high watermarks; nothing is deleted
        during a run: retention is days and compaction skips the active segment)."""
        assert self._wm is not None
        topic = self.settings.topic(name)
        return sum(self._wm.get_watermark_offsets(TopicPartition(topic, p), 10, cached=False)[1]
                   for p in range(self.partitions))

    def wait_count(self, name: str, target: int, timeout_s: float,
                   on_count: Callable[[int], None] | None = None) -> float | None:
        """Polls until `name` holds `target` records; the monotonic time it did, or None.

        `on_count` sees every count polled (a progress bar)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            n = self.count(name)
            if on_count is not None:
                on_count(n)
            if n >= target:
                return time.monotonic()
            time.sleep(0.1)
        return None

    # readiness

    def mark(self) -> None:
        """The measurement starts: CPU and the host's speed count from here. The probes start
        here too: the broker's warm-up before it is never counted, so it is not probed."""
        self.sampler.mark()
        self.host_speed.start()
        self.host_speed.mark()

    def mark_end(self) -> None:
        """The load is over: the host's speed after this (drain, audit) does not count, nor
        the main threads' busy shares."""
        self.sampler.mark_end()
        self.host_speed.end()

    def probe(self, timeout_s: float) -> list[str] | None:
        """One one-off job per partition, due now. Their job ids once all fired, else None.

        A probe on every partition proves every partition has an owner that fires timers.
        """
        self._probe_round += 1
        ids = [f"probe-{self._probe_round}-{p}" for p in range(self.partitions)]
        spec = job_spec(target=http_target(f"{self.receiver.url}/probe"),
                        run_at_ms=time.time_ns() // 1_000_000)
        seen_upto = len(self.receiver.hits)
        for p, job_id in enumerate(ids):
            self.sink.create(job_id, spec, partition=p)
        self.sink.flush()
        want = set(ids)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.workers.items():
                if not proc.alive() and not proc.expected_exit:
                    raise SetupError(f"worker {name} exited:\n{proc.tail()}")
            hits = self.receiver.hits
            end = len(hits)
            want.difference_update(h.job_id for h in hits[seen_upto:end])
            seen_upto = end
            if not want:
                return ids
            time.sleep(0.05)
        return None

    def wait_ready(self, timeout_s: float = 180.0) -> float:
        """Until every live worker owns partitions and fires on all of them; seconds taken."""
        started = time.monotonic()
        live = {n for n, p in self.workers.items() if p.alive()}
        for _ in range(30):  # bounded: each round ends by its own deadline
            left = timeout_s - (time.monotonic() - started)
            if left <= 0:
                break
            ids = self.probe(min(left, 90.0))
            if ids is None:
                continue
            if len(live) <= 1 or live <= self.probe_owners(ids):
                self.last_probe_ids = ids
                return time.monotonic() - started
            time.sleep(1.0)  # a later worker is still joining: let the rebalance settle
        logs = "\n".join(f"--- {n} ---\n{p.tail(1500)}" for n, p in self.workers.items())
        raise SetupError(f"workers not ready within {timeout_s:.0f}s\n{logs}")

    def probe_owners(self, ids: list[str]) -> set[str]:
        want = set(ids)
        recs = (e.record for e in read_topic(self.settings.bootstrap_servers,
                                             self.settings.topic("executions")))
        return {w for r in recs if r and r["job_id"] in want and (w := executor_of(r))}

    def partition_owners(self, ids: list[str]) -> dict[int, str]:
        """partition -> worker that fired that partition's probe (ids from `probe`)."""
        want = set(ids)
        out: dict[int, str] = {}
        for e in read_topic(self.settings.bootstrap_servers, self.settings.topic("executions")):
            if e.record and e.record["job_id"] in want and (w := executor_of(e.record)):
                out[e.partition] = w
        return out

    # history

    def history(self, *, grace_ms: int) -> History:
        """Reads kron.jobs and kron.executions back and audits them (replay.audit)."""
        bootstrap = self.settings.bootstrap_servers
        jobs = [e.record for e in read_topic(bootstrap, self.settings.topic("jobs"))
                if e.name == JOB_STATE and e.record]
        execs = [e for e in read_topic(bootstrap, self.settings.topic("executions"))
                 if e.name == EXECUTION_STATE and e.record]
        report = audit(jobs, (e.record for e in execs if e.record),
                       now_ms=time.time_ns() // 1_000_000, grace_ms=grace_ms)
        return History(report=report, executions=execs)
