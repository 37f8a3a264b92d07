"""Client, AsyncClient and the embedded Pool against real pools."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from discovery import list_workers, paths
from pool import (
    AsyncClient,
    Client,
    NoWorkerAvailable,
    Pool,
    PoolError,
    PoolNotRunning,
    TaskTimeout,
)
from pool.errors import BadTask
from tests.support import sample_tasks
from tests.support.helpers import ROOT, wait_until
from tests.support.pools import processes_mentioning, running_pool
from tests.support.streams import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    """One embedded pool of 4 workers shared by this module's tests."""
    embedded = Pool(workers=4)
    with embedded:
        yield embedded
    assert not (paths.SHM_DIR / paths.segment_name(embedded.namespace)).exists()
    assert not paths.namespace_dir(embedded.namespace, create=False).exists()
    assert processes_mentioning(embedded.namespace) == []


def test_map_keeps_order_with_and_without_chunks(pool: Pool) -> None:
    """map returns results in input order, whatever the chunk size."""
    with Client(pool.namespace) as client:
        expected = [x * x for x in range(500)]
        assert list(client.map(sample_tasks.square, range(500))) == expected
        assert (
            list(client.map(sample_tasks.square, range(500), chunksize=37)) == expected
        )


def test_map_timeout_raises(pool: Pool) -> None:
    """map's timeout bounds the wait for results, as Executor.map's does."""
    with Client(pool.namespace) as client:
        results = client.map(sample_tasks.nap, [2.0], timeout=0.2)
        with pytest.raises(concurrent.futures.TimeoutError):
            list(results)


def test_task_timeout_reaches_the_worker(pool: Pool) -> None:
    """A per-task timeout fails the task at the worker with TimeoutError."""
    with Client(pool.namespace, task_timeout_s=0.3) as client:
        with pytest.raises(TaskTimeout, match=r"ran over its 0\.3 s"):
            client.submit(sample_tasks.async_nap, 30).result(timeout=20)
        assert client.submit(sample_tasks.square, 4).result(timeout=30) == 16


async def test_async_client_submit_map_and_cancel(pool: Pool) -> None:
    """AsyncClient runs coroutine and plain functions; cancelling the awaiting
    task cancels the task in its worker (its running count falls to 0)."""
    async with AsyncClient(pool.namespace) as client:
        assert await client.submit(sample_tasks.async_double, 21) == 42
        got = [value async for value in client.map(sample_tasks.square, range(50))]
        assert got == [x * x for x in range(50)]
        napping = asyncio.ensure_future(client.submit(sample_tasks.async_nap, 60))
        await eventually(lambda: _running(pool.namespace) == 1)
        napping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await napping
        await eventually(lambda: _running(pool.namespace) == 0)


def _running(namespace: str) -> int:
    return sum(int(w.extra.get("running", "0")) for w in list_workers(namespace))


def test_tasks_spread_to_the_least_loaded_workers(pool: Pool) -> None:
    """Eight tasks that each hold a worker for a moment land on all four."""
    with Client(pool.namespace) as client:
        pids = set(client.map(sample_tasks.pid_after, [0.3] * 8))
    assert pids == {w.pid for w in list_workers(pool.namespace)}


def test_bad_tasks_fail_clearly(pool: Pool) -> None:
    """Unimportable names, non-callables and callables that do not pickle
    fail, set on their future; lambdas and bound methods travel by value;
    the pool keeps serving.

    Regression: a bound method was sent by its qualname and the worker
    called the plain function with the first argument as self."""
    with Client(pool.namespace) as client:
        with pytest.raises(BadTask, match="cannot import module 'no_such_module'"):
            client.submit("no_such_module:f").result(timeout=30)
        with pytest.raises(BadTask, match="is a int, not a callable"):
            client.submit("tests.support.sample_tasks:NOT_CALLABLE").result(timeout=30)
        with pytest.raises(TypeError, match="'int' object is not callable"):
            client.submit(42).result(timeout=30)  # type: ignore[arg-type]
        lock = threading.Lock()
        with pytest.raises(TypeError, match=r"cannot pickle '_thread\.lock'"):
            client.submit(lambda: lock.locked()).result(timeout=30)
        assert client.submit(lambda: 1).result(timeout=30) == 1
        assert client.submit(sample_tasks.Scaler(42).scale, 3).result(timeout=30) == 126
        assert client.submit(sample_tasks.Scaler.unit, 7).result(timeout=30) == 7
        assert client.submit(sample_tasks.square, 5).result(timeout=30) == 25


