"""Large data through each pool, side by side: the figures of
``benchmarks/bigdata.py`` and the large-data rows of ``pool bench --peers``
(see ``benchmarks/README.md``).

Peers, each with as many workers and the same tasks
(:mod:`pool.bench.arrays`, numpy float64 arrays): shm-pool (an embedded
:class:`~pool.Pool`), ``ProcessPoolExecutor``, loky as joblib runs it
(``joblib.executor.get_memmapping_executor``: arrays over 1 MB are memory
mapped from a file) and Ray (``ray.init(num_cpus=workers)``: its object
store is shared memory); loky and Ray when they are installed (the
``bench`` extra). Each figure is one task at a time, its value dropped
before the next, timed ``runs`` times after one untimed call; the median.
Beside them, the floor: a memcpy of the same bytes into memory already
written (``numpy.copyto``), in the same run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

from pool.bench import arrays

MB: Final = 10**6
OURS: Final = "shm-pool"
PEERS: Final = ("ProcessPoolExecutor", "loky", "Ray")


class Runner(Protocol):
    """One pool, through the calls the figures make."""

    def call(self, fn: Callable[..., Any], arg: Any) -> Any: ...
    def fan_out(self, fn: Callable[..., Any], arg: Any, n: int) -> list[Any]: ...


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    task: Callable[..., Any]
    sends_array: bool  # (else it sends the length, and gets an array back)


SCENARIOS: Final = (
    Scenario("arg", "argument only (`a.sum()`)", arrays.total, True),
    Scenario("res", "result only (`np.ones(n)`)", arrays.ones, False),
    Scenario("inout", "in and out (`a * 2`)", arrays.double, True),
)


class ExecutorRunner:
    """A ``concurrent.futures`` executor as a :class:`Runner`."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor

    def call(self, fn: Callable[..., Any], arg: Any) -> Any:
        return self.executor.submit(fn, arg).result()

    def fan_out(self, fn: Callable[..., Any], arg: Any, n: int) -> list[Any]:
        return list(self.executor.map(fn, [arg] * n))


class _Ray:
    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self._remote: dict[Callable[..., Any], Any] = {}

    def _task(self, fn: Callable[..., Any]) -> Any:
        if fn not in self._remote:
            self._remote[fn] = self.ray.remote(fn)
        return self._remote[fn]

    def call(self, fn: Callable[..., Any], arg: Any) -> Any:
        return self.ray.get(self._task(fn).remote(arg))

    def fan_out(self, fn: Callable[..., Any], arg: Any, n: int) -> list[Any]:
        return list(self.ray.get([self._task(fn).remote(arg) for _ in range(n)]))

    def fan_out_put(self, fn: Callable[..., Any], arg: Any, n: int) -> list[Any]:
        ref = self.ray.put(arg)
        return list(self.ray.get([self._task(fn).remote(ref) for _ in range(n)]))


class _Ours(ExecutorRunner):
    def fan_out_put(self, fn: Callable[..., Any], arg: Any, n: int) -> list[Any]:
        ref = self.executor.put(arg)
        return list(self.executor.map(fn, [ref] * n))


def available(name: str) -> bool:
    module = {"loky": "joblib", "Ray": "ray"}.get(name)
    return module is None or importlib.util.find_spec(module) is not None


@contextlib.contextmanager
def opened(name: str, workers: int) -> Iterator[Runner]:
    """The pool ``name`` with ``workers`` workers, started."""
    if name == OURS:
        from pool.client.embedded import Pool

        with Pool(workers=workers) as client:
            yield _Ours(client)
    elif name == "ProcessPoolExecutor":
        with concurrent.futures.ProcessPoolExecutor(workers) as executor:
            yield ExecutorRunner(executor)
    elif name == "loky":
        from joblib.executor import get_memmapping_executor

        executor = get_memmapping_executor(workers)
        try:
            yield ExecutorRunner(executor)
        finally:
            executor.shutdown(wait=True)
    else:
        import ray

        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        try:
            yield _Ray(ray)
        finally:
            ray.shutdown()


