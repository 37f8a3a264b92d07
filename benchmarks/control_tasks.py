"""The calls of :mod:`benchmarks.control`, in a module every pool it
measures imports by name (ours, pebble's, the standard library's)."""

from __future__ import annotations

import os
import time


def wait_for(flag: str, started: str = "") -> bool:
    """Hold a worker until the file ``flag`` exists (saying so first, in
    the file ``started``, if given)."""
    if started:
        open(started, "w").close()
    while not os.path.exists(flag):
        time.sleep(0.002)
    return True


def mark(path: str) -> int:
    """Leave the file ``path``: the call ran."""
    open(path, "w").close()
    return os.getpid()


def spin() -> None:
    """Burn a core for ever: only ending the process stops it."""
    while True:
        pass


def nop(x: int = 0) -> int:
    return x


def started(log: str, name: str) -> str:
    """Note ``name`` in the file ``log`` as the call starts."""
    with open(log, "a") as out:
        out.write(f"{name}\n")
    return name


_calls: dict[str, int] = {}  # by caller's key, in this worker


def fails_until(key: str, fails: int) -> int:
    """Raise ConnectionError the first ``fails`` calls of ``key`` in this
    process (a retry runs in the same worker), then return how many calls it
    took."""
    calls = _calls[key] = _calls.get(key, 0) + 1
    if calls <= fails:
        raise ConnectionError(f"call {calls} failed")
    return calls


def meet(directory: str, me: str, other: str) -> str:
    """Wait until ``other`` has started too: both run at once."""
    open(os.path.join(directory, me), "w").close()
    while not os.path.exists(os.path.join(directory, other)):
        time.sleep(0.001)
    return me
