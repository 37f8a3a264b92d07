"""What :meth:`pool.client.executor.Client.map` hands back: each task's
result in order, each let go of once taken (:func:`in_order`), a chunk's
values one by one (:func:`flatten`), and how long the first calls ran
(:func:`time_per_call`, which sizes the chunks of an adaptive
:class:`~pool.client.mapping.MapPlan`). What a map leaves unread when its
caller stops is abandoned (:func:`~pool.client.handlers.withdraw`).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterator
from typing import Any

from pool.client.handlers import withdraw
from pool.client.mapping import PROBE_MAX_S, PROBE_WAIT_S
from workers.protocol import codec


def time_per_call(futures: list[concurrent.futures.Future[Any]]) -> float | None:
    """How long one call took in the first chunk to answer; None if one
    ran :data:`PROBE_WAIT_S` without an answer (or none answered within
    :data:`PROBE_MAX_S`). Waiting counts from when a worker started one, so
    that a pool slow to start them is not mistaken for long calls."""
    started = time.monotonic()
    running_since = None
    while True:
        now = time.monotonic()
        if running_since is None and any(f.running() for f in futures):
            running_since = now
        if running_since is not None:
            left = running_since + PROBE_WAIT_S - now
        else:  # look again soon for one started
            left = min(PROBE_WAIT_S / 5, started + PROBE_MAX_S - now)
        if left <= 0 or now - started >= PROBE_MAX_S:
            return None
        done, _ = concurrent.futures.wait(
            futures, left, concurrent.futures.FIRST_COMPLETED
        )
        for future in done:
            if future.exception() is None:
                chunk: codec.ChunkResult = future.result()
                return chunk.elapsed_s / max(1, len(chunk.values))
        if done:
            return None  # the probe failed: so will the rest, one by one


def in_order(
    futures: list[concurrent.futures.Future[Any]],
    deadline: float | None,
    ended: Callable[[], None] | None = None,
) -> Iterator[Any]:
    """Each future's result in order, each future dropped once its result is
    taken (as ``Executor.map`` does); whatever is left is abandoned (nobody
    can read it: withdrawn, or a coroutine cancelled, all at once, with no
    wait for the pool's word), and ``ended`` called."""
    futures.reverse()
    try:
        while futures:
            left = None if deadline is None else deadline - time.monotonic()
            yield _result_or_cancel(futures.pop(), left)
    finally:
        if futures:
            withdraw(futures, "abandon", wait=False)
        if ended is not None:
            ended()


def _result_or_cancel(
    future: concurrent.futures.Future[Any], timeout: float | None
) -> Any:
    try:
        return future.result(timeout)
    finally:
        future.cancel()  # a no-op once done: a timeout or an interrupt cancels it


def flatten(
    chunks: Iterator[codec.ChunkResult], timed: Callable[[codec.ChunkResult], None]
) -> Iterator[Any]:
    """Each chunk's values in order, each let go of once yielded; ``timed``
    hears of each chunk."""
    for chunk in chunks:
        timed(chunk)
        if chunk.failures:
            yield from codec.chunk_items(chunk)
            continue
        values = chunk.values  # (chunk_items, inline: a generator less a value)
        values.reverse()
        pop = values.pop
        while values:
            yield pop()
