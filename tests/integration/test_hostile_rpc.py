"""Hostile requests to a live pool: each bad task is answered alone with its
precise gRPC status, and the worker and dispatcher go on serving."""

from __future__ import annotations

import hashlib
import pickle
import threading

import grpc
import pytest

import pool
from discovery import list_workers
from pool import Client
from pool.dispatcher_pb2 import Submission, SubmissionBatch
from tests.support import sample_tasks
from tests.support.helpers import wait_until
from tests.support.pools import running_pool
from tests.support.rpc import (
    ASYNC_NAP,
    SQUARE,
    call,
    dispatcher_stub,
    run,
    run_one,
    status,
    transfers_stub,
    value,
    worker_stub,
)
from workers.protocol.worker_pb2 import (
    Chunk,
    Data,
    FetchRequest,
    Part,
    Segment,
    Task,
    TaskBatch,
)

pytestmark = pytest.mark.integration

LIMIT = 4096
S = grpc.StatusCode

_SQUARE_CODE = pickle.dumps(sample_tasks.square)
_INT_CODE = pickle.dumps(42)


def _digest(code: bytes) -> bytes:
    return hashlib.sha256(code).digest()


def _data(segment: str) -> Data:
    """Arguments said to lie in the segment ``segment``."""
    return Data(
        segments=[Segment(name=segment, nonce=1, size=8192)],
        parts=[Part(segment=0, offset=4096, length=10)],
    )


# (task, status, an anchored piece of the message)
BAD_TASKS = [
    (
        Task(function=SQUARE, args=b"\x80\x05garbage"),
        S.INVALID_ARGUMENT,
        "arguments do not unpickle",
    ),
    (
        Task(function=SQUARE, args=pickle.dumps([1, 2])),
        S.INVALID_ARGUMENT,
        "arguments must be a pickled (tuple, dict)",
    ),
    (Task(function=SQUARE, args=b""), S.INVALID_ARGUMENT, "arguments do not unpickle"),
    (
        Task(function="no_such_module:f", args=call()),
        S.NOT_FOUND,
        "cannot import module 'no_such_module'",
    ),
    (
        Task(function="tests.support.exits_on_import:f", args=call()),
        S.NOT_FOUND,
        "importing module 'tests.support.exits_on_import' raised SystemExit: 3",
    ),
    (
        Task(function="os:no_such_name", args=call()),
        S.NOT_FOUND,
        "module 'os' has no 'no_such_name'",
    ),
    (
        Task(function="tests.support.sample_tasks:NOT_CALLABLE", args=call()),
        S.INVALID_ARGUMENT,
        "is a int, not a callable",
    ),
    (
        Task(function="square", args=call(2)),
        S.INVALID_ARGUMENT,
        "is not of the form module:qualname",
    ),
    (
        Task(function="..os:getpid", args=call()),
        S.INVALID_ARGUMENT,
        "is not of the form module:qualname",
    ),
    (
        Task(function="o\x00s:getpid", args=call()),
        S.INVALID_ARGUMENT,
        "is not of the form module:qualname",
    ),
    (
        Task(function=SQUARE, args=call(b"x" * LIMIT)),
        S.RESOURCE_EXHAUSTED,
        f"over the worker's limit of {LIMIT}",
    ),
    (
        Task(function=SQUARE, args=call(2), timeout_s=float("nan")),
        S.INVALID_ARGUMENT,
        "timeout_s must be a finite number",
    ),
    (
        Task(function=SQUARE, args=call(2), timeout_s=float("inf")),
        S.INVALID_ARGUMENT,
        "timeout_s must be a finite number",
    ),
    (
        Task(function=SQUARE, args=call(2), timeout_s=-1.0),
        S.INVALID_ARGUMENT,
        "timeout_s must be a finite number",
    ),
    (
        Task(function="tests.support.sample_tasks:fail", args=call("boom")),
        S.UNKNOWN,
        "boom",
    ),
    # Arguments said to lie in shared memory (workers/protocol/payload.py).
    (
        Task(function=SQUARE, data=_data("../../etc/passwd")),
        S.NOT_FOUND,
        "is not the name of a shm-pool data segment",
    ),
    (
        Task(
            function=SQUARE,
            data=_data(f"{'shmp-' + '0' * 24}.{'1' * 16}.{'1' * 16}.a-1"),
        ),
        S.NOT_FOUND,
        "is not in /dev/shm",
    ),
    (
        Task(function=SQUARE, data=Data(pickle=call(3), parts=[Part(segment=7)])),
        S.INVALID_ARGUMENT,
        "arguments do not unpickle",
    ),
    # Functions shipped by value (workers/shipping.py).
    (
        Task(digest=_digest(_SQUARE_CODE), args=call(2)),
        S.INVALID_ARGUMENT,
        "which this stream has not carried",
    ),
    (
        Task(digest=_digest(b"other"), code=_SQUARE_CODE, args=call(2)),
        S.INVALID_ARGUMENT,
        "does not match its digest",
    ),
    (
        Task(digest=_digest(_INT_CODE), code=_INT_CODE, args=call(2)),
        S.INVALID_ARGUMENT,
        "the shipped object is a int, not a callable",
    ),
    (
        Task(digest=_digest(b"\x80\x05junk"), code=b"\x80\x05junk", args=call()),
        S.INVALID_ARGUMENT,
        "does not unpickle in the worker",
    ),
]


