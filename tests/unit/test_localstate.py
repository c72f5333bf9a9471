"""Local state survives only a clean stop."""

from __future__ import annotations

from pathlib import Path

from streams import localstate


def _tables(data: Path) -> Path:
    tables = data / "v1" / "tables"
    (tables / "jobs-0.db").mkdir(parents=True)
    (tables / "jobs-0.db" / "CURRENT").write_text("x")
    return tables


def test_after_a_crash_local_tables_are_rebuilt(tmp_path: Path) -> None:
    tables = _tables(tmp_path)
    assert localstate.prepare(tmp_path, tables) is False
    assert not tables.exists()


def test_after_a_clean_stop_they_are_kept_once(tmp_path: Path) -> None:
    tables = _tables(tmp_path)
    localstate.mark_clean(tmp_path)
    assert localstate.prepare(tmp_path, tables) is True
    assert (tables / "jobs-0.db" / "CURRENT").exists()
    # The marker is consumed at start: a crash of this run is not mistaken for clean.
    assert localstate.prepare(tmp_path, tables) is False
    assert not tables.exists()


def test_a_first_start_has_nothing_to_drop(tmp_path: Path) -> None:
    assert localstate.prepare(tmp_path, tmp_path / "v1" / "tables") is False
