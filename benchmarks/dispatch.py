"""shm-pool against ProcessPoolExecutor(8) and multiprocessing.Pool(8).

    python -m benchmarks.dispatch [--runs 3] [--tasks 10000]

Run from the repository root (the workers import this module's tasks).
Each run measures, for each of the three pools of 8 workers:

- start: from nothing to 8 no-op tasks done, one per worker slot;
- round trip: one no-op task submitted and its result back, 500 times
  in a row (p50, p99);
- map: ``--tasks`` no-op tasks through ``map`` (chunksize 1), per second;
- cpu: the wall time of 64 tasks that each burn about 20 ms of CPU;
- memory: the proportional set size (PSS) of an idle worker process.

It prints the median over the runs and each figure's ratio to the peers
(for times, peer / ours: above 1 means shm-pool is faster; for rates and
memory likewise, above 1 means shm-pool is better).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from discovery import list_workers
from pool import Pool

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 8
CPU_TASK_S = 0.02


def noop(x: int = 0) -> int:
    return x


def burn(seconds: float) -> float:
    """Spend ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return seconds


class Executor(Protocol):
    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any: ...
    def map(self, fn: Callable[..., Any], *it: Any, chunksize: int = 1) -> Any: ...


@contextmanager
def shm_pool() -> Iterator[tuple[Executor, list[int]]]:
    embedded = Pool(workers=WORKERS)
    with embedded as client:
        yield client, [w.pid for w in list_workers(embedded.namespace)]


@contextmanager
def process_pool() -> Iterator[tuple[Executor, list[int]]]:
    with concurrent.futures.ProcessPoolExecutor(WORKERS) as executor:
        list(executor.map(noop, range(WORKERS)))  # it starts workers lazily
        yield executor, list(executor._processes)


class _MpAdapter:
    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        return self._pool.apply_async(fn, args)

    def map(self, fn: Callable[..., Any], *it: Any, chunksize: int = 1) -> Any:
        return self._pool.map(fn, *it, chunksize=chunksize)


@contextmanager
def mp_pool() -> Iterator[tuple[Executor, list[int]]]:
    with multiprocessing.Pool(WORKERS) as pool:
        yield _MpAdapter(pool), [p.pid for p in pool._pool]  # type: ignore[attr-defined]


PEERS: dict[str, Callable[[], Any]] = {
    "shm-pool": shm_pool,
    "ProcessPoolExecutor": process_pool,
    "multiprocessing.Pool": mp_pool,
}


def _result(future: Any) -> Any:
    return future.result() if hasattr(future, "result") else future.get()


def measure(make: Callable[[], Any], tasks: int) -> dict[str, float]:
    started = time.perf_counter()
    with make() as (executor, pids):
        list(executor.map(noop, range(WORKERS)))
        start_s = time.perf_counter() - started
        pss_mb = statistics.median(_pss_mb(pid) for pid in pids)
        rtts = []
        for _ in range(500):
            t = time.perf_counter()
            _result(executor.submit(noop, 1))
            rtts.append(time.perf_counter() - t)
        rtts.sort()
        t = time.perf_counter()
        assert list(executor.map(noop, range(tasks))) == list(range(tasks))
        map_rate = tasks / (time.perf_counter() - t)
        t = time.perf_counter()
        list(executor.map(burn, [CPU_TASK_S] * 64))
        cpu_s = time.perf_counter() - t
    return {
        "start_s": start_s,
        "rtt_p50_ms": rtts[len(rtts) // 2] * 1e3,
        "rtt_p99_ms": rtts[int(len(rtts) * 0.99)] * 1e3,
        "map_per_s": map_rate,
        "cpu64_s": cpu_s,
        "pss_mb": pss_mb,
    }


def _pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss for pid {pid}")


LOWER_IS_BETTER = {"start_s", "rtt_p50_ms", "rtt_p99_ms", "cpu64_s", "pss_mb"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=10_000)
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = str(ROOT)  # the workers import this module
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in PEERS}
    for i in range(args.runs):
        names = list(PEERS)
        order = names[i % len(names) :] + names[: i % len(names)]  # none always first
        for name in order:
            runs[name].append(measure(PEERS[name], args.tasks))
    median = {
        name: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for name, results in runs.items()
    }
    ours = median["shm-pool"]
    print(f"{WORKERS} workers each, median of {args.runs} runs; ratio = how many")
    print("times better shm-pool is (peer/ours for times and memory)\n")
    peers = [name for name in PEERS if name != "shm-pool"]
    print("| figure | shm-pool | " + " | ".join(f"{p} | ratio" for p in peers) + " |")
    print("|---|--:|" + "--:|--:|" * len(peers))
    for key, value in ours.items():
        cells = [f"{value:.3g}"]
        for peer in peers:
            theirs = median[peer][key]
            ratio = theirs / value if key in LOWER_IS_BETTER else value / theirs
            cells += [f"{theirs:.3g}", f"{ratio:.2f}x"]
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
