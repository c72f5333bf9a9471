"""A full disk stops the worker; it never turns a valid record into a dead letter."""

from __future__ import annotations

import errno

from streams.app import _environmental, _jobs_fault


def test_disk_and_descriptor_errors_are_the_machines_fault() -> None:
    assert _environmental(OSError(errno.ENOSPC, "No space left on device"))
    assert _environmental(Exception("IO error: No space left on device: While appending"))
    assert _environmental(RuntimeError("Read-only file system"))


def test_the_cause_chain_is_searched() -> None:
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as inner:
            raise ValueError("write failed") from inner
    except ValueError as outer:
        assert _environmental(outer)


def test_record_errors_are_not_environmental() -> None:
    assert not _environmental(KeyError("job_id"))
    assert not _environmental(ValueError("bad cron"))


def test_a_batch_refuses_a_job_alone_only_for_the_jobs_own_errors() -> None:
    # What Engine._create_jobs hands apply_batch: a full disk must stop the worker with the
    # record uncommitted, never dead-letter a valid job.
    assert not _jobs_fault(OSError(errno.ENOSPC, "No space left on device"))
    assert _jobs_fault(ValueError("bad cron"))
