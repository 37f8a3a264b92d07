"""What one task costs in each process: CPU time and system calls.

``python -m benchmarks.budget --rounds 5``: an embedded pool of 8 workers
runs 20,000 no-op submits with 256 in flight, ``--rounds`` times; around
each, this reads every process's CPU time (``/proc/PID/stat``) and its
read and write system calls (``/proc/PID/io``: on these sockets, pipes and
eventfds, the messages and the wake-ups), and prints the medians per task:
the client (this process), the dispatcher and the workers together. Beside
them, in the same rounds, ``ProcessPoolExecutor(8)`` with the same load
(this process and its workers). See ``benchmarks/README.md`` (the budget).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from discovery import list_workers
from pool import Pool
from pool.bench.measures import submit_rate
from pool.bench.proc import cpu_s

TASKS = 20_000


def _syscalls(pid: int) -> tuple[int, int]:
    counts = {}
    with open(f"/proc/{pid}/io") as io:
        for line in io:
            key, _, value = line.partition(":")
            counts[key] = int(value)
    return counts["syscr"], counts["syscw"]


def _sample(pids: Iterable[int]) -> tuple[float, int, int]:
    cpu = reads = writes = 0.0
    for pid in pids:
        cpu += cpu_s(pid)
        r, w = _syscalls(pid)
        reads, writes = reads + r, writes + w
    return cpu, int(reads), int(writes)


def _per_task(
    groups: dict[str, list[int]], run: Callable[[], Any]
) -> dict[str, tuple[float, float, float]]:
    """Each group's CPU µs, reads and writes per task over ``run()``."""
    before = {name: _sample(pids) for name, pids in groups.items()}
    run()
    figures = {}
    for name, pids in groups.items():
        after = _sample(pids)
        cpu, reads, writes = (a - b for a, b in zip(after, before[name], strict=True))
        figures[name] = (cpu * 1e6 / TASKS, reads / TASKS, writes / TASKS)
    return figures


def _dispatcher_pid(namespace: str, workers: set[int]) -> int:
    """The pool's dispatcher: the child of the zygote that is no worker."""
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                line = cmdline.read()  # (its title: one string, or argv)
        except OSError:
            continue
        if pid not in workers and b"dispatcher" in line and namespace.encode() in line:
            return pid
    raise SystemExit("no dispatcher process found")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    ours: list[dict[str, tuple[float, float, float]]] = []
    theirs: list[dict[str, tuple[float, float, float]]] = []
    with Pool(workers=8) as client:
        namespace = client.namespace
        workers = [w.pid for w in list_workers(namespace)]
        groups = {
            "client": [os.getpid()],
            "dispatcher": [_dispatcher_pid(namespace, set(workers))],
            "workers (8)": workers,
        }
        submit_rate(client, 5_000)  # warm: imports done, pace known
        with concurrent.futures.ProcessPoolExecutor(8) as executor:
            submit_rate(executor, 5_000)
            peer = {
                "client": [os.getpid()],
                "workers (8)": [  # (no other multiprocessing pool is open)
                    p.pid for p in multiprocessing.active_children() if p.pid
                ],
            }
            for _ in range(rounds):
                ours.append(_per_task(groups, lambda: submit_rate(client, TASKS)))
                theirs.append(_per_task(peer, lambda: submit_rate(executor, TASKS)))
    print(f"per task, medians of {rounds} rounds of {TASKS:,} no-op submits")
    print(f"{'':28}{'CPU µs':>10}{'reads':>10}{'writes':>10}")
    for title, runs in (("shm-pool", ours), ("ProcessPoolExecutor", theirs)):
        total = 0.0
        for name in runs[0]:
            cpu, reads, writes = (
                statistics.median(r[name][i] for r in runs) for i in range(3)
            )
            total += cpu
            print(f"{title + ' ' + name:28}{cpu:10.1f}{reads:10.2f}{writes:10.2f}")
        print(f"{title + ' in all':28}{total:10.1f}")


if __name__ == "__main__":
    main()
