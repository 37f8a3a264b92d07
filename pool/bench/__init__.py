"""``pool bench``: the standard benchmark set, with its peers, as ratios.

Each figure is measured for shm-pool and (with ``--peers``) for
``ProcessPoolExecutor`` and ``multiprocessing.Pool`` with as many workers,
in the same run, ``--runs`` times (the order of the pools rotates); the
table shows medians and each peer's ratio. See ``benchmarks/README.md``
for what each figure means and how it is taken.

Without ``--namespace`` it starts a pool inside this process
(:class:`~pool.Pool`); with one, it uses that running pool, and skips what
needs a pool of its own (start, replacement and the CPU-bound figure).
The tasks are in :mod:`pool.bench.tasks`, which a worker imports fast.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import uvloop
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from discovery import Subscriber, list_workers
from pool.bench import floor
from pool.bench.tasks import burn, noop
from pool.client.embedded import Pool
from pool.client.executor import Client

CPU_TASK_S: Final = 0.02
CPU_TASKS: Final = 64
CPU_WORKERS: Final = 2
RTT_SAMPLES: Final = 500
IN_FLIGHT: Final = 256


class Executor(Protocol):
    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any: ...
    def map(self, fn: Callable[..., Any], *it: Any) -> Any: ...


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    lower_is_better: bool


FIGURES: Final = [
    Figure("start", "start, to the first result", "s", True),
    Figure("up", "`pool up` to ready", "s", True),
    Figure("rtt", "round trip p50", "ms", True),
    Figure("floor", "floor: 2 raw gRPC hops p50", "ms", True),
    Figure("submit", f"submit, {IN_FLIGHT} in flight", "/s", False),
    Figure("map", "map, defaults", "/s", False),
    Figure(
        "cpu",
        f"{CPU_TASKS} x {CPU_TASK_S * 1e3:g} ms CPU, {CPU_WORKERS} workers",
        "x ideal",
        True,
    ),
    Figure("pss", "PSS per idle worker", "MB", True),
    Figure("extra", "PSS per extra idle worker", "MB", True),
    Figure("replace", "kill to replacement p50", "ms", True),
]


# -- the pools ------------------------------------------------------------------


class _MpAdapter:
    """``multiprocessing.Pool`` through the calls the set makes."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        return _MpFuture(self.pool.apply_async(fn, args))

    def map(self, fn: Callable[..., Any], *it: Any) -> Any:
        return self.pool.imap(fn, *it)


class _MpFuture:
    def __init__(self, result: Any) -> None:
        self._result = result

    def result(self) -> Any:
        return self._result.get()


@contextmanager
def _ours(workers: int, namespace: str | None) -> Iterator[tuple[Executor, list[int]]]:
    if namespace is not None:
        with Client(namespace) as client:
            yield client, [w.pid for w in list_workers(namespace)]
        return
    embedded = Pool(workers=workers)
    with embedded as client:
        yield client, [w.pid for w in list_workers(embedded.namespace)]


@contextmanager
def _process_pool(workers: int) -> Iterator[tuple[Executor, list[int]]]:
    with concurrent.futures.ProcessPoolExecutor(workers) as executor:
        list(executor.map(noop, range(workers)))  # it starts workers lazily
        yield executor, list(executor._processes)


@contextmanager
def _mp_pool(workers: int) -> Iterator[tuple[Executor, list[int]]]:
    with multiprocessing.Pool(workers) as pool:
        yield _MpAdapter(pool), [p.pid for p in pool._pool]  # type: ignore[attr-defined]


OURS: Final = "shm-pool"
PEERS: Final = ("ProcessPoolExecutor", "mp.Pool")


def _opener(
    name: str, workers: int, namespace: str | None
) -> Callable[[], AbstractContextManager[tuple[Executor, list[int]]]]:
    if name == OURS:
        return lambda: _ours(workers, namespace)
    if name == PEERS[0]:
        return lambda: _process_pool(workers)
    return lambda: _mp_pool(workers)


# -- the figures ------------------------------------------------------------------


def _start(open_pool: Callable[[], Any]) -> float:
    started = time.perf_counter()
    with open_pool() as (executor, _):
        executor.submit(noop).result()
        return time.perf_counter() - started


