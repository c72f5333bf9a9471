"""bench.instructions: the core's instructions per execution, from two cachegrind runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.instructions import (
    Count,
    CreateCount,
    Unavailable,
    measure,
    measure_creates,
    per_create,
    per_execution,
    summary_of,
)


def test_the_total_is_read_from_the_summary_line() -> None:
    text = "desc: I1 cache: 32768 B\ncmd: python -m bench.core_micro\nevents: Ir\nfl=x\n" \
           "summary: 3716272435\n"
    assert summary_of(text) == 3716272435
    with pytest.raises(Unavailable):
        summary_of("events: Ir\n")


@given(startup=st.integers(0, 10**10), cost=st.integers(1, 10**7), jobs=st.integers(1, 5000),
       short=st.integers(1, 10), more=st.integers(1, 10))
def test_start_up_cancels_and_the_cost_per_execution_is_left(
        startup: int, cost: int, jobs: int, short: int, more: int) -> None:
    runs = [Count(seconds=s, instructions=startup + cost * jobs * s)
            for s in (short + more, short)]
    assert per_execution(runs, jobs) == cost


def test_runs_of_the_same_length_are_refused() -> None:
    with pytest.raises(ValueError):
        per_execution([Count(seconds=2, instructions=5), Count(seconds=2, instructions=7)], 10)
    with pytest.raises(ValueError):
        measure(10, [3, 3], counter=lambda j, s, d: Count(seconds=s, instructions=0))


def test_measure_runs_both_lengths_with_the_same_jobs() -> None:
    calls: list[tuple[int, int]] = []

    def fake(jobs: int, seconds: int, workdir: Path) -> Count:
        calls.append((jobs, seconds))
        assert workdir.is_dir()
        return Count(seconds=seconds, instructions=1_000 + 7 * jobs * seconds)

    result = measure(50, [4, 2], counter=fake)
    assert sorted(calls) == [(50, 2), (50, 4)]
    assert result["instructions_per_execution"] == 7
    assert result["seconds"] == [4, 2]


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_real_count_under_valgrind() -> None:
    # Two short core_micro runs under cachegrind (~30 s, start-up bound): a count per
    # execution in the range the core has had (~0.7M instructions on 2026-12-02).
    result = measure(20, [1, 2])
    short, long = result["instructions"]
    assert long > short > 10**8
    assert 10**5 < result["instructions_per_execution"] < 10**7


@given(startup=st.integers(0, 10**10), encode=st.integers(0, 10**6), cost=st.integers(1, 10**7),
       jobs=st.integers(1, 5000))
def test_a_creates_count_leaves_out_start_up_and_the_records_encode(
        startup: int, encode: int, cost: int, jobs: int) -> None:
    runs = [CreateCount(jobs=n, encode_only=only,
                        instructions=startup + encode * n + (0 if only else cost * n))
            for n in (2 * jobs, jobs) for only in (True, False)]
    assert per_create(runs) == cost


def test_a_creates_count_needs_all_four_runs() -> None:
    with pytest.raises(ValueError):
        per_create([CreateCount(jobs=10, encode_only=False, instructions=5),
                    CreateCount(jobs=20, encode_only=False, instructions=9)])


def test_measure_creates_runs_both_sizes_in_full_and_encoding_only() -> None:
    calls: list[tuple[int, int, bool]] = []

    def fake(jobs: int, batch: int, encode_only: bool, workdir: Path) -> CreateCount:
        calls.append((jobs, batch, encode_only))
        assert workdir.is_dir()
        return CreateCount(jobs=jobs, encode_only=encode_only,
                           instructions=500 + 3 * jobs + (0 if encode_only else 11 * jobs))

    result = measure_creates(40, 100, counter=fake)
    assert sorted(calls) == [(40, 100, False), (40, 100, True), (80, 100, False),
                             (80, 100, True)]
    assert result["instructions_per_create"] == 11


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_real_creates_count_under_valgrind() -> None:
    # Four short create_micro runs, two at a time (~40 s, start-up bound): a count per
    # batched create in the range it has had (~0.33M instructions on 2026-12-02).
    result = measure_creates(200, 100)
    assert 10**4 < result["instructions_per_create"] < 10**7
