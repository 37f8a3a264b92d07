"""A client's futures follow the concurrent.futures states exactly, driven
by its ledger of tasks (no pool needed: the answers are played here), and
a cancel says what becomes of the call: True only once it never runs."""

from __future__ import annotations

import concurrent.futures
import pickle
import threading

import pytest

from pool import PoolNotRunning
from pool.client.cancels import Ask
from pool.client.core import Submissions
from pool.client.futures import PoolFuture
from pool.client.handlers import FutureHandler
from pool.client.ledger import Ledger
from pool.errors import RemoteTraceback
from tests.support import sample_tasks
from workers.protocol import codec
from workers.protocol.stream import MAX_BATCH_TASKS, Withdraw
from workers.protocol.worker_pb2 import Result, ResultBatch

pytestmark = pytest.mark.timeout(10)
Future = concurrent.futures.Future


class Sent:
    """A ledger with futures added the way Client adds them."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.submissions = Submissions()
        self.handlers: dict[int, FutureHandler] = {}

    def submit(self) -> tuple[int, PoolFuture]:
        ref = self.submissions.reference(sample_tasks.square)
        submission, _, _ = self.submissions.make(ref, (3,), {})
        future = PoolFuture()
        handler = FutureHandler(future)
        self.handlers[submission.task.id] = handler
        self.ledger.add(submission, handler)
        return submission.task.id, future

    def start(self, *ids: int) -> None:
        self.ledger.on_batch(ResultBatch(started=ids))

    def answer(self, task_id: int, value: object) -> None:
        result = Result(id=task_id, value=pickle.dumps(value))
        self.ledger.on_batch(ResultBatch(results=[result]))

    def withdrawn(self, task_id: int) -> None:
        """The dispatcher (or the worker) withdrew the task as asked."""
        result = Result(id=task_id, failure=codec.cancelled())
        self.ledger.on_batch(ResultBatch(results=[result]))

    def ask(self, task_id: int, kind: Withdraw = "cancel") -> Ask:
        """What the client's loop does when an owner cancels a future."""
        ask = Ask(kind)
        if self.handlers[task_id].ask(ask):
            self.ledger.cancel(task_id, kind)
        return ask


def _outgoing(ledger: Ledger) -> tuple[list[int], list[int], list[int]]:
    batches = list(ledger.batches())
    ids = [s.task.id for b in batches for s in b.submissions]
    cancels = [c for b in batches for c in b.cancel]
    return ids, cancels, [c for b in batches for c in b.stop]


def test_a_future_is_pending_until_a_worker_takes_its_task() -> None:
    """PENDING (cancellable) while queued; RUNNING once taken, and then
    cancel() is refused; FINISHED with the value."""
    sent = Sent()
    task_id, future = sent.submit()
    assert not future.running() and not future.done()
    sent.start(task_id)
    assert future.running() and not future.cancel()
    sent.answer(task_id, 9)
    assert future.result(0) == 9 and future.done()


def test_a_cancel_waits_for_the_pools_word_and_a_withdrawal_cancels() -> None:
    """A cancel of a task already sent is asked of the dispatcher: the future
    stays PENDING, unanswered, until the word comes; a withdrawal cancels it
    and wakes a thread in wait(); a late start or result changes nothing."""
    sent = Sent()
    task_id, future = sent.submit()
    _outgoing(sent.ledger)  # the submission went out
    ask = sent.ask(task_id)
    assert _outgoing(sent.ledger) == ([], [task_id], [])
    assert not ask.future.done() and not future.done()
    waited: list[set[Future[object]]] = []
    waiter = threading.Thread(
        target=lambda: waited.append(concurrent.futures.wait([future], 5).done)
    )
    waiter.start()
    sent.withdrawn(task_id)
    waiter.join(5)
    assert ask.wait(0) is True and future.cancelled() and waited == [{future}]
    assert len(sent.ledger) == 0
    sent.start(task_id)
    sent.answer(task_id, 9)
    assert future.cancelled()


def test_a_task_that_started_before_its_cancel_arrived_is_not_cancelled() -> None:
    """The defect this guards against: cancel() said True for a call that a
    worker had already started. The worker's start is the word: no, and the
    future runs to its value."""
    sent = Sent()
    task_id, future = sent.submit()
    _outgoing(sent.ledger)
    ask = sent.ask(task_id)
    sent.start(task_id)  # the worker took it in the same instant
    assert ask.wait(0) is False and future.running()
    sent.answer(task_id, 9)
    assert future.result(0) == 9 and not future.cancelled()


def test_a_task_cancelled_before_it_was_written_never_leaves() -> None:
    """Cancelling a task still in the client's outbox answers it here: it
    is never sent, and no cancel is either."""
    sent = Sent()
    task_id, future = sent.submit()
    kept, _ = sent.submit()
    ask = sent.ask(task_id)
    assert ask.wait(0) is True and future.cancelled()
    assert _outgoing(sent.ledger) == ([kept], [], [])
    assert len(sent.ledger) == 1