def rtt_ms(executor: Executor) -> float:
    times = []
    for _ in range(RTT_SAMPLES):
        started = time.perf_counter()
        executor.submit(noop, 1).result()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def submit_rate(executor: Executor, tasks: int) -> float:
    room = threading.BoundedSemaphore(IN_FLIGHT)
    started = time.perf_counter()
    futures = []
    for i in range(tasks):
        room.acquire()
        if isinstance(executor, _MpAdapter):  # (its results take callbacks)
            done = lambda _: room.release()  # noqa: E731
            futures.append(_MpFuture(executor.pool.apply_async(noop, (i,), {}, done)))
        else:
            future = executor.submit(noop, i)
            future.add_done_callback(lambda _: room.release())
            futures.append(future)
    for future in futures:
        future.result()
    return tasks / (time.perf_counter() - started)


def _map_rate(executor: Executor, tasks: int) -> float:
    started = time.perf_counter()
    count = sum(1 for _ in executor.map(noop, range(tasks)))
    elapsed = time.perf_counter() - started
    assert count == tasks
    return tasks / elapsed


def _cpu_ratio(open_pool: Callable[[], Any]) -> float:
    with open_pool() as (executor, _):
        started = time.perf_counter()
        list(executor.map(burn, [CPU_TASK_S] * CPU_TASKS))
        elapsed = time.perf_counter() - started
    ideal = CPU_TASKS * CPU_TASK_S / min(CPU_WORKERS, os.cpu_count() or 1)
    return elapsed / ideal


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss for pid {pid}")


def _descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                found += [int(child), *_descendants(int(child))]
    return found


def _extra_worker_mb(make: Callable[[int], Any], workers: int) -> float:
    """What each worker past ``workers`` adds to the PSS of every process
    this one started (pool processes, their zygote, helpers): the pool's
    total at twice ``workers`` less its total at ``workers``, per worker.
    Shared pages count once in a total, however many share them."""
    totals = []
    for size in (workers, 2 * workers):
        with make(size) as (executor, _):
            executor.submit(noop).result()
            total = 0.0
            for pid in _descendants(os.getpid()):
                with contextlib.suppress(OSError, RuntimeError):
                    total += pss_mb(pid)
            totals.append(total)
    return (totals[1] - totals[0]) / workers


def _pool_up_ready(workers: int) -> float:
    namespace = f"bench-{os.getpid()}-{random.randrange(1 << 30):x}"
    started = time.perf_counter()
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pool",
            "up",
            "-n",
            namespace,
            "--workers",
            str(workers),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if line.startswith("ready "):
                return time.perf_counter() - started
        raise RuntimeError("pool up ended before it was ready")
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=60)


def _replacement_ms(namespace: str, kills: int) -> float:
    """SIGKILL a worker, then time until its replacement is registered, as
    seen by a subscriber in this process."""

    async def measure() -> list[float]:
        events = aiter(Subscriber(namespace))
        times = []
        try:
            live = {w.pid for w in list_workers(namespace)}
            seen = 0
            while seen < len(live):  # the adds of the workers already there
                seen += (await anext(events)).type == "worker-added"
            for _ in range(kills):
                victim = random.choice(sorted(live))
                started = time.monotonic()
                os.kill(victim, signal.SIGKILL)
                async with asyncio.timeout(30):
                    while True:
                        event = await anext(events)
                        if event.type == "worker-added":
                            break
                times.append(time.monotonic() - started)
                live.discard(victim)
                live.add(event.worker_info.pid)
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        return times

    return statistics.median(uvloop.run(measure())) * 1e3


# -- the run ------------------------------------------------------------------------


@dataclass
class Settings:
    workers: int = 8
    runs: int = 3
    tasks: int = 100_000
    submit_tasks: int = 20_000
    kills: int = 10
    namespace: str | None = None
    peers: bool = False


