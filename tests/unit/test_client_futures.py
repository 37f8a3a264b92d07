"""A client's futures follow the concurrent.futures states exactly, driven
by its ledger of tasks (no pool needed: the answers are played here)."""

from __future__ import annotations

import concurrent.futures
import pickle
import threading

import pytest

from pool import PoolNotRunning, RemoteTraceback
from pool.client.core import Submissions
from pool.client.ledger import Ledger
from pool.client.loop import FutureHandler
from tests.support import sample_tasks
from workers.protocol import codec
from workers.protocol.stream import MAX_BATCH_TASKS
from workers.protocol.worker_pb2 import Result, ResultBatch

pytestmark = pytest.mark.timeout(10)
Future = concurrent.futures.Future


class Sent:
    """A ledger with futures added the way Client adds them."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.submissions = Submissions((), None)
        self.handlers: dict[int, FutureHandler] = {}

    def submit(self) -> tuple[int, Future[object]]:
        ref = self.submissions.reference(sample_tasks.square)
        submission, _, _ = self.submissions.make(ref, (3,), {})
        future: Future[object] = Future()
        handler = FutureHandler(future)
        self.handlers[submission.task.id] = handler
        self.ledger.add(submission, handler)
        return submission.task.id, future

    def start(self, *ids: int) -> None:
        self.ledger.on_batch(ResultBatch(started=ids))

    def answer(self, task_id: int, value: object) -> None:
        result = Result(id=task_id, value=pickle.dumps(value))
        self.ledger.on_batch(ResultBatch(results=[result]))

    def cancel(self, task_id: int, future: Future[object]) -> bool:
        """What Client does when its owner cancels a future."""
        if not future.cancel():
            return False
        self.ledger.cancel(task_id)
        self.handlers[task_id].cancelled()
        return True


def _outgoing(ledger: Ledger) -> tuple[list[int], list[int]]:
    batches = list(ledger.batches())
    ids = [s.task.id for b in batches for s in b.submissions]
    return ids, [c for b in batches for c in b.cancel]


def test_a_future_is_pending_until_a_worker_takes_its_task() -> None:
    """PENDING (cancellable) while queued; RUNNING once taken, and then
    cancel() is refused; FINISHED with the value."""
    sent = Sent()
    task_id, future = sent.submit()
    assert future._state == "PENDING" and not future.running()
    sent.start(task_id)
    assert future.running() and not future.cancel()
    sent.answer(task_id, 9)
    assert future.result(0) == 9 and future.done()


def test_cancelling_a_pending_future_sends_a_cancel_and_wakes_waiters() -> None:
    """A pending future cancels; the cancel goes to the dispatcher; a thread
    in wait() on it returns; a late acceptance or result changes nothing."""
    sent = Sent()
    task_id, future = sent.submit()
    _outgoing(sent.ledger)  # the submission went out
    waited: list[set[Future[object]]] = []
    waiter = threading.Thread(
        target=lambda: waited.append(concurrent.futures.wait([future], 5).done)
    )
    waiter.start()
    assert sent.cancel(task_id, future)
    waiter.join(5)
    assert waited == [{future}]
    assert _outgoing(sent.ledger) == ([], [task_id])
    assert len(sent.ledger) == 1  # until the dispatcher answers the cancel
    sent.start(task_id)  # the worker took it in the same instant
    sent.answer(task_id, 9)
    assert future.cancelled()


def test_a_task_cancelled_before_it_was_written_never_leaves() -> None:
    """Cancelling a task still in the client's outbox answers it here: it
    is never sent, and no cancel is either."""
    sent = Sent()
    task_id, future = sent.submit()
    kept, _ = sent.submit()
    assert sent.cancel(task_id, future)
    assert _outgoing(sent.ledger) == ([kept], [])
    assert len(sent.ledger) == 1 and future.cancelled()


def test_an_exception_carries_its_remote_traceback() -> None:
    """A failure sets the worker's exception, with its remote traceback as
    the cause."""
    sent = Sent()
    task_id, future = sent.submit()
    try:
        raise ValueError("boom")
    except ValueError as exc:
        failure = codec.failure_of(exc)
    sent.ledger.on_batch(ResultBatch(results=[Result(id=task_id, failure=failure)]))
    with pytest.raises(ValueError, match=r"^boom$") as raised:
        future.result(0)
    assert isinstance(raised.value.__cause__, RemoteTraceback)


def test_a_resent_task_keeps_its_state_and_its_cancel() -> None:
    """After a lost stream, unanswered tasks go out again: a running one
    stays RUNNING when a new worker takes it; one cancelled meanwhile is
    answered here, not sent again."""
    sent = Sent()
    running, running_future = sent.submit()
    cancelled, cancelled_future = sent.submit()
    waiting, _ = sent.submit()
    sent.start(running)
    assert sent.cancel(cancelled, cancelled_future)
    _outgoing(sent.ledger)
    sent.ledger.resend_all()
    assert _outgoing(sent.ledger) == ([running, waiting], [])
    sent.start(running, waiting)
    assert running_future.running()
    assert len(sent.ledger) == 2


def test_failing_everything_fails_each_pending_future_once() -> None:
    """When the pool goes away, every pending future gets the error."""
    sent = Sent()
    futures = [sent.submit()[1] for _ in range(3)]
    sent.ledger.fail_all(PoolNotRunning("ns", "the pool stopped"))
    for future in futures:
        with pytest.raises(PoolNotRunning, match="the pool stopped"):
            future.result(0)
    assert len(sent.ledger) == 0


def test_batches_are_bounded_and_cancels_ride_along() -> None:
    """Outgoing tasks go in messages of at most MAX_BATCH_TASKS; cancels of
    tasks already written go in the first."""
    sent = Sent()
    written, _ = sent.submit()
    _outgoing(sent.ledger)
    for _ in range(MAX_BATCH_TASKS + 1):
        sent.submit()
    sent.ledger.cancel(written)
    batches = list(sent.ledger.batches())
    assert [len(b.submissions) for b in batches] == [MAX_BATCH_TASKS, 1]
    assert [list(b.cancel) for b in batches] == [[written], []]
