"""``pool bench``: speed and memory, side by side with the standard pools
(see ``benchmarks/README.md``)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from pool.cli.common import Commands, UsageError, command
from pool.client.executor import Client

BENCH = """measure speed and memory, side by side with the standard pools

Run the standard benchmark set (start, round trip, submit and map
throughput, CPU-bound work, memory, replacement of a killed worker) against
a pool started in this process, or a running one with --namespace, and
print medians; with --peers, beside ProcessPoolExecutor and
multiprocessing.Pool of as many workers, as ratios, then large data (256 MB
arrays in and out, one 128 MB array to 16 tasks) through a pool of 2 workers
beside ProcessPoolExecutor, loky and Ray (those the `bench` extra
installed). See benchmarks/README.md for what each figure means.
"""
NAMESPACE_HELP = """measure this running pool (default: start one in this
process; start, replacement and CPU-bound figures need that)"""
CHART_HELP = """also write a bar chart of the ratios (needs --peers and the
`bench` extra: .venv/bin/pip install -e '.[bench]')"""

SCALE_HELP = """instead, how small tasks scale: Pool(workers=n) for n of 1, 2, 8,
32 and 128 beside ProcessPoolExecutor(n); 1, 4 and 16 client processes
sharing a Pool(8); the memory of a deep queue (--pending)"""


def add(commands: Commands) -> None:
    bench = command(commands, "bench", run_bench, BENCH)
    bench.add_argument("-n", "--namespace", help=NAMESPACE_HELP)
    bench.add_argument(
        "--workers", type=int, default=8, help="workers of each pool (default 8)"
    )
    bench.add_argument(
        "--runs", type=int, default=3, help="runs to take the median of (default 3)"
    )
    bench.add_argument(
        "--tasks",
        type=int,
        default=100_000,
        help="no-op tasks of the map figure (default 100000)",
    )
    bench.add_argument(
        "--peers",
        action="store_true",
        help="measure ProcessPoolExecutor and multiprocessing.Pool too",
    )
    bench.add_argument("--chart", metavar="PNG", help=CHART_HELP)
    bench.add_argument("--scale", action="store_true", help=SCALE_HELP)
    bench.add_argument(
        "--pending",
        type=int,
        default=1_000_000,
        help="no-ops pending in --scale's deep queue (default 1000000)",
    )


def run_bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pool.bench import suite

    _check(args)
    if (note := _uncompiled()) is not None:
        print(note, file=sys.stderr)
    if args.scale:
        return _run_scale(args)
    if args.namespace is not None:
        Client(args.namespace).shutdown()  # a clear error if it is not running
    settings = suite.Settings(
        workers=args.workers,
        runs=args.runs,
        tasks=args.tasks,
        namespace=args.namespace,
        peers=args.peers,
    )
    console = Console()
    if args.peers:  # (a column pair a peer: wider than 80, never cut)
        console = Console(width=max(console.width, 160))
    results = suite.run(settings, console)
    console.print(suite.table(results, settings))
    if args.peers and importlib.util.find_spec("numpy") is None:
        console.print("large data left out: it needs numpy (the `bench` extra)")
    elif args.peers and args.namespace is None:
        from pool.bench import bigdata

        with console.status("large data: shm-pool and its peers"):
            large = bigdata.bench(bigdata.BENCH_WORKERS, args.runs)
        console.print(bigdata.bench_table(large, bigdata.BENCH_WORKERS, args.runs))
    if args.chart:
        suite.chart(results, args.chart)
        console.print(f"chart: {args.chart}")
    return 0


def _run_scale(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pool.bench import scale

    if args.pending < 1:
        raise UsageError("--pending must be at least 1")
    for table in scale.tables(args.runs, args.pending):
        Console().print(table)
    return 0


def _check(args: argparse.Namespace) -> None:
    """:raises UsageError: for a bad flag, named."""
    if args.workers < 1 or args.runs < 1 or args.tasks < 1:
        raise UsageError("--workers, --runs and --tasks must be at least 1")
    if args.chart and not args.peers:
        raise UsageError("--chart draws the ratios to the peers: add --peers")
    if args.chart and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            "--chart needs matplotlib: .venv/bin/pip install -e '.[bench]'"
        )


def _uncompiled() -> str | None:
    """A warning, if every pool process will compile our modules as it
    starts (no cached bytecode, and none to be written): the start figures
    would then be slower than an installed pool's."""
    import workers.process

    source = workers.process.__file__
    if not sys.flags.dont_write_bytecode or source is None:
        return None
    if Path(importlib.util.cache_from_source(source)).exists():
        return None
    tree = Path(source).parents[1]
    packages = " ".join(str(tree / name) for name in ("pool", "workers", "discovery"))
    return (
        "note: PYTHONDONTWRITEBYTECODE is set and shm-pool's modules have no "
        "cached bytecode, so every pool process compiles them as it starts "
        "(start figures slower than an installed pool's); to measure as "
        f"installed: python -m compileall -q {packages}"
    )
