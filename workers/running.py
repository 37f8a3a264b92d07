"""What a worker holds of the tasks it runs (:mod:`workers.service`): each
Run stream's receiving half (:class:`Stream`), each task it took
(:class:`Entry`), how a plain task runs in a slot thread
(:func:`run_plain`; the threads are :mod:`workers.slots`) and a coroutine
task on the loop (:func:`run_coroutine`), and how long they have been
running (:class:`PaceMeter`).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from workers.common.offload import Offload
from workers.protocol import codec, transfer
from workers.protocol.errors import BadTask
from workers.protocol.owners import DataOwner
from workers.protocol.stream import Incoming
from workers.protocol.worker_pb2 import Data, Failure, Result, Task

# A stream with this many tasks unanswered is not read until some finish: a
# caller that ignores the advertised capacity meets gRPC flow control.
MAX_STREAM_TASKS: Final = 4096


PACE_WEIGHT: Final = 0.25
# Coroutine tasks' arguments larger than this are unpickled off the loop.
OFFLOAD_ARGS_BYTES: Final = 1 << 20


class Stream(Incoming["Entry"]):
    """One Run call: the receiving half of its task stream
    (:class:`~workers.protocol.stream.Incoming`), the callables being found,
    and the task group of its coroutine tasks and imports."""

    def __init__(self) -> None:
        super().__init__(MAX_STREAM_TASKS)
        self.group: asyncio.TaskGroup | None = None
        # Callables being found (by name and digest), and the tasks waiting.
        self.finding: dict[tuple[str, bytes], list[Entry]] = {}

    def answer(self, task_id: int, result: Result | None) -> None:
        entry = self.entries[task_id]
        super().answer(task_id, result)
        if entry.uploaded:
            transfer.ARRIVED.release(entry.uploaded)


class Phase(enum.Enum):
    """Where a task this worker took is; :class:`Entry`'s methods are the
    only transitions::

        HELD ──take──> RUNNING ──ran──> RAN
         │               │               │
       settle          settle          settle
         v               v               v
      ANSWERED  <──unstick── STUCK    ANSWERED

    A plain task's slot thread takes and runs it (under the claim lock); a
    coroutine task is never taken, and goes from HELD to ANSWERED (once
    launched, its ``job`` set, it is no longer withdrawn). STUCK: answered
    (timed out, stopped, its stream gone) while its thread still runs it:
    the worker ends for the first two (see :mod:`workers.service`).
    """

    HELD = "held"  # not started by a thread: it may be withdrawn
    RUNNING = "running"  # a slot thread runs it now
    RAN = "ran"  # its thread returned; the loop has not answered yet
    STUCK = "stuck"
    ANSWERED = "answered"


ANSWERED: Final = frozenset({Phase.STUCK, Phase.ANSWERED})


@dataclass(eq=False, slots=True)
class Entry:
    """A task this worker has taken and not yet answered: held (it may be
    withdrawn), then started by a slot thread (it runs). Its ``phase``
    changes only through the methods below: on the loop for a coroutine
    task, under the claim lock for a plain one. ``started`` is another
    fact: that its start was reported (on the loop, after the thread took
    it)."""

    task: Task
    stream: Stream
    code: bytes = b""  # its function's pickle, if it ships one
    fn: Callable[..., Any] | None = None  # what it calls, once found
    job: asyncio.Task[None] | None = None  # a coroutine function's run
    timer: asyncio.TimerHandle | None = None
    # Once its callable is found: "coroutine" runs on the loop (cancellable
    # while it runs), "plain" in a slot thread.
    kind: Literal["unknown", "plain", "coroutine"] = "unknown"
    phase: Phase = Phase.HELD
    started: bool = False  # its start was reported (on the loop)
    # The token of its arguments, if a client of another machine uploads
    # them (workers.protocol.transfer): held here until it is answered.
    uploaded: bytes = b""

    def __post_init__(self) -> None:
        if (held := transfer.transfer_of(self.task)) is not None:
            self.uploaded = held.token
            transfer.ARRIVED.claim(held.token)

    @property
    def answered(self) -> bool:
        return self.phase in ANSWERED

    def take(self) -> bool:
        """A slot thread starts it, unless it was answered (withdrawn, handed
        back, its stream ended): whether it does."""
        if self.phase is not Phase.HELD:
            return False
        self.phase = Phase.RUNNING
        return True

    def ran(self) -> None:
        """Its thread returned (an answer already sent stays sent)."""
        if self.phase is Phase.RUNNING:
            self.phase = Phase.RAN

    def settle(self, *, withdraw: bool = False) -> bool:
        """Answer it now, once; with ``withdraw``, only while it has not
        started (no thread has taken it; a coroutine not launched). Whether
        it is answered now: False if it was already, or it started and
        ``withdraw`` was asked."""
        if self.phase in ANSWERED:
            return False
        if withdraw and (self.phase is not Phase.HELD or self.job is not None):
            return False
        running = self.phase is Phase.RUNNING
        self.phase = Phase.STUCK if running else Phase.ANSWERED
        return True

    def unstick(self) -> bool:
        """Its thread returned after its answer went: whether it was stuck."""
        if self.phase is not Phase.STUCK:
            return False
        self.phase = Phase.ANSWERED
        return True


def run_plain(entry: Entry, max_args_bytes: int, writer: DataOwner | None) -> Result:
    """Run a plain task in the calling thread; always an answer (a large
    value written for its client by ``writer``)."""
    task, fn = entry.task, entry.fn
    try:
        assert fn is not None, "launched before its callable was found"
        try:
            args, kwargs = codec.load_call(codec.args_of(task), max_args_bytes)
        except BadTask as exc:
            return failed(task.id, codec.failure_of(exc, remote=False))
        try:
            value = fn(*args, **kwargs)
            del args, kwargs  # (their shared memory is unmapped before the answer)
            return codec.value_result(task.id, value, writer, task.home)
        except BaseException as exc:  # a task's SystemExit must not end the worker
            return failed(task.id, codec.failure_of(exc))
    except BaseException as exc:  # failure_of never raises; this is a last guard
        return failed(task.id, codec.internal_failure(exc))


async def run_coroutine(
    task: Task,
    fn: Callable[..., Any],
    offload: Offload,
    max_args_bytes: int,
    writer: DataOwner | None,
) -> Result:
    """Run a coroutine task on the loop (its large arguments unpickled in
    ``offload``): its result or failure.

    :raises asyncio.CancelledError: if cancelled (by the caller, a timeout
        or a hang-up: answered there).
    """
    try:
        args = codec.args_of(task)
        if len(task.args) > OFFLOAD_ARGS_BYTES or isinstance(args, Data):
            call = await offload.run(codec.load_call, args, max_args_bytes)
        else:
            call = codec.load_call(args, max_args_bytes)
        value = await fn(*call[0], **call[1])
        del call
        staged = codec.pickle_value(task.id, value, writer, task.home)
        if isinstance(staged, Result):
            return staged
        return await offload.run(codec.write_value, task.id, *staged)  # (large)
    except asyncio.CancelledError:
        raise
    except BadTask as exc:
        return failed(task.id, codec.failure_of(exc, remote=False))
    except BaseException as exc:  # a task's SystemExit must not end the worker
        return failed(task.id, codec.failure_of(exc))


def failed(task_id: int, failure: Failure) -> Result:
    return Result(id=task_id, failure=failure)


def timed(result: Result, slot: int, elapsed_s: float) -> Result:
    """``result``, saying how long its call ran, and in which slot."""
    result.run_us, result.slot = min(int(elapsed_s * 1e6), 2**32 - 1), slot
    return result


class PaceMeter:
    """How fast plain tasks have been running: a moving average, each task
    weighing :data:`PACE_WEIGHT`. The worker reports it with its results
    (``ResultBatch.pace_us``), and the dispatcher sends it ahead of its free
    slots only what hides a round trip at that pace."""

    def __init__(self) -> None:
        self.last_s = 0.0  # how long the last plain task ran
        self.typical_s = 0.0  # 0 until a task has run

    def note(self, elapsed_s: float) -> None:
        """Note one task's run."""
        self.last_s = elapsed_s
        if self.typical_s == 0.0:
            self.typical_s = elapsed_s
        else:
            self.typical_s += (elapsed_s - self.typical_s) * PACE_WEIGHT

    @property
    def typical_us(self) -> int:
        """The moving average in whole microseconds, at least 1 once known."""
        if self.typical_s == 0.0:
            return 0
        return max(1, min(int(self.typical_s * 1e6), 2**32 - 1))
