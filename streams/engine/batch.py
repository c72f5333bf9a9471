"""CreateJobs: many creates in one Kafka record, each applied as its own CreateJob.

A create read one record at a time paid Faust's per-event machinery (the consumer thread,
the conductor, the stream, the ack) and a record's decode for every job: about half the
worker's time per create. A batch pays them once for up to MAX_JOBS jobs.

The jobs of a batch share its partition: commands are keyed by job id with the murmur2
partitioner (Java's default; kron's own librdkafka producers set `murmur2_random`), so a
job's later commands (update, pause, delete) reach the partition that holds it only if its
create did too. The worker checks every job of a batch against the record's partition; a
producer groups its jobs with `group_by_partition` and sends each group to its partition.
"""

from __future__ import annotations

import ctypes
import glob
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from schemas import names
from streams.domain.errors import PermanentError
from streams.engine.core import Context, Effect, PartitionCore
from streams.engine.records import JobToCreate

# The most jobs group_by_partition puts in one record. The record must also fit the
# broker's message.max.bytes (1 MiB by default), which a producer of large specs meets with
# smaller batches. The worker applies any batch it is given, CHUNK jobs at a time.
MAX_JOBS = 500
# Jobs applied between two turns of the event loop: ticks, calls and acks wait no longer
# for a large batch than for one of these (~10 ms on a fast core).
CHUNK = 64

Record = dict[str, Any]


def partition_for(job_id: str, partitions: int) -> int:
    """The partition the murmur2 partitioner (Java's default, librdkafka's murmur2_random)
    gives a record keyed by this job id."""
    if _native_partitioner is not None:
        key = job_id.encode()
        return _native_partitioner(None, key, len(key), partitions, None, None)
    return (murmur2(job_id.encode()) & 0x7FFFFFFF) % partitions


def _librdkafka_partitioner() -> Callable[..., int] | None:
    """librdkafka's own murmur2 partitioner, from the library confluent-kafka's wheel
    brings: 0.5 us for a 32-character id (the API's) against 2.6 us for murmur2 below, in
    Python. Every batched create checks its job's partition. None where the wheel keeps
    the library elsewhere (the Python murmur2 then serves)."""
    try:
        import confluent_kafka

        libs = glob.glob(os.path.join(f"{os.path.dirname(confluent_kafka.__file__)}.libs",
                                      "librdkafka*.so*"))
        function = ctypes.PyDLL(libs[0]).rd_kafka_msg_partitioner_murmur2
    except (ImportError, IndexError, OSError, AttributeError):
        return None
    # PyDLL: the call keeps the GIL. A CDLL call gives it up and must win it back from the
    # worker's other threads, for a hash of half a microsecond.
    # (topic, key, keylen, partition_cnt, topic_opaque, msg_opaque): it reads only the key
    # and the count (rdkafka_msg.c).
    function.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int32,
                         ctypes.c_void_p, ctypes.c_void_p]
    function.restype = ctypes.c_int32
    return function


_native_partitioner = _librdkafka_partitioner()

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_words = struct.Struct("<I").iter_unpack


