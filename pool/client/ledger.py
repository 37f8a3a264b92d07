"""A client's bookkeeping of its tasks, with no I/O: :class:`Ledger`.

The tasks sent and not answered, what is still to be written (submissions
and cancels), and what each answer means for its :class:`Handler`
(``started``: a worker started the task; ``resolve``: its result). The
:class:`~pool.client.connection.Connection` runs it over its streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Final, Protocol

from pool.client.store import Store
from pool.dispatcher_pb2 import Submission, SubmissionBatch
from pool.errors import PoolError, PoolStopping
from workers.protocol import codec, transfer
from workers.protocol.errors import TransferLost
from workers.protocol.stream import Outgoing
from workers.protocol.worker_pb2 import Data, Result, ResultBatch, Task

# A task whose value was lost with the worker holding it runs again, up to
# this many times, before its future fails with DataGone.
MAX_REFETCHES: Final = 3
_STOPPING: Final = f"{PoolStopping.__module__}.{PoolStopping.__qualname__}"


class Handler(Protocol):
    """The caller's side of one task."""

    def started(self) -> None:
        """A worker has started the task (called at most once per send)."""

    def resolve(self, result: Result) -> None:
        """The task's result, or its failure (called once)."""


class Ledger:
    """The tasks a connection has sent and not heard the end of, and the
    sending half of its stream (:class:`~workers.protocol.stream.Outgoing`)."""

    def __init__(
        self, wake: asyncio.Event | None = None, store: Store | None = None
    ) -> None:
        # By id: the submission, who hears of it, its function's pickle.
        self._pending: dict[int, tuple[Submission, Handler, bytes]] = {}
        self._store = store
        self._cancelled: set[int] = set()  # asked for, not yet answered
        self._refetches: dict[int, int] = {}  # tasks run again, lost values
        self.outgoing: Outgoing[Submission] = Outgoing(_task_of, wake)
        self._hand_off = False  # (see new_stream)

    def new_stream(self, *, hand_off: bool = False) -> None:
        """A stream starts: it has carried no function yet. With
        ``hand_off`` (to one of several dispatchers), a task it fails with
        ``PoolStopping`` stays pending, to go to the next one."""
        self.outgoing.new_stream()
        self._hand_off = hand_off

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._pending

    def add(self, submission: Submission, handler: Handler, code: bytes = b"") -> None:
        """Send a task; ``code`` is its function's pickle if it ships one."""
        self._pending[submission.task.id] = (submission, handler, code)
        self.outgoing.add(submission, code)

    def cancel(self, task_id: int) -> None:
        """Cancel a pending task: here if it was not written yet, else ask
        the dispatcher (its answer comes then)."""
        if self.outgoing.withdraw(task_id):
            self._settle(Result(id=task_id, failure=codec.cancelled()))
        elif task_id in self._pending and task_id not in self._cancelled:
            self._cancelled.add(task_id)
            self.outgoing.cancel(task_id)

    def batches(self) -> Iterator[SubmissionBatch]:
        """What is to be written, in messages of at most MAX_BATCH_TASKS."""
        for submissions, cancels in self.outgoing.take():
            yield SubmissionBatch(submissions=submissions, cancel=cancels)

    def on_batch(self, batch: ResultBatch) -> list[Result]:
        """Hear a batch of answers; the results whose values are to be
        fetched first (held by a worker of another machine): each is heard
        of again, by :meth:`fetched`."""
        for task_id in batch.started:
            if (entry := self._pending.get(task_id)) is not None:
                entry[1].started()
        to_fetch: list[Result] = []
        for result in batch.results:
            if result.id not in self._pending:
                if self._store is not None and result.HasField("data"):
                    self._store.discard(result.data)  # (nobody will read it)
            elif transfer.transfer_of(result) is not None:
                to_fetch.append(result)
            elif self._hand_off and result.failure.type == _STOPPING:
                continue  # (sent again once the stream ends)
            else:
                self._settle(result)
        return to_fetch

    def fetched(self, result: Result, value: bytearray | Exception) -> None:
        """A held value's fetch ended: with its bytes, and the task is
        answered; or with an error: the value went with its holder, and
        the task runs again (up to :data:`MAX_REFETCHES` times)."""
        if result.id not in self._pending:
            return  # (failed meanwhile: the client closed)
        if isinstance(value, bytearray):
            transfer.ARRIVED.put(result.data.transfer.token, value)
            self._settle(result)
        elif result.id in self._cancelled:
            self._settle(Result(id=result.id, failure=codec.cancelled()))
        elif (tries := self._refetches.get(result.id, 0)) >= MAX_REFETCHES:
            self._refetches.pop(result.id, None)
            lost = TransferLost("a value held for this client", str(value))
            failure = codec.failure_of(lost, remote=False)
            self._settle(Result(id=result.id, failure=failure))
        else:
            self._refetches[result.id] = tries + 1
            submission, _, code = self._pending[result.id]
            self.outgoing.add(submission, code)

    def _settle(self, result: Result) -> None:
        _, handler = self._forget(result.id)
        self._cancelled.discard(result.id)
        self._refetches.pop(result.id, None)
        handler.resolve(result)

    def _forget(self, task_id: int) -> tuple[Submission, Handler]:
        """A task answered: what held its arguments for upload lets go."""
        submission, handler, _ = self._pending.pop(task_id)
        if (held := transfer.transfer_of(submission.task)) is not None:
            transfer.OFFERED.take(held.token)
        return submission, handler

    def offered(self, task_id: int) -> tuple[Data, list[memoryview]] | None:
        """A pending task's arguments, held for upload (None: it ended)."""
        if (entry := self._pending.get(task_id)) is None:
            return None
        data = entry[0].task.data
        parts = transfer.OFFERED.get(data.transfer.token)
        return None if parts is None else (data, parts)

    def resend_all(self) -> None:
        """After a lost stream: every unanswered task goes out again, but
        those cancelled meanwhile are answered here."""
        for task_id in self._cancelled:
            if task_id in self._pending:
                _, handler = self._forget(task_id)
                handler.resolve(Result(id=task_id, failure=codec.cancelled()))
        self._cancelled.clear()
        self.outgoing.clear()
        for submission, _, code in self._pending.values():
            self.outgoing.add(submission, code)

    def fail_all(self, error: PoolError) -> None:
        self.outgoing.clear()
        self._cancelled.clear()
        self._refetches.clear()
        failure = codec.failure_of(error, remote=False)
        for task_id in list(self._pending):
            _, handler = self._forget(task_id)
            handler.resolve(Result(id=task_id, failure=failure))


def _task_of(submission: Submission) -> Task:
    return submission.task
