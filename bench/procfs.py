"""Reading a process's or thread's CPU from /proc/PID[/task/TID]/stat."""

from __future__ import annotations

import os

CLK_TCK = os.sysconf("SC_CLK_TCK")


def name_of(stat: str) -> str:
    """The comm field (2): between the first '(' and the last ')', spaces and all."""
    return stat[stat.index("(") + 1:stat.rindex(")")]


def _after_name(stat: str) -> list[str]:
    """Fields 3 onwards. comm may hold spaces and parentheses, so they are counted after
    its closing parenthesis."""
    return stat.rsplit(")", 1)[1].split()


def cpu_ticks(stat: str) -> int:
    """utime + stime (fields 14 and 15)."""
    fields = _after_name(stat)
    return int(fields[11]) + int(fields[12])


def reaped_children_ticks(stat: str) -> int:
    """cutime + cstime (fields 16 and 17): the CPU of children the process has waited for."""
    fields = _after_name(stat)
    return int(fields[13]) + int(fields[14])


def state_of(stat: str) -> str:
    """The state field (3): R, S, D, ... and Z for a zombie (exited, not yet reaped)."""
    return _after_name(stat)[0]
