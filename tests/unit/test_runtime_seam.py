"""The seam to Faust's and aiokafka's internals (streams/runtime/), against the real
libraries: the start-up check, a real faust.App's consumer and assignor before start, the
real commit bookkeeping, and no private name used outside the seam. What needs a running
consumer (epoch, fetch tuning, the lease's requests) is in
tests/integration/test_runtime_seam_broker.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import faust
import pytest
from faust.transport import consumer as faust_consumer
from faust.types import TP

from streams.runtime import HOOKED_NAMES, OFFSET_KEY, PRIVATE_NAMES, RuntimeMismatch, verify
from streams.runtime.check import owner_class
from streams.runtime.group import FaustRuntime

REPO = Path(__file__).resolve().parents[2]
SEAM = REPO / "streams" / "runtime"
TREES = ("streams", "api", "replay", "kron", "bench")


def faust_app(tmp_path: Path) -> faust.App:
    """A real worker-shaped Faust app; nothing connects until it starts."""
    return faust.App("seam-test", broker="kafka://127.0.0.1:1", store="rocksdb://",
                     datadir=str(tmp_path), autodiscover=False, web_enabled=False)


def test_every_name_the_seam_relies_on_is_there() -> None:
    verify()
    assert len(PRIVATE_NAMES) >= 20


@pytest.mark.parametrize("spec", PRIVATE_NAMES + HOOKED_NAMES,
                         ids=lambda s: f"{s.owner}.{s.name}")
def test_a_missing_name_refuses_start_naming_it(spec: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cls = owner_class(spec.owner)
    # Gone from wherever it was defined (the class, a base class, or its __init__).
    for klass in cls.__mro__:
        if spec.name in vars(klass):
            monkeypatch.delattr(klass, spec.name)
    monkeypatch.setattr("streams.runtime.check._init_sources", lambda cls: "")
    with pytest.raises(RuntimeMismatch, match=re.escape(f"{spec.owner}.{spec.name}")):
        verify()


def test_a_method_that_changed_shape_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def _add_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
        return None  # no longer a coroutine: kron's wrapper would await None

    monkeypatch.setattr(faust_consumer.Consumer, "_add_gap", _add_gap)
    with pytest.raises(RuntimeMismatch, match=r"Consumer\._add_gap is no longer an async"):
        verify()


def test_the_runtime_refuses_to_be_built_on_a_missing_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(faust_consumer.Consumer, "_new_offset")
    with pytest.raises(RuntimeMismatch, match="_new_offset"):
        FaustRuntime(faust_app(tmp_path), owned_topic="t.signals")


def test_a_real_app_before_start_owns_nothing_and_has_no_epoch(tmp_path: Path) -> None:
    runtime = FaustRuntime(faust_app(tmp_path), owned_topic="t.signals")
    assert runtime.coordinator() is None
    assert runtime.epoch() == 0
    assert runtime.owned_partitions() == frozenset()
    assert not runtime.tune_fetches(min_bytes=1 << 16, max_wait_ms=5)
    assert runtime.fetch_settings() is None


def test_commit_control_reads_and_writes_fausts_own_bookkeeping(tmp_path: Path) -> None:
    app = faust_app(tmp_path)
    control = FaustRuntime(app, owned_topic="t.signals").commit_control()
    tp = TP("t.commands", 0)
    assert control.committed(tp) is None and list(control.acked(tp)) == []
    control.set_committed(tp, 27)
    assert control.committed(tp) == 27
    app.topics.acks_enabled_for = lambda topic: True  # type: ignore[method-assign]
    for offset in (28, 29):
        app.consumer.ack(faust.types.Message(
            topic=tp.topic, partition=tp.partition, offset=offset, timestamp=0.0,
            timestamp_type=0, headers=[], key=b"k", value=b"v", checksum=None, tp=tp))
    assert list(control.acked(tp)) == [28, 29]
    # Faust's own commit arithmetic, wrapped as streams.commits wraps it: 27 was never acked.
    seen: list[int | None] = []

    def recording(new_offset: Any) -> Any:
        def wrapped(tp: Any) -> Any:
            seen.append(new_offset(tp))
            return seen[-1]
        return wrapped

    control.wrap_new_offset(recording)
    app.consumer._new_offset(tp)
    assert seen == [30]  # the off-by-one streams.commits guards against


def test_the_offset_key_is_fausts(tmp_path: Path) -> None:
    from faust.stores import rocksdb

    assert rocksdb.Store.offset_key == OFFSET_KEY


def _uses(spec: Any, text: str = "") -> re.Pattern[str] | None:
    """How a use of the name looks in a file. A `shared` name is one kron also gives its
    own attributes (`self._thread`): only uses on other objects count, and not in a file
    that defines the name for its own (`def _consumer`, `self._consumer = ...`)."""
    name = re.escape(spec.name)
    if not spec.shared:
        return re.compile(rf"\b{name}\b")
    if re.search(rf"\bdef {name}\b|\bself\.{name}\s*(:[^=\n]*)?=(?!=)", text):
        return None
    return re.compile(rf"(?<!\bself)(?<!\bcls)\.{name}\b")


def test_no_private_name_of_the_seam_is_used_outside_it() -> None:
    offenders = []
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            if SEAM in path.parents:
                continue
            text = path.read_text()
            for spec in PRIVATE_NAMES:
                pattern = _uses(spec, text)
                for line_no, line in enumerate(text.splitlines(), 1):
                    if pattern is not None and pattern.search(line):
                        offenders.append(f"{path.relative_to(REPO)}:{line_no}: {spec.name}")
            if "__faust" in text:
                offenders.append(f"{path.relative_to(REPO)}: Faust's offset key (OFFSET_KEY)")
    assert not offenders, "private Faust/aiokafka names outside streams/runtime/:\n" + \
        "\n".join(offenders)


def test_the_grep_finds_a_use_it_is_meant_to_find() -> None:
    by_name = {s.name: s for s in PRIVATE_NAMES}

    def finds(name: str, line: str, text: str = "") -> bool:
        pattern = _uses(by_name[name], text)
        return pattern is not None and bool(pattern.search(line))

    assert finds("_db_for_partition", "db = store._db_for_partition(p)")
    assert finds("_thread", "app.consumer._thread._consumer")
    assert finds("_consumer", "app.consumer._thread._consumer")
    assert not finds("_thread", "self._thread.join()")
    assert not finds("_consumer", "c = projector._consumer(0)", "def _consumer(self): ...")
