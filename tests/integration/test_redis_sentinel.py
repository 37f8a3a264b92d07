"""A pool whose registry is the primary a set of Sentinels names
(``--discovery redis+sentinel://...``): two redis-servers and three
Sentinels on loopback, and a failover while tasks are in flight."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from discovery.redis import registered
from pool import Client
from pool.cli.inspect import dispatcher_view
from pool.client.rendezvous import Locator
from tests.integration.test_redis_pool import remote_worker
from tests.support import sample_tasks
from tests.support.helpers import wait_until
from tests.support.pools import pool_command, running_pool
from tests.support.redis_server import SentinelSet, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TASKS = 200


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    """A primary, its replica and three Sentinels of this test's own."""
    found = SentinelSet()
    try:
        found.start()
        yield found
    finally:
        found.close()


def test_a_pool_rides_a_primary_failover_with_tasks_in_flight(
    namespace: str, sentinels: SentinelSet, tmp_path: Path
) -> None:
    """200 tasks in flight, two of them running, while the primary is
    SIGKILLed and the Sentinels promote its replica: every task finishes
    with its value, neither worker is dropped (the new primary is given a
    lease period before it reaps: their publishers renew there), and a
    worker started after the failover is found and runs tasks. The client
    finds the pool through the Sentinels too."""
    url, gate = sentinels.url, tmp_path / "gate"
    with (
        running_pool(namespace, "--workers", "2", "--discovery", url) as pool,
        Client(namespace, discovery_url=url) as client,
    ):
        started = [tmp_path / f"started-{i}" for i in range(TASKS)]
        futures = [
            client.submit(
                sample_tasks.started_then_gated,
                *(str(started[i]), str(gate), str(tmp_path / f"done-{i}"), i),
            )
            for i in range(TASKS)
        ]
        try:
            wait_until(lambda: sum(path.exists() for path in started) == 2)
            sentinels.kill_primary()
            sentinels.wait_failover()
            with (
                remote_worker(namespace, url, "127.0.0.2") as remote,
                Client(namespace, tags=("remote",)) as tagged,
            ):
                try:  # (the worker that joined may hold some of them)
                    wait_until(lambda: _workers_linked(namespace) == 3, 30)
                    # (leases that ran out in the failover are renewed there)
                    wait_until(lambda: _registered(url, namespace) == 3, 30)
                finally:
                    gate.touch()  # (else they would hold up the stops)
                assert [f.result(60) for f in futures] == list(range(TASKS))
                assert tagged.submit(sample_tasks.pid_after, 0.0).result(30) == remote
        finally:
            gate.touch()
        pool.lines.drain()  # (the worker that joined has dropped: it stopped)
        drops = [s for s in pool.lines.seen if s.startswith("worker-dropped ")]
        assert [s for s in drops if f"pid={remote} " not in s] == []


def _registered(url: str, namespace: str) -> int:
    """How many workers hold a lease (0 while no primary is named yet: for
    a moment after a failover, a Sentinel may still hold the new one down)."""
    try:
        return len(registered(url, namespace))
    except redis.ConnectionError:
        return 0


def _workers_linked(namespace: str) -> int:
    """How many workers the pool's dispatcher has (0 while it is not up)."""
    view = dispatcher_view(Locator(namespace))
    return 0 if view is None else len(view.in_flight)


def test_sentinels_that_do_not_answer_are_one_line(namespace: str) -> None:
    """No Sentinel where --discovery points: one line, exit 1."""
    url = f"redis+sentinel://127.0.0.1:{free_port()}/nothing-here"
    done = pool_command("up", "-n", namespace, "--discovery", url)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"pool: error: cannot reach the registry at {url}: no Sentinel there "
        f"answers with a primary for 'nothing-here'; start Redis there, or give "
        f"another --discovery"
    ]