def test_no_matching_worker_fails_at_once_in_a_started_pool() -> None:
    """In a pool whose workers have all started, a task whose tags no worker
    has fails at once with NoWorkerAvailable naming the tags there are (with
    the hour-long wait, it would time out here otherwise); a matching worker
    takes a tagged task."""
    with Pool(workers=1, tags=("gpu",), no_worker_timeout_s=3600.0) as client:
        with Client(client.namespace, tags=("gpu",)) as gpu:
            assert gpu.submit(sample_tasks.square, 3).result(timeout=30) == 9
        with Client(client.namespace, tags=("tpu",)) as tpu:
            future = tpu.submit(sample_tasks.square, 3)
            with pytest.raises(
                NoWorkerAvailable,
                match=r"no worker of the pool has tags tpu \(the tags its workers "
                r"have: gpu\)",
            ):
                future.result(timeout=30)


def test_client_without_pool_says_how_to_start_one(namespace: str) -> None:
    with pytest.raises(PoolNotRunning, match=r"start one with `python -m pool up"):
        Client(namespace)


def test_max_pending_holds_submit_until_a_future_is_done(
    pool: Pool, tmp_path: Path
) -> None:
    """With max_pending=2 and two tasks held by a gate, a third submit waits
    (as put on a full queue.Queue does) and returns once one of them is done;
    a cancelled future frees its room too."""
    gate = tmp_path / "gate"
    with Client(pool.namespace, max_pending=2) as client:
        held = [client.submit(sample_tasks.gated, str(gate), i) for i in range(2)]
        returned = threading.Event()
        third: list[concurrent.futures.Future[int]] = []

        def submit_third() -> None:
            third.append(client.submit(sample_tasks.square, 3))
            returned.set()

        thread = threading.Thread(target=submit_third)
        thread.start()
        try:
            # (A bounded look: a slow machine can only let this pass wrongly,
            # never fail it wrongly; the gate below is what frees the room.)
            assert not returned.wait(0.5), "submit did not wait for room"
        finally:
            gate.touch()
        thread.join(30)
        assert returned.is_set() and third[0].result(30) == 9
        assert [f.result(30) for f in held] == [0, 1]
    with pytest.raises(ValueError, match="max_pending must be at least 1, got 0"):
        Client(pool.namespace, max_pending=0)


def test_a_client_whose_connection_failed_fails_every_future(pool: Pool) -> None:
    """A bug that ends a client's connection (here: its task cancelled, as
    nothing of ours does) fails its pending futures and every later one
    with PoolError, at once: no submit waits on the client's own lock.

    Regression: a submit after the failure deadlocked on the lock that
    failing its future takes."""
    client = Client(pool.namespace)
    assert client.submit(sample_tasks.square, 3).result(30) == 9
    runner = client._runner
    loop = runner._loop

    def crash() -> None:
        for task in asyncio.all_tasks(loop):
            task.cancel()

    loop.call_soon_threadsafe(crash)
    wait_until(lambda: runner._crashed is not None)
    later = client.submit(sample_tasks.square, 4)
    with pytest.raises(PoolError, match="connection failed"):
        later.result(30)


def _loop_io(*args: str) -> dict[str, Any]:
    """What ``tests.support.loop_io`` saw (run in a process of its own: an
    audit hook cannot be removed)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.loop_io", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return seen


def test_the_clients_loop_never_scans_dev_shm(namespace: str) -> None:
    """The client sweeps the results nobody will read each second: its scan
    of /dev/shm (thousands of entries on a busy machine) runs on a thread
    of its offload, never on its event loop. Regression: on the loop."""
    with running_pool(namespace, "--workers", "1"):
        seen = _loop_io("client", namespace)
    assert len(seen["scans"]) >= 2
    assert seen["loop"] not in seen["scans"]


def test_the_supervisors_loop_never_writes_a_file() -> None:
    """The supervisor writes the pool's files (its token, where clients find
    the dispatcher, the data plane's) from a thread of its offload, never
    on its event loop. Regression: the token and the address, on the loop."""
    seen = _loop_io("pool")
    assert len(seen["writes"]) >= 3, seen
    assert seen["loop"] not in seen["writes"]
