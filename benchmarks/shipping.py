"""What shipping a callable by value costs, beside the same call by name.

    python -m benchmarks.shipping [--workers 8] [--rounds 5] [--tasks 20000]

One embedded pool; in each round, ``--tasks`` submits of a function the
workers import by name (``benchmarks.shipping:square``), then as many of a
lambda that does the same (pickled with cloudpickle at each submit, sent
once per stream), 256 in flight, then a ``map`` of 100,000 calls of each.
Prints the median rate of each over the rounds, and by value / by name.
The two alternate within a round, so both see the same machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from pool import Client, Pool

IN_FLIGHT = 256
MAP_CALLS = 100_000


def square(x: int) -> int:
    return x * x


def submit_rate(client: Client, fn: Callable[[int], int], tasks: int) -> float:
    """Tasks per second, ``IN_FLIGHT`` at a time."""
    started = time.perf_counter()
    window: deque[Future[Any]] = deque()
    for i in range(tasks):
        window.append(client.submit(fn, i))
        if len(window) >= IN_FLIGHT:
            window.popleft().result()
    for future in window:
        future.result()
    return tasks / (time.perf_counter() - started)


def map_rate(client: Client, fn: Callable[[int], int]) -> float:
    started = time.perf_counter()
    for _ in client.map(fn, range(MAP_CALLS)):
        pass
    return MAP_CALLS / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=20_000)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {}
    with Pool(workers=args.workers) as client:
        submit_rate(client, square, 1000)  # warm every worker
        for _ in range(args.rounds):
            for name, fn in (("name", square), ("value", lambda x: x * x)):
                rates.setdefault(f"submit by {name}", []).append(
                    submit_rate(client, fn, args.tasks)
                )
                rates.setdefault(f"map by {name}", []).append(map_rate(client, fn))
    print(f"{args.workers} workers, median of {args.rounds} rounds")
    for kind in ("submit", "map"):
        by_name = statistics.median(rates[f"{kind} by name"])
        by_value = statistics.median(rates[f"{kind} by value"])
        print(
            f"{kind:<7} by name {by_name:>12,.0f}/s   by value {by_value:>12,.0f}/s"
            f"   value/name {by_value / by_name:.2f}x"
        )


if __name__ == "__main__":
    main()
