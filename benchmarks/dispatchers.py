"""A client whose dispatcher goes, with two dispatchers of one pool on Redis.

    python -m benchmarks.dispatchers [--repeats 20] [--victim kill|stop]

Its own ``redis-server`` on loopback; two ``pool up --workers 0`` in
runtime directories of their own (two "hosts"); 4 workers (``python -m
workers``, TCP on 127.0.0.2-5, concurrency 2). Each repeat, a fresh
client (of a third "machine": ``discovery_url``) submits ``--tasks``
tasks of 20 ms and, once 20 have come back, the host of the dispatcher
it uses (the one that has its tasks) is SIGKILLed (``--victim kill``:
supervisor and dispatcher) or SIGSTOPped (``stop``: a hang), and started
again for the next repeat. Beside it, in the same repeat, the same
tasks with no victim. Per repeat: tasks lost (not back with their own
value), and how much the longest wait for a task (submit to result)
grew over the same run's without a victim. Target: 0 lost, and growth at
most the lease (3 s).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import statistics
import tempfile
import time
from concurrent.futures import Future
from contextlib import ExitStack
from pathlib import Path

from pool import Client
from pool.cli.inspect import ask_dispatcher
from pool.client.rendezvous import Locator
from tests import sample_tasks
from tests.helpers import LineReader, python_module
from tests.pools import RunningPool
from tests.redis_server import RedisServer, free_port

NAMESPACE = "bench-dispatchers"
SLEEP_S = 0.02


class Hosts:
    """Two dispatchers' hosts and ``workers`` workers (each running
    ``concurrency`` tasks at once), on one Redis."""

    def __init__(
        self,
        stack: ExitStack,
        url: str,
        root: Path,
        workers: int = 4,
        concurrency: int = 2,
    ) -> None:
        self.url, self.root, self.serial = url, root, 0
        self.ports: dict[RunningPool, int] = {}
        self.token = root / "token"
        self.token.write_text(secrets.token_hex(32))
        self.token.chmod(0o600)
        self.pools = [self.start(), self.start()]
        stack.callback(self.close)
        for i in range(workers):
            worker = python_module(
                *("workers", "-n", NAMESPACE, "--discovery", url),
                *("--concurrency", str(concurrency), "--host", f"127.0.0.{2 + i}"),
                *("--token-file", str(self.token)),
            )
            stack.callback(worker.wait, 30)
            stack.callback(worker.terminate)
            LineReader(worker.stdout).wait_for("READY ", 30)
        self.locator = Locator(NAMESPACE, url, str(self.token))

    def close(self) -> None:
        for pool in self.pools:
            pool.close()

    def start(self) -> RunningPool:
        self.serial += 1
        runtime = self.root / f"host-{self.serial}"
        runtime.mkdir(mode=0o700)
        port = free_port()
        pool = RunningPool(
            NAMESPACE,
            *("--workers", "0", "--discovery", self.url, "--host", "127.0.0.1"),
            *("--port", str(port), "--token-file", str(self.token)),
            runtime_dir=runtime,
        )
        pool.wait_for("ready ", 60)
        self.ports[pool] = port
        return pool

    def busy(self) -> RunningPool:
        """The host whose dispatcher has tasks (the client's)."""
        for target in self.locator.all_now():
            view = ask_dispatcher(self.locator, target)
            if view is not None and (view.queued or any(view.in_flight.values())):
                port = int(target.address.rsplit(":", 1)[1])
                return next(p for p in self.pools if self.ports[p] == port)
        raise RuntimeError("no dispatcher has the client's tasks")

    def hit(self, victim: RunningPool, how: str) -> None:
        for pid in (victim.dispatcher_pid(), victim.proc.pid):
            os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)

    def replace(self, victim: RunningPool) -> None:
        for pid in (victim.dispatcher_pid(), victim.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        victim.close()
        self.pools[self.pools.index(victim)] = self.start()


def run(hosts: Hosts, tasks: int, victim: str | None) -> tuple[int, float]:
    """Tasks lost, and the longest wait for one (s), with ``victim``."""
    with Client(NAMESPACE, discovery_url=hosts.url, token_file=str(hosts.token)) as c:
        c.submit(sample_tasks.square, 1).result(30)  # (connected)
        submitted = time.monotonic()
        futures: list[Future[float]] = [
            c.submit(sample_tasks.nap, SLEEP_S + i * 1e-9) for i in range(tasks)
        ]
        waits: list[float] = []
        lost, hit = 0, None
        for i, future in enumerate(futures):
            try:
                value = future.result(60)
            except Exception:  # (counted: that is the figure)
                value = None
            waits.append(time.monotonic() - submitted)
            lost += value != SLEEP_S + i * 1e-9
            if victim and i == 20:
                hit = hosts.busy()
                hosts.hit(hit, victim)
        if hit is not None:
            hosts.replace(hit)
    return lost, max(waits)


def main(repeats: int, tasks: int, victim: str) -> None:
    server = RedisServer()
    with ExitStack() as stack, tempfile.TemporaryDirectory() as root:
        server.start()
        stack.callback(server.close)
        hosts = Hosts(stack, server.url, Path(root))
        rows = []
        for repeat in range(repeats):
            _, calm = run(hosts, tasks, None)
            lost, hurt = run(hosts, tasks, victim)
            rows.append((lost, hurt - calm))
            growth = hurt - calm
            print(f"repeat {repeat + 1}: lost {lost}, longest wait +{growth:.2f} s")
    grew = [g for _, g in rows]
    print(
        f"victim={victim} repeats={repeats} tasks={tasks}: "
        f"lost {sum(r[0] for r in rows)}; longest wait grew median "
        f"{statistics.median(grew):.2f} s, max {max(grew):.2f} s "
        "(target: at most the 3 s lease)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--victim", choices=["kill", "stop"], default="kill")
    args = parser.parse_args()
    main(args.repeats, args.tasks, args.victim)
