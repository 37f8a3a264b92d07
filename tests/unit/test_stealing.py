"""Stealing, and slots shared with other dispatchers: a free slot takes
what a worker holds behind a busy one; short work is packed."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from pool.routing.choosing import PACK_FACTOR
from pool.routing.jobs import Job
from tests.support.routing import (
    FakeLink,
    settle,
    until,
    world,
)
from workers.protocol import codec

pytestmark = pytest.mark.timeout(10)


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
    worker, kept the short ones behind it while another worker sat idle.
    (Whether it was left alone while it kept up is read from when it was
    asked: a look right after the idle worker came raced the clock.)"""
    async with world() as w:
        a = w.add("a", capacity=1)
        a.ahead = 2
        running, *held = (w.submit() for _ in range(3))
        a.write()
        a.start(running)
        a.rtt_s, a.pace_s = 0.05, 0.0001
        a.progressed_at = time.monotonic()  # it keeps up, for a while
        w.add("b", capacity=1)
        async with asyncio.timeout(5):
            await until(lambda: a.cancels == [held[-1].task.id])
        kept_up = a.cancelled_at[0] - a.progressed_at
        assert kept_up >= a.rtt_s, "a worker that keeps up is left alone"
        a.withdrawn(held[-1])
        assert held[-1].link is w.link("b")


async def test_a_holder_that_lags_sooner_is_looked_at_sooner() -> None:
    """Two workers keep up beside an idle one, the first to be looked at
    again in a minute, the other after a round trip of 50 ms: once the
    second lags, its held task is asked back, without waiting for the first.

    Regression: the look-again timer, once set for the first, was not set
    again for the second's sooner time."""
    async with world() as w:
        a = w.add("a", capacity=1)
        a.ahead = 3
        on_a = [w.submit() for _ in range(4)]  # (1 runs, 3 held: looked at first)
        keep_up(a, on_a[0], rtt_s=60.0)
        c = w.add("c", capacity=1)
        c.ahead = 2
        on_c = [w.submit() for _ in range(3)]  # (1 runs, 2 held)
        keep_up(c, on_c[0], rtt_s=0.05)
        assert [j.link for j in on_a + on_c] == [a] * 4 + [c] * 3
        w.add("b", capacity=1)
        async with asyncio.timeout(5):
            await until(lambda: c.cancels == [on_c[-1].task.id])
        assert a.cancels == []


def keep_up(link: FakeLink, running: Job, rtt_s: float) -> None:
    """``link``'s worker has what it was sent, started ``running`` now, and
    runs tasks far shorter than its round trip of ``rtt_s``."""
    link.write()
    link.start(running)
    link.rtt_s, link.pace_s = rtt_s, 0.0001
    link.progressed_at = time.monotonic()
