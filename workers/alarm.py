"""The kernel's backstop for a time limit the worker's loop cannot keep:
:class:`Alarm`.

A worker ends a task over its time limit from its loop
(:mod:`workers.ending`). A call that holds the GIL all along (a long C
loop such as ``sum(range(10**10))``, a regular expression that
backtracks) stops the loop too, and with it the timer that would end
it. So each task with a time limit also keeps this process's real-time
alarm (``setitimer``, whose SIGALRM the kernel acts on by ending the
process, with no Python code to run) set :data:`BACKSTOP_S` past the
earliest limit of the tasks running, and lets go when it ends. A worker
ended so is seen dead by its dispatcher, which fails the task with
:class:`~workers.protocol.errors.TaskTimeout` (its loss rule,
:mod:`pool.routing.losses`), and replaced by its supervisor.

Set and cleared from the slot threads and the loop, under its own lock.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Final

# How long past a limit the kernel ends a worker whose loop did not.
BACKSTOP_S: Final = 1.0
# Limits longer than this (years) are not held: the timer takes no more.
MAX_LIMIT_S: Final = 1e8


class Alarm:
    """This process's real-time alarm, at the earliest deadline held."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}  # by task id (this worker's own)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # (the kernel ends it)

    def hold(self, key: int, limit_s: float) -> None:
        """A task ``key`` with a limit of ``limit_s`` starts now."""
        if limit_s > MAX_LIMIT_S:
            return
        with self._lock:
            self._deadlines[key] = time.monotonic() + limit_s + BACKSTOP_S
            self._set()

    def release(self, key: int) -> None:
        """The task ``key`` ended (or was answered: its worker ends it)."""
        with self._lock:
            if self._deadlines.pop(key, None) is not None:
                self._set()

    def _set(self) -> None:
        if not self._deadlines:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return
        left = min(self._deadlines.values()) - time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))
