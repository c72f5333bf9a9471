"""The gate that local ticks and results pass (streams/rebalance.py), driven through the
two app hooks Faust calls, in orders Faust can produce them."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from streams.rebalance import RebalanceGate


class FakeApp:
    """The two hooks and the assignment generation Faust keeps on the app."""

    def __init__(self) -> None:
        self.consumer_generation_id = 0
        self.rebalancing = False
        self.calls: list[str] = []

    def on_rebalance_start(self) -> None:
        self.rebalancing = True
        self.calls.append("start")

    def on_rebalance_end(self) -> None:
        self.rebalancing = False
        self.calls.append("end")


def _installed() -> tuple[FakeApp, RebalanceGate]:
    app, gate = FakeApp(), RebalanceGate()
    gate.install(app)
    return app, gate


def test_closed_until_the_first_assignment_is_recovered() -> None:
    app, gate = _installed()
    assert not gate.open
    app.on_rebalance_start()
    app.consumer_generation_id = 1
    assert not gate.open
    app.on_rebalance_end()
    assert gate.open and app.calls == ["start", "end"]  # Faust's own hooks still run


def test_a_recovery_ending_after_the_next_rebalance_began_does_not_open_it() -> None:
    """Faust clears app.rebalancing here; the partitions may be someone else's already."""
    app, gate = _installed()
    app.on_rebalance_start()
    app.consumer_generation_id = 7
    app.on_rebalance_start()  # generation 8 begins while 7's tables recover
    app.on_rebalance_end()  # ...and 7's recovery ends
    assert not app.rebalancing and not gate.open
    app.consumer_generation_id = 8
    app.on_rebalance_end()
    assert gate.open


def test_a_new_rebalance_closes_it_at_once() -> None:
    app, gate = _installed()
    app.on_rebalance_start()
    app.consumer_generation_id = 3
    app.on_rebalance_end()
    app.on_rebalance_start()
    assert not gate.open


@given(st.lists(st.sampled_from(["start", "assign", "end"]), max_size=40))
def test_open_exactly_when_the_latest_assignment_was_recovered_and_nothing_began_since(
        events: list[str]) -> None:
    app, gate = _installed()
    last = {"start": -1, "assign": -1, "end": -1}
    for i, event in enumerate(events):
        if event == "start":
            app.on_rebalance_start()
        elif event == "assign":
            if last["start"] <= last["assign"]:
                continue  # an assignment comes only from a rebalance that began
            app.consumer_generation_id += 1
        else:
            if last["assign"] < 0:
                continue  # nothing recovered yet
            app.on_rebalance_end()  # possibly late: Faust ends the recovery it was doing
        last[event] = i
    expected = last["start"] < last["assign"] < last["end"]
    assert gate.open == expected, (events, last)


def test_engine_declines_local_work_while_the_gate_is_closed() -> None:
    from streams.app import Engine

    gate = RebalanceGate()
    engine = SimpleNamespace(_stopping=False, gate=gate,
                             app=SimpleNamespace(rebalancing=False), owns=lambda p: True)
    may = Engine._may_apply_here
    assert not may(engine, 0)  # type: ignore[arg-type]
    gate.started(0)
    gate.ended(1)
    assert may(engine, 0)  # type: ignore[arg-type]
    gate.started(1)
    assert not may(engine, 0)  # type: ignore[arg-type]
