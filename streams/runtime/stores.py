"""Faust tables as kron uses them: the rocksdict DB of each partition, the store Faust
opens, and the callback that records a changelog write's offset."""

from __future__ import annotations

from typing import Any

import faust
from faust.stores.rocksdb import Store as RocksDBStore


class StoreTable(faust.Table[Any, Any]):
    """A Faust table with kron's access to its partition stores."""

    def adapt_store(self, store: Any) -> None:
        """Called with each store Faust makes for this table, before any DB is opened."""

    def _new_store(self) -> Any:
        store = super()._new_store()
        self.adapt_store(store)
        return store

    def partition_db(self, partition: int) -> Any:
        """The rocksdict DB of one partition, opened if need be. Never hold it across an
        await: a rebalance may close it."""
        store: Any = self.data
        return store._db_for_partition(partition)

    def open_dbs(self) -> dict[int, Any]:
        """The partition DBs open now (none for a store that is not RocksDB)."""
        store = self.data
        return dict(store._dbs) if isinstance(store, RocksDBStore) else {}

    @property
    def on_changelog_sent(self) -> Any:
        """Faust's callback for a sent changelog record: records its offset as persisted."""
        return self._on_changelog_sent