def test_an_ask_given_up_sends_the_task_again_if_it_is_withdrawn() -> None:
    """An owner that stops waiting gets False; a withdrawal that comes after
    that does not cancel the future, whose call is sent again and runs."""
    sent = Sent()
    task_id, future = sent.submit()
    _outgoing(sent.ledger)
    ask = sent.ask(task_id)
    _outgoing(sent.ledger)  # the cancel went out
    assert ask.wait(0) is False  # given up
    sent.withdrawn(task_id)
    assert not future.done()
    assert _outgoing(sent.ledger) == ([task_id], [], [])
    sent.start(task_id)
    sent.answer(task_id, 9)
    assert future.result(0) == 9


def test_a_stop_ends_a_running_future_cancelled() -> None:
    """A stop (force) is asked even of a started task; once the pool says it
    stopped, the future is cancelled: result() and exception() raise
    CancelledError, and callbacks run."""
    sent = Sent()
    task_id, future = sent.submit()
    _outgoing(sent.ledger)
    sent.start(task_id)
    called: list[bool] = []
    future.add_done_callback(lambda f: called.append(f.cancelled()))
    ask = sent.ask(task_id, "stop")
    assert _outgoing(sent.ledger) == ([], [], [task_id])
    assert not ask.future.done() and future.running()
    sent.withdrawn(task_id)
    assert ask.wait(0) is True and future.cancelled() and called == [True]
    with pytest.raises(concurrent.futures.CancelledError):
        future.result(0)
    with pytest.raises(concurrent.futures.CancelledError):
        future.exception(0)


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


def test_a_lost_stream_answers_an_open_cancel_no_and_sends_the_task_again() -> None:
    """After a lost stream, unanswered tasks go out again: a running one
    stays RUNNING when a new worker takes it; one whose cancel was not
    answered is told no (it may have started with the lost dispatcher), and
    goes again."""
    sent = Sent()
    running, running_future = sent.submit()
    asked, asked_future = sent.submit()
    waiting, _ = sent.submit()
    sent.start(running)
    _outgoing(sent.ledger)
    ask = sent.ask(asked)
    sent.ledger.resend_all()
    assert ask.wait(0) is False and not asked_future.done()
    assert _outgoing(sent.ledger) == ([running, asked, waiting], [], [])
    sent.start(running, waiting)
    assert running_future.running()
    assert len(sent.ledger) == 3


def test_failing_everything_fails_each_pending_future_once() -> None:
    """When the pool goes away, every pending future gets the error, and a
    cancel asked of one is answered no."""
    sent = Sent()
    futures = [sent.submit() for _ in range(3)]
    _outgoing(sent.ledger)
    ask = sent.ask(futures[0][0])
    sent.ledger.fail_all(PoolNotRunning("ns", "the pool stopped"))
    for _, future in futures:
        with pytest.raises(PoolNotRunning, match="the pool stopped"):
            future.result(0)
    assert ask.wait(0) is False and len(sent.ledger) == 0


def test_batches_are_bounded_and_cancels_ride_along() -> None:
    """Outgoing tasks go in messages of at most MAX_BATCH_TASKS; cancels and
    stops of tasks already written go in the first."""
    sent = Sent()
    written, _ = sent.submit()
    stopped, _ = sent.submit()
    _outgoing(sent.ledger)
    for _ in range(MAX_BATCH_TASKS + 1):
        sent.submit()
    sent.ask(written)
    sent.ask(stopped, "stop")
    batches = list(sent.ledger.batches())
    assert [len(b.submissions) for b in batches] == [MAX_BATCH_TASKS, 1]
    assert [list(b.cancel) for b in batches] == [[written], []]
    assert [list(b.stop) for b in batches] == [[stopped], []]


def test_an_abandon_stands_through_a_start_and_its_withdrawal_is_taken() -> None:
    """An abandon (its caller is gone) is asked even of a running task and
    stays held through its start: the pool's withdrawal (a coroutine
    cancelled there) ends the future cancelled, and the task goes no more."""
    sent = Sent()
    task_id, future = sent.submit()
    _outgoing(sent.ledger)
    ask = sent.ask(task_id, "abandon")
    sent.start(task_id)
    assert not ask.future.done() and future.running()
    assert [list(b.abandon) for b in sent.ledger.batches()] == [[task_id]]
    sent.withdrawn(task_id)
    assert ask.wait(0) is True and future.cancelled() and len(sent.ledger) == 0


def test_an_ask_the_loop_takes_after_the_withdrawal_hears_yes() -> None:
    """Two owners ask at once; the second ask reaches the loop after the
    first was answered (the future let go of): it hears the same yes."""
    sent = Sent()
    task_id, future = sent.submit()
    _outgoing(sent.ledger)
    first = sent.ask(task_id)
    sent.withdrawn(task_id)
    late = Ask()
    assert sent.handlers[task_id].ask(late) is False
    assert first.wait(0) is True and late.wait(0) is True and future.cancelled()
