"""What a task is on the wire, and how its outcome travels back.

A task names an importable callable as ``"module:qualname"`` and carries
``pickle((args, kwargs))``, in the message or, when large, in shared memory
(:mod:`workers.protocol.payload`). Its result is a pickled value (the same
two ways) or a
:class:`~workers.protocol.worker_pb2.Failure` holding the exception pickled (when it
pickles), its type name, its message and the remote traceback as text.
:func:`exception_of` rebuilds the exception in the caller with that text
attached as its ``__cause__``, like ``concurrent.futures.process`` does.
Every Failure names its condition with a gRPC status code (see
``proto/workers/protocol/worker.proto``); a task that cannot be run as sent raises a
:class:`BadTask` whose subclass and ``status`` say why.

Unpickling is code execution: only authenticated peers' bytes reach
:func:`load_call` (see :mod:`workers.protocol.auth`). Callers: :mod:`workers.service`
(decodes calls, encodes outcomes) and :mod:`pool` (the reverse).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import pickle
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import grpc

from workers.protocol import payload, shipping, transfer
from workers.protocol.errors import (
    ArgumentsTooLarge,
    BadTask,
    DataGone,
    FunctionNotFound,
    RemoteError,
    RemoteTraceback,
    TaskIdReused,
    TransferLost,
)
from workers.protocol.owners import DataOwner
from workers.protocol.worker_pb2 import Data, Failure, Home, Result, Task

MAX_MESSAGE_BYTES: Final = 128 * 1024 * 1024  # gRPC's limit, each way
# One task's arguments, or one result, must fit a message with room for the
# rest of its batch (batches are cut at this size: workers.protocol.stream).
MAX_ARGS_LIMIT: Final = MAX_MESSAGE_BYTES // 2
MAX_ARGS_BYTES: Final = MAX_ARGS_LIMIT  # a worker's default limit
MAX_FAILURE_BYTES: Final = 4 * 1024 * 1024  # each of a failure's parts


def dump_call(
    args: tuple[Any, ...], kwargs: dict[str, Any], *, by_value: bool = False
) -> bytes:
    """The wire bytes of a call's arguments: with cloudpickle for a callable
    shipped by value (its arguments are often of classes shipped with it),
    else with pickle (cloudpickle for what pickle refuses)."""
    return shipping.dumps((args, kwargs), by_value=by_value)


def check_call_size(args: bytes, code: bytes) -> None:
    """:raises ArgumentsTooLarge: if a task of these pickled arguments and
    function does not fit a message (no worker could take it)."""
    if (size := len(args) + len(code)) > MAX_ARGS_LIMIT:
        raise ArgumentsTooLarge(
            f"the task's arguments (and function) pickle to {size} bytes, over "
            f"the pool's limit of {MAX_ARGS_LIMIT}; pass large data by "
            f"reference (a path, a key), or a map a smaller chunksize"
        )


def check_timeout(task: Task) -> None:
    """:raises BadTask: unless ``task.timeout_s`` is finite and not negative."""
    if not (math.isfinite(task.timeout_s) and task.timeout_s >= 0):
        raise BadTask(
            f"timeout_s must be a finite number of seconds >= 0 (0: none), "
            f"got {task.timeout_s}"
        )


def args_of(task: Task) -> bytes | Data:
    """A task's arguments: in the message, or where they lie in shared memory."""
    return task.data if task.HasField("data") else task.args


