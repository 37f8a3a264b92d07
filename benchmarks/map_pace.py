"""``Client.map`` of no-ops beside ``multiprocessing.Pool.map``, and where
our map's time goes.

    python -m benchmarks.map_pace [--rounds 5] [--maps 9] [--tasks 100000]

Each round starts a ``Pool(workers=8)`` and a ``multiprocessing.Pool(8)``,
one after the other (never both at once: they would share the 2 cores),
warms each with 3 maps, and times ``--maps`` maps of ``--tasks`` no-ops
over a ``range``: ours with its default arguments (adaptive chunks, sized
at once from the warm-up's timing), theirs with its own chunks
(``n / (4 x 8)`` calls each). Which pool goes first alternates by round.
For ours it also times, from the call: when ``map()`` returned (every
chunk cut, pickled and handed to the client's loop), its first value and
its last; and the CPU each of our processes spent a map. Prints each
round's medians, then the medians of the rounds and our rate over theirs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from pool import Pool
from pool.bench.measures import descendants
from pool.bench.proc import cpu_s
from pool.bench.tasks import noop

WARM_MAPS = 3
Row = dict[str, float]


def _timeline(results: Iterator[object], called: float) -> tuple[float, float]:
    """Since ``called``: the first value, and the last (s)."""
    next(results)
    first = time.perf_counter() - called
    for _ in results:
        pass
    return first, time.perf_counter() - called


@contextmanager
def _cpu_ms(pids: Iterable[int], into: Row, maps: int) -> Iterator[None]:
    """Add to ``into`` the CPU (ms) the processes ``pids`` spent a map."""
    pids = list(pids)
    before = sum(cpu_s(pid) for pid in pids)
    yield
    into["cpu_ms"] = (sum(cpu_s(pid) for pid in pids) - before) / maps * 1e3


def _ours(maps: int, tasks: int) -> Row:
    with Pool(workers=8) as client:
        for _ in range(WARM_MAPS):
            sum(1 for _ in client.map(noop, range(tasks)))
        rows: list[Row] = []
        totals: Row = {}
        with _cpu_ms([os.getpid(), *descendants(os.getpid())], totals, maps):
            for _ in range(maps):
                called = time.perf_counter()
                results = client.map(noop, range(tasks))
                returned = time.perf_counter() - called
                first, last = _timeline(results, called)
                rows.append({"returned": returned, "first": first, "last": last})
    row = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return row | totals | {"rate": tasks / row["last"]}


def _theirs(maps: int, tasks: int) -> Row:
    with multiprocessing.Pool(8) as pool:
        for _ in range(WARM_MAPS):
            pool.map(noop, range(tasks))
        times = []
        for _ in range(maps):
            called = time.perf_counter()
            count = sum(1 for _ in pool.map(noop, range(tasks)))
            times.append(time.perf_counter() - called)
            assert count == tasks
    return {"rate": tasks / statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--maps", type=int, default=9)
    parser.add_argument("--tasks", type=int, default=100_000)
    args = parser.parse_args()
    ours: list[Row] = []
    theirs: list[Row] = []
    sides: list[tuple[Callable[[int, int], Row], list[Row]]] = [
        (_ours, ours),
        (_theirs, theirs),
    ]
    for round_ in range(args.rounds):
        for measure, into in sides if round_ % 2 == 0 else sides[::-1]:
            into.append(measure(args.maps, args.tasks))
        _print(f"round {round_ + 1}", ours[-1], theirs[-1])
    median = {k: statistics.median(r[k] for r in ours) for k in ours[0]}
    _print(
        f"medians of {args.rounds} rounds",
        median,
        {"rate": statistics.median(r["rate"] for r in theirs)},
    )


def _print(title: str, ours: Row, theirs: Row) -> None:
    ratio = ours["rate"] / theirs["rate"]
    print(
        f"{title}: ours {ours['rate'] / 1e6:.2f}M calls/s, multiprocessing.Pool "
        f"{theirs['rate'] / 1e6:.2f}M/s, ours/theirs {ratio:.2f}x; "
        f"ours from the call: map() returned {ours['returned'] * 1e3:.1f} ms, "
        f"first value {ours['first'] * 1e3:.1f} ms, last {ours['last'] * 1e3:.1f} ms; "
        f"CPU of our processes a map {ours['cpu_ms']:.1f} ms",
        flush=True,
    )


if __name__ == "__main__":
    main()
