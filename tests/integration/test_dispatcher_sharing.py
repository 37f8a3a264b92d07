"""Several dispatchers of one pool on Redis, sharing it: a worker's slots
(never promised twice), cancels across dispatchers, which dispatcher a new
client takes, and the dashboard that shows them all. The hosts are
:class:`~tests.integration.test_dispatchers.Hosts`."""

from __future__ import annotations

from concurrent.futures import CancelledError, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from pool.cli.inspect import ask_dispatcher
from pool.client.rendezvous import Locator, Target
from tests.integration.test_dashboard import ARTIFACTS
from tests.integration.test_dispatchers import Hosts, kill_host, sent_by_dispatcher
from tests.support import sample_tasks
from tests.support.helpers import wait_until
from tests.support.pools import dashboard_url
from tests.support.redis_server import RedisServer
from tests.support.rpc import call, submit_to, value
from workers.protocol.worker_pb2 import Task

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


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
        [used] = sent_by_dispatcher(locator)  # (the first client's dispatcher)
        with ExitStack() as stack:
            while True:  # a client of the other one (each takes one at random)
                second = stack.enter_context(hosts.client())
                held = second.submit(sample_tasks.mark, str(ran))
                wait_until(lambda: sum(sent_by_dispatcher(locator).values()) == 2, 30)
                if sent_by_dispatcher(locator).get(used) == 1:
                    break
                held.cancel()  # (the same dispatcher: try another client)
                wait_until(lambda: sum(sent_by_dispatcher(locator).values()) == 1, 30)
            assert held.cancel()
            with pytest.raises(CancelledError):
                held.result(30)
            # (the worker's answer, withdrawn, reaches its dispatcher)
            wait_until(lambda: sent_by_dispatcher(locator) == {used: 1}, 30)
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
        return Task(
            id=i, function="tests.support.sample_tasks:started_then_gated", args=args
        )

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
            wait_until(lambda: len(sent_by_dispatcher(locator)) == 1, 30)
            [busy] = sent_by_dispatcher(locator)
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
        kill_host(second)
        page.wait_for_selector("#dispatchers tr.gone >> text=no answer")
        wait_until(lambda: rows.count() == 1, 30)


def _linked(locator: Locator, target: Target) -> int:
    """How many workers the dispatcher ``target`` links."""
    view = ask_dispatcher(locator, target)
    return 0 if view is None else len(view.in_flight)
