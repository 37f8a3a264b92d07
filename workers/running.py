"""What a worker holds of the tasks it runs (:mod:`workers.service`): each
Run stream's receiving half (:class:`Stream`), each task it took
(:class:`Entry`), how a plain one runs in a slot thread
(:func:`run_plain`), and how long they have been running
(:class:`PaceMeter`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from workers.protocol import codec
from workers.protocol.errors import BadTask
from workers.protocol.stream import Incoming
from workers.protocol.worker_pb2 import Failure, Result, Task

# A stream with this many tasks unanswered is not read until some finish: a
# caller that ignores the advertised capacity meets gRPC flow control.
MAX_STREAM_TASKS: Final = 4096


Pace = Literal["short", "unknown", "long"]
SHORT_TASK_S: Final = 0.001
LONG_TASK_S: Final = 0.005
PACE_WEIGHT: Final = 0.25


class Stream(Incoming["Entry"]):
    """One Run call: the receiving half of its task stream
    (:class:`~workers.protocol.stream.Incoming`), the tasks accepted and not
    yet started, and the task group of its coroutine tasks and imports."""

    def __init__(self) -> None:
        super().__init__(MAX_STREAM_TASKS)
        self.starting: list[Entry] = []  # accepted, the acceptance not written
        self.group: asyncio.TaskGroup | None = None

    def take_starting(self) -> list[Entry]:
        starting, self.starting = self.starting, []
        return starting


@dataclass(eq=False, slots=True)
class Entry:
    """A task this worker has accepted and not yet answered."""

    task: Task
    stream: Stream
    code: bytes = b""  # its function's pickle, if it ships one
    fn: Callable[..., Any] | None = None  # what it calls, once found
    job: asyncio.Task[None] | None = None  # a coroutine function's run
    timer: asyncio.TimerHandle | None = None
    plain: bool = False  # handed to the slot threads
    running: bool = False  # a slot thread has it (under the claim lock)
    answered: bool = False  # (plain tasks: set under the claim lock)
    stuck: bool = False  # answered while its thread still runs it


def run_plain(entry: Entry, max_args_bytes: int) -> Result:
    """Run a plain task in the calling thread; always an answer."""
    task, fn = entry.task, entry.fn
    try:
        assert fn is not None, "launched before its callable was found"
        try:
            args, kwargs = codec.load_call(task.args, max_args_bytes)
        except BadTask as exc:
            return failed(task.id, codec.failure_of(exc, remote=False))
        try:
            return Result(id=task.id, value=codec.dump_value(fn(*args, **kwargs)))
        except BaseException as exc:  # a task's SystemExit must not end the worker
            return failed(task.id, codec.failure_of(exc))
    except BaseException as exc:  # failure_of never raises; this is a last guard
        return failed(task.id, codec.internal_failure(exc))


def failed(task_id: int, failure: Failure) -> Result:
    return Result(id=task_id, failure=failure)


class PaceMeter:
    """How fast plain tasks have been running: a moving average, each task
    weighing :data:`PACE_WEIGHT`, which sets how many tasks the worker takes
    at once (:mod:`workers.process`): many while they are short, one past its
    free threads while they are long, so that no task waits behind a long
    one while another worker is free."""

    def __init__(self) -> None:
        self.last_s = 0.0  # how long the last plain task ran
        self._typical_s = 0.0
        self.pace: Pace = "unknown"

    def note(self, elapsed_s: float) -> bool:
        """Note one task's run; whether the pace changed."""
        self.last_s = elapsed_s
        self._typical_s += (elapsed_s - self._typical_s) * PACE_WEIGHT
        pace: Pace = "unknown"
        if self._typical_s < SHORT_TASK_S:
            pace = "short"
        elif self._typical_s >= LONG_TASK_S:
            pace = "long"
        changed, self.pace = pace != self.pace, pace
        return changed
