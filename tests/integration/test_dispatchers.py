"""Several dispatchers of one pool on Redis: each host runs `pool up
--workers 0` in the same namespace (a runtime directory of its own stands
for the host), four workers join from other "hosts", and a client of a
third machine rides the loss of the dispatcher it uses."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from pool import Client
from pool.cli.inspect import ask_dispatcher
from pool.client.announcements import live_sync
from pool.client.rendezvous import Locator, Target
from tests import sample_tasks
from tests.helpers import wait_until
from tests.integration.test_dashboard import ARTIFACTS
from tests.integration.test_redis_pool import remote_worker
from tests.pools import RunningPool, dashboard_url, pool_command, running_pool
from tests.redis_server import RedisServer
from tests.rpc import call, submit_to, value
from workers.protocol.worker_pb2 import Task

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


def _kill_host(pool: RunningPool) -> None:
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
    one again, though its announcement runs on for a while; only a task
    that had begun runs again (at least once, as the README says). `pool
    workers` of a third machine lists both dispatchers while both live."""
    hosts = Hosts(namespace, redis_server.url, tmp_path)
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
            _kill_host(first)
            began = _runs(tmp_path)  # (none has ended: the gate is shut)
            with counting_calls(dead.address) as calls:
                gate.touch()
                assert [f.result(60) for f in futures] == list(range(TASKS))
            assert calls == [0]
            # At least once: only a task that had begun may run again.
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
        _kill_host(first)
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


