"""Render tests/faults/report.json as a markdown table and rewrite docs/reliability.md
(between `<!-- reliability:start -->` and `<!-- reliability:end -->`).

    python -m tests.faults.report            # rewrite docs/reliability.md
    python -m tests.faults.report --print    # only print the table
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPORT = HERE / "report.json"
README = HERE.parent.parent / "docs" / "reliability.md"
START, END = "<!-- reliability:start -->", "<!-- reliability:end -->"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(scenarios: list[dict[str, Any]]) -> str:
    rows = ["| scenario | injected | lost | duplicates | max lateness (ms) | attempts within "
            "policy | notes |", "|---|---|---|---|---|---|---|"]
    for s in scenarios:
        rows.append("| " + " | ".join(_cell(s.get(k)) for k in (
            "scenario", "injected", "lost", "duplicates", "max_lateness_ms", "attempts_ok",
            "notes")) + " |")
    return "\n".join(rows)


def section(scenarios: list[dict[str, Any]]) -> str:
    dates = sorted(s.get("measured_at", "") for s in scenarios if s.get("measured_at"))
    when = f"{dates[0]} to {dates[-1]}" if dates else "unknown"
    return (f"{START}\nMeasured by `pytest tests/faults` (real KRaft brokers, real `kron worker` "
            "and API processes, a loopback target logging every attempt; judged by "
            "`replay.audit` plus the target's log), rendered by `python -m tests.faults.report`."
            f" Measured {when}.\n\n{COLUMNS}\n\n{table(scenarios)}\n{END}")


COLUMNS = (
    "*lost*: an expected slot (or acknowledged create) without a 2xx at the target, or a "
    "slot `replay.audit` finds lost. *duplicates*: a slot called under two Idempotency-Keys "
    "or recorded with two executions, or a duplicate trigger `replay.audit` finds; in the "
    "broker-fault and indeterminate-create rows also one Idempotency-Key called twice with "
    "one X-Kron-Attempt, and in the latter two jobs listed for one create key. "
    "*attempts within policy*: no call's X-Kron-Attempt above its job's "
    "`retry.max_attempts` (as sent, else as kron.jobs records it) and no "
    "`attempts_over_policy` finding by `replay.audit`.")


def rewrite(readme: str, body: str) -> str:
    if START in readme and END in readme:
        head, rest = readme.split(START, 1)
        _, tail = rest.split(END, 1)
        return head + body + tail
    return readme.rstrip("\n") + "\n\n## Reliability\n\n" + body + "\n"


def main(argv: list[str]) -> int:
    scenarios = json.loads(REPORT.read_text())["scenarios"]
    if "--print" in argv:
        print(table(scenarios))
        return 0
    README.write_text(rewrite(README.read_text(), section(scenarios)))
    print(f"{README.relative_to(HERE.parent.parent)}: {len(scenarios)} scenarios")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