@pytest.mark.timeout(90)
def test_each_bad_task_gets_its_status_and_the_rest_run(namespace: str) -> None:
    """One batch mixes every kind of bad task with good ones: each bad one
    gets its own status and message, each good one its result, on the same
    stream; a client through the dispatcher sees the same errors, typed."""
    with running_pool(namespace, "--workers", "1", "--max-args-bytes", str(LIMIT)):
        with worker_stub(namespace) as (stub, metadata):
            batch = TaskBatch()
            for i, (task, _, _) in enumerate(BAD_TASKS):
                batch.tasks.append(task)
                batch.tasks[-1].id = 2 * i
                batch.tasks.add(id=2 * i + 1, function=SQUARE, args=call(i))
            answers = run(stub, metadata, [batch])
            assert sorted(answers) == list(range(2 * len(BAD_TASKS)))
            for i, (_, code, message) in enumerate(BAD_TASKS):
                (bad,), (good,) = answers[2 * i], answers[2 * i + 1]
                assert status(bad) == code, (i, bad.failure)
                assert message in bad.failure.message
                assert value(good) == i * i
        with Client(namespace) as client:
            with pytest.raises(pool.errors.FunctionNotFound) as raised:
                client.submit("no_such_module:f").result(timeout=30)
            assert raised.value.status == S.NOT_FOUND
            with pytest.raises(pool.errors.ArgumentsTooLarge, match="limit of 4096"):
                client.submit(sample_tasks.square, b"x" * LIMIT).result(timeout=30)
            assert client.submit(sample_tasks.square, 7).result(timeout=30) == 49


@pytest.mark.timeout(60)
def test_task_id_reused_in_flight_is_already_exists(namespace: str) -> None:
    """A task id sent again while the first is in flight is refused with
    ALREADY_EXISTS, on the worker and on the dispatcher, and the first
    task still finishes."""
    with running_pool(namespace, "--workers", "1"):
        with worker_stub(namespace) as (stub, metadata):
            first = Task(id=7, function=ASYNC_NAP, args=call(0.3))
            again = Task(id=7, function=SQUARE, args=call(3))
            (refused, finished) = run(
                stub, metadata, [TaskBatch(tasks=[first, again])]
            )[7]
            assert status(refused) == S.ALREADY_EXISTS
            assert "task id 7 is already in flight" in refused.failure.message
            assert value(finished) == 0.3
        with dispatcher_stub(namespace) as (dispatcher, metadata):
            batch = SubmissionBatch(
                submissions=[Submission(task=first), Submission(task=again)]
            )
            answers = [
                r
                for b in dispatcher.SubmitStream(
                    iter([batch]), metadata=metadata, timeout=30
                )
                for r in b.results
            ]
            assert [status(answers[0]), value(answers[1])] == [S.ALREADY_EXISTS, 0.3]


