"""The worker's service in this process, over a real grpc.aio stream: what
it starts, what it holds and withdraws, what it refuses, and the room that
holds a sender back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from tests.support.rpc import SQUARE, call, status, value
from workers import running
from workers.protocol.worker_pb2 import ResultBatch, Task, TaskBatch
from workers.protocol.worker_pb2_grpc import WorkerStub, add_WorkerServicer_to_server
from workers.service import WorkerService

pytestmark = pytest.mark.timeout(30)
GATED = "tests.support.sample_tasks:gated"
ASYNC_UNTIL_CANCELLED = "tests.support.sample_tasks:async_until_cancelled"
ASYNC_DOUBLE = "tests.support.sample_tasks:async_double"


class Stream:
    """One Run call, and everything it answered so far."""

    def __init__(self, stub: WorkerStub) -> None:
        self.stub, self.call = stub, stub.Run()
        self.started: list[int] = []
        self.others: list[int] = []  # what it was told, in turn
        self.results: dict[int, list[Any]] = {}
        self.changed = asyncio.Event()

    async def send(self, *tasks: Task) -> None:
        await self.call.write(TaskBatch(tasks=tasks))

    async def read(self) -> None:
        async for batch in self.call:
            assert isinstance(batch, ResultBatch)
            self.started += batch.started
            if batch.HasField("others"):
                self.others.append(batch.others)
            for result in batch.results:
                self.results.setdefault(result.id, []).append(result)
            self.changed.set()

    async def until(self, done: Any) -> None:
        async with asyncio.timeout(20):
            while not done():
                self.changed.clear()
                await self.changed.wait()


@asynccontextmanager
async def worker(
    tmp_path: Path, concurrency: int = 1
) -> AsyncIterator[tuple[Stream, Path]]:
    """A service on loopback and one stream to it; ``gate`` frees gated tasks."""
    gate = tmp_path / "gate"
    service = WorkerService(concurrency, lambda: None)
    server = aio.server()
    add_WorkerServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    stream = Stream(WorkerStub(channel))  # type: ignore[no-untyped-call]
    try:
        async with asyncio.TaskGroup() as group:
            reading = group.create_task(stream.read())
            try:
                yield stream, gate
            finally:
                gate.touch()
                await stream.call.done_writing()
                await asyncio.wait_for(reading, 20)
    finally:
        await channel.close()
        await server.stop(0)
        await service.aclose()


def gated(task_id: int, gate: Path) -> Task:
    return Task(id=task_id, function=GATED, args=call(str(gate), task_id))


async def test_a_task_is_started_then_answered_once_and_its_id_guarded(
    tmp_path: Path,
) -> None:
    """The worker says it started a task before its result; the same id sent
    while it is in flight is refused with ALREADY_EXISTS, and the first goes
    on to its one answer."""
    async with worker(tmp_path) as (stream, gate):
        await stream.send(gated(1, gate))
        await stream.until(lambda: 1 in stream.started)
        await stream.send(gated(1, gate))
        await stream.until(lambda: 1 in stream.results)
        (refused,) = stream.results[1]
        assert status(refused) == grpc.StatusCode.ALREADY_EXISTS
        gate.touch()
        await stream.until(lambda: len(stream.results[1]) == 2)
        assert value(stream.results[1][1]) == 1
        assert stream.started == [1]


async def test_a_malformed_task_is_refused_alone(tmp_path: Path) -> None:
    async with worker(tmp_path) as (stream, _):
        bad = Task(id=5, function=SQUARE, args=call(3), timeout_s=-1.0)
        await stream.send(bad, Task(id=6, function=SQUARE, args=call(4)))
        await stream.until(lambda: {5, 6} <= stream.results.keys())
        assert status(stream.results[5][0]) == grpc.StatusCode.INVALID_ARGUMENT
        assert value(stream.results[6][0]) == 16
        assert stream.started == [6]


async def test_a_full_stream_is_not_read_until_a_task_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for two, a third task is not even read (so gRPC's flow
    control holds the sender) until one of the two is answered. (The two
    slot threads may report their starts in either order.)"""
    monkeypatch.setattr(running, "MAX_STREAM_TASKS", 2)
    async with worker(tmp_path, concurrency=2) as (stream, gate):
        await stream.send(gated(1, gate), gated(2, gate))
        await stream.until(lambda: sorted(stream.started) == [1, 2])
        await stream.send(Task(id=3, function=SQUARE, args=call(3)))
        # (A bounded look: a slow machine can only let this pass wrongly.)
        await asyncio.sleep(0.3)
        assert 3 not in stream.started and 3 not in stream.results
        gate.touch()
        await stream.until(lambda: {1, 2, 3} <= stream.results.keys())
        assert value(stream.results[3][0]) == 9


def logged(task_id: int, gate: Path, log: Path) -> Task:
    """A gated task that notes its id in ``log`` when it runs."""
    return Task(id=task_id, function=GATED, args=call(str(gate), task_id, str(log)))


async def test_a_held_task_is_withdrawn_by_a_cancel_and_never_runs(
    tmp_path: Path,
) -> None:
    """With its one slot busy, the worker holds the next task unstarted: a
    cancel withdraws it (CANCELLED, never listed as started, never run),
    and the running one is not disturbed."""
    log = tmp_path / "log"
    async with worker(tmp_path) as (stream, gate):
        await stream.send(logged(1, gate, log), logged(2, gate, log))
        await stream.until(lambda: 1 in stream.started)
        await stream.call.write(TaskBatch(cancel=[2]))
        await stream.until(lambda: 2 in stream.results)
        assert status(stream.results[2][0]) == grpc.StatusCode.CANCELLED
        gate.touch()
        await stream.until(lambda: 1 in stream.results)
        assert value(stream.results[1][0]) == 1
    assert stream.started == [1]
    assert log.read_text().split() == ["1"]


