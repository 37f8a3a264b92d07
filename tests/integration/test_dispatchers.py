"""Several dispatchers of one pool on Redis: each host runs `pool up
--workers 0` in the same namespace (a runtime directory of its own stands
for the host), four workers join from other "hosts", and a client of a
third machine rides the loss of the dispatcher it uses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from pool import Client
from pool.cli.inspect import ask_dispatcher
from pool.client import announcements
from pool.client.announcements import Announced, live_sync
from pool.client.rendezvous import Locator, Target
from tests.integration.test_redis_pool import remote_worker
from tests.support import sample_tasks
from tests.support.helpers import wait_until
from tests.support.pools import RunningPool, pool_command, running_pool
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TASKS = 200


class Hosts:
    """The machines of one test: a token file they share, and a runtime
    directory for each dispatcher's host."""

    def __init__(self, namespace: str, url: str, tmp_path: Path) -> None:
        self.namespace, self.url, self._tmp = namespace, url, tmp_path
        self.token = tmp_path / "token"
        self.token.write_text(secrets.token_hex(32))
        self.token.chmod(0o600)

    @contextmanager
    def dispatcher(self, name: str, *options: str) -> Iterator[RunningPool]:
        """`pool up --workers 0` on the host ``name``, its dispatcher on TCP,
        started with ``options`` too."""
        runtime = self._tmp / name
        runtime.mkdir(mode=0o700)
        with running_pool(
            self.namespace,
            *("--workers", "0", "--discovery", self.url, "--host", "127.0.0.1"),
            *("--token-file", str(self.token), *options),
            runtime_dir=runtime,
        ) as pool:
            yield pool

    @contextmanager
    def workers(self, count: int, *options: str) -> Iterator[list[int]]:
        """``count`` workers of other hosts (127.0.0.2 on), started with
        ``options`` too; their pids."""
        with ExitStack() as stack:
            yield [
                stack.enter_context(
                    remote_worker(
                        self.namespace,
                        self.url,
                        f"127.0.0.{2 + i}",
                        *("--token-file", str(self.token), *options),
                    )
                )
                for i in range(count)
            ]

    def client(self) -> Client:
        return Client(
            self.namespace, discovery_url=self.url, token_file=str(self.token)
        )


@contextmanager
def counting_calls(address: str) -> Iterator[list[int]]:
    """A listener on ``address`` ("host:port", free again once its
    dispatcher died) that hangs up on each caller; how many came, so far."""
    host, port = address.rsplit(":", 1)
    bound: list[socket.socket] = []

    def bind() -> bool:
        with contextlib.suppress(OSError):  # (until the killed one has gone)
            bound.append(socket.create_server((host, int(port))))
        return bool(bound)

    wait_until(bind)
    [listener] = bound
    listener.settimeout(0.1)
    calls, done = [0], threading.Event()

    def serve() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                listener.accept()[0].close()
                calls[0] += 1

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield calls
    finally:
        done.set()
        thread.join()
        listener.close()


def kill_host(pool: RunningPool) -> None:
    """SIGKILL a host's pool: its supervisor and its dispatcher at once."""
    for pid in (pool.dispatcher_pid(), pool.proc.pid):
        os.kill(pid, signal.SIGKILL)
    pool.proc.wait(30)


def _gated(client: Client, tmp_path: Path) -> tuple[list[Future[int]], Path]:
    """:data:`TASKS` tasks that wait for the file it returns, each noting
    its runs (:func:`_runs`); once some run."""
    gate, runs = tmp_path / "gate", tmp_path / "runs"
    futures = [
        client.submit(sample_tasks.noted_then_gated, str(runs), str(gate), i)
        for i in range(TASKS)
    ]
    wait_until(lambda: len(_runs(tmp_path)) >= 2)
    return futures, gate


def _runs(tmp_path: Path) -> Counter[int]:
    """How many times each task of :func:`_gated` has begun to run."""
    with contextlib.suppress(FileNotFoundError):
        return Counter(int(n) for n in (tmp_path / "runs").read_text().split())
    return Counter()


