"""The dispatcher's routing logic, driven through small fake links."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from discovery import DiscoveryEvent, WorkerInfo
from pool import NoWorkerAvailable, PoolStopping, WorkerLost
from pool.dispatcher.choosing import PACK_FACTOR, Chooser
from pool.dispatcher.jobs import InFlight, Job, LinkEvents
from pool.dispatcher.links import MAX_AHEAD_PER_SLOT, WorkerLink
from pool.dispatcher.placement import MAX_UNTAKEN_LOSSES, Router
from pool.dispatcher.queue import TaskQueue
from workers.protocol import codec
from workers.protocol.worker_pb2 import Chunk, FetchRequest, Result, Task

pytestmark = pytest.mark.timeout(10)


class FakeLink:
    """A worker's stream that the test plays: it takes, answers and dies."""

    def __init__(self, info: WorkerInfo, router: LinkEvents) -> None:
        self.info = info
        self.router = router
        self.in_flight = InFlight(self)
        self.done = 0
        self.dropped = False
        self.written: list[Job] = []  # what reached the worker
        self.unwritten: list[Job] = []  # sent, not yet written
        self.cancels: list[int] = []
        self.ahead = 0  # what it may hold past its slots
        self.pace_s, self.rtt_s, self.progressed_at = 0.0, 0.001, 0.0
        self.others = 0
        self._ended = asyncio.Event()

    @property
    def ready(self) -> bool:
        return (
            not self._ended.is_set()
            and not self.dropped
            and (self.info.status == "ready")
        )

    @property
    def slots(self) -> int:
        return self.info.capacity

    @property
    def load(self) -> int:
        return len(self.in_flight) + self.others

    @property
    def free(self) -> int:
        return self.slots + self.ahead - self.load

    def send(self, job: Job) -> None:
        job.task.attempt = job.attempts + 1
        self.in_flight.add(job)
        self.unwritten.append(job)

    def take_back(self, job: Job) -> bool:
        if job not in self.unwritten:
            return False
        self.unwritten.remove(job)
        self.in_flight.remove(job.task.id)
        return True

    def cancel(self, task_id: int) -> None:
        self.cancels.append(task_id)

    async def run(self) -> None:
        self.router.on_connected(self)  # (ready from the start, as its stream)
        await self._ended.wait()

    def close(self) -> None:
        self._ended.set()

    def fetch(self, request: FetchRequest) -> AsyncIterator[Chunk]:
        raise LookupError("a played worker holds no values")

    async def upload(self, chunks: AsyncIterator[Chunk]) -> None:
        raise LookupError("a played worker takes no arguments")

    # -- what the test makes the worker do ------------------------------------

    def write(self) -> list[Job]:
        """The sent tasks reach the worker."""
        self.written += self.unwritten
        written, self.unwritten = self.unwritten, []
        return written

    def start(self, *jobs: Job) -> None:
        self.router.on_started(self, [job.task.id for job in jobs])

    def answer(self, job: Job, value: Any) -> None:
        self.router.on_results(
            self, [Result(id=job.task.id, value=pickle.dumps(value))]
        )

    def withdrawn(self, job: Job) -> None:
        """The worker gives back a task it held unstarted."""
        withdrawn = Result(id=job.task.id, failure=codec.cancelled())
        self.router.on_results(self, [withdrawn])

    def tell_others(self, count: int) -> None:
        """The worker holds ``count`` tasks for other dispatchers now."""
        self.others = count
        self.router.on_results(self, [])

    def refuse(self, job: Job) -> None:
        self.router.on_results(self, [Result(id=job.task.id, failure=codec.rejected())])


