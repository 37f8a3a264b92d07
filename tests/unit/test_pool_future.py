"""A client's future behaves as a ``concurrent.futures.Future`` for the
standard library's own functions, whichever thread touches it first."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest

from pool.client.futures import PoolFuture
from tests.support.helpers import DEADLINE_S

pytestmark = pytest.mark.timeout(30)


def test_a_pool_future_goes_through_the_standard_states() -> None:
    """Pending, then cancelled by its handler's word (asked once, and told to
    its waiters once), or left pending when the word is no; or running,
    then done with a value or an exception, callbacks called, as a Future."""
    told: list[str] = []

    class Handler:
        """What the client's loop does: the pool's word sets the state."""

        def __init__(self, future: PoolFuture, word: bool) -> None:
            self.future, self.word = future, word

        def cancel(self, *, stop: bool = False) -> bool:
            told.append(f"asked {self.word}")
            if self.word:
                concurrent.futures.Future.cancel(self.future)
                self.future.set_running_or_notify_cancel()
            return self.word

    cancelled = PoolFuture()
    cancelled._handler = Handler(cancelled, True)
    assert not cancelled.done() and cancelled.cancel() and cancelled.cancel()
    assert cancelled.cancelled() and told == ["asked True"]
    with pytest.raises(concurrent.futures.CancelledError):
        cancelled.result(0)

    refused = PoolFuture()
    refused._handler = Handler(refused, False)
    assert not refused.cancel() and not refused.done()
    assert told == ["asked True", "asked False"]

    ran = PoolFuture()
    ran._handler = Handler(ran, True)
    seen: list[object] = []
    ran.add_done_callback(lambda f: seen.append(f.result()))
    assert ran.set_running_or_notify_cancel() and ran.running()
    assert not ran.cancel()  # (running: nobody is asked)
    ran.set_result(7)
    assert ran.result(0) == 7 and seen == [7] and len(told) == 2

    failed = PoolFuture()
    failed.set_exception(KeyError("k"))
    assert isinstance(failed.exception(0), KeyError)


def test_wait_and_as_completed_take_pool_futures_beside_plain_ones() -> None:
    """FIRST_COMPLETED, ALL_COMPLETED and as_completed see each future end,
    set from another thread."""
    ours: concurrent.futures.Future[Any] = PoolFuture()
    theirs: concurrent.futures.Future[Any] = concurrent.futures.Future()
    setter = threading.Thread(target=ours.set_result, args=(1,))
    setter.start()
    done, _ = concurrent.futures.wait(
        [ours, theirs], DEADLINE_S, concurrent.futures.FIRST_COMPLETED
    )
    assert done == {ours}
    theirs.set_result(2)
    assert set(concurrent.futures.as_completed([ours, theirs], DEADLINE_S)) == {
        ours,
        theirs,
    }
    setter.join()
