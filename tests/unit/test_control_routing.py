"""The dispatcher's side of control over running work, through played links
(:mod:`tests.support.routing`): priorities and the held work they take
back, stops, and what a lost worker's cancelled, stopped or timed-out
tasks become."""

from __future__ import annotations

import grpc
import pytest

from pool.routing.jobs import Job
from tests.support.routing import FakeLink, World, settle, world
from workers.protocol import codec
from workers.protocol.errors import TaskTimeout

pytestmark = pytest.mark.timeout(10)


def _one_running_one_held(w: World) -> tuple[FakeLink, Job, Job]:
    """A worker of one slot that runs a task and holds one more unstarted."""
    a = w.add("a", capacity=1)
    a.ahead = 1
    running, held = w.submit(), w.submit()
    a.write()
    a.start(running)
    return a, running, held


async def test_a_higher_priority_is_placed_first_and_equal_ones_in_order() -> None:
    """With one slot free at a time, queued tasks go highest priority first,
    and in the order they came within one priority."""
    async with world() as w:
        a = w.add("a", capacity=1)
        first = w.submit()
        a.write()
        a.start(first)
        lows = [w.submit(priority=-1) for _ in range(2)]
        mids = [w.submit() for _ in range(2)]
        high = w.submit(priority=5)
        order = []
        for job in [first, high, *mids, *lows]:
            assert job.link is a, f"expected {job.client_id} next"
            order.append(job.client_id)
            a.write()
            a.start(job)
            a.answer(job, job.client_id)  # (the next one goes there)
        assert order == [1, 6, 4, 5, 2, 3]


async def test_a_waiting_higher_priority_takes_back_a_lower_one_held_unstarted() -> (
    None
):
    """A worker holds a low-priority task unstarted behind a busy slot; a
    higher one arrives: the held one is asked back, and once withdrawn the
    higher one goes there, the lower one queued again ahead of its peers."""
    async with world() as w:
        a, running, held = _one_running_one_held(w)
        later = w.submit()
        assert held.link is a and later.link is None and a.cancels == []
        urgent = w.submit(priority=3)
        assert a.cancels == [held.task.id] and urgent.link is None
        a.withdrawn(held)
        assert urgent.link is a and held.link is None
        a.write()
        a.answer(running, 1)
        assert held.link is None  # (until the urgent one, held there, starts)
        a.start(urgent)
        assert held.link is a and later.link is None


async def test_a_higher_priority_no_worker_fits_takes_nothing_back() -> None:
    """A high-priority task whose tags no linked worker has leaves what the
    workers hold alone (taking it back would only send it there again)."""
    async with world() as w:
        a, _, held = _one_running_one_held(w)
        w.submit(("gpu",), priority=9)
        assert a.cancels == [] and held.link is a


async def test_a_stop_goes_to_the_worker_even_for_a_started_task() -> None:
    """A cancel of a started task is not sent (the worker would refuse it);
    a stop is, once; and the worker's answer is the client's."""
    async with world() as w:
        a = w.add("a", capacity=1)
        job = w.submit()
        a.write()
        a.start(job)
        w.router.cancel(job)
        assert a.cancels == [] and a.stops == []
        w.router.cancel(job, "stop")
        w.router.cancel(job, "stop")
        assert a.stops == [job.task.id]
        a.withdrawn(job)
        assert codec.status_of(w.owner.results[job.client_id].failure) == (
            grpc.StatusCode.CANCELLED
        )


async def test_a_lost_workers_stopped_and_cancelled_tasks_never_run_again() -> None:
    """Lost with its worker: a task asked to stop is answered cancelled
    (started or not); one asked to cancel that had not started too; one
    asked to cancel that had started runs again (its client heard it
    started); one handed back unrun with a cancel asked is cancelled."""
    async with world() as w:
        a = w.add("a", capacity=2)
        a.ahead = 2  # (two held behind the two that run: not started there)
        stopped, cancelled, ran, handed = (w.submit() for _ in range(4))
        a.write()
        a.start(stopped, ran)
        w.router.cancel(stopped, "stop")
        w.router.cancel(cancelled)
        w.router.cancel(ran)
        w.router.cancel(handed)
        a.refuse(handed)
        a.close()
        await settle()
        status = {
            job.client_id: codec.status_of(w.owner.results[job.client_id].failure)
            for job in (stopped, cancelled, handed)
        }
        assert set(status.values()) == {grpc.StatusCode.CANCELLED}
        assert ran.client_id not in w.owner.results and ran.attempts == 1


async def test_a_task_lost_past_its_limit_fails_with_task_timeout() -> None:
    """A started task whose worker is lost after its time limit passed (the
    worker ended to stop it, and its answer was lost) fails with
    TaskTimeout and is not run again; one within its limit runs again."""
    async with world() as w:
        a = w.add("a", capacity=2)
        over, within = w.submit(timeout_s=1e-6), w.submit(timeout_s=3600)
        a.write()
        a.start(over, within)
        a.close()
        await settle()
        error = w.owner.error(over.client_id)
        assert isinstance(error, TaskTimeout) and error.timeout_s == 1e-6
        assert within.client_id not in w.owner.results and within.attempts == 1


async def test_a_lower_priority_waits_while_a_higher_one_is_held_unstarted() -> None:
    """A worker holds a high-priority task behind a busy slot: a low one
    queued after it is not sent anywhere (it would start first on a free
    worker); the worker that frees up takes the high one back from the
    holder, and once that started, the low one goes."""
    async with world() as w:
        a, b = w.add("a", capacity=1), w.add("b", capacity=1)
        a.ahead = 1
        first, second = w.submit(), w.submit()
        assert {first.link, second.link} == {a, b}
        busy_a = first if first.link is a else second
        busy_b = second if busy_a is first else first
        a.write()
        b.write()
        a.start(busy_a)
        b.start(busy_b)
        high = w.submit(priority=5)
        assert high.link is a
        a.write()
        low = w.submit()
        assert low.link is None
        b.answer(busy_b, 0)
        assert a.cancels == [high.task.id] and low.link is None
        a.withdrawn(high)
        assert high.link is b and low.link is None
        b.write()
        b.start(high)
        assert low.link is not None


async def test_an_abandon_reaches_a_started_task_and_its_loss_runs_nothing() -> None:
    """An abandon (nobody waits for the task) goes to the worker even once
    the task started (a running coroutine is cancelled there); lost with its
    worker, the task is answered cancelled and runs nowhere else."""
    async with world() as w:
        a = w.add("a", capacity=1)
        job = w.submit()
        a.write()
        a.start(job)
        w.router.cancel(job, "abandon")
        assert a.abandons == [job.task.id] and a.cancels == []
        a.close()
        await settle()
        result = w.owner.results[job.client_id]
        assert codec.status_of(result.failure) == grpc.StatusCode.CANCELLED


async def test_a_task_that_may_have_started_and_was_lost_past_its_limit_times_out() -> (
    None
):
    """A task sent to a free slot whose start was never reported (a call
    that held the GIL kept the worker's loop from it, until the kernel
    ended the worker) and lost past its limit fails with TaskTimeout."""
    async with world() as w:
        a = w.add("a", capacity=1)
        job = w.submit(timeout_s=1e-6)
        a.write()
        a.close()
        await settle()
        assert isinstance(w.owner.error(job.client_id), TaskTimeout)
