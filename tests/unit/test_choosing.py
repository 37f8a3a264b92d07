"""How much a link may hold, which link a job goes to, and the queue's
order."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from discovery import WorkerInfo
from pool.routing.choosing import Chooser
from pool.routing.jobs import Job
from pool.routing.links import MAX_AHEAD_PER_SLOT, WorkerLink
from pool.routing.queue import TaskQueue
from tests.support.routing import (
    FakeLink,
    Owner,
)
from workers.protocol.worker_pb2 import Task

pytestmark = pytest.mark.timeout(10)


def test_a_worker_is_sent_ahead_only_what_hides_a_round_trip() -> None:
    """Before its pace is known, and while its tasks run a round trip or
    longer, a worker is sent one task ahead per slot; far shorter tasks get
    as many as one round trip runs, up to the bound."""
    info = WorkerInfo(uuid.uuid4(), "unix:/w", 1, "1", frozenset(), capacity=2)
    link = WorkerLink(info, _NoEvents(), "token")
    assert link.free == 4
    link.rtt_s, link.pace_s = 0.0005, 0.002
    assert link.free == 4
    link.pace_s = 0.0001
    assert link.free == 2 * (1 + 5)
    link.pace_s = 1e-7
    assert link.free == 2 * (1 + MAX_AHEAD_PER_SLOT)


class _NoEvents:
    def on_connected(self, link: Any) -> None: ...
    def on_started(self, link: Any, task_ids: Any) -> None: ...
    def on_results(self, link: Any, results: Any) -> None: ...


def test_least_loaded_picks_as_a_scan_of_every_link_would() -> None:
    """The heap-backed choice, over a mix of jobs with and without tags,
    sends each where the least-loaded link with room and the tags is (the
    first on a tie), as a scan of every link for every job would."""
    rng = random.Random(7)
    for _ in range(50):
        infos = [
            WorkerInfo(
                uuid.uuid4(),
                f"unix:/{i}",
                i,
                "1",
                frozenset(rng.sample(["a", "b"], rng.randint(0, 2))),
                capacity=rng.randint(1, 3),
            )
            for i in range(rng.randint(1, 6))
        ]
        links = [FakeLink(info, _NoEvents()) for info in infos]
        for link in links:
            link.ahead = rng.randint(0, 2)
            for _ in range(rng.randint(0, 3)):
                link.in_flight[rng.getrandbits(32)] = None  # type: ignore[assignment]
        chooser = Chooser(links)  # type: ignore[arg-type]
        for n in range(20):
            job = Job(
                Task(id=n),
                frozenset(rng.sample(["a", "b"], rng.randint(0, 1))),
                Owner(),
                n,
            )
            fits = [k for k in links if k.free > 0 and job.tags <= k.info.tags]
            expected = min(fits, key=lambda k: len(k.in_flight) / k.slots, default=None)
            assert chooser.choose(job) is expected
            if expected is not None:
                expected.send(job)


def test_the_queue_serves_given_back_jobs_then_each_client_in_turn() -> None:
    """A job given back goes first; then one job of each client in turn. A
    job no link can take (its tags) keeps its place in its client's line,
    and goes once a link with its tags has room."""
    first, second = Owner(), Owner()
    queue = TaskQueue(100)
    lines = {"a0": first, "a1": first, "a2": first, "b0": second}
    lines |= {"b1": second, "back": second}
    jobs = {
        name: Job(Task(id=n), frozenset({"gpu"} if name == "a1" else ()), owner, n)
        for n, (name, owner) in enumerate(lines.items())
    }
    for name in ("a0", "a1", "a2", "b0", "b1"):
        queue.push(jobs[name])
    queue.push(jobs["back"], front=True)
    plain = FakeLink(
        WorkerInfo(uuid.uuid4(), "unix:/p", 1, "1", capacity=10), _NoEvents()
    )
    queue.place(Chooser([plain]))
    names = {id(job): name for name, job in jobs.items()}
    assert [names[id(j)] for j in plain.unwritten] == ["back", "a0", "b0", "b1", "a2"]
    assert queue and queue.waiting == 1
    gpu = FakeLink(
        WorkerInfo(uuid.uuid4(), "unix:/g", 2, "1", frozenset({"gpu"})), _NoEvents()
    )
    queue.place(Chooser([plain, gpu]))
    assert gpu.unwritten == [jobs["a1"]]
    assert not queue and queue.waiting == 0
