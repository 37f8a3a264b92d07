"""When a worker retires: after ``--max-tasks-per-child`` tasks, or when its
memory is over ``--max-memory``, as ``ProcessPoolExecutor``'s
``max_tasks_per_child`` and Dask's nanny do.

:class:`Limits` counts starts. A slot thread asks it, under the service's
claim lock, before it starts a task (:meth:`Limits.take_start`), so a
worker never starts more than its budget, however many tasks it holds; the
task that spends the last start retires the worker: it refuses new tasks,
hands back those it holds (UNAVAILABLE: the dispatcher sends them to
another worker, and does not count an attempt), finishes what runs, and
exits 0. Its supervisor starts another in its place.

Memory is its resident set (``/proc/self/statm``). Read after each task, a
worker over the limit retires the same way, before it starts another. While
a task runs, :class:`MemoryWatch` reads it every :data:`WATCH_S`: a task
that blows through the limit (past :data:`KILL_FACTOR` times it) ends the
process at once (exit status :data:`OVER_MEMORY_EXIT`), which the
dispatcher counts as an attempt of that task, like any other death, so it
is not run again for ever.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable
from typing import Final

WATCH_S: Final = 0.05
KILL_FACTOR: Final = 1.5
OVER_MEMORY_EXIT: Final = 3
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
_SIZE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(value: int | str, name: str = "max_memory") -> int:
    """Bytes from ``2GB``, ``512MiB``, ``1.5G`` or a number of bytes.

    :raises ValueError: naming the setting (``name``), the value and the
        forms it takes.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name} must be 0 or more bytes, got {value}")
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise ValueError(
            f"{name} {value!r} is not a size: give bytes, or a number with "
            f"a unit, such as 2GB, 512MiB or 1.5G"
        )
    number, unit, binary = match.groups()
    power = "KMGT".index(unit.upper()) + 1 if unit else 0
    return int(float(number) * (1024 if binary else 1000) ** power)


def rss_bytes() -> int:
    """This process's resident set now."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


class Limits:
    """One worker's retirement rules; see the module docstring.

    :param max_tasks: tasks it starts before it retires (0: no limit).
    :param max_memory: resident bytes over which it retires (0: no limit).
    """

    def __init__(self, max_tasks: int = 0, max_memory: int = 0) -> None:
        self.max_tasks, self.max_memory = max_tasks, max_memory
        self._starts_left = max_tasks or -1
        self.why: str | None = None  # set once it is to retire

    def take_start(self) -> bool:
        """Whether a task may start now (the caller holds the claim lock);
        the last start allowed sets :attr:`why`."""
        if self.why is not None:  # (set by the last start allowed, or memory)
            return False
        if self._starts_left > 0:
            self._starts_left -= 1
            if self._starts_left == 0:
                self.why = (
                    f"it has run its {self.max_tasks} tasks (max_tasks_per_child)"
                )
        return True

    def after_task(self) -> bool:
        """Whether the worker is newly to retire, its memory read after a task."""
        if self.why is not None or not self.max_memory:
            return False
        if (rss := rss_bytes()) <= self.max_memory:
            return False
        self.why = (
            f"its memory ({_mb(rss)}) is over max_memory ({_mb(self.max_memory)})"
        )
        return True


class MemoryWatch:
    """A daemon thread that ends the process if its memory goes past
    :data:`KILL_FACTOR` times ``limit`` while ``running()`` says a task
    runs; see the module docstring."""

    def __init__(self, limit: int, running: Callable[[], bool]) -> None:
        self._limit, self._running = int(limit * KILL_FACTOR), running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="memory", daemon=True)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):  # a reading every WATCH_S, not a wait
            if self._running() and (rss := rss_bytes()) > self._limit:
                print(
                    f"worker: error: a task took its memory to {_mb(rss)}, past "
                    f"{KILL_FACTOR:g} x max_memory ({_mb(self._limit)}); exiting "
                    f"(the task counts an attempt)",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(OVER_MEMORY_EXIT)


def warn_if_under_baseline(limit: int) -> None:
    """Say so if this worker is over ``limit`` before any task: it would
    retire after every task, and its replacements too."""
    if limit and (rss := rss_bytes()) > limit:
        print(
            f"worker: warning: max_memory ({_mb(limit)}) is below this worker's "
            f"own memory before any task ({_mb(rss)}), so every worker retires "
            f"after each task; give more, such as {_mb(2 * rss)}",
            file=sys.stderr,
        )


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB"
