"""The one seam between kron and the internals of Faust, aiokafka and mode.

Only this package uses their private names (listed in `PRIVATE_NAMES`, streams/runtime/
names.py; a test greps the rest of the tree for them), and it verifies every one of them
against the installed libraries before the worker starts (`verify`, raising
RuntimeMismatch naming what is missing). The interface the rest of the worker uses:

- `FaustRuntime` (streams.runtime.group): partitions owned, the ownership epoch, the group
  coordinator, fetch tuning, commit control (`CommitControl`) and the rebalance hooks;
  `wrap_group_requests` for the ownership lease.
- `StoreTable` (streams.runtime.stores): a Faust table's per-partition rocksdict DBs.
- `bounded_stop_worker_class` (streams.runtime.stop): the stop.
- `OFFSET_KEY`: Faust's persisted-offset key inside a partition store.

Import the submodules for the classes: this module stays free of Faust imports.
"""

from streams.runtime.check import RuntimeMismatch, verify
from streams.runtime.names import HOOKED_NAMES, OFFSET_KEY, PRIVATE_NAMES, Kind, Private

__all__ = ["HOOKED_NAMES", "OFFSET_KEY", "PRIVATE_NAMES", "Kind", "Private", "RuntimeMismatch",
           "verify"]
