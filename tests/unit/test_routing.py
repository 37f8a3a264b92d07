"""The dispatcher's routing: placement, tags, attempts, cancels, stopping;
driven through played links (:mod:`tests.support.routing`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid

import grpc
import pytest

from discovery import DiscoveryEvent, WorkerInfo
from pool import NoWorkerAvailable, WorkerLost
from pool.errors import PoolStopping
from pool.routing import roster
from pool.routing.jobs import LinkEvents
from pool.routing.losses import MAX_UNTAKEN_LOSSES
from pool.routing.placement import Router
from tests.support.routing import (
    FakeLink,
    settle,
    until,
    with_status,
    world,
)
from workers.protocol import codec

pytestmark = pytest.mark.timeout(10)


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
        w.router.on_event(
            DiscoveryEvent("worker-updated", with_status(a.info, "draining"))
        )
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
        w.router.on_event(
            DiscoveryEvent("worker-updated", with_status(a.info, "ready"))
        )
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
    opened again, and the tasks it had go out again on the new one. Whether
    it is alive (a file lock's probe) is asked off the event loop."""
    asked_on: list[threading.Thread] = []

    def alive(namespace: str, uid: uuid.UUID) -> bool:
        asked_on.append(threading.current_thread())
        return True

    async with world(alive=alive) as w:
        first = w.add("a", capacity=1)
        job = w.submit()
        first.close()
        await settle()
        assert w.router.queued == 1
        # (The new link is made, then the task goes out on it: a turn of the
        # loop or more apart, as the loop schedules them.)
        await asyncio.wait_for(until(lambda: job.link is not None), 5)
        assert job.link is w.link("a") and job.link is not first
    assert asked_on and threading.current_thread() not in asked_on


async def test_a_worker_that_refuses_us_is_left_alone_until_it_registers_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A live worker that refuses this dispatcher (a wrong token, say) is
    linked again after a pause, and after MAX_REFUSALS refusals in a row for
    the same reason it is left alone: no link until it registers again,
    when it is linked at once. Regression: it was linked every 0.5 s for as
    long as it was registered, two error lines a second."""
    monkeypatch.setattr(roster, "RECONNECT_DELAY_S", 0.001)  # (the pauses' scale)
    async with world(alive=lambda namespace, uid: True) as w:
        info = WorkerInfo(uuid.uuid4(), "unix:/a", 100, "1", frozenset(), capacity=1)
        w.refusals[info.uid] = "UNAUTHENTICATED: the token is not this pool's"
        w.router.on_event(DiscoveryEvent("worker-added", info))
        await asyncio.wait_for(until(lambda: info.uid not in w.router.links), 5)
        assert w.linked == [info.uid] * roster.MAX_REFUSALS
        w.router.on_event(DiscoveryEvent("worker-updated", info))
        await settle()
        assert w.linked == [info.uid] * roster.MAX_REFUSALS  # (news is not a new start)
        del w.refusals[info.uid]  # its pool's token, now
        w.router.on_event(DiscoveryEvent("worker-added", info))
        await asyncio.wait_for(
            until(lambda: w.router.links.get(info.uid) is not None), 5
        )
        assert len(w.linked) == roster.MAX_REFUSALS + 1
        job = w.submit()
        assert job.link is w.router.links[info.uid]


async def test_a_worker_never_reached_is_said_once_and_tried_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A live worker whose stream never reaches it (its address does not
    resolve here, say) is said once, at warning level, with its address and
    why, after MAX_REFUSALS links in a row; it is still linked again after
    that, and taken once it is reached. Regression: only an info line each
    time, so `pool up` said nothing while its tasks waited for a worker."""
    monkeypatch.setattr(roster, "RECONNECT_DELAY_S", 0.001)  # (the pauses' scale)
    caplog.set_level(logging.WARNING, logger="pool.dispatcher")
    async with world(alive=lambda namespace, uid: True) as w:
        info = WorkerInfo(uuid.uuid4(), "vm:7000", 100, "1", frozenset(), capacity=1)
        w.unreachable[info.uid] = "UNAVAILABLE: DNS resolution failed for vm:7000"
        w.router.on_event(DiscoveryEvent("worker-added", info))
        await asyncio.wait_for(
            until(lambda: len(w.linked) > roster.MAX_REFUSALS + 1), 5
        )
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1
        assert "vm:7000" in said[0] and "DNS resolution failed" in said[0]
        del w.unreachable[info.uid]  # (its name resolves now)
        await asyncio.wait_for(until(lambda: w.router.links[info.uid].connected), 5)
        job = w.submit()
        assert job.link is w.router.links[info.uid]
        assert len(caplog.records) == 1


def test_a_link_that_does_not_reach_its_worker_waits_longer_each_time() -> None:
    """The pause before linking a worker again doubles with each link in a
    row that did not reach it, from RECONNECT_DELAY_S, up to a bound."""
    delays = [roster.reconnect_delay(n) for n in range(12)]
    assert delays[:4] == [roster.RECONNECT_DELAY_S * k for k in (1, 1, 2, 4)]
    assert delays == sorted(delays)
    assert max(delays) == roster.MAX_RECONNECT_DELAY_S


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
