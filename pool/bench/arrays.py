"""The large-data tasks of ``pool bench`` and ``benchmarks/bigdata.py``
(:mod:`pool.bench.bigdata`), importable by every peer's workers; numpy is
imported by the first that runs."""

from __future__ import annotations

from typing import Any


def total(a: Any) -> float:
    """An argument only: its sum."""
    return float(a.sum())


def ones(n: int) -> Any:
    """A result only: ``n`` float64 ones."""
    import numpy as np

    return np.ones(n)


def double(a: Any) -> Any:
    """An argument in, a result as large out."""
    return a * 2