class Owner:
    """A client stream: what it heard about each of its jobs."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.results: dict[int, Result] = {}

    def on_started(self, job: Job) -> None:
        self.started.append(job.client_id)

    def on_wanted(self, job: Job, source: str) -> None:
        raise AssertionError("no task of these tests has its arguments held")

    def on_result(self, job: Job, result: Result) -> None:
        assert job.client_id not in self.results, "answered twice"
        self.results[job.client_id] = result

    def value(self, client_id: int) -> Any:
        result = self.results[client_id]
        assert result.HasField("value"), result.failure
        return pickle.loads(result.value)

    def error(self, client_id: int) -> BaseException:
        result = self.results[client_id]
        assert result.HasField("failure"), result
        return codec.exception_of(result.failure)


class World:
    """A router, its fake links by worker name, and one owner."""

    def __init__(self, router: Router, links: dict[uuid.UUID, FakeLink]) -> None:
        self.router, self._links, self.owner = router, links, Owner()
        self.infos: dict[str, WorkerInfo] = {}
        self._next_id = 0

    def add(
        self, name: str, capacity: int = 2, tags: frozenset[str] = frozenset()
    ) -> FakeLink:
        """A worker appears in discovery."""
        pid = 100 + len(self.infos)
        info = WorkerInfo(
            uuid.uuid4(), f"unix:/{name}", pid, "1", tags, capacity=capacity
        )
        self.infos[name] = info
        self.router.on_event(DiscoveryEvent("worker-added", info))
        return self.link(name)

    def link(self, name: str) -> FakeLink:
        return self._links[self.infos[name].uid]

    def submit(self, tags: tuple[str, ...] = ()) -> Job:
        self._next_id += 1
        job = Job(Task(function="m:f"), frozenset(tags), self.owner, self._next_id)
        self.router.submit(job)
        self.router.pump()
        return job


@asynccontextmanager
async def world(**options: Any) -> AsyncIterator[World]:
    links: dict[uuid.UUID, FakeLink] = {}

    def connect(info: WorkerInfo, router: LinkEvents) -> FakeLink:
        links[info.uid] = FakeLink(info, router)
        return links[info.uid]

    alive = options.pop("alive", lambda namespace, uid: False)
    async with Router("ns", connect, is_alive=alive, **options) as router:
        yield World(router, links)


async def settle() -> None:
    """Let the router's own tasks (link ends, failures) take their step."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_tasks_go_to_the_least_loaded_ready_worker_up_to_capacity() -> None:
    """Each task goes to the ready worker with the lowest load; none is sent
    past a worker's capacity; the rest wait, in order, and go as slots free."""
    async with world() as w:
        a, b = w.add("a", capacity=2), w.add("b", capacity=1)
        jobs = [w.submit() for _ in range(4)]
        assert [j.link for j in jobs[:3]].count(a) == 2
        assert [j.link for j in jobs[:3]].count(b) == 1
        assert jobs[3].link is None and w.router.queued == 1
        a.write()
        a.answer(jobs[0], "done")
        assert w.owner.value(jobs[0].client_id) == "done"
        assert jobs[3].link is a and w.router.queued == 0


async def test_tags_choose_the_worker_and_untagged_workers_wait() -> None:
    """A task needing tags goes only to a worker that has them all."""
    async with world() as w:
        w.add("plain")
        gpu = w.add("gpu", tags=frozenset({"gpu", "big"}))
        assert w.submit(("gpu",)).link is gpu
        assert w.submit(("gpu", "big")).link is gpu
        assert w.submit(("tpu",)).link is None


async def test_a_task_counts_an_attempt_only_if_it_may_have_run() -> None:
    """A worker lost with a task it had started costs that task an attempt,
    and so does one it may have started (a slot was free for it, and its
    start report may not have left); a task it held behind a busy slot costs
    none. The attempt number travels with the task."""
    async with world() as w:
        a = w.add("a", capacity=1)
        a.ahead = 1
        taken, untaken = w.submit(), w.submit()
        a.write()
        a.start(taken)
        assert w.owner.started == [taken.client_id]
        a.close()
        await settle()
        assert (taken.attempts, untaken.attempts) == (1, 0)
        assert untaken.untaken_losses == 1
        b = w.add("b", capacity=2)
        assert taken.link is b and taken.task.attempt == 2
        assert untaken.link is b and untaken.task.attempt == 1
        b.write()
        b.start(taken)
        b.close()  # untaken had a free slot there: it may have run
        await settle()
        assert (taken.attempts, untaken.attempts) == (2, 1)


async def test_a_task_that_kills_every_worker_fails_after_max_attempts() -> None:
    """A poison task that each worker took and died of fails with WorkerLost
    after max_attempts, naming each worker and how it died (the exit the
    supervisor reported); nothing else is disturbed."""
    async with world(max_attempts=3) as w:
        poison = w.submit()
        for round_ in range(3):
            link = w.add(f"w{round_}", capacity=1)
            assert poison.link is link
            link.write()
            link.start(poison)
            w.router.record_exit(link.info.pid, "exit code 3")
            link.close()
            await settle()
        error = w.owner.error(poison.client_id)
        assert isinstance(error, WorkerLost) and error.attempts == 3
        assert [s.rsplit(": ", 1)[1] for s in error.workers] == ["exit code 3"] * 3
        assert str(error).startswith("the task was lost with its worker 3 time(s)")


