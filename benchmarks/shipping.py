"""What shipping a callable by value costs, beside the same call by name.

    python -m benchmarks.shipping [--workers 8] [--rounds 5] [--tasks 20000]

One embedded pool; in each round, ``--tasks`` submits of a function the
workers import by name (``benchmarks.shipping:square``), then as many of a
lambda that does the same (pickled with cloudpickle at each submit, sent
once per stream), 256 in flight, then a ``map`` of 100,000 calls of each.
Prints the median rate of each over the rounds, and by value / by name.
The two alternate within a round, so both see the same machine.

Then what it costs that arguments naming ``__main__`` go by value: the
submit rate of an importable function given a function of this script
(``__main__``, when run with ``-m``) as an argument, beside the same call
given an importable one; and, in this process alone, how long
``shipping.dumps`` takes for small plain arguments (the scan of the pickle
for ``__main__``) beside ``pickle.dumps``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import time
import timeit
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from pool import Client, Pool
from workers.protocol import shipping

IN_FLIGHT = 256
MAP_CALLS = 100_000


def square(x: int) -> int:
    return x * x


def apply(fn: Callable[[int], int], x: int) -> int:
    return fn(x)


def submit_rate(
    client: Client, fn: Callable[..., int], tasks: int, *before: Any
) -> float:
    """Tasks per second, ``IN_FLIGHT`` at a time (``fn(*before, i)``)."""
    started = time.perf_counter()
    window: deque[Future[Any]] = deque()
    for i in range(tasks):
        window.append(client.submit(fn, *before, i))
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
            for name, arg in (("importable", abs), ("__main__", square)):
                rates.setdefault(f"argument {name}", []).append(
                    submit_rate(client, apply, args.tasks, arg)
                )
    print(f"{args.workers} workers, median of {args.rounds} rounds")
    for kind in ("submit", "map"):
        by_name = statistics.median(rates[f"{kind} by name"])
        by_value = statistics.median(rates[f"{kind} by value"])
        print(
            f"{kind:<7} by name {by_name:>12,.0f}/s   by value {by_value:>12,.0f}/s"
            f"   value/name {by_value / by_name:.2f}x"
        )
    plain = statistics.median(rates["argument importable"])
    main = statistics.median(rates["argument __main__"])
    print(
        f"submit of apply(f, i): f importable {plain:>10,.0f}/s   f of __main__ "
        f"{main:>10,.0f}/s   __main__/importable {main / plain:.2f}x"
    )
    scan, bare = _dumps_ns()
    print(
        f"dumps of small plain arguments: shipping.dumps {scan:.0f} ns, "
        f"pickle.dumps {bare:.0f} ns ({scan / bare:.2f}x; medians of 5)"
    )


def _dumps_ns() -> tuple[float, float]:
    """Median ns per call of shipping.dumps and of pickle.dumps, for the
    arguments of a typical small task."""
    call = ((12, "text", 3.5), {"key": [1, 2, 3]})
    runs = []
    for dumps in (lambda: shipping.dumps(call), lambda: pickle.dumps(call, 5)):
        each = [timeit.timeit(dumps, number=100_000) * 1e4 for _ in range(5)]
        runs.append(statistics.median(each))
    return runs[0], runs[1]


if __name__ == "__main__":
    main()
