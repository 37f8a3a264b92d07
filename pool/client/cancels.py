"""A cancel that tells the truth: :class:`Ask`, one owner's request to
cancel a task, and the pool's word on it.

Where a task is decides whether it can still be cancelled: the client's
outbox (never written: certain here), the dispatcher's queue, a link's
outbox, or a worker that holds it unstarted (there a slot thread's start
and the withdrawal are decided under one lock). So a cancel is *asked*,
and answered by whoever holds the task: True once it is withdrawn (it
will never run), False once it started (or finished, or its stream was
lost: it runs again elsewhere). ``Future.cancel()`` returns that word,
never a guess. An ask's ``kind`` says what else it asks
(:data:`~workers.protocol.stream.Withdraw`): ``stop`` a running call too
(True once stopped), or ``abandon`` it (its caller is gone: a running
coroutine is cancelled, and nobody waits for the word).

An ask is answered on the client's loop and waited for on the owner's
thread (:meth:`Ask.wait`, bounded by :data:`CANCEL_WAIT_S`). An owner
that stops waiting *gives up* the ask, atomically against its answer: an
ask given up is answered False, and a withdrawal that comes after it
sends the task again (the caller was told it would run).
:class:`Asks` is what a task's handler keeps of the asks made of it.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable
from typing import Final

from workers.protocol.stream import Withdraw

# How long an owner waits for the pool's word on a cancel; then it gives
# the ask up (its future goes on, and cancel() returns False). The word
# takes a round trip to the task's worker; only a worker whose loop is
# held (a C call that keeps the GIL) keeps it longer.
CANCEL_WAIT_S: Final = 10.0


class Ask:
    """One request to cancel a task; see the module docstring.

    :param kind: how (``"stop"``: even if it started, ``force=True``).
    """

    __slots__ = ("_answer", "kind")

    def __init__(self, kind: Withdraw = "cancel") -> None:
        self.kind: Withdraw = kind
        self._answer: concurrent.futures.Future[bool] = concurrent.futures.Future()

    @property
    def future(self) -> concurrent.futures.Future[bool]:
        """The answer, to wait on (from asyncio, ``asyncio.wrap_future``);
        cancelling it gives the ask up."""
        return self._answer

    def claim(self) -> bool:
        """The loop takes the right to answer: False if the owner gave the
        ask up (or it is answered already). Answer with :meth:`answer`."""
        try:
            return self._answer.set_running_or_notify_cancel()
        except RuntimeError:  # (claimed before)
            return False

    def answer(self, cancelled: bool) -> None:
        """Say whether the task was cancelled (after :meth:`claim`)."""
        self._answer.set_result(cancelled)

    def settle(self, cancelled: bool) -> None:
        """Answer now, unless given up."""
        if self.claim():
            self.answer(cancelled)

    def wait(self, timeout_s: float | None) -> bool:
        """The pool's word: whether the task was cancelled. Past
        ``timeout_s``, give the ask up: False (the task goes on)."""
        try:
            return self._answer.result(timeout_s)
        except TimeoutError:
            if self._answer.cancel():  # given up, before any answer
                return False
            return self._answer.result()  # (claimed: its answer comes now)
        except concurrent.futures.CancelledError:  # another waiter gave it up
            return False


def wait_all(asks: Iterable[Ask], timeout_s: float = CANCEL_WAIT_S) -> list[bool]:
    """Each ask's word, all within one deadline."""
    deadline = time.monotonic() + timeout_s
    return [ask.wait(max(0.0, deadline - time.monotonic())) for ask in asks]


class Asks:
    """The asks made of one task, not yet answered (a handler's, on the
    client's loop). A handler starts with :data:`NO_ASKS`, shared (a task
    rarely has any), and makes its own with its first ask (:meth:`of`)."""

    __slots__ = ("_asks",)

    def __init__(self) -> None:
        self._asks: list[Ask] = []

    def __bool__(self) -> bool:
        return bool(self._asks)

    def of(self) -> Asks:
        """These, or a task's own to hold asks in, if these are shared."""
        return Asks() if self is NO_ASKS else self

    def hold(self, ask: Ask, *, ended: bool, cancelled: bool, running: bool) -> bool:
        """Hold ``ask`` (True: ask the pool), or answer it now from the
        task's state: ended (``cancelled``, or not), or running (no, to a
        cancel)."""
        if ended:
            ask.settle(cancelled)
        elif running and ask.kind == "cancel":
            ask.settle(False)
        else:
            self._asks.append(ask)
            return True
        return False

    def started(self) -> None:
        """The task started: an ask to cancel it is answered no; one to
        stop or abandon it stands."""
        if not self._asks:
            return
        for ask in self._asks:
            if ask.kind == "cancel":
                ask.settle(False)
        self._asks = [ask for ask in self._asks if ask.kind != "cancel"]

    def ended(self) -> None:
        """The task was answered otherwise (a value, an error), or its ask
        will not be (its stream was lost): no."""
        if not self._asks:
            return
        asks, self._asks = self._asks, []
        for ask in asks:
            ask.settle(False)

    def withdrawn(self, cancel: Callable[[], None]) -> bool:
        """The task was withdrawn as asked: unless every ask was given up
        (False: it must run after all), ``cancel`` its future, then answer
        the asks yes."""
        if not self._asks:
            return False
        asks, self._asks = self._asks, []
        claimed = [ask for ask in asks if ask.claim()]
        if not claimed:
            return False
        cancel()
        for ask in claimed:
            ask.answer(True)
        return True


NO_ASKS: Final = Asks()  # (never holds one: see Asks.of)