def test_a_client_rides_the_death_of_its_dispatcher(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Two dispatchers on hosts of their own, four workers: the host whose
    dispatcher a client uses is SIGKILLed with 200 tasks in flight (running,
    held by workers, queued); every task finishes with its value, through
    the other dispatcher, which the client calls at once: never the dead
    one again, though its announcement runs on for a while; once the
    workers have let go of what they held for it, only the tasks that had
    started run again (at least once, as the README says). `pool workers`
    of a third machine lists both dispatchers while both live."""
    hosts = Hosts(namespace, redis_server.url, tmp_path)
    locator = Locator(namespace, hosts.url, str(hosts.token))
    with hosts.dispatcher("a") as first, hosts.workers(4), hosts.client() as client:
        assert client.submit(sample_tasks.square, 3).result(30) == 9  # (through a)
        [dead] = live_sync(hosts.url, namespace)
        with hosts.dispatcher("b"):
            both = {a.address for a in live_sync(hosts.url, namespace)}
            assert len(both) == 2
            listed = pool_command(
                *("workers", "-n", namespace, "--discovery", hosts.url),
                *("--token-file", str(hosts.token)),
            ).stdout.splitlines()
            assert sum(line.startswith("worker ") for line in listed) == 4
            assert {
                line.split("address=")[1].split()[0]
                for line in listed
                if line.startswith("dispatcher ")
            } == both
            futures, gate = _gated(client, tmp_path)
            kill_host(first)
            [alive] = [t for t in locator.all_now() if t.address != dead.address]
            # (once every worker has let go of what it held for the dead one)
            wait_until(lambda: _held_for_others(locator, alive) == 0, 30)
            began = _runs(tmp_path)  # (none has ended: the gate is shut)
            with counting_calls(dead.address) as calls:
                gate.touch()
                assert [f.result(60) for f in futures] == list(range(TASKS))
            assert calls == [0]
            # At least once: a task a worker had started for the dead
            # dispatcher runs again; one it held, never.
            runs = _runs(tmp_path)
            assert set(runs) == set(range(TASKS)) and max(runs.values()) <= 2
            assert {i for i, n in runs.items() if n == 2} <= set(began)
            wait_until(lambda: len(live_sync(hosts.url, namespace)) == 1, 30)


def test_a_client_hangs_up_on_a_hung_dispatcher(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The host of a client's dispatcher SIGSTOPped (a hang: its streams
    stay open and answer nothing) with 200 tasks in flight: once its
    announcement runs out, the client sends them to the other dispatcher,
    and every task finishes with its value."""
    hosts = Hosts(namespace, redis_server.url, tmp_path)
    with hosts.dispatcher("a") as first, hosts.workers(4), hosts.client() as client:
        assert client.submit(sample_tasks.square, 3).result(30) == 9  # (through a)
        with hosts.dispatcher("b"):
            futures, gate = _gated(client, tmp_path)
            hung = (first.dispatcher_pid(), first.proc.pid)
            for pid in hung:
                os.kill(pid, signal.SIGSTOP)
            try:
                wait_until(lambda: len(live_sync(hosts.url, namespace)) == 1, 30)
                gate.touch()
                assert [f.result(60) for f in futures] == list(range(TASKS))
            finally:
                for pid in hung:
                    os.kill(pid, signal.SIGCONT)


def test_a_new_client_finds_the_live_dispatcher(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A client that starts while one of the two dispatchers is dead (its
    announcement not yet run out) runs its tasks through the other."""
    hosts = Hosts(namespace, redis_server.url, tmp_path)
    with hosts.dispatcher("a") as first, hosts.dispatcher("b"), hosts.workers(2):
        kill_host(first)
        assert len(live_sync(hosts.url, namespace)) == 2  # (a's lease runs on)
        for _ in range(4):  # (each client takes one of the two at random)
            with hosts.client() as client:
                assert list(client.map(sample_tasks.square, range(20))) == [
                    x * x for x in range(20)
                ]


def test_a_dispatcher_that_stops_hands_its_tasks_to_the_other(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The host of a client's dispatcher stops cleanly (Ctrl-C) with 200
    tasks in flight: what it had not sent to a worker, it hands back, and
    the client sends that to the other dispatcher; every task finishes
    with its value (none fails with PoolStopping)."""
    hosts = Hosts(namespace, redis_server.url, tmp_path)
    with hosts.dispatcher("a") as first, hosts.workers(2), hosts.client() as client:
        assert client.submit(sample_tasks.square, 3).result(30) == 9  # (through a)
        with hosts.dispatcher("b"):
            futures, gate = _gated(client, tmp_path)
            first.proc.send_signal(signal.SIGINT)
            wait_until(lambda: len(live_sync(hosts.url, namespace)) == 1, 30)
            gate.touch()
            assert [f.result(60) for f in futures] == list(range(TASKS))
            assert first.proc.wait(60) == 0


def test_tasks_run_on_through_both_dispatchers_while_redis_is_down(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Redis stops with a client on each of two dispatchers: tasks submitted
    while it is down, for longer than a lease, all come back with their
    values (neither client hangs up on its dispatcher, whose announcement
    it cannot read); once Redis is back, with its data lost, both
    dispatchers are announced again and both clients go on."""
    hosts = Hosts(namespace, redis_server.url, tmp_path)
    locator = Locator(namespace, hosts.url, str(hosts.token))
    with (
        hosts.dispatcher("a"),
        hosts.dispatcher("b"),
        hosts.workers(2, "--concurrency", "1"),
        hosts.client() as first,
        hosts.client() as second,
    ):
        for client in (first, second):  # (the second takes the other one)
            assert client.submit(sample_tasks.square, 3).result(30) == 9
        clients = [
            v.clients for t in locator.all_now() if (v := ask_dispatcher(locator, t))
        ]
        assert clients == [1, 1]
        redis_server.stop()
        try:
            # 12 s of naps on 2 slots: Redis stays down past a lease (3 s)
            naps = [0.1 + i * 1e-6 for i in range(60)]  # (each a value of its own)
            maps = [c.map(sample_tasks.nap, naps, chunksize=1) for c in (first, second)]
            assert [list(m) for m in maps] == [naps, naps]
        finally:
            redis_server.start()
        wait_until(lambda: len(live_sync(hosts.url, namespace)) == 2, 30)
        for client in (first, second):
            assert client.submit(sample_tasks.square, 4).result(30) == 16


def test_a_client_leaves_a_dispatcher_that_missed_two_renewals(
    namespace: str, redis_server: RedisServer
) -> None:
    """A dispatcher whose lease runs on but was last renewed more than
    STALE_S ago (its host hung) is left by a watching client, once another
    one is renewed; one renewed lately is not left."""
    import redis

    store = redis.Redis(port=redis_server.port)
    keys = announcements._keys(namespace)
    lease_ms = int(announcements.LEASE_S * 1000)
    stale_ms = int((announcements.STALE_S + 0.5) * 1000)
    beating = threading.Event()

    def heartbeats() -> None:
        """Keep "alive" renewed, and "hung" announced as if last renewed
        STALE_S + 0.5 s ago (its lease always runs another 0.5 s)."""
        while not beating.is_set():
            for ident, lease in (("alive", lease_ms), ("hung", lease_ms - stale_ms)):
                where = Announced("127.0.0.1:1", id=ident).encode()
                store.eval(announcements._RENEW, 2, *keys, ident, where, lease)
            beating.wait(0.05)  # (a heartbeat's period, not a wait for an event)

    async def left(ident: str) -> bool:
        """Whether a client of ``ident`` leaves it within a few looks."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(6 * announcements.WATCH_S):
                await announcements.until_withdrawn(redis_server.url, namespace, ident)
                return True
        return False

    beat = threading.Thread(target=heartbeats)
    beat.start()
    try:
        wait_until(lambda: len(live_sync(redis_server.url, namespace)) == 2)
        assert asyncio.run(left("hung"))
        assert not asyncio.run(left("alive"))
    finally:
        beating.set()
        beat.join()
        store.delete(*keys)
        store.close()


def _held_for_others(locator: Locator, target: Target) -> int | None:
    """What the workers last told the dispatcher ``target`` they hold for
    other dispatchers, in all (None if it does not answer)."""
    view = ask_dispatcher(locator, target)
    return None if view is None else sum(view.others.values())


def sent_by_dispatcher(locator: Locator) -> dict[str, int]:
    """How many tasks each dispatcher (by address) has at workers, of
    those that have some."""
    sent = {}
    for target in locator.all_now():
        view = ask_dispatcher(locator, target)
        if view is not None and (count := sum(view.in_flight.values())):
            sent[target.address] = count
    return sent
