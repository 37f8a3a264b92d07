"""What a process has used, read from ``/proc``: light enough for the
floor's own servers (:mod:`pool.bench.floor`) to import."""

from __future__ import annotations

import os
from typing import Final

TICKS_S: Final = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """The CPU time process ``pid`` has used, in seconds (utime + stime)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_S
