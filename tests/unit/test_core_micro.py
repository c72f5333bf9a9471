"""bench.core_micro drives the real partition core over real RocksDB stores; a small run
must fire every job once a second and finish each execution it started."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import core_micro, create_micro


def test_a_small_run_fires_every_job_every_second(tmp_path: Path) -> None:
    result = core_micro.run(20, 3, tmp_path)  # run() asserts each second fired all 20
    assert result["jobs"] == 20 and result["seconds"] == 3
    assert result["fire_us"] > 0 and result["finish_us"] > 0


def test_every_execution_it_starts_is_finished(tmp_path: Path) -> None:
    part = core_micro.Partition(tmp_path)
    try:
        core_micro.create(part, 5)
        dispatches = core_micro.fire(part, core_micro.T0_MS)
        core_micro.finish(part, dispatches, core_micro.T0_MS)
        store = part.core().store
        states = {d.exec_id: store.execution(d.exec_id)["state"] for d in dispatches}
        assert len(states) == 5 and set(states.values()) == {"succeeded"}
    finally:
        part.close()


@pytest.mark.parametrize("batch", [1, 7])
def test_create_micro_creates_every_job_once(tmp_path: Path, batch: int) -> None:
    result = create_micro.run(30, batch, tmp_path)  # run() asserts all 30 are in the table
    assert result["jobs"] == 30 and result["batch"] == batch and result["create_us"] > 0


def test_create_micro_splits_off_the_state_io_of_the_same_records(tmp_path: Path) -> None:
    # run() asserts the rewritten stores hold the created stores' bytes: the I/O timed is
    # of exactly the records the creates wrote.
    result = create_micro.run(300, 100, tmp_path, split=True)
    assert 0 < result["state_io_us"] < result["create_us"]
