"""A client whose dispatcher goes, with two dispatchers of one pool on Redis.

    python -m benchmarks.dispatchers [--repeats 20] [--victim kill|stop|failover]

Its own ``redis-server`` on loopback; two ``pool up --workers 0`` in
runtime directories of their own (two "hosts"); 4 workers (``python -m
workers``, TCP on 127.0.0.2-5, concurrency 2). Each repeat, a fresh
client (of a third "machine": ``discovery_url``) submits ``--tasks``
tasks of 20 ms and, once 20 have come back, the host of the dispatcher
it uses (the one that has its tasks) is SIGKILLed (``--victim kill``:
supervisor and dispatcher) or SIGSTOPped (``stop``: a hang), and started
again for the next repeat; or (``failover``, on two redis-servers and
three Sentinels) Redis' primary is SIGKILLed and the Sentinels promote its
replica, and then a worker started after the failover is timed until both
dispatchers link it. Beside it, in the same repeat, the same
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

from pool import Client, PoolNotRunning
from pool.cli.inspect import ask_dispatcher
from pool.client.rendezvous import Locator
from tests.support import sample_tasks
from tests.support.helpers import LineReader, python_module, wait_until
from tests.support.pools import RunningPool
from tests.support.redis_server import RedisServer, SentinelSet, free_port

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
        self.workers = []
        for i in range(workers):
            worker = python_module(
                *("workers", "-n", NAMESPACE, "--discovery", url),
                *("--concurrency", str(concurrency), "--host", f"127.0.0.{2 + i}"),
                *("--token-file", str(self.token)),
            )
            stack.callback(worker.wait, 30)
            stack.callback(worker.terminate)
            LineReader(worker.stdout).wait_for("READY ", 30)
            self.workers.append(worker)
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


class HostDown:
    """``--victim kill`` or ``stop``: the host of the client's dispatcher."""

    def __init__(self, hosts: Hosts, how: str) -> None:
        self.hosts, self.how = hosts, how
        self.victim: RunningPool | None = None

    def hit(self) -> None:
        self.victim = self.hosts.busy()
        self.hosts.hit(self.victim, self.how)

    def heal(self) -> str:
        assert self.victim is not None
        self.hosts.replace(self.victim)
        return ""


class PrimaryDown:
    """``--victim failover``: Redis' primary, which the Sentinels replace
    with its replica; then a worker started after the failover is timed
    until both dispatchers have linked it, and the old primary comes back
    as the new one's replica (for the next repeat's failover)."""

    def __init__(self, hosts: Hosts, sentinels: SentinelSet) -> None:
        self.hosts, self.sentinels = hosts, sentinels

    def hit(self) -> None:
        self.sentinels.kill_primary()

    def heal(self) -> str:
        sets = self.sentinels
        # (A Sentinel waits twice its failover-timeout, 5 s, before it fails
        # over the same service again: repeats come faster than that.)
        wait_until(lambda: sets.primary_port() == sets.replica.port, 60)
        started = time.monotonic()
        worker = python_module(
            *("workers", "-n", NAMESPACE, "--discovery", self.hosts.url),
            *("--host", "127.0.0.50", "--token-file", str(self.hosts.token)),
        )
        try:
            LineReader(worker.stdout).wait_for("READY ", 30)
            wait_until(lambda: self._linked() == [len(self.hosts.workers) + 1] * 2, 30)
            found = time.monotonic() - started
        finally:
            worker.terminate()
            worker.wait(30)
        sets.primary.start("--replicaof", "127.0.0.1", str(sets.replica.port))
        sets.primary, sets.replica = sets.replica, sets.primary
        return f", a worker started after it linked by both in {found:.2f} s"

    def _linked(self) -> list[int]:
        """How many workers each dispatcher links (none announced for a
        moment after a failover that outlasted their leases)."""
        with contextlib.suppress(PoolNotRunning):
            return self._linked_now()
        return []

    def _linked_now(self) -> list[int]:
        views = (
            ask_dispatcher(self.hosts.locator, t) for t in self.hosts.locator.all_now()
        )
        return [len(view.in_flight) for view in views if view is not None]


Victim = HostDown | PrimaryDown


def run(hosts: Hosts, tasks: int, victim: Victim | None) -> tuple[int, float, str]:
    """Tasks lost, the longest wait for one (s), and what the victim's
    healing saw, with ``victim`` hit once 20 tasks are back."""
    with Client(NAMESPACE, discovery_url=hosts.url, token_file=str(hosts.token)) as c:
        c.submit(sample_tasks.square, 1).result(30)  # (connected)
        submitted = time.monotonic()
        futures: list[Future[float]] = [
            c.submit(sample_tasks.nap, SLEEP_S + i * 1e-9) for i in range(tasks)
        ]
        waits: list[float] = []
        lost = 0
        for i, future in enumerate(futures):
            try:
                value = future.result(60)
            except Exception:  # (counted: that is the figure)
                value = None
            waits.append(time.monotonic() - submitted)
            lost += value != SLEEP_S + i * 1e-9
            if victim is not None and i == 20:
                victim.hit()
        note = victim.heal() if victim is not None else ""
    return lost, max(waits), note


def main(repeats: int, tasks: int, how: str) -> None:
    server: RedisServer | SentinelSet = (
        SentinelSet() if how == "failover" else RedisServer()
    )
    with ExitStack() as stack, tempfile.TemporaryDirectory() as root:
        server.start()
        stack.callback(server.close)
        hosts = Hosts(stack, server.url, Path(root))
        victim = (
            PrimaryDown(hosts, server)
            if isinstance(server, SentinelSet)
            else HostDown(hosts, how)
        )
        rows = []
        for repeat in range(repeats):
            _, calm, _ = run(hosts, tasks, None)
            lost, hurt, note = run(hosts, tasks, victim)
            rows.append((lost, hurt - calm))
            growth = f"+{hurt - calm:.2f} s"
            print(f"repeat {repeat + 1}: lost {lost}, longest wait {growth}{note}")
    grew = [g for _, g in rows]
    print(
        f"victim={how} repeats={repeats} tasks={tasks}: "
        f"lost {sum(r[0] for r in rows)}; longest wait grew median "
        f"{statistics.median(grew):.2f} s, max {max(grew):.2f} s "
        "(target: at most the 3 s lease)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument(
        "--victim", choices=["kill", "stop", "failover"], default="kill"
    )
    args = parser.parse_args()
    main(args.repeats, args.tasks, args.victim)
