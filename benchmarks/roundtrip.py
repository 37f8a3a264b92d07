"""Where a round trip's time goes: the floor, ``AsyncClient``, ``Client``.

    python -m benchmarks.roundtrip [--runs 3] [--samples 500]

In one process, each run: the floor (two raw grpc.aio hops through three
processes, :mod:`pool.bench.floor`), then one no-op submitted and awaited
``--samples`` times in a row through an :class:`~pool.AsyncClient` (no
thread hop: the caller is on the client's loop; in a process of its own,
since gRPC's asyncio poller serves one loop a process) and through a
:class:`~pool.Client` (the caller's thread hands each task to the client's
loop thread and waits for its future), on one ``Pool(workers=8)``. Prints
each run's medians and the differences that make the budget of
``benchmarks/README.md``: ``AsyncClient`` over the floor (the dispatcher's
and the worker's work) and ``Client`` over ``AsyncClient`` (the thread
hop); then the CPU time each process spent per round trip, the floor's
three (client, relay, echo) beside ours (``AsyncClient``, dispatcher,
workers): with one task in flight, a process's share of a round trip is
its CPU time and its wake-ups.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import uvloop

from pool import AsyncClient, Client, Pool
from pool.bench import floor
from pool.bench.measures import async_round_trips_ms, descendants, rtt_ms
from pool.bench.proc import cpu_s
from pool.bench.tasks import noop


async def _async_rtt(namespace: str, samples: int) -> tuple[float, float]:
    """The median round trip (ms), and this process's CPU per one (µs)."""
    async with AsyncClient(namespace) as client:
        await client.submit(noop, 1)
        cpu = time.process_time()
        times = await async_round_trips_ms(lambda: client.submit(noop, 1), samples)
        cpu = time.process_time() - cpu
    return statistics.median(times), cpu / samples * 1e6


def _pool_pids() -> dict[str, list[int]]:
    """The pids of this process's pool: its dispatcher, its workers."""
    found: dict[str, list[int]] = {"dispatcher": [], "workers": []}
    for pid in descendants(os.getpid()):
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"pool.dispatcher.server" in command:
            found["dispatcher"].append(pid)
        elif b"workers.process" in command:
            found["workers"].append(pid)
    return found


def _async_in_own_process(namespace: str, samples: int) -> dict[str, float]:
    """An ``AsyncClient``'s round trip (ms) and the CPU µs per round trip of
    it and of the pool's processes."""
    pids = _pool_pids()
    before = {name: sum(map(cpu_s, group)) for name, group in pids.items()}
    argv = [sys.executable, "-m", "benchmarks.roundtrip", "--async-rtt", namespace]
    argv += ["--samples", str(samples)]
    out = subprocess.run(argv, check=True, capture_output=True).stdout.split()
    figures = {"rtt": float(out[0]), "client": float(out[1])}
    for name, group in pids.items():
        figures[name] = (sum(map(cpu_s, group)) - before[name]) / samples * 1e6
    return figures


def _one_run(client: Client, namespace: str, samples: int) -> str:
    cpu: dict[str, float] = {}
    base = statistics.median(floor.measure(samples, cpu)) * 1e3
    ours = _async_in_own_process(namespace, samples)
    threaded = rtt_ms(client, samples)
    direct = ours["rtt"]
    return (
        f"floor {base:.3f} ms, AsyncClient {direct:.3f} ms "
        f"(+{(direct - base) * 1e3:.0f} µs), Client {threaded:.3f} ms "
        f"(+{(threaded - direct) * 1e3:.0f} µs over AsyncClient)\n"
        f"  CPU per round trip (µs): floor client {cpu['client'] * 1e6:.0f}, "
        f"relay {cpu['relay'] * 1e6:.0f}, echo {cpu['echo'] * 1e6:.0f}; "
        f"AsyncClient {ours['client']:.0f}, dispatcher {ours['dispatcher']:.0f}, "
        f"workers {ours['workers']:.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--async-rtt", metavar="NAMESPACE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.async_rtt:  # (the AsyncClient's half, in its own process)
        print(*uvloop.run(_async_rtt(args.async_rtt, args.samples)))
        return
    with Pool(workers=8) as client:
        client.submit(noop).result()
        for run in range(args.runs):
            line = _one_run(client, client.namespace, args.samples)
            print(f"run {run + 1}: {line}", flush=True)


if __name__ == "__main__":
    main()
