"""Task functions the tests send to workers (importable as
``tests.support.sample_tasks``)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import sys
import time
from typing import Any


def square(x: int) -> int:
    return x * x


def speak(text: str) -> int:
    """Print ``text`` on stdout, and again on stderr; its length."""
    print(text)
    print(f"{text} (stderr)", file=sys.stderr)
    return len(text)


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


def host_pid_after(seconds: float) -> int:
    """:func:`pid_after`, as the machine's /proc names the process: its pid
    outside a pid namespace of its own (where ``os.getpid()`` may be 1)."""
    time.sleep(seconds)
    return int(os.readlink("/proc/self"))


def work(x: int) -> int:
    """A few milliseconds of work."""
    time.sleep(0.003)
    return x * x


def die() -> None:
    """Kill the worker that runs it (a poison task)."""
    os._exit(3)


class Scaler:
    """An object whose methods are tasks (bound and class methods)."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    def scale(self, x: int) -> int:
        return self.factor * x

    @classmethod
    def unit(cls, x: int) -> int:
        return x

    @staticmethod
    def twice(x: int) -> int:
        return 2 * x


class BadStr(Exception):
    """An exception that cannot be printed."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def raise_bad_str() -> None:
    raise BadStr("hidden")


async def async_raise_bad_str() -> None:
    raise BadStr("hidden")


def gated(gate: str, index: int, log: str = "") -> int:
    """Wait until the file ``gate`` exists (a test opens it), note ``index``
    in the file ``log`` if given, and return it."""
    deadline = time.monotonic() + 60
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never appeared")
        time.sleep(0.005)
    if log:
        with open(log, "a") as out:
            out.write(f"{index}\n")
    return index


def started_then_gated(started: str, gate: str, done: str, value: int) -> int:
    """Say it started (the file ``started``), wait for ``gate``, leave the
    file ``done`` and return ``value``."""
    open(started, "w").close()
    gated(gate, value)
    open(done, "w").close()
    return value


def noted_then_gated(runs: str, gate: str, value: int) -> int:
    """Note this run (``value``, a line appended to the file ``runs``), wait
    for ``gate``, and return ``value``."""
    with open(runs, "a") as out:
        out.write(f"{value}\n")
    return gated(gate, value)


async def async_until_cancelled(started: str, cancelled: str, done: str) -> None:
    """Say it started, then wait for ever; note a cancellation, or (never)
    the end."""
    open(started, "w").close()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        open(cancelled, "w").close()
        raise
    open(done, "w").close()


class Box:
    """A result a test can hold weakly."""

    def __init__(self, value: int) -> None:
        self.value = value


def boxed(value: int) -> Box:
    return Box(value)


def noted(log: str, seconds: float, x: int) -> int:
    """Note ``x`` and this process's pid in the file ``log``, sleep
    ``seconds``, and return ``x * x``."""
    with open(log, "a") as out:
        out.write(f"{x} {os.getpid()}\n")
    time.sleep(seconds)
    return x * x


_runs = itertools.count()


def sequenced(x: int) -> tuple[int, int, int]:
    """``x``, this process's pid, and how many calls it ran before."""
    return x, os.getpid(), next(_runs)


def fail_on(bad: int, x: int) -> int:
    if x == bad:
        raise ValueError(f"{x} is bad")
    return x


def call(*args: object, **kwargs: object) -> str:
    """How it was called, as text."""
    return f"{args} {sorted(kwargs.items())}"


def exit_with(code: int) -> None:
    raise SystemExit(code)


def meet(directory: str, me: str, other: str) -> str:
    """Leave the file ``me`` in ``directory`` and wait (at most 60 s) for
    ``other``: it returns only if both calls run at once."""
    open(os.path.join(directory, me), "w").close()
    gated(os.path.join(directory, other), 0)
    return me


