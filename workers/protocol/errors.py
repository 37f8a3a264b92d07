"""The errors about a task itself (not what the task raised), under
:class:`TaskError`. Each :class:`BadTask` names its condition with the gRPC
status code a :class:`~workers.protocol.worker_pb2.Failure` carries (see
``proto/workers/protocol/worker.proto``); :mod:`workers.protocol.codec`
turns them into failures and back.
"""

from __future__ import annotations

from typing import ClassVar

import grpc

from discovery.errors import Facts, PoolError


class TaskError(PoolError):
    """Root of the errors about a task itself (not what the task raised)."""


class BadTask(TaskError, ValueError):
    """A task cannot be run as sent: fix the call, a retry will not help.

    ``status`` is the gRPC status code that names the condition; this base
    class is a malformed task (INVALID_ARGUMENT).
    """

    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.INVALID_ARGUMENT


class FunctionNotFound(BadTask):
    """The task's module (or one its arguments name) does not import, or
    has no such qualname."""

    status = grpc.StatusCode.NOT_FOUND


class NotCallable(BadTask):
    """The task names something that is not a callable."""


class ArgumentsTooLarge(BadTask):
    """The task's pickled arguments are over the worker's limit."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class InitializerFailed(Facts, TaskError):
    """The pool's initializer failed in its workers, so often that the pool
    starts no more: no task can run. ``exception`` is the initializer's own
    exception (None if it did not pickle); the remote traceback, its
    traceback, is the ``__cause__``."""

    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.FAILED_PRECONDITION

    message: str
    exception: BaseException | None = None

    MESSAGE = "{message}"


class TaskIdReused(BadTask):
    """The task's id is already in flight on its stream."""

    status = grpc.StatusCode.ALREADY_EXISTS


class TaskTimeout(Facts, TaskError, TimeoutError):
    """The task ran over its time limit (``task_timeout_s``), and was
    stopped: a coroutine task is cancelled; a plain function, which no
    thread can interrupt, is stopped by ending its worker (its supervisor
    starts another).
    """

    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.DEADLINE_EXCEEDED

    timeout_s: float

    MESSAGE = "the task ran over its {timeout_s:g} s"


class RemoteError(Facts, TaskError):
    """A task raised an exception that could not be rebuilt here.

    ``type_name`` is the remote exception's type; the message is its text.
    """

    type_name: str
    message: str

    MESSAGE = "{type_name}: {message}"


class RemoteTraceback(Facts, PoolError):
    """The traceback of an exception raised in a worker, as text."""

    tb: str

    MESSAGE = '\n"""\n{tb}"""'


class DataGone(Facts, BadTask, LookupError):
    """A payload's shared memory is gone: its client released it (a
    ``put`` reference released or dropped, the client closed) or died.
    ``segment`` names it."""

    status = grpc.StatusCode.NOT_FOUND

    segment: str
    why: str

    MESSAGE = (
        "shared memory segment {segment!r} {why}: its client "
        "released it (a put() reference released or no longer held, or "
        "the client closed) or died; keep the reference (or the client) "
        "until the task is done"
    )


class TransferLost(DataGone):
    """A payload between machines did not come whole (its holder went, or it
    waited too long): ``segment`` says which payload, ``why`` what happened."""

    MESSAGE = "{segment}: {why}"


class SharedMemoryFull(Facts, TaskError, MemoryError):
    """A payload does not fit the shared memory left: ``needed`` bytes,
    ``free`` of them free in ``where`` (/dev/shm, or the pool's
    ``--shm-limit``). Nothing was written; a smaller payload, or one sent
    once memory is freed, goes through."""

    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.RESOURCE_EXHAUSTED

    needed: int
    free: int
    where: str

    def __str__(self) -> str:
        return (
            f"the payload needs {_mib(self.needed)} of shared memory and "
            f"{self.where} has {_mib(self.free)} free; free some (drop large "
            f"results, release put() references), send less at once, or give "
            f"it more room (a container's /dev/shm is 64 MiB unless its "
            f"shm_size says more: docker-compose.yml sets it; `pool up "
            f"--shm-limit` caps what a pool holds)"
        )


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB ({size} bytes)"