async def test_a_task_never_taken_is_not_retried_forever() -> None:
    """A task whose workers all die before it could start (their one slot
    busy with another task) fails after MAX_UNTAKEN_LOSSES, rather than
    bouncing for ever."""
    async with world() as w:
        job = w.submit()
        for round_ in range(MAX_UNTAKEN_LOSSES):
            link = w.add(f"w{round_}", capacity=1)
            link.ahead = 1
            w.submit()  # (another task, which takes the slot)
            link.write()
            link.start(next(j for j in link.in_flight.values() if j is not job))
            link.close()
            await settle()
        error = w.owner.error(job.client_id)
        assert isinstance(error, WorkerLost)
        assert f"sent to {MAX_UNTAKEN_LOSSES} workers that each died" in str(error)


async def test_a_busy_worker_hands_a_task_back_without_an_attempt() -> None:
    """UNAVAILABLE (draining, stuck) puts a task back at the queue's front
    without counting an attempt."""
    async with world() as w:
        a = w.add("a", capacity=1)
        job = w.submit()
        a.write()
        a.start(job)
        w.router.on_event(DiscoveryEvent("worker-updated", _status(a.info, "draining")))
        a.refuse(job)
        assert job.link is None and job.attempts == 0 and w.router.queued == 1
        b = w.add("b")
        assert job.link is b


async def test_a_worker_that_refused_gets_nothing_until_its_news_changes() -> None:
    """After an UNAVAILABLE (every thread stuck), the router sends that
    worker nothing more until discovery brings its new state, instead of
    bouncing the task back at once."""
    async with world() as w:
        a = w.add("a", capacity=2)
        job = w.submit()
        a.write()
        a.refuse(job)
        assert job.link is None and w.router.queued == 1
        w.router.pump()
        assert job.link is None
        w.router.on_event(DiscoveryEvent("worker-updated", _status(a.info, "ready")))
        assert job.link is a


async def test_cancel_reaches_the_queue_the_link_or_the_worker() -> None:
    """A queued task is cancelled at once; one sent but not yet written is
    withdrawn; one the worker has gets a cancel sent to it."""
    async with world() as w:
        a = w.add("a", capacity=2)
        written, unwritten = w.submit(), w.submit()
        a.write()
        a.unwritten.append(unwritten)
        a.written.remove(unwritten)
        queued = w.submit()
        for job in (queued, unwritten, written):
            w.router.cancel(job)
        for job in (queued, unwritten):
            status = codec.status_of(w.owner.results[job.client_id].failure)
            assert status == grpc.StatusCode.CANCELLED
        assert a.cancels == [written.task.id]
        assert written.client_id not in w.owner.results
        assert w.router.queued == 0 and unwritten.task.id not in a.in_flight


async def test_stopping_fails_what_waits_and_delivers_what_runs() -> None:
    """When the pool drains, queued tasks and new ones fail at once with
    PoolStopping; a task a worker has still delivers its result."""
    async with world() as w:
        a = w.add("a", capacity=1)
        running, queued = w.submit(), w.submit()
        a.write()
        a.start(running)
        w.router.stop_taking()
        assert isinstance(w.owner.error(queued.client_id), PoolStopping)
        late = w.submit()
        assert "never sent to a worker" in str(w.owner.error(late.client_id))
        a.answer(running, 42)
        assert w.owner.value(running.client_id) == 42
        await w.router.finish(linger_s=1.0)


async def test_finish_fails_what_no_worker_answered_in_time() -> None:
    """At the dispatcher's stop, a task whose worker never answers fails
    with PoolStopping once the linger is over."""
    async with world() as w:
        a = w.add("a", capacity=1)
        stuck = w.submit()
        a.write()
        a.start(stuck)
        await w.router.finish(linger_s=0.01)
        assert "stopped before its worker answered" in str(
            w.owner.error(stuck.client_id)
        )


async def test_the_queue_bound_clears_room_until_tasks_leave() -> None:
    """With max_queued tasks waiting, `room` is clear (client streams stop
    reading); it is set again as soon as one leaves the queue."""
    async with world(max_queued=3) as w:
        jobs = [w.submit() for _ in range(3)]
        assert not w.router.queue.room.is_set()
        w.router.cancel(jobs[0])
        assert w.router.queue.room.is_set()
        w.add("a", capacity=5)
        assert w.router.queued == 0 and w.router.queue.room.is_set()


async def test_a_task_with_no_matching_worker_expires() -> None:
    """A task no ready worker could take for no_worker_timeout_s fails with
    NoWorkerAvailable naming its tags."""
    async with world(no_worker_timeout_s=0.0) as w:
        job = w.submit(("gpu",))
        w.router.expire()  # first look: it starts waiting
        w.router.expire()
        error = w.owner.error(job.client_id)
        assert isinstance(error, NoWorkerAvailable) and error.tags == ("gpu",)