@pytest.mark.timeout(60)
def test_client_that_disconnects_mid_stream_leaves_nothing_running(
    namespace: str,
) -> None:
    """A caller that hangs up with tasks in flight, on a worker or on the
    dispatcher, has its tasks cancelled; both go on serving others."""
    with running_pool(namespace, "--workers", "1", "--concurrency", "2"):
        hang_up = threading.Event()

        def batches(batch: object) -> object:
            yield batch
            hang_up.wait(30)  # keep the stream open until the test hangs up

        naps = [Task(id=i, function=ASYNC_NAP, args=call(30.0)) for i in range(4)]
        with worker_stub(namespace) as (stub, metadata):
            stream = stub.Run(batches(TaskBatch(tasks=naps)), metadata=metadata)
            wait_until(lambda: _running(namespace) == 4)
            stream.cancel()
            wait_until(lambda: _running(namespace) == 0)
            assert (
                value(
                    run_one(stub, metadata, Task(id=1, function=SQUARE, args=call(4)))
                )
                == 16
            )
        with dispatcher_stub(namespace) as (dispatcher, metadata):
            submissions = SubmissionBatch(
                submissions=[Submission(task=t) for t in naps]
            )
            stream = dispatcher.SubmitStream(batches(submissions), metadata=metadata)
            wait_until(lambda: _running(namespace) == 4)
            stream.cancel()
            wait_until(lambda: _running(namespace) == 0)
        hang_up.set()
        with Client(namespace) as client:
            assert client.submit(sample_tasks.square, 5).result(timeout=30) == 25


def _running(namespace: str) -> int:
    """Tasks running on the namespace's workers, as they last published."""
    return sum(int(w.extra.get("running", "0")) for w in list_workers(namespace))


@pytest.mark.timeout(60)
def test_hostile_transfers_are_refused_and_harm_nothing(namespace: str) -> None:
    """Fetches of values nobody holds, uploads that are empty, lie about their
    size or name no worker, at a worker and at the dispatcher: each refused
    with its status, and the pool runs on."""
    with running_pool(namespace, "--workers", "1"):
        with transfers_stub(namespace, at="worker") as (held, metadata):
            with pytest.raises(grpc.RpcError) as raised:
                list(held.Fetch(FetchRequest(token=b"x" * 16), metadata=metadata))
            assert raised.value.code() == S.NOT_FOUND
            for chunks, code in (
                ([Chunk(token=b"t", size=10, data=b"abc")], S.DATA_LOSS),
                ([Chunk(token=b"t", size=2, data=b"abc")], S.DATA_LOSS),
                ([], S.INVALID_ARGUMENT),
            ):
                with pytest.raises(grpc.RpcError) as raised:
                    held.Upload(iter(chunks), metadata=metadata, timeout=30)
                assert raised.value.code() == code
        with transfers_stub(namespace, at="dispatcher") as (relay, metadata):
            for source in ("not-a-uid", "00000000-0000-0000-0000-000000000000"):
                request = FetchRequest(token=b"x", source=source)
                with pytest.raises(grpc.RpcError) as raised:
                    list(relay.Fetch(request, metadata=metadata, timeout=30))
                assert raised.value.code() == S.NOT_FOUND
                upload = iter([Chunk(token=b"t", size=3, data=b"abc", source=source)])
                with pytest.raises(grpc.RpcError) as raised:
                    relay.Upload(upload, metadata=metadata, timeout=30)
                assert raised.value.code() == S.NOT_FOUND
            with pytest.raises(grpc.RpcError) as raised:  # as the worker's
                relay.Upload(iter([]), metadata=metadata, timeout=30)
            assert raised.value.code() == S.INVALID_ARGUMENT
        with Client(namespace) as client:
            assert client.submit(sample_tasks.square, 7).result(timeout=30) == 49