async def test_a_started_task_runs_on_through_a_cancel(tmp_path: Path) -> None:
    """A cancel that comes once a plain task has started leaves it to run:
    its one answer is its value (the start was already reported)."""
    async with worker(tmp_path) as (stream, gate):
        await stream.send(gated(1, gate))
        await stream.until(lambda: 1 in stream.started)
        await stream.call.write(TaskBatch(cancel=[1]))
        await stream.send(Task(id=2, function=SQUARE, args=call(5)))
        gate.touch()
        await stream.until(lambda: {1, 2} <= stream.results.keys())
        assert value(stream.results[1][0]) == 1
        assert len(stream.results[1]) == 1


async def test_held_tasks_start_in_order_as_slots_free(tmp_path: Path) -> None:
    """Tasks wait for a slot in the order they came; each is reported
    started only when it gets one. (Two slot threads that take tasks one
    after the other may report them in either order.) Regression: the test
    waited for the starts [1, 2] exactly, and timed out on [2, 1] (3.14)."""
    log = tmp_path / "log"
    async with worker(tmp_path, concurrency=2) as (stream, gate):
        await stream.send(*(logged(i, gate, log) for i in range(1, 6)))
        await stream.until(lambda: len(stream.started) >= 2)
        assert sorted(stream.started) == [1, 2]  # (3 to 5 wait for a slot)
        gate.touch()
        await stream.until(lambda: len(stream.results) == 5)
    assert sorted(stream.started) == [1, 2, 3, 4, 5]
    assert sorted(stream.started[:2]) == [1, 2]
    assert sorted(map(int, log.read_text().split())) == [1, 2, 3, 4, 5]


async def test_each_stream_hears_what_the_worker_holds_for_the_others(
    tmp_path: Path,
) -> None:
    """With two streams (two dispatchers), each is told, as it changes, how
    many tasks the worker holds for the other: taken tasks count until they
    are answered; a lone stream is told nothing."""
    async with worker(tmp_path, concurrency=2) as (first, gate):
        await first.send(Task(id=9, function=SQUARE, args=call(3)))
        await first.until(lambda: 9 in first.results)
        assert first.others == []
        second = Stream(first.stub)
        async with asyncio.TaskGroup() as group:
            group.create_task(second.read())
            await first.send(gated(1, gate), gated(2, gate))
            await second.until(lambda: second.others[-1:] == [2])
            await first.until(lambda: 1 in first.started and 2 in first.started)
            await second.send(Task(id=5, function=SQUARE, args=call(4)))
            await first.until(lambda: first.others[-1:] == [1])  # (5 waits)
            gate.touch()
            await second.until(lambda: second.others[-1:] == [0])
            await second.until(lambda: 5 in second.results)
            await first.until(lambda: first.others[-1:] == [0])
            await second.call.done_writing()
        assert 0 not in second.others[:-1]  # (it rose to 2, and held there)


async def test_a_stream_that_hangs_up_is_held_for_no_longer(tmp_path: Path) -> None:
    """A second stream (another dispatcher) that hangs up with a task
    running: the first is told the worker holds nothing for others now."""
    async with worker(tmp_path, concurrency=2) as (first, gate):
        second = Stream(first.stub)
        async with asyncio.TaskGroup() as group:
            reading = group.create_task(second.read())
            await second.send(gated(1, gate))
            await first.until(lambda: first.others[-1:] == [1])
            second.call.cancel()
            await first.until(lambda: first.others[-1:] == [0])
            reading.cancel()


async def test_a_running_coroutine_runs_on_through_a_cancel_and_stops_for_an_abandon(
    tmp_path: Path,
) -> None:
    """A cancel leaves a started coroutine to run (its start was reported:
    the client's no); an abandon (its caller is gone) cancels it there, and
    its one answer is CANCELLED; the worker serves on."""
    started, cancelled, done = (str(tmp_path / n) for n in ("s", "c", "d"))
    until_cancelled = Task(
        id=1, function=ASYNC_UNTIL_CANCELLED, args=call(started, cancelled, done)
    )
    async with worker(tmp_path) as (stream, _):
        await stream.send(until_cancelled)
        await stream.until(lambda: 1 in stream.started)
        await stream.call.write(TaskBatch(cancel=[1]))
        await stream.send(Task(id=2, function=SQUARE, args=call(5)))
        await stream.until(lambda: 2 in stream.results)
        assert 1 not in stream.results
        await stream.call.write(TaskBatch(abandon=[1]))
        await stream.until(lambda: 1 in stream.results)
        assert status(stream.results[1][0]) == grpc.StatusCode.CANCELLED
        assert len(stream.results[1]) == 1 and (tmp_path / "c").exists()


async def test_held_tasks_of_a_higher_priority_start_first(tmp_path: Path) -> None:
    """Among the tasks a worker holds for its slot, a higher priority starts
    first; equal ones in the order they came."""
    log = tmp_path / "log"
    async with worker(tmp_path) as (stream, gate):
        await stream.send(logged(1, gate, log))
        await stream.until(lambda: stream.started == [1])
        held = [logged(i, gate, log) for i in range(2, 5)]
        held[2].priority = 5  # (4 came last, and starts first of those held)
        await stream.send(*held)
        # A coroutine's answer comes once the batch before it was taken.
        await stream.send(Task(id=9, function=ASYNC_DOUBLE, args=call(1)))
        await stream.until(lambda: 9 in stream.results)
        gate.touch()
        await stream.until(lambda: len(stream.results) == 5)
    assert [i for i in stream.started if i != 9] == [1, 4, 2, 3]