async def test_once_started_a_task_no_worker_has_tags_for_fails_at_once() -> None:
    """Before the pool has started, a tagged task waits (its worker may be
    on its way); once the supervisor says every worker started, a waiting
    one fails, and so does the next at once, naming the tags that exist.
    A task a worker has tags for is not touched."""
    async with world(no_worker_timeout_s=3600.0) as w:
        w.add("a", capacity=1, tags=frozenset({"cpu", "big"}))
        w.add("b", capacity=1, tags=frozenset({"cpu"}))
        waiting = w.submit(("gpu",))
        matched = w.submit(("cpu", "big"))
        assert waiting.client_id not in w.owner.results
        w.router.started()
        error = w.owner.error(waiting.client_id)
        assert isinstance(error, NoWorkerAvailable) and error.known == ("big", "cpu")
        assert "the tags its workers have: big, cpu" in str(error)
        late = w.submit(("tpu",))
        assert isinstance(w.owner.error(late.client_id), NoWorkerAvailable)
        assert matched.client_id not in w.owner.results and not matched.finished
        assert w.router.queued == 0


async def test_a_broken_link_to_a_live_worker_reconnects() -> None:
    """A stream that breaks while its worker is alive and registered is
    opened again, and the tasks it had go out again on the new one."""
    async with world(alive=lambda namespace, uid: True) as w:
        first = w.add("a", capacity=1)
        job = w.submit()
        first.close()
        await settle()
        assert w.router.queued == 1
        await asyncio.wait_for(_until(lambda: w.link("a") is not first), 5)
        assert job.link is w.link("a")


async def test_a_link_that_fails_unexpectedly_ends_the_router() -> None:
    """A link task that raises (a bug) is not swallowed: the router's task
    group ends, and the error reaches whoever runs the router (the
    dispatcher, which then exits and is restarted)."""

    class Broken(FakeLink):
        async def run(self) -> None:
            raise RuntimeError("link bug")

    def connect(info: WorkerInfo, router: LinkEvents) -> FakeLink:
        return Broken(info, router)

    with pytest.raises(BaseExceptionGroup) as raised:
        async with Router("ns", connect, is_alive=lambda ns, uid: False) as router:
            info = WorkerInfo(uuid.uuid4(), "unix:/x", 1, "1")
            router.on_event(DiscoveryEvent("worker-added", info))
            await asyncio.sleep(3600)  # cancelled by the failure
    assert raised.group_contains(RuntimeError, match="link bug")


def _status(info: WorkerInfo, status: str) -> WorkerInfo:
    return dataclasses.replace(info, status=status)  # type: ignore[arg-type]


async def _until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.01)  # polled within the caller's deadline


async def test_a_free_worker_steals_a_task_held_behind_a_busy_slot() -> None:
    """With the queue empty, a worker with a slot that has nothing for it
    gets a task another worker holds unstarted: the holder is asked to
    withdraw it, and, withdrawn, it goes to the free worker (no attempt, no
    answer to its client meanwhile)."""
    async with world() as w:
        a = w.add("a", capacity=1)
        a.ahead = 1
        first, second = w.submit(), w.submit()
        assert first.link is a and second.link is a
        a.write()
        a.start(first)
        b = w.add("b", capacity=1)
        w.router.pump()  # (b's stream is up: what a link reports)
        assert a.cancels == [second.task.id] and second.withdrawing == "requeue"
        w.router.pump()
        assert a.cancels == [second.task.id], "asked once, not again"
        a.withdrawn(second)
        assert second.link is b and b.unwritten == [second]
        assert second.attempts == 0 and second.client_id not in w.owner.results


async def test_a_worker_busy_with_another_dispatchers_tasks_is_sent_none() -> None:
    """A worker that says it holds tasks of another dispatcher counts them
    in its load: a task goes to the worker whose slot is free, though this
    dispatcher has sent neither anything."""
    async with world() as w:
        a, b = w.add("a", capacity=1), w.add("b", capacity=1)
        a.tell_others(1)
        first = w.submit()
        assert first.link is b
        b.write()
        b.start(first)
        b.tell_others(2)  # (now b is the busier one)
        a.tell_others(0)
        assert w.submit().link is a


async def test_a_slot_another_dispatcher_frees_steals_a_task_held_here() -> None:
    """A task held behind a busy slot is moved when another dispatcher's
    task ends on a second worker: its report alone (no result of ours)
    frees the slot, and the steal follows at once."""
    async with world() as w:
        a, b = w.add("a", capacity=1), w.add("b", capacity=1)
        a.ahead = 1
        b.tell_others(1)
        first, second = w.submit(), w.submit()
        assert first.link is a and second.link is a  # (b is not free)
        a.write()
        a.start(first)
        assert a.cancels == []
        b.tell_others(0)
        assert a.cancels == [second.task.id] and second.withdrawing == "requeue"
        a.withdrawn(second)
        assert second.link is b and second.attempts == 0