def load_call(
    args: bytes | Data, max_bytes: int = MAX_ARGS_BYTES
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments from the wire (an authenticated peer's only), mapped from
    shared memory if they lie there (:func:`workers.protocol.payload.loads`),
    or, uploaded by a client of another machine, once they are here
    (:mod:`workers.protocol.transfer`; the calling thread waits).

    :raises ArgumentsTooLarge: if what the message carries is over ``max_bytes``.
    :raises DataGone: if the shared memory they lie in is gone.
    :raises FunctionNotFound: if they name a module the worker cannot import.
    :raises BadTask: if they are not a pickled (tuple, dict).
    """
    inline = args.pickle if isinstance(args, Data) else args
    if len(inline) > max_bytes:
        raise ArgumentsTooLarge(
            f"arguments are {len(inline)} bytes, over the worker's limit of "
            f"{max_bytes} (--max-args-bytes)"
        )
    try:
        call = _loads_call(args)
    except DataGone:
        raise
    except ImportError as exc:
        raise FunctionNotFound(
            f"the task's arguments need module {exc.name!r}, which the worker "
            f"cannot import ({exc}); {shipping.where_imports_look()}"
        ) from None
    except Exception as exc:
        raise BadTask(
            f"arguments do not unpickle: {type(exc).__name__}: {exc}"
        ) from None
    if (
        not isinstance(call, tuple)
        or len(call) != 2
        or not isinstance(call[0], tuple)
        or not isinstance(call[1], dict)
    ):
        raise BadTask("arguments must be a pickled (tuple, dict) pair")
    return call


def _loads_call(args: bytes | Data) -> Any:
    if not isinstance(args, Data):
        return pickle.loads(args)
    if not args.HasField("transfer"):
        return payload.loads(args)
    uploaded = transfer.ARRIVED.take(args, wait_s=transfer.KEEP_S)
    if uploaded is None:
        raise TransferLost(
            "the task's arguments",
            f"they did not come from its client within {transfer.KEEP_S:.0f} s",
        )
    return transfer.loads(args, uploaded)


Staged = tuple[payload.Sink, bytes, list[memoryview]]  # a value to write


def value_result(
    task_id: int, value: Any, writer: DataOwner | None, home: Home
) -> Result:
    """The Result carrying a return value: pickled in the message, or, when
    large and the task's ``home`` is a client of this machine, written into
    the client's shared memory by ``writer``, or held for another machine's
    to fetch (cloudpickle when plain pickle refuses it, as it does an
    object of a class shipped by value).

    :raises SharedMemoryFull: if it does not fit the shared memory left.
    """
    staged = pickle_value(task_id, value, writer, home)
    return staged if isinstance(staged, Result) else write_value(task_id, *staged)


def pickle_value(
    task_id: int, value: Any, writer: DataOwner | None, home: Home
) -> Result | Staged:
    """:func:`value_result`'s first half: the Result, if the value goes in
    the message or is held for a client of another machine
    (:mod:`workers.protocol.transfer`); else what :func:`write_value`
    writes (the slow half)."""
    if writer is None or not home.owner:
        return unshared_value(task_id, shipping.dumps(value))
    pickled, buffers = payload.dumps(value)
    if payload.in_message(pickled, buffers):
        return Result(id=task_id, value=pickled)
    sink = payload.Sink.of(writer, home)
    if sink is None:  # (a client of another machine)
        views = [buffer.raw() for buffer in buffers.taken]
        if len(pickled) + sum(view.nbytes for view in views) >= transfer.TRANSFER_MIN:
            return Result(id=task_id, data=transfer.HELD.hold(pickled, views))
        return Result(id=task_id, value=shipping.dumps(value))
    return sink, pickled, [buffer.raw() for buffer in buffers.taken]


def unshared_value(task_id: int, pickled: bytes) -> Result:
    """The Result of a value pickled (buffers in band) for a client this
    process shares no memory with: in the message, or held for it to fetch
    when large."""
    if len(pickled) >= transfer.TRANSFER_MIN:
        return Result(id=task_id, data=transfer.HELD.hold(pickled))
    return Result(id=task_id, value=pickled)


def write_value(
    task_id: int, sink: payload.Sink, pickled: bytes, parts: list[memoryview]
) -> Result:
    """:func:`value_result`'s second half: the value into shared memory."""
    data = payload.write(sink.writer, sink.name(), pickled, parts, sink.lend)
    return Result(id=task_id, data=data)


def failure_of(
    exc: BaseException,
    code: grpc.StatusCode | None = None,
    *,
    remote: bool = True,
) -> Failure:
    """A Failure carrying ``exc``, its type, text and (if ``remote``) its
    traceback, which the receiving side attaches as the cause.

    ``code`` defaults to the exception's own ``status`` (the task errors
    have one), else UNKNOWN (the task raised). Never raises, whatever the
    exception does when printed or pickled: every task gets its answer. It
    fits a message: an exception that pickles to over
    :data:`MAX_FAILURE_BYTES` comes back as a :class:`RemoteError`, and its
    text and traceback are cut to that size.
    """
    if code is None:
        code = getattr(type(exc), "status", grpc.StatusCode.UNKNOWN)
        if not isinstance(code, grpc.StatusCode):
            code = grpc.StatusCode.UNKNOWN
    kind = type(exc)
    try:
        pickled = shipping.dumps(exc)
        pickle.loads(pickled)  # some exceptions pickle but do not unpickle
    except BaseException:  # a hostile exception may raise anything
        pickled = b""
    if len(pickled) > MAX_FAILURE_BYTES:
        pickled = b""
    try:
        trace = "".join(traceback.format_exception(exc)) if remote else ""
    except BaseException:
        trace = ""
    return Failure(
        type=f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', '?')}",
        message=_cut(_text_of(exc)),
        traceback=_cut(trace),
        exception=pickled,
        code=code.value[0],
    )


def _cut(text: str) -> str:
    """``text``, or its first :data:`MAX_FAILURE_BYTES` // 4 characters
    (each at most 4 bytes in UTF-8) and what was cut."""
    keep = MAX_FAILURE_BYTES // 4
    if len(text) <= keep:
        return text
    return f"{text[:keep]}... ({len(text) - keep} characters cut)"


def _text_of(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when its ``__str__`` raises or lies."""
    try:
        text = str(exc)
    except BaseException:  # whatever __str__ raises
        return f"<{type(exc).__name__}: str() failed>"
    return text if isinstance(text, str) else repr(type(exc))


def internal_failure(exc: BaseException) -> Failure:
    """The Failure of a task whose answer could not be built (a bug of ours,
    or a hostile object): say so rather than leave the caller waiting."""
    return Failure(
        type="workers.InternalError",
        message=f"the worker could not answer the task: {type(exc).__name__}",
        code=grpc.StatusCode.INTERNAL.value[0],
    )


def cancelled() -> Failure:
    """The Failure of a task cancelled before it finished."""
    return Failure(
        type="asyncio.CancelledError",
        message="the task was cancelled",
        code=grpc.StatusCode.CANCELLED.value[0],
    )


def rejected(reason: str = "it is draining") -> Failure:
    """The Failure of a task a worker cannot take now (sent elsewhere)."""
    return Failure(
        type="workers.Unavailable",
        message=f"the worker cannot take the task: {reason}",
        code=grpc.StatusCode.UNAVAILABLE.value[0],
    )


def id_reused(task_id: int) -> Failure:
    """The Failure of a task whose id is already in flight on its stream."""
    exc = TaskIdReused(
        f"task id {task_id} is already in flight on this stream; give each "
        f"task of a stream its own id"
    )
    return failure_of(exc, remote=False)


_STATUS_BY_CODE: Final = {status.value[0]: status for status in grpc.StatusCode}


def status_of(failure: Failure) -> grpc.StatusCode:
    """The gRPC status code a Failure names (UNKNOWN for an unknown one)."""
    return _STATUS_BY_CODE.get(failure.code, grpc.StatusCode.UNKNOWN)


def exception_of(failure: Failure) -> BaseException:
    """The exception a Failure carries, with its remote traceback as cause
    (its frames' missing source lines filled in from this process's files)."""
    exc: BaseException
    try:
        exc = pickle.loads(failure.exception) if failure.exception else None  # type: ignore[assignment]
    except Exception:
        exc = None  # type: ignore[assignment]
    if not isinstance(exc, BaseException):
        exc = RemoteError(failure.type, failure.message)
    if failure.traceback:
        exc.__cause__ = RemoteTraceback(shipping.fill_source_lines(failure.traceback))
    return exc


class ChunkResult(NamedTuple):
    """What :func:`run_chunk` returns: every call's value in order, and the
    failure (a serialized :class:`Failure`) of each call that raised, by
    position (its value is None). ``elapsed_s`` is the time the chunk took
    in the worker, which tells ``map`` how long one call runs."""

    elapsed_s: float
    values: list[Any]
    failures: dict[int, bytes]


def run_chunk(fn: Callable[..., Any], columns: Sequence[Sequence[Any]]) -> ChunkResult:
    """Run ``fn`` over many calls as one task (``map``'s chunks, a Task with
    ``chunk`` set): ``columns`` holds each positional argument's values, one
    sequence per iterable of the map, so the calls are
    ``fn(*column_values)`` in order (``map(fn, *columns)``: the calls run in
    C while none raises). Every call runs, as it would as a task of its own,
    and each keeps its own value or exception."""
    values: list[Any] = []
    failures: dict[int, bytes] = {}
    if inspect.iscoroutinefunction(fn):

        async def run_all() -> None:
            for args in zip(*columns, strict=True):
                try:
                    values.append(await fn(*args))
                except Exception as exc:
                    failures[len(values)] = failure_of(exc).SerializeToString()
                    values.append(None)

        started = time.perf_counter()
        asyncio.run(run_all())
    else:
        started = time.perf_counter()
        calls = map(fn, *columns)
        while True:
            try:
                values.extend(calls)  # (what ran before a raise stays)
                break
            except Exception as exc:  # one call raised: note it, go on
                failures[len(values)] = failure_of(exc).SerializeToString()
                values.append(None)
    return ChunkResult(time.perf_counter() - started, values, failures)


def chunk_items(chunk: ChunkResult) -> Iterator[Any]:
    """The values of a chunk in order, raising the exception of a call that
    raised when its turn comes (as ``Executor.map`` does); each value is let
    go of once yielded."""
    values, failures = chunk.values, chunk.failures
    values.reverse()
    if not failures:  # (the common case: no position to look up)
        while values:
            yield values.pop()
        return
    position = 0
    while values:
        if position in failures:
            values.pop()
            raise exception_of(Failure.FromString(failures.pop(position)))
        position += 1
        yield values.pop()  # (no local keeps it while the caller holds it)