def array(nbytes: int) -> Any:
    import numpy as np

    return np.random.default_rng(nbytes).random(nbytes // 8)


def timed(
    runner: Runner, scenario: Scenario, nbytes: int, runs: int, a: Any = None
) -> float:
    """The median time of one task of ``scenario`` on ``nbytes``, its value
    dropped before the next (one untimed call first)."""
    arg = (array(nbytes) if a is None else a) if scenario.sends_array else nbytes // 8
    runner.call(scenario.task, arg)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        value = runner.call(scenario.task, arg)
        times.append(time.perf_counter() - started)
        del value
    return statistics.median(times)


def memcpy_s(nbytes: int, runs: int) -> float:
    """The floor: a copy of ``nbytes`` into memory already written."""
    import numpy as np

    source = array(nbytes)
    target = np.empty_like(source)
    target[:] = 0
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def fan_out_s(runner: Any, a: Any, n: int, runs: int, *, put: bool) -> float:
    """The median time of ``n`` tasks reading one array: ``map`` over
    ``[a] * n``, or (``put``: shm-pool and Ray) the array stored once, then
    ``n`` tasks."""
    go = runner.fan_out_put if put else runner.fan_out
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        go(arrays.total, a, n)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def fan_out_memory(a: Any, n: int, workers: int, *, put: bool) -> float:
    """In a fresh shm-pool: this process's peak RSS growth plus the most its
    namespace held in /dev/shm, while ``n`` tasks read ``a``; over one copy
    of ``a``."""
    from discovery import paths
    from pool.client.embedded import Pool
    from workers.protocol import owners

    with Pool(workers=workers) as client:
        runner = _Ours(client)
        runner.call(arrays.total, a[:1])
        key = paths.segment_name(client.namespace)
        peak, done = [0], threading.Event()

        def sample() -> None:
            while not done.wait(0.001):
                peak[0] = max(peak[0], owners.used_bytes(key))

        before = _status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # (VmHWM, the peak RSS, starts again from now)
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            fan_out_s(runner, a, n, 1, put=put)
        finally:
            done.set()
            sampler.join()
        grown = max(0, _status_kb("VmHWM") - before) * 1024
        return float((grown + peak[0]) / a.nbytes)


# -- the large-data rows of `pool bench --peers` -------------------------------

BENCH_WORKERS: Final = 2
BENCH_BYTES: Final = 256 * MB
FAN_OUT_BYTES: Final = 128 * MB
FAN_OUT_TASKS: Final = 16


def bench(workers: int, runs: int) -> dict[str, dict[str, float]]:
    """Seconds, by pool then figure: the three scenarios at 256 MB, and a
    128 MB array to 16 tasks (put once where the pool can, else ``map``)."""
    names = [OURS, *(p for p in PEERS if available(p))]
    a = array(FAN_OUT_BYTES)
    results: dict[str, dict[str, float]] = {}
    for name in names:
        with opened(name, workers) as runner:
            figures = {s.key: timed(runner, s, BENCH_BYTES, runs) for s in SCENARIOS}
            fan = max(1, runs // 2)
            figures["map"] = fan_out_s(runner, a, FAN_OUT_TASKS, fan, put=False)
            if hasattr(runner, "fan_out_put"):
                figures["put"] = fan_out_s(runner, a, FAN_OUT_TASKS, fan, put=True)
        results[name] = figures
    return results


def bench_table(results: dict[str, dict[str, float]], workers: int, runs: int) -> Any:
    """The rows as a rich Table: seconds, and each peer's time over ours."""
    from rich.table import Table

    peers = [name for name in results if name != OURS]
    grid = Table(
        title=f"large data (numpy float64), {workers} workers each, one task at a "
        f"time, median of {runs}; ratio: the peer's time over ours",
        title_justify="left",
    )
    grid.add_column("figure")
    for name in (OURS, *peers):
        grid.add_column(name, justify="right")
        if name != OURS:
            grid.add_column("ratio", justify="right")
    rows = [(s.key, f"{BENCH_BYTES // MB} MB {s.label}") for s in SCENARIOS]
    fan = f"{FAN_OUT_BYTES // MB} MB to {FAN_OUT_TASKS} tasks"
    rows += [("put", f"{fan}: put once"), ("map", f"{fan}: map over \\[a] * n")]
    ours = results[OURS]
    for key, label in rows:
        row = [label, f"{ours[key]:.3f} s"]
        for peer in peers:
            theirs = results[peer].get(key)
            row += (
                ["-", ""]
                if theirs is None
                else [f"{theirs:.3f} s", f"{theirs / ours[key]:.1f}x"]
            )
        grid.add_row(*row)
    missing = [p for p in PEERS if p not in results]
    grid.caption = (
        "loky: joblib's memmapping executor; Ray: ray.init(num_cpus=workers)"
        + (
            f"; not installed: {', '.join(missing)} (the `bench` extra)"
            if missing
            else ""
        )
    )
    return grid
