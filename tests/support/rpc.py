"""Raw gRPC calls to a running pool's workers and dispatcher, for tests that
send what pool.Client never would."""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from discovery import list_workers
from pool.client.rendezvous import locate
from pool.dispatcher_pb2 import Submission, SubmissionBatch
from pool.dispatcher_pb2_grpc import DispatcherStub
from workers.common.channels import blocking_channel
from workers.protocol import auth, codec
from workers.protocol.worker_pb2 import Result, Task, TaskBatch
from workers.protocol.worker_pb2_grpc import TransfersStub, WorkerStub

SQUARE = "tests.support.sample_tasks:square"
ASYNC_NAP = "tests.support.sample_tasks:async_nap"


def call(*args: Any, **kwargs: Any) -> bytes:
    """The wire bytes of a call's arguments."""
    return codec.dump_call(args, kwargs)


def value(result: Result) -> Any:
    assert result.HasField("value"), result.failure
    return pickle.loads(result.value)


def status(result: Result) -> grpc.StatusCode:
    assert result.HasField("failure"), result
    return codec.status_of(result.failure)


@contextmanager
def worker_stub(namespace: str) -> Iterator[tuple[WorkerStub, Any]]:
    """A stub of the namespace's first worker and the token's metadata."""
    worker = list_workers(namespace)[0]
    metadata = auth.call_metadata(auth.read_token(namespace))
    with blocking_channel(worker.address) as channel:
        yield WorkerStub(channel), metadata  # type: ignore[no-untyped-call]


@contextmanager
def dispatcher_stub(namespace: str) -> Iterator[tuple[DispatcherStub, Any]]:
    """A stub of the namespace's dispatcher and the token's metadata."""
    address, token = locate(namespace)
    metadata = auth.call_metadata(token)
    with blocking_channel(address) as channel:
        yield DispatcherStub(channel), metadata  # type: ignore[no-untyped-call]


@contextmanager
def transfers_stub(namespace: str, *, at: str) -> Iterator[tuple[TransfersStub, Any]]:
    """A stub of the Transfers service of the namespace's first worker
    (``at="worker"``) or of its dispatcher, and the token's metadata."""
    if at == "worker":
        address, token = list_workers(namespace)[0].address, auth.read_token(namespace)
    else:
        address, token = locate(namespace)
    with blocking_channel(address) as channel:
        yield TransfersStub(channel), auth.call_metadata(token)  # type: ignore[no-untyped-call]


def run(
    stub: WorkerStub, metadata: Any, batches: Iterable[TaskBatch]
) -> dict[int, list[Result]]:
    """Send the batches on one Run stream; every answer, by task id."""
    answers: dict[int, list[Result]] = {}
    for batch in stub.Run(iter(list(batches)), metadata=metadata, timeout=30):
        for result in batch.results:
            answers.setdefault(result.id, []).append(result)
    return answers


def submit_to(address: str, token: str, tasks: Iterable[Task]) -> dict[int, Result]:
    """Send the tasks to the dispatcher at ``address`` on one SubmitStream,
    closed at once; each answer, by task id, once every task is answered."""
    batch = SubmissionBatch(submissions=[Submission(task=task) for task in tasks])
    answers: dict[int, Result] = {}
    with blocking_channel(address) as channel:
        stub = DispatcherStub(channel)  # type: ignore[no-untyped-call]
        metadata = auth.call_metadata(token)
        for batch_back in stub.SubmitStream(iter([batch]), metadata=metadata):
            answers.update((result.id, result) for result in batch_back.results)
    return answers


def run_one(stub: WorkerStub, metadata: Any, task: Task) -> Result:
    """One task on its own stream, and its only answer."""
    (answer,) = run(stub, metadata, [TaskBatch(tasks=[task])])[task.id]
    return answer
