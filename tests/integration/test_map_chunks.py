"""``map``'s adaptive chunks: short calls travel many to a task, long ones
one to a task, and every call keeps its own value and exception."""

from __future__ import annotations

import itertools
import os
import signal
import threading
from pathlib import Path

import pytest

from pool import AsyncClient, Client, Pool
from pool.client.mapping import MIN_CHUNKS
from tests.support import sample_tasks
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pool() -> Client:  # type: ignore[misc]
    with Pool(workers=4) as client:
        yield client


def test_short_calls_are_packed_many_to_a_task(pool: Client) -> None:
    """20,000 no-op calls: right and in order, and nearly every call ran in
    the same worker right after the call before it, as a chunk does (one
    call per task would spread neighbours over the 4 workers)."""
    runs = list(pool.map(sample_tasks.sequenced, range(20_000)))
    assert [x for x, _, _ in runs] == list(range(20_000))
    followed = sum(
        1
        for (_, pid_a, n_a), (_, pid_b, n_b) in itertools.pairwise(runs)
        if pid_a == pid_b and n_b == n_a + 1
    )
    assert followed > 0.9 * len(runs)


def test_a_call_that_raises_fails_alone_and_in_its_turn(pool: Client) -> None:
    """In a chunked map, the calls before the bad one yield their values,
    the bad one raises its own exception (with the remote traceback), and
    the calls after it still ran."""
    results = pool.map(sample_tasks.fail_on, itertools.repeat(1500, 3000), range(3000))
    for expected in range(1500):
        assert next(results) == expected
    with pytest.raises(ValueError, match="1500 is bad") as raised:
        next(results)
    assert "fail_on" in str(raised.value.__cause__)
    with pytest.raises(StopIteration):
        next(results)


def test_explicit_chunks_keep_exceptions_per_call(pool: Client) -> None:
    results = pool.map(
        sample_tasks.fail_on, itertools.repeat(5, 10), range(10), chunksize=4
    )
    assert [next(results) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="5 is bad"):
        next(results)


async def test_the_async_client_chunks_the_same_way(pool: Client) -> None:
    async with AsyncClient(pool.namespace) as client:
        got = [x async for x in client.map(sample_tasks.square, range(5000))]
        assert got == [x * x for x in range(5000)]
        failing = client.map(sample_tasks.fail_on, itertools.repeat(3, 9), range(9))
        assert [await anext(failing) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(ValueError, match="3 is bad"):
            await anext(failing)


def test_a_killed_worker_costs_only_the_chunks_it_held(tmp_path: Path) -> None:
    """A worker is SIGKILLed a quarter of the way through a chunked map of
    4,000 calls: every result is right; the only calls run twice were ones
    the killed worker had, and there are no more of them than the chunks it
    could hold (its 4 task slots and the one running, at most 1/64 of the
    calls each)."""
    log = tmp_path / "calls.log"
    with Pool(workers=4) as client:
        killed: list[int] = []

        def killer() -> None:
            wait_until(lambda: _lines(log) >= 1000, timeout_s=60)
            pid = int(log.read_text().splitlines()[-1].split()[1])
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            results = list(
                client.map(
                    sample_tasks.noted,
                    itertools.repeat(str(log), 4000),
                    itertools.repeat(0.0005, 4000),
                    range(4000),
                    timeout=100,
                )
            )
        finally:
            thread.join()
    assert results == [x * x for x in range(4000)]
    assert len(killed) == 1
    first_pid: dict[int, int] = {}
    again = []
    for line in log.read_text().splitlines():
        x, pid = map(int, line.split())
        if x in first_pid:
            again.append(x)
        else:
            first_pid[x] = pid
    assert len(first_pid) == 4000
    assert all(first_pid[x] == killed[0] for x in again)
    assert len(again) <= 5 * (4000 // MIN_CHUNKS)


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0
