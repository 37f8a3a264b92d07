"""Task functions of the data-plane tests (importable as tests.support.data_tasks):
they describe what a worker received, and return large values."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.sample_tasks import gated


def identity(value: Any) -> Any:
    return value


def describe(value: Any) -> dict[str, Any]:
    """What a value is, as the tests compare it with ProcessPoolExecutor's."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, np.ndarray):
        flags = value.flags
        return {
            "type": kind,
            "dtype": value.dtype.descr if value.dtype.names else value.dtype.str,
            "shape": value.shape,
            "strides": value.strides,
            "flags": (
                flags.c_contiguous,
                flags.f_contiguous,
                flags.writeable,
                flags.aligned,
            ),
        }
    if hasattr(value, "dtypes"):  # a pandas DataFrame
        return {
            "type": kind,
            "dtypes": [str(d) for d in value.dtypes],
            "shape": value.shape,
            "index": type(value.index).__name__,
            "writeable": [value[c].to_numpy().flags.writeable for c in value.columns],
        }
    if hasattr(value, "__len__"):
        return {"type": kind, "len": len(value)}
    return {"type": kind, "repr": repr(value)}


def total(a: np.ndarray) -> float:
    return float(a.sum())


def ones(n: int) -> np.ndarray:
    return np.ones(n)


def double(a: np.ndarray) -> np.ndarray:
    return a * 2


def mapping_of(address: int) -> tuple[str, int]:
    """The file mapped at ``address`` in this process (``/proc/self/maps``)
    and the private dirty bytes of that mapping (``smaps``)."""
    found, dirty = "", -1
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                start, end = (int(x, 16) for x in head[0].split("-"))
                inside = start <= address < end
                if inside:
                    found = head[5] if len(head) > 5 else ""
            elif inside and head[0] == "Private_Dirty:":
                dirty = int(head[1]) * 1024
    return found, dirty


def write_in_place(a: np.ndarray) -> dict[str, Any]:
    """Where the argument lies, whether it is writable, and what a write
    of one element costs: the private pages the mapping has after it."""
    address = a.__array_interface__["data"][0]
    path, before = mapping_of(address)
    a[0] = -1.0
    _, after = mapping_of(address)
    return {
        "path": path,
        "writeable": a.flags.writeable,
        "dirty_before": before,
        "dirty_after": after,
        "first": float(a[0]),
    }


def sum_when(gate: str, a: np.ndarray) -> float:
    """``a.sum()`` once the file ``gate`` exists (a test holds the task)."""
    gated(gate, 0)
    return float(a.sum())


def first_when(gate: str, a: np.ndarray) -> float:
    gated(gate, 0)
    return float(a[0])


def mapped_then_gated(started: str, gate: str, a: np.ndarray) -> float:
    """Say (the file ``started``, holding this worker's pid) that the
    argument is mapped, then wait for ``gate``; its sum."""
    _say_pid(started)
    gated(gate, 0)
    return float(a.sum())


def pid_then_ones(said: str, n: int) -> np.ndarray:
    """Leave this worker's pid in the file ``said``, then return n ones."""
    _say_pid(said)
    return np.ones(n)


def ones_when(gate: str, n: int) -> np.ndarray:
    gated(gate, 0)
    return np.ones(n)


def _say_pid(path: str) -> None:
    """Write this process's pid into ``path`` whole (through a rename)."""
    part = f"{path}.part"
    Path(part).write_text(str(os.getpid()))
    os.replace(part, path)
