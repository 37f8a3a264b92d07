"""A worker keeps its promises whatever its tasks do: one answer per task,
honest capacity, coroutines cancelled with their caller, a loop that never
blocks."""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from discovery import WorkerInfo, list_workers
from pool import Client, Pool
from tests.support import sample_tasks
from tests.support.helpers import wait_until
from tests.support.rpc import call, worker_stub
from workers.protocol import auth
from workers.protocol.worker_pb2 import Task, TaskBatch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

GATED = "tests.support.sample_tasks:gated"


def _only_worker(namespace: str) -> WorkerInfo:
    (worker,) = list_workers(namespace)
    return worker


def _running(namespace: str) -> int:
    return sum(int(w.extra.get("running", "0")) for w in list_workers(namespace))


def test_a_task_whose_exception_cannot_be_printed_is_answered(tmp_path: Path) -> None:
    """A plain or coroutine task that raises an exception whose __str__
    raises gets exactly one answer (the exception itself), and the worker,
    with one thread, runs the next task.

    Regression: building the failure raised in the slot thread, which died:
    the task was never answered and the worker never ran a plain task again
    while it still advertised its capacity."""
    with Pool(workers=1, concurrency=1) as client:
        for fn in (sample_tasks.raise_bad_str, sample_tasks.async_raise_bad_str):
            error = client.submit(fn).exception(timeout=30)
            assert isinstance(error, sample_tasks.BadStr)
            assert client.submit(sample_tasks.square, 5).result(timeout=30) == 25
        wait_until(lambda: _running(client.namespace) == 0)


def test_hanging_up_cancels_the_streams_coroutine_tasks(tmp_path: Path) -> None:
    """A caller that cancels its Run stream cancels the coroutine tasks it
    had there: the task sees CancelledError and never reaches its end.

    Regression: the worker answered nobody and counted the task done, but
    the coroutine ran on to completion."""
    started, cancelled, done = (str(tmp_path / n) for n in ("s", "c", "d"))
    with Pool(workers=1) as client, worker_stub(client.namespace) as (stub, metadata):
        requests: queue.SimpleQueue[TaskBatch | None] = queue.SimpleQueue()
        task = Task(
            id=1,
            function="tests.support.sample_tasks:async_until_cancelled",
            args=call(started, cancelled, done),
        )
        requests.put(TaskBatch(tasks=[task]))
        run = stub.Run(iter(requests.get, None), metadata=metadata)
        assert list(next(run).started) == [1]
        wait_until(lambda: os.path.exists(started))
        run.cancel()
        wait_until(lambda: os.path.exists(cancelled))
        wait_until(lambda: _running(client.namespace) == 0)
        assert not os.path.exists(done)


@pytest.fixture
def import_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    gate = tmp_path / "import-gate"
    monkeypatch.setenv("SHMP_IMPORT_GATE", str(gate))  # the workers inherit it
    try:
        yield gate
    finally:
        gate.touch()


def test_a_hanging_import_does_not_hold_up_the_worker(import_gate: Path) -> None:
    """While a task's module takes long to import, the same worker runs
    another stream's tasks and answers health checks; the slow task then
    completes.

    Regression: the import ran on the worker's event loop and stalled
    everything on that worker."""
    with Pool(workers=1) as client, Client(client.namespace) as other:
        slow = client.submit("tests.support.hanging_import:identity", 3)
        importing = import_gate.with_name(import_gate.name + ".importing")
        wait_until(importing.exists)  # its module is being imported
        assert other.submit(sample_tasks.square, 6).result(timeout=30) == 36
        worker = _only_worker(client.namespace)
        metadata = auth.call_metadata(auth.read_token(client.namespace))
        with grpc.insecure_channel(worker.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = health.Check(
                health_pb2.HealthCheckRequest(), metadata=metadata, timeout=10
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert not slow.done() and not slow.running()  # (held until found)
        import_gate.touch()
        assert slow.result(timeout=30) == 3


def test_a_thread_a_hang_up_left_running_counts_stuck_and_its_worker_is_replaced(
    tmp_path: Path,
) -> None:
    """A caller hangs up on a worker while a plain call of its runs, with no
    time limit to end it: the thread runs on, and the worker advertises that
    much less capacity and counts it running and stuck; with every thread so
    held it reports "stuck", and the supervisor replaces it after
    stuck_grace_s; the pool serves again."""
    gate = str(tmp_path / "gate")
    try:
        embedded = Pool(workers=1, concurrency=2, stuck_grace_s=0.5)
        with embedded as client, worker_stub(client.namespace) as (stub, metadata):
            first = _only_worker(client.namespace)
            assert first.capacity == 2  # its 2 threads
            for held in (1, 2):
                requests: queue.SimpleQueue[TaskBatch | None] = queue.SimpleQueue()
                task = Task(id=1, function=GATED, args=call(gate, held))
                requests.put(TaskBatch(tasks=[task]))
                run = stub.Run(iter(requests.get, None), metadata=metadata)
                assert list(next(run).started) == [1]
                run.cancel()
                if held == 1:
                    wait_until(lambda: _only_worker(client.namespace).capacity == 1)
                    worker = _only_worker(client.namespace)
                    assert (worker.status, worker.extra["stuck"]) == ("ready", "1")
            wait_until(
                lambda: (
                    [w.pid for w in list_workers(client.namespace)]
                    not in ([], [first.pid])
                ),
                30,
            )
            assert client.submit(sample_tasks.square, 9).result(timeout=30) == 81
            lines = embedded.log.getvalue().splitlines()
            assert any(
                line.startswith(f"worker-updated pid={first.pid} ")
                and "status=stuck" in line
                for line in lines
            )
            assert any(
                line.startswith(f"worker-stuck pid={first.pid} ") for line in lines
            )
    finally:
        Path(gate).touch()