def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2, as an unsigned 32-bit int. aiokafka's version assembles each
    word from bytes and masks after every step: 4.4% of a batched create's CPU, for the
    partition check alone."""
    length = len(data)
    whole = length & ~3
    h = 0x9747B28C ^ length
    for (k,) in _words(data[:whole]):
        k = (k * _M) & _MASK
        k = ((k ^ (k >> 24)) * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest:
        if rest == 3:
            h ^= data[whole + 2] << 16
        if rest >= 2:
            h ^= data[whole + 1] << 8
        h = ((h ^ data[whole]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def item_command_id(command_id: str, index: int) -> str:
    return f"{command_id}#{index}"


def item_command(batch: Mapping[str, Any], index: int) -> Record:
    """The CreateJob that job `index` of the batch stands for. Its command and event ids are
    derived from the batch's, so a batch read again (its offset was not committed) finds
    each job it created already applied, as a repeated CreateJob would, and a refused job's
    dead letter is a CreateJob of its own that can be sent again."""
    item: JobToCreate = batch["jobs"][index]
    envelope = batch["envelope"]
    return {"envelope": {**envelope, "event_id": item_command_id(envelope["event_id"], index),
                         "event_type": "job.create_requested"},
            "command_id": item_command_id(batch["command_id"], index),
            "job_id": item["job_id"], "idempotency_key": item["idempotency_key"],
            "spec": item["spec"]}


def check_partition(job_id: str, partitions: int, partition: int) -> None:
    """A job created on a partition its commands are not keyed to could never be updated,
    paused or deleted: refuse it."""
    home = partition_for(job_id, partitions)
    if home != partition:
        raise PermanentError(
            f"job {job_id!r} belongs to partition {home}, not {partition}: a CreateJobs "
            "batch may only hold jobs of its record's partition", field="job_id")


def group_by_partition(jobs: Iterable[Record], partitions: int, *,
                       size: int = MAX_JOBS) -> Iterator[tuple[int, list[Record]]]:
    """(partition, jobs) groups of at most `size`, for a producer of CreateJobs: each is
    one record, sent to that partition. Jobs keep their order within a partition."""
    if not 0 < size <= MAX_JOBS:
        raise ValueError(f"a batch holds 1 to {MAX_JOBS} jobs, not {size}")
    pending: dict[int, list[Record]] = {}
    for job in jobs:
        partition = partition_for(job["job_id"], partitions)
        group = pending.setdefault(partition, [])
        group.append(job)
        if len(group) == size:
            yield partition, pending.pop(partition)
    yield from pending.items()


@dataclass(frozen=True, kw_only=True, slots=True)
class Refused:
    """A job of a batch that was not created; the others were."""

    index: int
    error: Exception

    @property
    def where(self) -> str:
        return f"jobs[{self.index}]"


def apply_batch(core: PartitionCore, batch: Mapping[str, Any], *, partitions: int,
                partition: int, context: Callable[[], Context],
                refusable: Callable[[Exception], bool], start: int = 0,
                stop: int | None = None) -> tuple[list[Effect], list[Refused]]:
    """Create jobs start..stop of the batch, each writing the events (and event ids) a lone
    CreateJob of it would, and refuse the ones that cannot be: a job of another partition,
    one that exists, a bad spec. An error that is not the job's fault (`refusable` says no:
    a full disk) is raised, so the record is not committed and its jobs are not lost.

    A new job (nearly every job) goes to PartitionCore.create_new with the batch's context
    renumbered, not through on_command with a CreateJob and a context built for it: those
    took ~1.5 us of a 27 us create, and a new job's create uses neither. A job that exists
    (a batch read again, a repeated id) takes the CreateJob path, which judges it."""
    effects: list[Effect] = []
    refused: list[Refused] = []
    # A kron.commands.CreateJobs record (records.CreateJobsCommand).
    jobs: list[JobToCreate] = batch["jobs"]
    tenant: str = batch["envelope"]["tenant"]
    command_id: str = batch["command_id"]
    ctx = context()
    for index in range(start, len(jobs) if stop is None else min(stop, len(jobs))):
        item = jobs[index]
        try:
            job_id = item["job_id"]
            check_partition(job_id, partitions, partition)
            if core.store.job(job_id) is None:
                ctx.seq = 0
                core.create_new(job_id=job_id, tenant=tenant,
                                command_id=item_command_id(command_id, index),
                                spec=item["spec"], idempotency_key=item["idempotency_key"],
                                ctx=ctx)
            else:
                effects += core.on_command(names.CREATE_JOB, item_command(batch, index),
                                           context())
        except Exception as exc:
            if not isinstance(exc, PermanentError) and not refusable(exc):
                raise
            refused.append(Refused(index=index, error=exc))
    return effects, refused
