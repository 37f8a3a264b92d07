"""The scheduler's promises, in a real pool: no task waits while a slot is
free, a fresh pool spreads its first tasks, and a future stays PENDING and
cancellable until its call starts.

Tasks that must stay put wait on gate files the test creates; nothing
here waits on a clock. A task stuck where it must not be makes its wait
run into the deadline (or the test's timeout), which fails the test.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pool import Client, Pool
from pool.dispatcher_pb2 import ListWorkersRequest
from tests.support import sample_tasks
from tests.support.helpers import wait_until
from tests.support.pools import running_pool
from tests.support.rpc import dispatcher_stub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEADLINE_S = 60.0  # for what must happen; only a broken scheduler waits this long
Futures = list[concurrent.futures.Future[Any]]


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[Path]:
    """A directory for gate and mark files; every gate opens at the end."""
    try:
        yield tmp_path
    finally:
        for name in ("gate", "gate-a", "gate-b"):
            (tmp_path / name).touch()


def _unsettled(namespace: str) -> int:
    """Tasks the dispatcher still has: queued, or on a worker."""
    with dispatcher_stub(namespace) as (stub, metadata):
        reply = stub.ListWorkers(ListWorkersRequest(), metadata=metadata, timeout=10)
    return int(reply.queued) + sum(int(w.in_flight) for w in reply.workers)


def _all_done(futures: Futures) -> bool:
    _, not_done = concurrent.futures.wait(futures, timeout=DEADLINE_S)
    return not not_done


def _hold(client: Client, gate: Path) -> concurrent.futures.Future[Any]:
    holder = client.submit(sample_tasks.gated_pid, str(gate))
    wait_until(holder.running, DEADLINE_S)
    return holder


@pytest.mark.parametrize("learned", [False, True], ids=["fresh", "learned-short"])
def test_short_tasks_never_wait_behind_a_long_one(gates: Path, learned: bool) -> None:
    """A task holds one worker of a Pool(2) until its gate opens; twenty
    short tasks submitted after it all finish before the gate opens, on a
    fresh pool and on one that has learned its tasks are short (and so
    sends a worker many ahead).

    Regression: short tasks waited 3 s behind a long one, on the busy
    worker, while the other sat idle."""
    with Pool(workers=2) as client:
        if learned:
            assert sum(client.map(abs, range(-100, 100), chunksize=1)) == 10_000
        holder = _hold(client, gates / "gate")
        shorts = [client.submit(sample_tasks.square, i) for i in range(20)]
        assert _all_done(shorts), "a short task waited behind the holder"
        assert not holder.done()
        assert [f.result() for f in shorts] == [i * i for i in range(20)]
        (gates / "gate").touch()
        assert holder.result(timeout=DEADLINE_S) > 0


def test_a_burst_with_a_long_task_spreads_over_both_workers(gates: Path) -> None:
    """The holder and seven short tasks sent in one burst to a fresh Pool(2):
    all seven finish while the holder still waits.

    Regression: three of the seven waited behind the holder while the
    other worker was free."""
    with Pool(workers=2) as client:
        holder = client.submit(sample_tasks.gated_pid, str(gates / "gate"))
        shorts = [client.submit(sample_tasks.square, i) for i in range(7)]
        assert _all_done(shorts), "a short task waited behind the holder"
        assert not holder.done()
        (gates / "gate").touch()
        holder.result(timeout=DEADLINE_S)


@pytest.mark.parametrize("learned", [False, True], ids=["fresh", "learned-short"])
def test_two_tasks_that_wait_for_each_other_run_at_once(
    gates: Path, learned: bool
) -> None:
    """Two tasks on a Pool(2) each wait until both have started: they
    finish only if they run at the same time, one on each worker: on a
    fresh pool, and on one that has learned its tasks are short (and so
    packs them onto one worker).

    Regressions: Pool.__enter__ returned before the dispatcher had linked
    the second worker, so both went to the first; packed behind the first,
    the second stayed there while the other worker was idle."""
    with Pool(workers=2) as client:
        if learned:
            assert sum(client.map(abs, range(-100, 100), chunksize=1)) == 10_000
        a = client.submit(sample_tasks.meet, str(gates), "a", "b")
        b = client.submit(sample_tasks.meet, str(gates), "b", "a")
        assert _all_done([a, b]), "the two tasks did not run at once"
        assert (a.result(), b.result()) == ("a", "b")


def test_pool_up_is_ready_only_once_every_worker_is_linked(
    namespace: str, gates: Path
) -> None:
    """The first two tasks a client sends to `pool up --workers 2` as soon
    as it says `ready` run at once, one on each worker (each waits until
    both have started)."""
    with running_pool(namespace, "--workers", "2"), Client(namespace) as client:
        a = client.submit(sample_tasks.meet, str(gates), "a", "b")
        b = client.submit(sample_tasks.meet, str(gates), "b", "a")
        assert _all_done([a, b]), "the two tasks did not run at once"
        assert (a.result(), b.result()) == ("a", "b")


def test_futures_cancel_until_their_call_starts_and_never_run(gates: Path) -> None:
    """Both workers are held. Of forty calls submitted after, at least 36
    cancel (the others are RUNNING), and no cancelled call ever runs, though
    the gate opens the moment the cancels return: each call that runs
    leaves a file.

    Regressions: once a pool had learned its tasks were short, all forty
    reported running() and none would cancel; cancel() said True before
    the worker that held the call had withdrawn it (the test then had to
    wait for the cancels to settle before opening the gate)."""
    with Pool(workers=2) as client:
        assert sum(client.map(abs, range(-100, 100), chunksize=1)) == 10_000
        holders = [_hold(client, gates / "gate") for _ in range(2)]
        marks = [gates / f"mark-{i}" for i in range(40)]
        futures = [client.submit(sample_tasks.mark, str(m)) for m in marks]
        cancelled = [f for f in futures if f.cancel()]
        assert len(cancelled) >= 36
        assert not any(f.running() for f in cancelled)
        (gates / "gate").touch()
        assert _all_done(holders + [f for f in futures if not f.cancelled()])
        ran = {i for i, m in enumerate(marks) if m.exists()}
        assert ran == {i for i, f in enumerate(futures) if not f.cancelled()}


def test_run_in_executor_calls_cancelled_by_asyncio_never_run(gates: Path) -> None:
    """Through asyncio's run_in_executor, a call whose asyncio future is
    cancelled before it starts never runs.

    Regressions: asyncio raised CancelledError for three of six queued
    calls, and all six ran anyway; the concurrent future said cancelled
    before the pool had withdrawn its call (the test then waited for the
    cancels to settle before opening the gate)."""
    with Pool(workers=2) as client:
        holders = [_hold(client, gates / "gate") for _ in range(2)]
        marks = [gates / f"mark-{i}" for i in range(6)]

        async def main() -> list[bool]:
            loop = asyncio.get_running_loop()
            calls = [
                loop.run_in_executor(client, sample_tasks.mark, str(m)) for m in marks
            ]
            await asyncio.sleep(0)  # (each call is submitted)
            for call in calls:
                call.cancel()
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            return [isinstance(o, asyncio.CancelledError) for o in outcomes]

        cancelled = asyncio.run(main())
        assert all(cancelled)
        (gates / "gate").touch()
        assert _all_done(holders)
        assert not any(m.exists() for m in marks)


def test_a_worker_that_frees_up_takes_what_another_holds_unstarted(
    gates: Path,
) -> None:
    """Each worker of a Pool(2) is held and holds one more task unstarted.
    When one worker's gate opens, it runs its own task and then the one the
    other worker still holds: each runs exactly once, both on the free one.
    """
    with Pool(workers=2) as client:
        held_a = _hold(client, gates / "gate-a")
        held_b = _hold(client, gates / "gate-b")
        marks = [gates / "mark-0", gates / "mark-1"]
        extras = [client.submit(sample_tasks.mark, str(m)) for m in marks]
        wait_until(lambda: _unsettled(client.namespace) == 4)
        assert not any(f.running() for f in extras)
        (gates / "gate-b").touch()
        free_pid = held_b.result(timeout=DEADLINE_S)
        assert _all_done(extras), "a task stayed behind the held worker"
        assert [f.result() for f in extras] == [free_pid, free_pid]
        assert not held_a.done()
        (gates / "gate-a").touch()
        assert held_a.result(timeout=DEADLINE_S) != free_pid
        assert all(m.exists() for m in marks)


def test_wait_first_completed_returns_the_quick_call_alone(gates: Path) -> None:
    """CPython's WaitTests.test_first_completed, with a gate for its sleep:
    wait(FIRST_COMPLETED) on mul(21, 2) and a held call returns the product
    alone, with the held call and an already cancelled future not done."""
    cancelled_future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    cancelled_future.cancel()
    with Pool(workers=2) as client:
        product = client.submit(sample_tasks.mul, 21, 2)
        held = client.submit(sample_tasks.gated_pid, str(gates / "gate"))
        done, not_done = concurrent.futures.wait(
            [cancelled_future, product, held],
            timeout=DEADLINE_S,
            return_when=concurrent.futures.FIRST_COMPLETED,
        )
        assert done == {product} and not_done == {cancelled_future, held}
        assert product.result() == 42
        (gates / "gate").touch()
        held.result(timeout=DEADLINE_S)


def test_wait_with_a_timeout_leaves_the_held_call_pending(gates: Path) -> None:
    """CPython's WaitTests.test_timeout, with a gate for its sleep: a
    wait(ALL_COMPLETED) that times out returns the finished futures (one
    cancelled, one failed, one successful) as done and the held call as
    not done."""
    cancelled: concurrent.futures.Future[Any] = concurrent.futures.Future()
    cancelled.cancel()
    cancelled.set_running_or_notify_cancel()
    failed: concurrent.futures.Future[Any] = concurrent.futures.Future()
    failed.set_exception(OSError())
    succeeded: concurrent.futures.Future[Any] = concurrent.futures.Future()
    succeeded.set_result(42)
    with Pool(workers=2) as client:
        held = client.submit(sample_tasks.gated_pid, str(gates / "gate"))
        done, not_done = concurrent.futures.wait(
            [cancelled, failed, succeeded, held],
            timeout=0.05,
            return_when=concurrent.futures.ALL_COMPLETED,
        )
        assert done == {cancelled, failed, succeeded} and not_done == {held}
        (gates / "gate").touch()
        assert held.result(timeout=DEADLINE_S) > 0


def test_a_second_clients_task_waits_for_a_turn_not_for_the_first_ones_backlog(
    gates: Path,
) -> None:
    """The one worker of a Pool(1) is held, and its client queues 100 tasks
    behind the holder; a second client then sends one. Once the gate opens,
    the second client's task runs within the first few: the dispatcher
    serves its clients in turn, one task each.

    Regression: one queue served every client in arrival order, so a new
    client's task waited behind everything another had queued."""
    log = gates / "log"
    with Pool(workers=1) as client:
        holder = _hold(client, gates / "gate")
        first = [
            client.submit(sample_tasks.gated, str(gates / "gate"), i, str(log))
            for i in range(100)
        ]
        wait_until(lambda: _unsettled(client.namespace) == 101, DEADLINE_S)
        with Client(client.namespace) as other:
            second = other.submit(sample_tasks.gated, str(gates / "gate"), -1, str(log))
            wait_until(lambda: _unsettled(client.namespace) == 102, DEADLINE_S)
            (gates / "gate").touch()
            assert second.result(timeout=DEADLINE_S) == -1
        assert _all_done([holder, *first])
    order = [int(line) for line in log.read_text().split()]
    assert sorted(order) == [-1, *range(100)]
    assert order.index(-1) < 4, f"the second client's task ran {order.index(-1) + 1}th"
