"""Task functions the tests send to workers (importable as tests.sample_tasks)."""

from __future__ import annotations

import asyncio
import os
import time


def square(x: int) -> int:
    return x * x


def fail(message: str) -> None:
    raise ValueError(message)


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


async def async_nap(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


async def async_double(x: int) -> int:
    return 2 * x


def pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


NOT_CALLABLE = 42


def work(x: int) -> int:
    """A few milliseconds of work."""
    time.sleep(0.003)
    return x * x


def die() -> None:
    """Kill the worker that runs it (a poison task)."""
    os._exit(3)
