"""Every private name of Faust, aiokafka and mode that kron relies on, in one list.

Only streams/runtime/ may use these names (tests/unit/test_runtime_seam.py greps the rest of
the tree); streams/runtime/check.py verifies each one against the installed libraries before
the worker starts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Faust's persisted-offset key inside each partition store (RocksDB): the offset of the
# last changelog record the store holds. The restore writes it, the scans skip it.
OFFSET_KEY = b"__faust\x00offset__"


class Kind(enum.Enum):
    ATTRIBUTE = "attribute"  # read or replaced: on the class, or assigned in __init__
    METHOD = "method"  # called, wrapped or overridden: a plain function on the class
    COROUTINE = "coroutine"  # as METHOD, an `async def`


@dataclass(frozen=True, slots=True)
class Private:
    """`owner` ("module:Class") has `name` of `kind`, used as `why` says. `arity`: the
    parameters after self, for a method kron calls or replaces with its own.

    `shared`: kron's own classes also name their attributes so (`self._thread`), so the
    tree-wide grep counts only uses on other objects (`consumer._thread`)."""

    owner: str
    name: str
    kind: Kind
    why: str
    arity: int | None = None
    shared: bool = False


_FAUST_CONSUMER = "faust.transport.consumer:Consumer"
_AIOKAFKA_THREAD = "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread"
_AIOKAFKA_CONSUMER = "aiokafka.consumer.consumer:AIOKafkaConsumer"
_FETCHER = "aiokafka.consumer.fetcher:Fetcher"
_COORDINATOR = "aiokafka.consumer.group_coordinator:GroupCoordinator"
_ROCKSDB_STORE = "faust.stores.rocksdb:Store"
_TABLE = "faust.tables.table:Table"
_MODE_WORKER = "mode.worker:Worker"

PRIVATE_NAMES: tuple[Private, ...] = (
    # Ownership and the epoch: the group coordinator of the consumer in Faust's thread.
    Private("faust.transport.consumer:ThreadDelegateConsumer", "_thread", Kind.ATTRIBUTE,
            "the consumer thread, to reach aiokafka's consumer", shared=True),
    Private(_AIOKAFKA_THREAD, "_consumer", Kind.ATTRIBUTE,
            "aiokafka's consumer (None until the thread starts)", shared=True),
    Private(_AIOKAFKA_CONSUMER, "_coordinator", Kind.ATTRIBUTE,
            "the group coordinator: generation (the epoch) and the lease's requests"),
    Private(_COORDINATOR, "_send_req", Kind.COROUTINE,
            "wrapped: an acknowledged heartbeat or sync renews the ownership lease",
            arity=1),
    Private("faust.assignor.partition_assignor:PartitionAssignor", "_assignment",
            Kind.ATTRIBUTE, "the partitions this member owns (replaced per assignment)"),
    # Fetch tuning.
    Private(_AIOKAFKA_CONSUMER, "_fetcher", Kind.ATTRIBUTE, "the fetcher (None until start)"),
    Private(_FETCHER, "_fetch_min_bytes", Kind.ATTRIBUTE, "set: fetch.min.bytes"),
    Private(_FETCHER, "_fetch_max_wait_ms", Kind.ATTRIBUTE, "set: fetch.max.wait.ms"),
    # Commit control (streams.commits).
    Private(_FAUST_CONSUMER, "_new_offset", Kind.METHOD,
            "wrapped: no commit over a skipped record", arity=1),
    Private(_FAUST_CONSUMER, "_add_gap", Kind.COROUTINE,
            "wrapped: no gaps counted on source topics", arity=3),
    Private("faust.transport.drivers.aiokafka:Consumer", "_commit", Kind.COROUTINE,
            "wrapped: commit only once state writes are acknowledged", arity=1, shared=True),
    Private(_FAUST_CONSUMER, "_committed_offset", Kind.ATTRIBUTE,
            "read (and raised past retention): the committed offsets"),
    Private(_FAUST_CONSUMER, "_acked", Kind.ATTRIBUTE, "read: the acked offsets",
            shared=True),
    Private(_FAUST_CONSUMER, "_gap", Kind.ATTRIBUTE, "read: the known offset gaps",
            shared=True),
    # Per-partition stores.
    Private(_TABLE, "_new_store", Kind.METHOD,
            "overridden: stores open their DBs without a write-ahead log", arity=0),
    Private(_TABLE, "_on_changelog_sent", Kind.METHOD,
            "the callback that records a changelog write's offset", arity=1),
    Private(_ROCKSDB_STORE, "_db_for_partition", Kind.METHOD,
            "the rocksdict DB of a table partition", arity=1),
    Private(_ROCKSDB_STORE, "_dbs", Kind.ATTRIBUTE, "the open DBs, flushed at stop"),
    # Stop.
    Private(_MODE_WORKER, "_schedule_shutdown", Kind.METHOD,
            "overridden: a graceful stop is bounded", arity=1),
    Private(_MODE_WORKER, "_signal_stop_time", Kind.ATTRIBUTE,
            "read: whether a stop was already scheduled"),
)

# Public names whose behaviour kron replaces or overrides, or whose meaning it depends on:
# verified at start as the private ones are, not confined to streams/runtime/.
HOOKED_NAMES: tuple[Private, ...] = (
    Private(_FAUST_CONSUMER, "perform_seek", Kind.COROUTINE,
            "wrapped: seek uncommitted source partitions to their start", arity=0),
    Private("faust.app.base:App", "on_rebalance_start", Kind.METHOD,
            "wrapped: the rebalance gate closes", arity=0),
    Private("faust.app.base:App", "on_rebalance_end", Kind.METHOD,
            "wrapped: the rebalance gate opens", arity=0),
    Private(_COORDINATOR, "generation", Kind.ATTRIBUTE, "the ownership epoch"),
    Private(_TABLE, "send_changelog", Kind.METHOD, "overridden: epoch headers", arity=5),
    Private(_TABLE, "apply_changelog_batch", Kind.METHOD, "overridden: the epoch fence",
            arity=1),
    Private(_TABLE, "on_key_set", Kind.METHOD, "overridden: the key floor", arity=2),
    Private(_TABLE, "on_rebalance", Kind.COROUTINE, "overridden: the key floor", arity=4),
    Private(_ROCKSDB_STORE, "persisted_offset", Kind.METHOD, "read by the gap filler",
            arity=1),
    Private(_ROCKSDB_STORE, "set_persisted_offset", Kind.METHOD,
            "written for writes that bypass Faust", arity=2),
    Private(_ROCKSDB_STORE, "partition_path", Kind.METHOD, "where the restore writes",
            arity=1),
    Private(_ROCKSDB_STORE, "rocksdb_options", Kind.ATTRIBUTE, "how the restore opens DBs"),
)
