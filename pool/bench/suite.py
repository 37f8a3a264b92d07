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

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from pool.bench import floor
from pool.bench.measures import (
    CPU_TASK_S,
    CPU_TASKS,
    CPU_WORKERS,
    IN_FLIGHT,
    PEER_CHUNKSIZE,
    RTT_SAMPLES,
    cpu_ratio,
    extra_worker_mb,
    map_rate,
    pool_up_ready,
    pss_mb,
    replacement_ms,
    rtt_ms,
    start,
    submit_rate,
)
from pool.bench.pools import OURS, PEERS, opener
from pool.bench.tasks import noop


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
    Figure("floor1", "floor: 1 raw gRPC hop p50", "ms", True),
    Figure("submit", f"submit, {IN_FLIGHT} in flight", "/s", False),
    Figure("map", "map, peers chunked", "/s", False),
    Figure("map1", "map, peers unchunked", "/s", False),
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


@dataclass
class Settings:
    workers: int = 8
    runs: int = 3
    tasks: int = 100_000
    submit_tasks: int = 20_000
    kills: int = 10
    namespace: str | None = None
    peers: bool = False


Note = Callable[[str, str, float], None]  # pool, figure, one sample


def run(settings: Settings, console: Console) -> dict[str, dict[str, float]]:
    """Every figure for every pool: the median over the runs."""
    names = [OURS, *(PEERS if settings.peers else ())]
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in names}

    def note(name: str, key: str, value: float) -> None:
        samples[name].setdefault(key, []).append(value)

    own_pool = settings.namespace is None
    per_pool = 3 + 3 * own_pool  # (and the replacement figure, for ours)
    total = settings.runs * (len(names) * per_pool + 2 * own_pool + 2)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("benchmarking", total=total)

        def step(text: str) -> None:
            progress.update(bar, description=text)
            progress.advance(bar)

        for run_index in range(settings.runs):
            order = names[run_index % len(names) :] + names[: run_index % len(names)]
            for name in order:
                _measure(name, settings, note, step)
            for key, hops in (("floor", 2), ("floor1", 1)):
                step(f"floor: raw gRPC hops, {hops}")
                trips = floor.measure(RTT_SAMPLES, hops=hops)
                note(OURS, key, statistics.median(trips) * 1e3)
            if own_pool:
                step("pool up until ready")
                note(OURS, "up", pool_up_ready(settings.workers))
    return {
        name: {key: statistics.median(values) for key, values in figures.items()}
        for name, figures in samples.items()
    }


def _measure(
    name: str, settings: Settings, note: Note, step: Callable[[str], None]
) -> None:
    """One run of every figure of the pool ``name``."""
    own_pool = settings.namespace is None
    open_pool = opener(name, settings.workers, settings.namespace)
    if own_pool:
        step(f"{name}: start")
        note(name, "start", start(open_pool))
    step(f"{name}: round trips")
    with open_pool() as (executor, pids):
        executor.submit(noop).result()
        note(name, "pss", statistics.median(pss_mb(p) for p in pids))
        note(name, "rtt", rtt_ms(executor))
        step(f"{name}: submit, {IN_FLIGHT} in flight")
        note(name, "submit", submit_rate(executor, settings.submit_tasks))
        step(f"{name}: map of {settings.tasks:,}")
        rate = map_rate(executor, settings.tasks, chunked=True)
        note(name, "map", rate)
        if name == OURS:  # (the same defaults, whatever the peers do)
            note(name, "map1", rate)
        else:
            note(name, "map1", map_rate(executor, settings.tasks, chunked=False))
        if name == OURS and own_pool:
            step(f"{name}: killed workers replaced")
            namespace = executor.namespace  # type: ignore[attr-defined]
            note(name, "replace", replacement_ms(namespace, settings.kills))
    if own_pool:
        step(f"{name}: memory per extra worker")
        sized = lambda n: opener(name, n, None)()  # noqa: E731
        note(name, "extra", extra_worker_mb(sized, settings.workers))
        step(f"{name}: CPU-bound on {CPU_WORKERS} workers")
        note(name, "cpu", cpu_ratio(opener(name, CPU_WORKERS, None)))


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
    grid.caption = "; ".join(_notes(peers, ours))
    return grid


def _notes(peers: list[str], ours: dict[str, float]) -> list[str]:
    """What the table's caption says: which peer ran how."""
    notes = ["tasks are no-ops but for the CPU row"]
    if peers:
        notes.append(
            "mp.Pool is multiprocessing.Pool; shm-pool's map keeps its defaults "
            "(adaptive chunks); peers chunked: mp.Pool.map with its own chunks, "
            f"ProcessPoolExecutor.map(chunksize={PEER_CHUNKSIZE}); peers "
            "unchunked: mp.Pool.imap and ProcessPoolExecutor.map, chunksize 1"
        )
    if {"loky", "mpire"} & set(peers):
        notes.append(
            "loky: loky.ProcessPoolExecutor, as ProcessPoolExecutor; mpire: "
            "WorkerPool(keep_alive=True), its apply_async and map (which chunk "
            "as mp.Pool's)"
        )
    if "floor" in ours and "rtt" in ours:
        notes.append(
            f"round trip / floor: {ours['rtt'] / ours['floor']:.2f}x of two hops, "
            f"{ours['rtt'] / ours['floor1']:.2f}x of one"
        )
    return notes


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
            "--chart needs matplotlib: .venv/bin/pip install -e '.[bench]'"
        ) from None
    peers = [name for name in results if name != OURS]
    if not peers:
        raise SystemExit("--chart compares with peers: add --peers")
    ours = results[OURS]
    figures = [f for f in FIGURES if f.key in ours and f.key in results[peers[0]]]
    fig, axes = plt.subplots(figsize=(11, 5.5))
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        values = [ratio(f, ours[f.key], results[peer][f.key]) for f in figures]
        positions = [x + i * width for x in range(len(figures))]
        # From 1.0 (even), up for a gain and down for a loss.
        bars = axes.bar(
            positions, [v - 1 for v in values], width, bottom=1.0, label=f"vs {peer}"
        )
        axes.bar_label(bars, labels=[f"{v:.2f}x" for v in values], fontsize=7)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks([x + width * (len(peers) - 1) / 2 for x in range(len(figures))])
    axes.set_xticklabels([f.label for f in figures], rotation=30, ha="right")
    axes.set_ylabel("times better than the peer (above 1: shm-pool is ahead)")
    axes.set_yscale("log")
    axes.set_title("shm-pool against its peers, same machine, same run")
    axes.legend()
    fig.tight_layout()
    fig.savefig(path)
