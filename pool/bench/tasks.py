"""The tasks of ``pool bench`` (:mod:`pool.bench`), in a module of their own
so that a worker imports nothing else to run them."""

from __future__ import annotations

import os
import time


def noop(x: int = 0) -> int:
    return x


async def async_noop(x: int = 0) -> int:
    """A coroutine no-op: a worker runs it on its loop, where a plain call
    goes to a slot thread and back (``benchmarks/one_hop.py`` measures the
    difference)."""
    return x


def burn(seconds: float) -> float:
    """Spend ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return seconds


def gate(path: str) -> bool:
    """Hold a worker until ``path`` exists (``pool bench --scale``'s deep
    queue: every worker busy while the queue fills)."""
    while not os.path.exists(path):
        time.sleep(0.01)
    return True
