"""Large arrays through shm-pool, beside ProcessPoolExecutor, loky and Ray,
and a memcpy of the same bytes, in one run.

    python -m benchmarks.bigdata [--runs 5] [--sizes 8,64,256] [--gigabyte]
        [--fan-out-mb 128] [--baseline DIR]

Needs the ``bench`` extra for loky (joblib) and Ray (each is left out,
said so, when missing): ``.venv/bin/pip install -e '.[bench]'``. Every
pool has ``--workers`` (2) workers; see :mod:`pool.bench.bigdata` for how
each figure is taken, and ``benchmarks/README.md`` for the copy budget.
With ``--baseline DIR`` (a checkout of another version of this project),
the no-op round trip and ``submit`` rate of both are measured too,
alternately, each in a process of its own: what large data costs small
tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from pool.bench import bigdata
from pool.bench.bigdata import MB, OURS, PEERS, SCENARIOS

SMALL = """
import json
from pool import Pool
from pool.bench.measures import rtt_ms, submit_rate
from pool.bench.tasks import noop
with Pool(workers=8) as client:
    client.submit(noop).result()
    print(json.dumps({"rtt": rtt_ms(client), "submit": submit_rate(client, 20000)}))
"""


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bigdata")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5, help="per figure (median)")
    parser.add_argument("--sizes", default="8,64,256", help="MB, comma-separated")
    parser.add_argument("--gigabyte", action="store_true", help="and 1000 MB")
    parser.add_argument("--fan-out-mb", type=int, default=128)
    parser.add_argument("--fan-out", type=int, default=16, help="tasks of it")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--baseline", metavar="DIR")
    parser.add_argument("--small-runs", type=int, default=5)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    sizes = [int(x) * MB for x in args.sizes.split(",")] + [1000 * MB] * args.gigabyte
    names = [OURS] + [p for p in args.peers.split(",") if p in PEERS]
    missing = [n for n in names if not bigdata.available(n)]
    names = [n for n in names if n not in missing]
    a = bigdata.array(args.fan_out_mb * MB)
    times: dict[str, dict[str, float]] = {n: {} for n in names}
    for name in names:
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        with bigdata.opened(name, args.workers) as runner:
            for size in sizes:
                for scenario in SCENARIOS:
                    key = f"{scenario.key}-{size}"
                    times[name][key] = bigdata.timed(runner, scenario, size, args.runs)
            fan = max(1, args.runs // 2)
            times[name]["map"] = bigdata.fan_out_s(
                runner, a, args.fan_out, fan, put=False
            )
            if name in (OURS, "Ray"):
                times[name]["put"] = bigdata.fan_out_s(
                    runner, a, args.fan_out, fan, put=True
                )
    floor = {size: bigdata.memcpy_s(size, args.runs) for size in sizes}
    memory = {
        put: bigdata.fan_out_memory(a, args.fan_out, args.workers, put=put)
        for put in (False, True)
    }
    print(_table(names, sizes, times, floor, args))
    print(_fan_out_table(names, times, memory, args))
    if missing:
        print(f"\n(not installed, left out: {', '.join(missing)}; the `bench` extra)")
    if args.baseline:
        print(_small(args.baseline, args.small_runs))


def _table(
    names: list[str],
    sizes: list[int],
    times: dict[str, dict[str, float]],
    floor: dict[int, float],
    args: argparse.Namespace,
) -> str:
    peers = names[1:]
    head = ["payload", OURS, *(f"{p} (ours x faster)" for p in peers)]
    head += ["memcpy", "ours / memcpy"]
    rows = [head, ["---"] + ["--:"] * (len(head) - 1)]
    for size in sizes:
        for scenario in SCENARIOS:
            key = f"{scenario.key}-{size}"
            ours = times[OURS][key]
            row = [f"{size // MB} MB {scenario.label}", f"{ours:.3f} s"]
            row += [
                f"{times[p][key]:.3f} s ({times[p][key] / ours:.1f}x)" for p in peers
            ]
            copies = 2 if scenario.key == "inout" else 1
            row += [
                f"{copies} x {floor[size]:.3f} s",
                f"{ours / (copies * floor[size]):.1f}x",
            ]
            rows.append(row)
    title = (
        f"\n{args.workers} workers each, one task at a time, median of "
        f"{args.runs}; ratio: the peer's time over ours"
    )
    return title + "\n\n" + "\n".join("| " + " | ".join(r) + " |" for r in rows)


def _fan_out_table(
    names: list[str],
    times: dict[str, dict[str, float]],
    memory: dict[bool, float],
    args: argparse.Namespace,
) -> str:
    base = times.get("ProcessPoolExecutor", {}).get("map")
    rows = [["how", "time", "ProcessPoolExecutor.map / this"], ["---", "--:", "--:"]]
    for name in names:
        for way in ("put", "map"):
            if way in times[name]:
                took = times[name][way]
                how = f"{name}: {'put once, then' if way == 'put' else 'map over'}"
                ratio = f"{base / took:.1f}x" if base else "-"
                rows.append([f"{how} [a] * {args.fan_out}", f"{took:.3f} s", ratio])
    lines = "\n".join("| " + " | ".join(r) + " |" for r in rows)
    mem = (
        f"shm-pool, peak RSS growth + most held in /dev/shm, over one copy: "
        f"map {memory[False]:.2f}x, put {memory[True]:.2f}x"
    )
    title = f"fan-out: one {args.fan_out_mb} MB array to {args.fan_out} tasks"
    return f"\n{title}\n\n{lines}\n\n{mem}"


def _small(baseline: str, runs: int) -> str:
    """The no-op round trip and submit rate, ours and the baseline's."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found: dict[str, list[dict[str, Any]]] = {"this": [], "baseline": []}
    for _ in range(runs):
        for label, root in (("this", here), ("baseline", baseline)):
            env = {**os.environ, "PYTHONPATH": root}
            out = subprocess.run(
                [sys.executable, "-c", SMALL],
                env=env,
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
            )
            found[label].append(json.loads(out.stdout.splitlines()[-1]))
    lines = [f"\nsmall tasks, Pool(workers=8), median of {runs} alternating runs:"]
    for figure, unit in (("rtt", "ms"), ("submit", "/s")):
        ours = statistics.median(r[figure] for r in found["this"])
        theirs = statistics.median(r[figure] for r in found["baseline"])
        lines.append(
            f"  {figure}: this {ours:,.3f} {unit}, baseline {theirs:,.3f} "
            f"{unit}, this / baseline {ours / theirs:.3f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
