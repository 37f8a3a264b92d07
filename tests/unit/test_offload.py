"""Offload: blocking calls on threads their owner bounds and ends."""

from __future__ import annotations

import asyncio
import threading

import pytest

from workers.common.offload import Offload

pytestmark = pytest.mark.timeout(30)


async def test_calls_run_off_the_loop_and_errors_come_back() -> None:
    offload = Offload("test")
    try:
        loop_thread = threading.current_thread()
        ran_on = await offload.run(threading.current_thread)
        assert ran_on is not loop_thread and ran_on.daemon
        with pytest.raises(ZeroDivisionError):
            await offload.run(divmod, 1, 0)
    finally:
        await offload.aclose()
    assert not ran_on.is_alive()  # joined


async def test_at_most_max_threads_run_at_once() -> None:
    """A third call waits on the loop while two hold both threads."""
    offload = Offload("test", max_threads=2)
    release = threading.Event()
    started = threading.Semaphore(0)

    def hold() -> None:
        started.release()
        release.wait(20)

    calls = [asyncio.ensure_future(offload.run(hold)) for _ in range(3)]
    try:
        for _ in range(2):
            await asyncio.to_thread(started.acquire, True, 20)
        assert not await asyncio.to_thread(started.acquire, True, 0.3)
    finally:
        release.set()
        await asyncio.gather(*calls)
        await offload.aclose()
    assert started.acquire(timeout=0)  # the third ran once there was room


async def test_close_waits_a_bounded_time_for_a_call_that_hangs() -> None:
    """aclose returns after join_s even if a call never returns (its thread
    is a daemon), and takes no more calls."""
    offload = Offload("test")
    never = threading.Event()
    started = threading.Event()

    def hang() -> None:
        started.set()
        never.wait(20)

    call = asyncio.ensure_future(offload.run(hang))
    await asyncio.to_thread(started.wait, 20)
    await offload.aclose(join_s=0.05)
    with pytest.raises(RuntimeError, match="closed"):
        await offload.run(print)
    never.set()
    await call


async def test_a_cancelled_callers_thread_keeps_its_place_until_it_returns() -> None:
    """With one thread: a caller cancelled while its call runs leaves the
    call running, and the next call starts only once that one has returned.
    Regression: the place was given back on the cancel, so two threads ran."""
    offload = Offload("test", max_threads=1)
    started, release, returned = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(20)
        returned.set()

    first = asyncio.ensure_future(offload.run(hold))
    try:
        await asyncio.to_thread(started.wait, 20)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.ensure_future(offload.run(returned.is_set))
        for _ in range(10):  # (turns in which a free place would start it)
            await asyncio.sleep(0)
    finally:
        release.set()
    assert await asyncio.wait_for(second, 20) is True  # it ran after hold returned
    await offload.aclose()