def test_a_task_held_behind_another_dispatchers_stays_cancellable(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """One worker with one slot, linked by two dispatchers: a task sent
    through one dispatcher, held by the worker behind a task of the other's
    that runs, is cancelled (the worker withdraws it: it never runs), and
    the worker then runs the next task as usual."""
    hosts = Hosts(namespace, redis_server.url, tmp_path)
    locator = Locator(namespace, hosts.url, str(hosts.token))
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    with (
        hosts.dispatcher("a"),
        hosts.dispatcher("b"),
        hosts.workers(1, "--concurrency", "1"),
        hosts.client() as first,
    ):
        running = first.submit(
            sample_tasks.started_then_gated,
            *(str(tmp_path / "started"), str(gate), str(tmp_path / "done"), 1),
        )
        wait_until((tmp_path / "started").exists)
        [used] = _sent(locator)  # (the first client's dispatcher)
        with ExitStack() as stack:
            while True:  # a client of the other one (each takes one at random)
                second = stack.enter_context(hosts.client())
                held = second.submit(sample_tasks.mark, str(ran))
                wait_until(lambda: sum(_sent(locator).values()) == 2, 30)
                if _sent(locator).get(used) == 1:
                    break
                held.cancel()  # (the same dispatcher: try another client)
                wait_until(lambda: sum(_sent(locator).values()) == 1, 30)
            assert held.cancel()
            with pytest.raises(CancelledError):
                held.result(30)
            # (the worker's answer, withdrawn, reaches its dispatcher)
            wait_until(lambda: _sent(locator) == {used: 1}, 30)
            gate.touch()
            assert running.result(30) == 1
            assert second.submit(sample_tasks.square, 4).result(30) == 16
        assert not ran.exists()


def test_a_slot_another_dispatcher_filled_is_not_promised_again(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Two dispatchers, two workers of one slot each: while a task sent
    through one dispatcher runs, a task sent through the other starts on
    the free worker, not held behind it (the busy worker told the other
    dispatcher what it holds for the first). Fails without the sharing:
    both dispatchers pick the same first worker."""
    hosts = Hosts(namespace, redis_server.url, tmp_path)
    locator = Locator(namespace, hosts.url, str(hosts.token))
    gate = tmp_path / "gate"
    started = [tmp_path / f"started-{i}" for i in range(2)]

    def task(i: int) -> Task:
        done = str(tmp_path / f"done-{i}")
        args = call(str(started[i]), str(gate), done, i)
        return Task(id=i, function="tests.sample_tasks:started_then_gated", args=args)

    with (
        hosts.dispatcher("a"),
        hosts.dispatcher("b"),
        hosts.workers(2, "--concurrency", "1"),
        ThreadPoolExecutor(2) as streams,
    ):
        first, second = locator.all_now()
        both = (first, second)  # (each links both workers)
        wait_until(lambda: all(_linked(locator, t) == 2 for t in both), 30)
        answers = [streams.submit(submit_to, first.address, first.token, [task(0)])]
        try:
            wait_until(started[0].exists, 30)
            answers.append(
                streams.submit(submit_to, second.address, second.token, [task(1)])
            )
            wait_until(started[1].exists, 30)
        finally:
            gate.touch()
        assert [value(a.result(30)[i]) for i, a in enumerate(answers)] == [0, 1]


def test_new_clients_take_the_least_loaded_dispatcher(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """With a task held in one of two dispatchers, each new client takes
    the other (by what each answers), not one at random."""
    hosts = Hosts(namespace, redis_server.url, tmp_path)
    locator = Locator(namespace, hosts.url, str(hosts.token))
    gate = tmp_path / "gate"
    with (
        hosts.dispatcher("a"),
        hosts.dispatcher("b"),
        hosts.workers(2),
        hosts.client() as first,
        ExitStack() as others,
    ):
        held = first.submit(sample_tasks.gated, str(gate), 1)
        try:
            wait_until(lambda: len(_sent(locator)) == 1, 30)
            [busy] = _sent(locator)
            for _ in range(3):
                client = others.enter_context(hosts.client())
                assert client.submit(sample_tasks.square, 3).result(30) == 9
            clients = {
                t.address: view.clients
                for t in locator.all_now()
                if (view := ask_dispatcher(locator, t)) is not None
            }
            assert [n for a, n in clients.items() if a != busy] == [3]
            assert clients[busy] == 1
        finally:
            gate.touch()
        assert held.result(30) == 1


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


def test_the_dashboard_shows_every_dispatcher(
    namespace: str, redis_server: RedisServer, tmp_path: Path, browser: Any
) -> None:
    """Host a's dashboard, in a real browser, lists both dispatchers (its
    own marked), each one's clients; host b's once it is killed shows no
    answer, then goes once its lease runs out. A screenshot is kept."""
    hosts = Hosts(namespace, redis_server.url, tmp_path)
    with (
        hosts.dispatcher("a", "--dashboard", "127.0.0.1:0") as first,
        hosts.dispatcher("b") as second,
        hosts.workers(1),
        hosts.client() as client,
    ):
        assert client.submit(sample_tasks.square, 3).result(30) == 9
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(dashboard_url(first))
        rows = page.locator("#dispatchers tbody tr")
        wait_until(lambda: rows.count() == 2, 30)
        page.wait_for_selector("#dispatchers td .here >> text=this host")
        cells = "[...document.querySelectorAll('#dispatchers tbody tr')]"
        clients = f"{cells}.map(r => r.cells[1].textContent).sort().join()"
        page.wait_for_function(f"{clients} === '0,1'")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-dispatchers.png"))
        _kill_host(second)
        page.wait_for_selector("#dispatchers tr.gone >> text=no answer")
        wait_until(lambda: rows.count() == 1, 30)


def _linked(locator: Locator, target: Target) -> int:
    """How many workers the dispatcher ``target`` links."""
    view = ask_dispatcher(locator, target)
    return 0 if view is None else len(view.in_flight)


def _sent(locator: Locator) -> dict[str, int]:
    """How many tasks each dispatcher (by address) has at workers, of
    those that have some."""
    sent = {}
    for target in locator.all_now():
        view = ask_dispatcher(locator, target)
        if view is not None and (count := sum(view.in_flight.values())):
            sent[target.address] = count
    return sent
