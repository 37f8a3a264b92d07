"""Discovery latency and subscriber cost, by pool size.

    python -m benchmarks.discovery [--sizes 8,1024,4096] [--events 300] [--runs 3]

For each size N, this process creates a namespace, registers N workers and
starts a subscriber in another process, which times how long it takes to
yield all N (its first look). It then publishes ``--events``
``worker-updated`` events one at a time, each carrying the monotonic time
of its publish (CLOCK_MONOTONIC is shared by every process on the machine);
the subscriber answers each with the latency it saw, and at the end with
its CPU time (all threads) per event. The publisher times each ``publish``
call (median). Each figure is the median over
``--runs`` runs (the order of sizes rotates between runs); the last column
is the CPU per event relative to the smallest size measured in the same
run: what a larger pool costs a subscriber.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import replace

import uvloop

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from discovery import LocalDiscovery, Subscriber, WorkerInfo

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def subscriber_role(namespace: str, workers: int, events: int) -> None:
    """Consume the N adds, then answer each update with its latency."""
    out = sys.stdout
    started = time.monotonic()
    stream = aiter(Subscriber(namespace))
    for _ in range(workers):
        await anext(stream)
    first_look = time.monotonic() - started
    out.write(json.dumps({"ready": True, "first_look": first_look}) + "\n")
    out.flush()
    cpu = time.process_time()
    for _ in range(events):
        event = await anext(stream)
        latency = time.monotonic() - float(event.worker_info.extra["t"])
        out.write(json.dumps({"latency": latency, "type": event.type}) + "\n")
        out.flush()
    cpu = time.process_time() - cpu
    out.write(json.dumps({"cpu_per_event": cpu / events}) + "\n")
    out.flush()


async def measure(size: int, events: int) -> dict[str, float]:
    """One run at one size: latencies (p50, p99) and CPU per event."""
    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    with LocalDiscovery(namespace, capacity=size) as discovery:
        async with discovery.publisher as publisher:
            infos = [
                WorkerInfo(uuid.uuid4(), f"unix:/w{i}", os.getpid(), "1", capacity=4)
                for i in range(size)
            ]
            for info in infos:
                await publisher.publish("worker-added", info)
            role = ["--role", "subscriber", namespace, str(size), str(events)]
            child = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.discovery", *role],
                stdout=subprocess.PIPE,
                text=True,
                cwd=_ROOT,
            )
            try:
                return await _drive(child, publisher, infos, events)
            finally:
                child.kill()
                child.wait()


async def _drive(child, publisher, infos, events) -> dict[str, float]:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    readline = child.stdout.readline

    async def answer() -> dict[str, object]:
        return json.loads(await loop.run_in_executor(None, readline))  # type: ignore[no-any-return]

    ready = await answer()
    latencies, publishes = [], []
    for i in range(events):
        info = infos[i % len(infos)]
        stamped = replace(info, extra={"t": repr(time.monotonic())})
        started = time.perf_counter()
        await publisher.publish("worker-updated", stamped)
        publishes.append(time.perf_counter() - started)
        reply = await answer()
        assert reply["type"] == "worker-updated", reply
        latencies.append(float(reply["latency"]))  # type: ignore[arg-type]
    cpu = float((await answer())["cpu_per_event"])  # type: ignore[arg-type]
    latencies.sort()
    return {
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
        "max_ms": latencies[-1] * 1e3,
        "cpu_us": cpu * 1e6,
        "publish_us": statistics.median(publishes) * 1e6,
        "first_look_ms": float(ready["first_look"]) * 1e3,  # type: ignore[arg-type]
    }


async def main(sizes: list[int], events: int, runs: int) -> None:
    results: dict[int, list[dict[str, float]]] = {size: [] for size in sizes}
    ratios: dict[int, list[float]] = {size: [] for size in sizes}
    smallest = min(sizes)
    for i in range(runs):
        order = (
            sizes[i % len(sizes) :] + sizes[: i % len(sizes)]
        )  # no size always first
        run = {size: await measure(size, events) for size in order}
        for size in sizes:
            results[size].append(run[size])
            ratios[size].append(run[size]["cpu_us"] / run[smallest]["cpu_us"])
    print(f"{events} events per size, median of {runs} runs\n")
    print(
        "| workers | p50 ms | p99 ms | max ms | CPU/event us | CPU vs smallest "
        "| publish us | first look ms |"
    )
    print("|--:|--:|--:|--:|--:|--:|--:|--:|")
    for size in sizes:
        med = {
            k: statistics.median(r[k] for r in results[size]) for k in results[size][0]
        }
        print(
            f"| {size} | {med['p50_ms']:.2f} | {med['p99_ms']:.2f} | "
            f"{med['max_ms']:.2f} | {med['cpu_us']:.0f} | "
            f"{statistics.median(ratios[size]):.2f}x | {med['publish_us']:.0f} | "
            f"{med['first_look_ms']:.1f} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,1024,4096")
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--role", nargs=4, metavar=("ROLE", "NS", "N", "EVENTS"))
    args = parser.parse_args()
    if args.role:
        _, ns, n, count = args.role
        uvloop.run(subscriber_role(ns, int(n), int(count)))
    else:
        sizes = [int(s) for s in args.sizes.split(",")]
        uvloop.run(main(sizes, args.events, args.runs))
