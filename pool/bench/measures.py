"""How ``pool bench`` takes each figure of one pool (see
``benchmarks/README.md``): start, round trips, throughput, CPU-bound
work, memory and the replacement of a killed worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import uvloop

from discovery import Subscriber, list_workers
from pool.bench.pools import Executor, MpAdapter, MpFuture
from pool.bench.tasks import burn, noop
from pool.client.executor import Client

CPU_TASK_S: Final = 0.02
CPU_TASKS: Final = 64
CPU_WORKERS: Final = 2
RTT_SAMPLES: Final = 500
IN_FLIGHT: Final = 256


def start(open_pool: Callable[[], Any]) -> float:
    started = time.perf_counter()
    with open_pool() as (executor, _):
        executor.submit(noop).result()
        return time.perf_counter() - started


def rtt_ms(executor: Executor, samples: int = RTT_SAMPLES) -> float:
    return statistics.median(round_trips_ms(executor, samples))


def round_trips_ms(executor: Executor, samples: int) -> list[float]:
    """``samples`` no-op round trips, one after another (ms each)."""
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        executor.submit(noop, 1).result()
        times.append((time.perf_counter() - started) * 1e3)
    return times


async def async_round_trips_ms(
    call: Callable[[], Awaitable[object]], samples: int
) -> list[float]:
    """``samples`` calls of ``call`` awaited one after another (ms each)."""
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1e3)
    return times


def submit_rate(executor: Executor, tasks: int) -> float:
    room = threading.BoundedSemaphore(IN_FLIGHT)
    started = time.perf_counter()
    futures = []
    for i in range(tasks):
        room.acquire()
        if isinstance(executor, MpAdapter):  # (its results take callbacks)
            done = lambda _: room.release()  # noqa: E731
            futures.append(MpFuture(executor.pool.apply_async(noop, (i,), {}, done)))
        else:
            future = executor.submit(noop, i)
            future.add_done_callback(lambda _: room.release())
            futures.append(future)
    for future in futures:
        future.result()
    return tasks / (time.perf_counter() - started)


# ProcessPoolExecutor.map's chunksize where the peers chunk (theirs is 1
# by default); multiprocessing.Pool.map picks its own (n / (4 x workers)).
PEER_CHUNKSIZE: Final = 1000


def map_rate(executor: Executor, tasks: int, *, chunked: bool) -> float:
    """Calls a second through ``map``: ours with its defaults; the peers
    chunked (``chunked``: ``Pool.map`` with its own chunks, and
    ``ProcessPoolExecutor.map(chunksize=PEER_CHUNKSIZE)``) or with theirs
    (``Pool.imap``, chunksize 1, and ``ProcessPoolExecutor.map``)."""
    calls = range(tasks)
    started = time.perf_counter()
    if isinstance(executor, MpAdapter):
        pool = executor.pool
        results = pool.map(noop, calls) if chunked else pool.imap(noop, calls)
    elif (  # (a peer's: ours keeps its defaults)
        chunked
        and isinstance(executor, concurrent.futures.Executor)
        and not isinstance(executor, Client)
    ):
        results = executor.map(noop, calls, chunksize=PEER_CHUNKSIZE)
    else:
        results = executor.map(noop, calls)
    count = sum(1 for _ in results)
    elapsed = time.perf_counter() - started
    assert count == tasks
    return tasks / elapsed


def cpu_ratio(open_pool: Callable[[], Any]) -> float:
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


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (children, theirs, and so on)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                found += [int(child), *descendants(int(child))]
    return found


def extra_worker_mb(make: Callable[[int], Any], workers: int) -> float:
    """What each worker past ``workers`` adds to the PSS of every process
    this one started (pool processes, their zygote, helpers): the pool's
    total at twice ``workers`` less its total at ``workers``, per worker.
    Shared pages count once in a total, however many share them."""
    totals = []
    for size in (workers, 2 * workers):
        with make(size) as (executor, _):
            executor.submit(noop).result()
            total = 0.0
            for pid in descendants(os.getpid()):
                with contextlib.suppress(OSError, RuntimeError):
                    total += pss_mb(pid)
            totals.append(total)
    return (totals[1] - totals[0]) / workers


def pool_up_ready(workers: int) -> float:
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


def replacement_ms(namespace: str, kills: int) -> float:
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
