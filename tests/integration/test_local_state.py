"""A worker keeps its local tables only after a clean stop; after a crash it rebuilds them
from the changelogs, and what was accepted before the crash still runs."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest

from kron.processes import WorkerProcess
from tests.conftest import fresh_settings
from tests.support.stack import Commands, spec, wait_until

pytestmark = pytest.mark.integration


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_clean_stop_keeps_state_and_a_crash_rebuilds_it(kafka_cluster, tmp_path,
                                                          receiver) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0)
    commands = Commands(settings)
    worker = WorkerProcess(settings, "w1", tmp_path).start()
    try:
        first = f"job-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", first, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                     run_at_ms=now_ms()))
        assert receiver.wait_for(first, 1, 90), worker.log()[-3000:]
        later = f"job-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", later, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                     run_at_ms=now_ms() + 40_000))
        assert wait_until(lambda: _applied(settings, later), 30)
        # The stores keep no write-ahead log: the changelogs are theirs.
        assert _wal_bytes(worker.data_dir) == 0
        worker.signal(signal.SIGTERM)
        worker.proc.wait(60)
        assert (worker.data_dir / "clean-shutdown").exists(), worker.log()[-3000:]
        # Without a log, only the memtables' flush at the stop put the job on disk.
        assert _stored_job(worker.data_dir, later), "the clean stop left the job unflushed"
        worker = WorkerProcess(settings, "w1", tmp_path).start()
        # One log file across the restarts: count the starts.
        assert wait_until(lambda: worker.log().count("engine started") >= 2, 90)
        assert "rebuilding it from the changelogs" not in worker.log()
        worker.kill()  # kill -9: local state may now be ahead of Kafka
        assert not (worker.data_dir / "clean-shutdown").exists()
        worker = WorkerProcess(settings, "w1", tmp_path).start()
        assert wait_until(lambda: "rebuilding it from the changelogs" in worker.log(), 90)
        # The stores are filled in bulk before Faust starts (streams.restore).
        assert wait_until(lambda: "restored partition stores" in worker.log(), 90)
        # The traceback of a failed restore quotes that line too: it must not be one.
        assert "bulk restore failed" not in worker.log(), worker.log()[-3000:]
        # The job accepted before both restarts fires from state rebuilt out of Kafka.
        assert receiver.wait_for(later, 1, 90), worker.log()[-3000:]
    finally:
        worker.stop()
        commands.close()


def _stores(data_dir: Path, table: str) -> list[Path]:
    stores = sorted(data_dir.glob(f"**/tables/{table}-*.db"))
    assert stores, f"no {table} stores under {data_dir}"
    return stores


def _stored_job(data_dir: Path, job_id: str) -> bool:
    """Read the stopped worker's stores as a restart with the state kept would."""
    import rocksdict

    for path in _stores(data_dir, "jobs"):
        db = rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True))
        try:
            if db.get(job_id.encode()) is not None:
                return True
        finally:
            db.close()
    return False


def _wal_bytes(data_dir: Path) -> int:
    return sum(log.stat().st_size for table in ("jobs", "executions", "timers")
               for store in _stores(data_dir, table) for log in store.glob("*.log"))


def _applied(settings, job_id: str) -> bool:
    from replay.reader import read_topic

    return any(e.record and e.record.get("job_id") == job_id
               for e in read_topic(settings.bootstrap_servers, settings.topic("jobs")))
