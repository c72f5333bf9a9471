"""Disk full in a worker's state dir (a small tmpfs as its KRON_DATA_DIR, filled up) under a
seeded load. Expected: the worker stops with a clear error naming the disk ("No space" /
"disk") and the other worker takes its partitions, or it runs on from memory (its stores
keep no write-ahead log, so a small load may not write the disk at all) without losing,
doubling or dead-lettering anything; after space returns the worker restarts, recovers
from the changelogs, and no slot is lost or triggered twice."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from replay.reader import read_topic
from tests.conftest import fresh_settings
from tests.faults.support import (
    Fleet,
    judge,
    now_ms,
    seeded_load,
    wait_for_group,
    wait_settled,
    wait_until,
    warm_up,
)
from tests.support.stack import Commands

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "8m"):
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the disk-full test: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(path: Path) -> Path:
    filler = path / "filler"
    # Unbuffered: a buffered file that took part of its last chunk would raise ENOSPC
    # again at close, trying to flush the rest (it did once the state dir's use changed).
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


DISK_WORDS = ("no space", "disk", "enospc")


def test_disk_full_stops_the_worker_cleanly_and_it_recovers(
        kafka_cluster, tmp_path, fault_receiver, reliability) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0)
    commands = Commands(settings)
    rcv = fault_receiver
    tag = uuid.uuid4().hex[:6]
    with tmpfs(tmp_path / "small") as small, Fleet(settings, tmp_path, rcv) as fleet:
        state = small / "state"
        victim = fleet.start("wdisk", KRON_DATA_DIR=str(state))
        fleet.start("w2")
        warm_up(commands, rcv, fleet)
        assert wait_for_group(settings, 2), fleet.logs()
        filler = fill(small)
        start = now_ms() + 1000
        load = seeded_load(commands, f"{rcv.url}/ok", seed=9, start_ms=start,
                           end_ms=start + 12_000, cron_jobs=4, one_offs=12, periods_s=(1, 2),
                           prefix=f"df-{tag}")
        exited = wait_until(lambda: victim.proc.poll() is not None, 20, 0.5)
        log = victim.log()
        clear = any(w in log.lower() for w in DISK_WORDS)
        letters = [e.record for e in read_topic(settings.bootstrap_servers,
                                                settings.topic("dead-letters"))
                   if e.record and (e.key or b"").decode().startswith(f"df-{tag}")]
        # The stores keep no write-ahead log (the changelogs are their log): the worker
        # writes its state dir only when a memtable flushes (16 MB per store) or it stops.
        # A small load may then run on from memory and Kafka, which is correct as long as
        # nothing is lost, doubled or dead-lettered while the disk stays full.
        ran_on = not exited and not letters
        if ran_on:
            ran_on = wait_settled(settings, load, 90)
            during = judge(settings, rcv, load)
            assert not during.lost and not during.duplicates, during.summary()
        if not (ran_on or (exited and clear and not letters)):
            # Today's engine: measure what the fault did, then fail (xfail) without the
            # recovery waits, which only make sense once the worker stops cleanly.
            verdict = judge(settings, rcv, load)
            os.unlink(filler)
            reliability.record(
                scenario="disk full in a worker's state dir", injected="8 MiB tmpfs as "
                "KRON_DATA_DIR, filled during a load",
                lost=len(verdict.lost), duplicates=len(verdict.duplicates),
                max_lateness_ms=verdict.max_lateness_ms, attempts_ok=verdict.attempts_ok,
                notes=f"XFAIL (engine): worker exited: {bool(exited)}; disk error in log: "
                      f"{clear}; valid commands dead-lettered: {len(letters)} (their jobs "
                      "are lost); figures measured before any restart")
            commands.close()
            pytest.fail(f"no clean stop on disk full: exited={bool(exited)} clear={clear} "
                        f"dead-lettered={len(letters)}\n{log[-2000:]}")
        # Space returns; the worker restarts on its own state dir.
        os.unlink(filler)
        if victim.proc.poll() is None:
            victim.kill()
        fleet.start("wdisk", KRON_DATA_DIR=str(state))
        recovered = wait_for_group(settings, 2, 90)
        settled = wait_settled(settings, load, 90)
        verdict = judge(settings, rcv, load)
    commands.close()
    reliability.record(
        scenario="disk full in a worker's state dir", injected="8 MiB tmpfs as KRON_DATA_DIR, "
        "filled during a load; space freed, worker restarted",
        lost=len(verdict.lost), duplicates=len(verdict.duplicates),
        max_lateness_ms=verdict.max_lateness_ms, attempts_ok=verdict.attempts_ok,
        notes=f"worker exited: {bool(exited)}; clear disk error in log: {clear}; "
              f"ran on from memory while full: {ran_on}; "
              f"valid commands dead-lettered: {len(letters)}; rejoined: {recovered}")
    assert recovered, fleet.logs()
    assert settled, fleet.logs()
    assert not verdict.lost and not verdict.duplicates, verdict.summary()
    assert not letters, f"valid commands dead-lettered as poison: {letters[:3]}"
    assert ran_on or (exited and clear), f"no clean stop with a disk error:\n{log[-3000:]}"