def run(settings: Settings, console: Console) -> dict[str, dict[str, float]]:
    """Every figure for every pool: the median over the runs."""
    names = [OURS, *(PEERS if settings.peers else ())]
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in names}

    def note(name: str, key: str, value: float) -> None:
        samples[name].setdefault(key, []).append(value)

    own_pool = settings.namespace is None
    steps_per_pool = 5 + (3 if own_pool else 0)
    total = settings.runs * (len(names) * steps_per_pool + 1 + own_pool * 2)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("benchmarking", total=total)

        def step(text: str) -> None:
            progress.update(bar, description=text)

        for run_index in range(settings.runs):
            order = names[run_index % len(names) :] + names[: run_index % len(names)]
            for name in order:
                open_pool = _opener(name, settings.workers, settings.namespace)
                if own_pool:
                    step(f"{name}: start")
                    note(name, "start", _start(open_pool))
                    progress.advance(bar)
                step(f"{name}: round trips")
                with open_pool() as (executor, pids):
                    executor.submit(noop).result()
                    note(name, "pss", statistics.median(pss_mb(p) for p in pids))
                    progress.advance(bar)
                    note(name, "rtt", rtt_ms(executor))
                    progress.advance(bar)
                    step(f"{name}: submit, {IN_FLIGHT} in flight")
                    note(name, "submit", submit_rate(executor, settings.submit_tasks))
                    progress.advance(bar)
                    step(f"{name}: map of {settings.tasks:,}")
                    note(name, "map", _map_rate(executor, settings.tasks))
                    progress.advance(bar)
                    if name == OURS and own_pool:
                        step(f"{name}: killed workers replaced")
                        namespace = executor.namespace  # type: ignore[attr-defined]
                        note(
                            name, "replace", _replacement_ms(namespace, settings.kills)
                        )
                progress.advance(bar)
                if own_pool:
                    step(f"{name}: memory per extra worker")
                    sized = lambda n, name=name: _opener(name, n, None)()  # noqa: E731
                    note(name, "extra", _extra_worker_mb(sized, settings.workers))
                    progress.advance(bar)
                    step(f"{name}: CPU-bound on {CPU_WORKERS} workers")
                    note(name, "cpu", _cpu_ratio(_opener(name, CPU_WORKERS, None)))
                    progress.advance(bar)
            step("floor: two raw gRPC hops")
            note(OURS, "floor", statistics.median(floor.measure(RTT_SAMPLES)) * 1e3)
            progress.advance(bar)
            if own_pool:
                step("pool up until ready")
                note(OURS, "up", _pool_up_ready(settings.workers))
                progress.advance(bar, 2)
    return {
        name: {key: statistics.median(values) for key, values in figures.items()}
        for name, figures in samples.items()
    }


def ratio(figure: Figure, ours: float, theirs: float) -> float:
    """How many times better shm-pool is than a peer on ``figure``."""
    return theirs / ours if figure.lower_is_better else ours / theirs


def table(results: dict[str, dict[str, float]], settings: Settings) -> Table:
    peers = [name for name in results if name != OURS]
    pool = (
        f"{settings.workers} workers"
        if settings.namespace is None
        else f"the pool of namespace {settings.namespace!r}"
    )
    title = (
        f"{pool}, median of {settings.runs} run(s); "
        "ratio: how many times better shm-pool is"
    )
    grid = Table(title=title, title_justify="left")
    grid.add_column("figure")
    grid.add_column(OURS, justify="right")
    for peer in peers:
        grid.add_column(peer, justify="right")
        grid.add_column("ratio", justify="right")
    ours = results[OURS]
    for figure in FIGURES:
        if figure.key not in ours:
            continue
        row = [f"{figure.label} ({figure.unit})", _number(ours[figure.key])]
        for peer in peers:
            theirs = results[peer].get(figure.key)
            if theirs is None:
                row += ["-", ""]
            else:
                row += [
                    _number(theirs),
                    f"{ratio(figure, ours[figure.key], theirs):.2f}x",
                ]
        grid.add_row(*row)
    notes = ["tasks are no-ops but for the CPU row"]
    if peers:
        notes.append("mp.Pool is multiprocessing.Pool, and its map row is imap")
    if "floor" in ours and "rtt" in ours:
        notes.append(f"round trip / floor: {ours['rtt'] / ours['floor']:.2f}x")
    grid.caption = "; ".join(notes)
    return grid


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def chart(results: dict[str, dict[str, float]], path: str) -> None:
    """A bar chart of each peer's ratio per figure (needs the `bench` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(
            "--chart needs matplotlib: pip install 'shm-pool[bench]'"
        ) from None
    peers = [name for name in results if name != OURS]
    if not peers:
        raise SystemExit("--chart compares with peers: add --peers")
    ours = results[OURS]
    figures = [f for f in FIGURES if f.key in ours and f.key in results[peers[0]]]
    fig, axes = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        values = [ratio(f, ours[f.key], results[peer][f.key]) for f in figures]
        positions = [x + i * width for x in range(len(figures))]
        axes.bar(positions, values, width, label=f"vs {peer}")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks([x + width * (len(peers) - 1) / 2 for x in range(len(figures))])
    axes.set_xticklabels([f.key for f in figures])
    axes.set_ylabel("times better (shm-pool / peer)")
    axes.set_yscale("log")
    axes.legend()
    fig.tight_layout()
    fig.savefig(path)
