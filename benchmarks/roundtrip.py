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
and the worker's work) and ``Client`` over ``AsyncClient`` (the thread hop).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import uvloop

from pool import AsyncClient, Pool
from pool.bench import floor
from pool.bench.measures import rtt_ms
from pool.bench.tasks import noop


async def _async_rtt_ms(namespace: str, samples: int) -> float:
    async with AsyncClient(namespace) as client:
        await client.submit(noop, 1)
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            await client.submit(noop, 1)
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def _async_in_own_process(namespace: str, samples: int) -> float:
    argv = [sys.executable, "-m", "benchmarks.roundtrip", "--async-rtt", namespace]
    argv += ["--samples", str(samples)]
    return float(subprocess.run(argv, check=True, capture_output=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--async-rtt", metavar="NAMESPACE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.async_rtt:  # (the AsyncClient's half, in its own process)
        print(uvloop.run(_async_rtt_ms(args.async_rtt, args.samples)))
        return
    with Pool(workers=8) as client:
        client.submit(noop).result()
        for run in range(args.runs):
            base = statistics.median(floor.measure(args.samples)) * 1e3
            direct = _async_in_own_process(client.namespace, args.samples)
            threaded = rtt_ms(client, args.samples)
            print(
                f"run {run + 1}: floor {base:.3f} ms, AsyncClient {direct:.3f} ms "
                f"(+{(direct - base) * 1e3:.0f} µs), Client {threaded:.3f} ms "
                f"(+{(threaded - direct) * 1e3:.0f} µs over AsyncClient)",
                flush=True,
            )


if __name__ == "__main__":
    main()