def mark(path: str) -> int:
    """Leave the file ``path`` (it ran) and return the worker's pid."""
    open(path, "w").close()
    return os.getpid()


def gated_pid(gate: str) -> int:
    """Wait for the file ``gate``, then return the worker's pid."""
    gated(gate, 0)
    return os.getpid()


def pid_then_gated(said: str, gate: str) -> int:
    """Write the worker's pid to the file ``said``, then wait for ``gate``."""
    with open(said + ".part", "w") as out:
        out.write(str(os.getpid()))
    os.replace(said + ".part", said)  # (whole, or not there)
    return gated(gate, 0)


def mul(x: int, y: int) -> int:
    return x * y


_kept: list[bytearray] = []


def keep_memory(megabytes: int) -> int:
    """Allocate ``megabytes`` (touched, so resident) and keep it for the
    life of the process, as a leak does; the worker's pid."""
    _kept.append(bytearray(megabytes * 10**6))
    return os.getpid()


def hold_memory(megabytes: int, seconds: float) -> int:
    """Allocate ``megabytes`` and hold it (at most ``seconds``) before
    letting it go; the worker's pid."""
    block = bytearray(megabytes * 10**6)
    time.sleep(seconds)  # (the task's own work: the watch ends it first)
    del block
    return os.getpid()


def set_base(value: str, log: str = "") -> None:
    """An initializer: remember ``value`` for :func:`read_base` (and note
    this process's pid in the file ``log``)."""
    os.environ["SHMP_TEST_BASE"] = value
    if log:
        with open(log, "a") as out:
            out.write(f"{os.getpid()}\n")


def read_base() -> tuple[str | None, int]:
    return os.environ.get("SHMP_TEST_BASE"), os.getpid()


def refuse_to_start(why: str) -> None:
    """An initializer that always fails."""
    raise RuntimeError(f"cannot start: {why}")


def boxed_unless(bad: int, value: int) -> Box:
    """A Box of ``value``; raises for ``bad``."""
    if value == bad:
        raise ValueError(f"{value} is bad")
    return Box(value)


def sum_when(started: str, gate: str, values: Any) -> tuple[int, float]:
    """Leave a file named for this process in the folder ``started``, wait
    for ``gate``, and return the pid and the sum of ``values``."""
    open(os.path.join(started, str(os.getpid())), "w").close()
    gated(gate, 0)
    return os.getpid(), float(values.sum())


@dataclasses.dataclass(frozen=True)
class HoldFd:
    """The settings of :func:`read_to_eof`, a child the zygote forks."""

    fd: int = -1


def read_to_eof(settings: HoldFd) -> int:
    """A zygote child's entry: wait until every writer of ``fd`` closed it."""
    while os.read(settings.fd, 4096):
        pass
    return 0


def spin(pids: str) -> None:
    """Note this process's pid (a line appended to the file ``pids``), then
    spin for ever: only ending the process stops it."""
    with open(pids, "a") as out:
        out.write(f"{os.getpid()}\n")
    while True:
        pass


def flaky(counter: str, fails: int, value: int) -> int:
    """Count this call in the file ``counter``; raise ConnectionError the
    first ``fails`` times, then return ``value``."""
    calls = 0
    if os.path.exists(counter):
        with open(counter) as seen:
            calls = int(seen.read())
    with open(counter, "w") as out:
        out.write(str(calls + 1))
    if calls < fails:
        raise ConnectionError(f"call {calls + 1} failed")
    return value


def started_log(log: str, name: str) -> str:
    """Note ``name`` (a line appended to the file ``log``) as it starts."""
    with open(log, "a") as out:
        out.write(f"{name}\n")
    return name


def hold_gil(pids: str) -> int:
    """Note this process's pid in the file ``pids``, then hold the GIL for
    hours (one C loop): the worker's own loop cannot run meanwhile."""
    with open(pids, "a") as out:
        out.write(f"{os.getpid()}\n")
    return sum(range(10**13))