async def test_a_steal_that_comes_too_late_leaves_the_task_where_it_runs() -> None:
    """A task that started before the withdrawal reached its worker runs
    there, and its result is its client's."""
    async with world() as w:
        a = w.add("a", capacity=1)
        a.ahead = 1
        first, second = w.submit(), w.submit()
        a.write()
        a.start(first)
        w.add("b", capacity=1)
        w.router.pump()
        assert second.withdrawing == "requeue"
        a.answer(first, 1)
        a.start(second)
        assert second.withdrawing is None
        a.answer(second, 2)
        assert (w.owner.value(1), w.owner.value(2)) == (1, 2)


async def test_a_task_not_yet_written_is_stolen_at_once() -> None:
    """A held task still waiting to be written is taken back without asking
    its worker."""
    async with world() as w:
        a = w.add("a", capacity=1)
        a.ahead = 1
        first, second = w.submit(), w.submit()
        b = w.add("b", capacity=1)
        w.router.pump()
        assert second.link is b and a.cancels == [] and a.unwritten == [first]


async def test_a_cancel_withdraws_a_held_task_even_while_it_is_stolen() -> None:
    """A client's cancel of a task its worker holds unstarted asks the worker
    to withdraw it; withdrawn, it is answered CANCELLED, not moved, even if a
    steal had asked first."""
    async with world() as w:
        a = w.add("a", capacity=1)
        a.ahead = 2
        first, second, third = w.submit(), w.submit(), w.submit()
        a.write()
        a.start(first)
        w.router.cancel(third)
        assert a.cancels == [third.task.id]
        w.add("b", capacity=1)
        w.router.pump()
        assert second.withdrawing == "requeue"
        w.router.cancel(second)
        assert a.cancels == [third.task.id, second.task.id], "no second ask"
        a.withdrawn(second)
        a.withdrawn(third)
        for job in (second, third):
            assert codec.status_of(w.owner.results[job.client_id].failure) == (
                grpc.StatusCode.CANCELLED
            )


async def test_short_work_is_packed_onto_the_busiest_worker_that_keeps_up() -> None:
    """Workers whose tasks run far shorter than a round trip take tasks
    first, the busiest first, each up to its room; then the least loaded
    of the rest (one whose pace is not known yet, or is long)."""
    async with world() as w:
        b = w.add("b", capacity=1)
        b.ahead = 3
        first = w.submit()  # (b only: b is the busiest from now on)
        a, fresh, slow = (w.add(n, capacity=1) for n in ("a", "fresh", "slow"))
        await settle()
        for link in (a, b, slow):  # (each started a task within a round trip)
            link.rtt_s, link.progressed_at = 60.0, time.monotonic()
            link.pace_s = link.rtt_s / PACK_FACTOR / 10
        slow.pace_s = slow.rtt_s / PACK_FACTOR * 2  # (runs near a round trip)
        a.ahead = 3
        jobs = [w.submit() for _ in range(10)]
        assert first.link is b
        assert [j.link for j in jobs[:7]] == [b] * 3 + [a] * 4
        assert {j.link for j in jobs[7:9]} == {fresh, slow}
        assert jobs[9].link is None, "no room is left anywhere"


async def test_a_packed_worker_that_stops_answering_has_its_held_tasks_stolen() -> None:
    """A worker that keeps up with short work holds tasks behind its busy
    slot while another worker is idle; once it lags (starts nothing for a
    while), with nothing else happening, a held task is asked back, and
    goes to the idle worker.

    Regression (of packing): a long task among short ones, packed on a
    worker, kept the short ones behind it while another worker sat idle."""
    async with world() as w:
        a = w.add("a", capacity=1)
        a.ahead = 2
        running, *held = (w.submit() for _ in range(3))
        a.write()
        a.start(running)
        a.rtt_s, a.pace_s = 0.05, 0.0001
        a.progressed_at = time.monotonic()  # it keeps up, for a while
        w.add("b", capacity=1)
        await settle()
        assert a.cancels == [], "a worker that keeps up is left alone"
        async with asyncio.timeout(5):
            await _until(lambda: a.cancels == [held[-1].task.id])
        assert time.monotonic() - a.progressed_at >= a.rtt_s
        a.withdrawn(held[-1])
        assert held[-1].link is w.link("b")


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
