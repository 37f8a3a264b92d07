"""``submit`` throughput with one dispatcher and with two, on Redis.

    python -m benchmarks.dispatcher_scale [--repeats 5] [--workers 16]
        [--clients 4] [--seconds 3]

Its own ``redis-server`` on loopback; two ``pool up --workers 0`` in
runtime directories of their own (two "hosts"); ``--workers`` workers
(``python -m workers``, TCP on 127.0.0.2 on, concurrency 1). Each repeat
measures both ways, one after the other: with the second host stopped
(one dispatcher), then with it started again (two). Each way,
``--clients`` client processes (of a third "machine": ``discovery_url``),
released together once each has had a task answered, each keep their share
of 256 no-op tasks in flight for ``--seconds`` (started one by one, each
takes the least loaded dispatcher: with two, half the clients each). Per
way: the total rate (tasks/s), and the dispatchers' CPU per task (their
user and system time from ``/proc``, over the tasks of the run), in µs.

On one machine the dispatchers share its cores with the clients and the
workers, so the ratio two/one says what a second dispatcher buys *here*;
the CPU per task says how many tasks a second one's own host could carry.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.dispatchers import NAMESPACE, Hosts
from pool import Client
from pool.bench.measures import IN_FLIGHT
from pool.bench.tasks import noop
from tests.support.redis_server import RedisServer

TICKS_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User and system time of the process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_S  # (utime, stime)


def one_way(hosts: Hosts, clients: int, seconds: float) -> tuple[float, float]:
    """The clients' total rate (/s) and the dispatchers' CPU per task (µs)."""
    argv = [sys.executable, "-m", "benchmarks.dispatcher_scale", "--client"]
    argv += [hosts.url, str(hosts.token), str(IN_FLIGHT // clients), str(seconds)]
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(clients):  # one by one: each takes the least loaded
            procs.append(
                subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
            )
            assert procs[-1].stdout is not None
            assert procs[-1].stdout.readline() == "ready\n"
        pids = [
            pool.dispatcher_pid() for pool in hosts.pools if pool.proc.poll() is None
        ]
        before = sum(cpu_s(pid) for pid in pids)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        rate = sum(float(proc.communicate(timeout=120)[0]) for proc in procs)
        spent = sum(cpu_s(pid) for pid in pids) - before
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return rate, spent / (rate * seconds) * 1e6


def client_main(url: str, token: str, in_flight: int, seconds: float) -> None:
    """One client process: ready once a task is answered; at "go", keep
    ``in_flight`` no-ops in flight for ``seconds``; print its rate."""
    with Client(NAMESPACE, discovery_url=url, token_file=token) as client:
        client.submit(noop).result(60)
        print("ready", flush=True)
        sys.stdin.readline()
        futures: list[concurrent.futures.Future[Any]] = []
        done, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            waiting = [f for f in futures if not f.done()]
            done += len(futures) - len(waiting)
            futures = waiting + [
                client.submit(noop) for _ in range(in_flight - len(waiting))
            ]
            concurrent.futures.wait(futures, return_when="FIRST_COMPLETED")
        print(done / seconds, flush=True)


def main(repeats: int, workers: int, clients: int, seconds: float) -> None:
    server = RedisServer()
    rows: list[tuple[float, float, float, float]] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory() as root:
        server.start()
        stack.callback(server.close)
        hosts = Hosts(stack, server.url, Path(root), workers, concurrency=1)
        for repeat in range(repeats):
            second = hosts.pools[1]
            second.close()  # (its announcement goes: clients take the first)
            one, one_cpu = one_way(hosts, clients, seconds)
            hosts.pools[1] = hosts.start()
            two, two_cpu = one_way(hosts, clients, seconds)
            rows.append((one, two, one_cpu, two_cpu))
            print(
                f"repeat {repeat + 1}: one dispatcher {one:,.0f}/s "
                f"({one_cpu:.0f} µs of its CPU a task), two {two:,.0f}/s "
                f"({two_cpu:.0f} µs), two/one {two / one:.2f}",
                flush=True,
            )
    med = [statistics.median(column) for column in zip(*rows, strict=True)]
    ratio = statistics.median(two / one for one, two, _, _ in rows)
    print(
        f"workers={workers} clients={clients} in_flight={IN_FLIGHT} "
        f"seconds={seconds} repeats={repeats}: one dispatcher {med[0]:,.0f}/s, "
        f"two {med[1]:,.0f}/s, two/one median {ratio:.2f} (target 1.6); "
        f"dispatcher CPU a task: one {med[2]:.0f} µs, two {med[3]:.0f} µs"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        url, token, in_flight, seconds = sys.argv[2:6]
        client_main(url, token, int(in_flight), float(seconds))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    main(args.repeats, args.workers, args.clients, args.seconds)
