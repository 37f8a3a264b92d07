"""A client's bookkeeping of its tasks, with no I/O: :class:`Ledger`.

The tasks sent and not answered, what is still to be written (submissions
and cancels), and what each answer means for its :class:`Handler`
(``started``: a worker started the task; ``resolve``: its result;
``withdrawn``: cancelled as asked, :mod:`pool.client.cancels`). The
:class:`~pool.client.connection.Connection` runs it over its streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Final, Protocol

import grpc

from pool.client.store import Store
from pool.dispatcher_pb2 import Submission, SubmissionBatch
from pool.errors import PoolError, PoolStopping
from workers.protocol import codec, transfer
from workers.protocol.errors import TransferLost
from workers.protocol.stream import MAX_UNANSWERED, STRENGTH, Outgoing, Withdraw
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

    def withdrawn(self) -> bool:
        """The task was cancelled (or stopped) as its owner asked: whether
        the owner takes it so. False: every ask was given up, and the task
        is sent again (its owner was told it would run)."""

    def undecided(self) -> None:
        """Its stream was lost with a cancel asked: the task is sent again,
        and the ask answered no (it may have started there)."""


class Ledger:
    """The tasks a connection has sent and not heard the end of, and the
    sending half of its stream (:class:`~workers.protocol.stream.Outgoing`)."""

    def __init__(
        self, wake: asyncio.Event | None = None, store: Store | None = None
    ) -> None:
        # By id: the submission, who hears of it, its function's pickle.
        self._pending: dict[int, tuple[Submission, Handler, bytes]] = {}
        self._store = store
        self._cancelled: dict[int, Withdraw] = {}  # asked, not yet answered
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

    def room(self) -> int:
        """How many more tasks may be written now: the stream holds at most
        :data:`~workers.protocol.stream.MAX_UNANSWERED` written and not
        answered (the rest stays here, where a cancel withdraws it)."""
        return MAX_UNANSWERED - (len(self._pending) - self.outgoing.unwritten)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._pending

    def add(self, submission: Submission, handler: Handler, code: bytes = b"") -> None:
        """Send a task; ``code`` is its function's pickle if it ships one."""
        self._pending[submission.task.id] = (submission, handler, code)
        self.outgoing.add(submission, code)

    def cancel(self, task_id: int, kind: Withdraw = "cancel") -> None:
        """Ask to withdraw a pending task (see
        :data:`~workers.protocol.stream.Withdraw`): here if it was not
        written yet, else of the dispatcher (whose word comes then:
        withdrawn, started, or its result); once per kind, the stronger
        going on. The task's handler holds the ask."""
        if task_id not in self._pending:
            return
        if self.outgoing.withdraw(task_id):
            self._withdrawn(task_id)
        elif STRENGTH[kind] > STRENGTH[self._cancelled.get(task_id)]:
            self._cancelled[task_id] = kind
            self.outgoing.cancel(task_id, kind)

    def withdraw_unsent(self, task_id: int) -> bool:
        """Take back a task not written yet (without asking anyone):
        whether it was (its handler has then heard ``withdrawn``)."""
        if task_id not in self._pending or not self.outgoing.withdraw(task_id):
            return False
        self._withdrawn(task_id)
        return True

    def _withdrawn(self, task_id: int) -> None:
        """The task was cancelled as asked: settled, unless every ask was
        given up meanwhile (then it goes again)."""
        submission, handler, code = self._pending[task_id]
        self._cancelled.pop(task_id, None)
        if handler.withdrawn():
            self._forget(task_id)
            self._refetches.pop(task_id, None)
        else:
            self.outgoing.add(submission, code)

    def batches(self) -> Iterator[SubmissionBatch]:
        """What is to be written, in messages of at most MAX_BATCH_TASKS."""
        for submissions, cancels in self.outgoing.take():
            yield SubmissionBatch(submissions=submissions, **cancels._asdict())

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
            elif result.id in self._cancelled and _withdrawal(result):
                self._withdrawn(result.id)
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
        elif (tries := self._refetches.get(result.id, 0)) >= MAX_REFETCHES:
            self._refetches.pop(result.id, None)
            lost = TransferLost("a value held for this client", str(value))
            failure = codec.failure_of(lost, remote=False)
            self._settle(Result(id=result.id, failure=failure))
        else:
            self._refetches[result.id] = tries + 1
            submission, handler, code = self._pending[result.id]
            if self._cancelled.pop(result.id, None) is not None:
                handler.undecided()  # (it ran: its value is what was lost)
            self.outgoing.add(submission, code)

    def _settle(self, result: Result) -> None:
        _, handler = self._forget(result.id)
        self._cancelled.pop(result.id, None)
        self._refetches.pop(result.id, None)
        handler.resolve(result)

    def _forget(self, task_id: int) -> tuple[Submission, Handler]:
        """A task answered: what held its arguments for upload lets go, and
        what waits to be written has room."""
        submission, handler, _ = self._pending.pop(task_id)
        if self.outgoing.unwritten:
            self.outgoing.wake.set()
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
        """After a lost stream: every unanswered task goes out again. A
        cancel asked of one is answered no: the stream took its word with
        it, and the task may have started there (a task runs at least
        once)."""
        for task_id in self._cancelled:
            if (entry := self._pending.get(task_id)) is not None:
                entry[1].undecided()
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


def _withdrawal(result: Result) -> bool:
    """Whether ``result`` is a task's withdrawal (cancelled where it was)."""
    return (
        result.HasField("failure")
        and codec.status_of(result.failure) == grpc.StatusCode.CANCELLED
    )
