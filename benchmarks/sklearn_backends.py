"""joblib on the pool (``pool.joblib``) beside joblib's default, loky.

    python -m benchmarks.sklearn_backends [--runs 5] [--workers N]

Each run times, on each backend in turn (the order alternates from run to
run), with ``n_jobs=-1`` on N workers (default: one per CPU):

- ``GridSearchCV(SVC(), 6 candidates, cv=5)`` on 1,000 samples (30 fits);
- ``Parallel(n_jobs=-1)(delayed(math.sqrt)(i) for i in range(100_000))``, joblib's
  auto-batching (many tiny calls: the cost of a batch's round trip);
- 32 calls each given the same 16 MiB array (``a.sum()``): what crossing
  to a worker costs a large argument (loky memory-maps it to a file; the
  pool writes it to shared memory once).

Both backends' workers are started before the first timed call (loky's
reusable executor, the pool's ``Pool``), so no start is timed. Prints the
median of each, and loky's time over ours (above 1: the pool is faster).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import numpy as np
from joblib import Parallel, delayed, parallel_config

import pool.joblib
from pool import Pool


def _grid() -> None:
    from sklearn.datasets import make_classification
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    X, y = make_classification(n_samples=1000, n_features=20, random_state=0)
    grid = {"C": [0.1, 1, 10], "gamma": ["scale", 0.01]}
    GridSearchCV(SVC(), grid, cv=5, n_jobs=-1).fit(X, y)


def _tiny() -> None:
    Parallel(n_jobs=-1)(delayed(math.sqrt)(i) for i in range(100_000))


_ARRAY = np.random.default_rng(0).random(2 * 2**20)  # 16 MiB


def _large() -> None:
    Parallel(n_jobs=-1)(delayed(np.sum)(_ARRAY) for _ in range(32))


CASES: dict[str, Callable[[], None]] = {
    "GridSearchCV, 30 fits": _grid,
    "100,000 tiny calls": _tiny,
    "32 calls of a 16 MiB array": _large,
}


def _timed(case: Callable[[], None]) -> float:
    started = time.perf_counter()
    case()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    times: dict[tuple[str, str], list[float]] = {}
    with Pool(workers=args.workers) as client:
        # (a parallel_config takes effect when made: one per block)
        backends: dict[str, Callable[[], Any]] = {
            "loky": lambda: parallel_config(backend="loky", n_jobs=args.workers),
            "shm-pool": lambda: parallel_config(
                backend=pool.joblib.BACKEND, client=client
            ),
        }
        for configured in backends.values():  # (both warm: workers started)
            with configured():
                _tiny()
        for run in range(args.runs):
            order = list(backends) if run % 2 == 0 else list(reversed(backends))
            for name in order:
                with backends[name]():
                    for case_name, case in CASES.items():
                        times.setdefault((case_name, name), []).append(_timed(case))
    print(f"median of {args.runs} runs, {args.workers} workers, n_jobs=-1")
    print(f"{'case':32} {'loky (s)':>10} {'shm-pool (s)':>13} {'loky/ours':>10}")
    for case_name in CASES:
        loky = statistics.median(times[case_name, "loky"])
        ours = statistics.median(times[case_name, "shm-pool"])
        print(f"{case_name:32} {loky:10.3f} {ours:13.3f} {loky / ours:9.2f}x")


if __name__ == "__main__":
    main()
