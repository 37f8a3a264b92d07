"""The concurrent.futures contract, behaviour for behaviour, for a Client of
a running pool and for the client an embedded Pool hands back.

Tasks that must stay put wait on a gate file that the test opens; none of
these tests waits on a clock.
"""

from __future__ import annotations

import concurrent.futures
import gc
import os
import signal
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from discovery import paths, reclaim
from pool import Client, Pool, PoolNotRunning
from pool.dispatcher_pb2 import ListWorkersRequest
from pool.errors import RemoteTraceback
from tests.support import sample_tasks
from tests.support.helpers import wait_until
from tests.support.pools import RunningPool, processes_mentioning
from tests.support.rpc import dispatcher_stub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

WORKERS = 2
# What the workers run at once: a slot each (concurrency 1). Each also
# holds one task unstarted, which stays PENDING and cancellable.
TAKEN = WORKERS


@pytest.fixture(params=["Client", "Pool"])
def executor(request: pytest.FixtureRequest) -> Iterator[Client]:
    """A Client of a running pool, or the client of an embedded Pool. Each
    test has a pool of its own: how many tasks a worker takes at once
    depends on how long the tasks it ran before took."""
    with Pool(workers=WORKERS) as embedded:
        if request.param == "Client":
            client = Client(embedded.namespace)
            try:
                yield client
            finally:
                client.shutdown()
        else:
            yield embedded


class Gate:
    """A file that gated tasks wait for, and a log of those that ran."""

    def __init__(self, directory: Path) -> None:
        self.path, self.log = directory / "gate", directory / "log"
        self.log.touch()

    def submit(self, client: Client, index: int) -> concurrent.futures.Future[Any]:
        return client.submit(sample_tasks.gated, str(self.path), index, str(self.log))

    def open(self) -> None:
        self.path.touch()

    def ran(self) -> list[int]:
        return sorted(int(line) for line in self.log.read_text().split())


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Gate]:
    gate = Gate(tmp_path)
    try:
        yield gate
    finally:
        gate.open()  # whatever the test did, nothing stays blocked


def _queued(namespace: str) -> int:
    """The tasks the dispatcher has not settled: queued, or on a worker."""
    with dispatcher_stub(namespace) as (stub, metadata):
        reply = stub.ListWorkers(ListWorkersRequest(), metadata=metadata, timeout=10)
    return int(reply.queued) + sum(int(w.in_flight) for w in reply.workers)


def _saturate(
    client: Client, gate: Gate, count: int
) -> list[concurrent.futures.Future[Any]]:
    """``count`` gated tasks, once the workers have started all they can."""
    futures = [gate.submit(client, i) for i in range(count)]
    wait_until(lambda: sum(f.running() for f in futures) == TAKEN, 30)
    return futures


def test_a_future_stays_pending_and_cancellable_until_a_worker_takes_it(
    executor: Client, gate: Gate
) -> None:
    """With every worker slot taken, the other futures are PENDING: each
    cancels, the cancel empties the dispatcher's queue, and none of them
    ever runs. The taken ones are RUNNING and refuse to cancel.

    Regression: a future turned RUNNING when it reached the dispatcher, so
    queued tasks could not be cancelled."""
    futures = _saturate(executor, gate, TAKEN + 12)
    running, waiting = futures[:TAKEN], futures[TAKEN:]
    assert all(f.running() for f in running)
    assert not any(f.running() or f.done() for f in waiting)
    assert all(f.cancel() for f in waiting)
    assert not any(f.cancel() for f in running)
    assert _queued(executor.namespace) == TAKEN  # (each withdrawn, as it said)
    gate.open()
    assert [f.result(timeout=30) for f in running] == list(range(TAKEN))
    assert all(f.cancelled() for f in waiting)
    assert gate.ran() == list(range(TAKEN))


def test_shutdown_cancel_futures_cancels_only_what_no_worker_has(
    executor: Client, gate: Gate
) -> None:
    """shutdown(wait=False, cancel_futures=True) cancels the pending futures
    before it returns, for certain: the gate opens at once, and none of them
    runs; the running ones finish with their results.

    Regression: the futures said cancelled before the workers that held
    some had withdrawn them (the test waited for that to open the gate)."""
    futures = _saturate(executor, gate, TAKEN + 5)
    executor.shutdown(wait=False, cancel_futures=True)
    assert [f.cancelled() for f in futures] == [False] * TAKEN + [True] * 5
    gate.open()
    assert [f.result(timeout=30) for f in futures[:TAKEN]] == list(range(TAKEN))
    assert gate.ran() == list(range(TAKEN))


def test_shutdown_without_wait_lets_pending_futures_finish(
    executor: Client, gate: Gate
) -> None:
    """shutdown(wait=False) returns at once and every future, running or
    pending, still completes with its result.

    Regression: it failed every pending future with PoolNotRunning."""
    futures = _saturate(executor, gate, TAKEN + 3)
    executor.shutdown(wait=False)
    with pytest.raises(
        RuntimeError, match="cannot schedule new futures after shutdown"
    ):
        executor.submit(sample_tasks.square, 2)
    gate.open()
    assert [f.result(timeout=30) for f in futures] == list(range(TAKEN + 3))


def test_shutdown_waits_for_every_future(executor: Client, gate: Gate) -> None:
    """shutdown(wait=True) returns once every future is done."""
    futures = _saturate(executor, gate, TAKEN + 2)
    opener = threading.Thread(target=gate.open)
    opener.start()
    executor.shutdown(wait=True)
    opener.join()
    assert all(f.done() for f in futures)
    assert [f.result(0) for f in futures] == list(range(TAKEN + 2))


def test_an_argument_that_cannot_be_pickled_fails_its_future(
    executor: Client,
) -> None:
    """submit does not raise: the pickling error is the future's exception,
    as in ProcessPoolExecutor, and the client goes on."""
    future = executor.submit(sample_tasks.square, threading.Lock())
    with pytest.raises(TypeError, match="cannot pickle"):
        future.result(timeout=10)
    assert executor.submit(sample_tasks.square, 5).result(timeout=30) == 25


def test_map_releases_each_result_once_yielded(executor: Client) -> None:
    """map holds no result it has handed out (with and without chunks)."""
    for chunksize in (1, 2):
        results = executor.map(sample_tasks.boxed, range(4), chunksize=chunksize)
        first = next(results)
        gone = weakref.ref(first)
        assert first.value == 0
        del first
        second = next(results)
        gc.collect()
        assert gone() is None and second.value == 1
        assert [box.value for box in results] == [2, 3]


def test_map_lets_go_of_each_result_as_cpythons_test_free_reference_asks(
    executor: Client,
) -> None:
    """CPython's test_free_reference, on every path of map: the default
    (probes, then adaptive chunks), and a chunk holding a failure, whose
    values before it are yielded one by one."""
    import functools

    for results in (
        executor.map(sample_tasks.boxed, range(100)),
        executor.map(functools.partial(sample_tasks.boxed_unless, 99), range(100)),
    ):
        seen = 0
        try:
            for obj in results:
                gone = weakref.ref(obj)
                del obj
                gc.collect()
                assert gone() is None, f"result {seen} is still held"
                seen += 1
        except ValueError:
            assert seen == 99
        else:
            assert seen == 100


def test_map_timeout_counts_from_the_call(executor: Client, gate: Gate) -> None:
    """map's timeout runs from the call to map, not from the first next():
    with the deadline already past, next() raises at once even though the
    result is not there yet (with it counted from next(), this test would
    wait an hour of fake time)."""
    clock = [1000.0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pool.client.executor.time.monotonic", lambda: clock[0])
        # (One call per task: map's probe for a chunk size waits on this clock.)
        results = executor.map(
            sample_tasks.gated, [str(gate.path)], [0], timeout=3600, chunksize=1
        )
        clock[0] += 3601
        with pytest.raises(concurrent.futures.TimeoutError):
            next(results)


def test_waiting_and_callbacks_work_as_in_the_standard_library(
    executor: Client, gate: Gate
) -> None:
    """add_done_callback, wait (each return_when), as_completed with a
    timeout, map with chunks, and exceptions with their remote traceback."""
    called = threading.Event()
    first = executor.submit(sample_tasks.square, 3)
    first.add_done_callback(lambda f: called.set())
    assert called.wait(30) and first.result() == 9
    failing = executor.submit(sample_tasks.fail, "boom")
    blocked = gate.submit(executor, 1)
    done, not_done = concurrent.futures.wait(
        [failing, blocked], timeout=30, return_when=concurrent.futures.FIRST_EXCEPTION
    )
    assert done == {failing} and not_done == {blocked}
    done, _ = concurrent.futures.wait(
        [failing, blocked], timeout=30, return_when=concurrent.futures.FIRST_COMPLETED
    )
    assert failing in done
    with pytest.raises(concurrent.futures.TimeoutError):
        list(concurrent.futures.as_completed([blocked], timeout=0.05))
    gate.open()
    assert list(concurrent.futures.as_completed([blocked], timeout=30)) == [blocked]
    done, not_done = concurrent.futures.wait([failing, blocked], timeout=30)
    assert not not_done
    with pytest.raises(ValueError, match=r"^boom$") as raised:
        failing.result()
    assert isinstance(raised.value.__cause__, RemoteTraceback)
    squares = list(executor.map(sample_tasks.square, range(25), chunksize=4))
    assert squares == [x * x for x in range(25)]


def test_an_unreferenced_client_lets_its_futures_finish_and_its_thread_end(
    gate: Gate,
) -> None:
    """A client dropped without shutdown still completes its futures, then
    its thread ends (a weakref finalizer, as the standard executors use)."""
    with Pool(workers=1) as embedded:
        _unreferenced(embedded.namespace, gate)


def _unreferenced(namespace: str, gate: Gate) -> None:
    client = Client(namespace)
    future = gate.submit(client, 7)
    thread = client._runner._thread
    del client
    gc.collect()
    gate.open()
    assert future.result(timeout=30) == 7
    thread.join(30)
    assert not thread.is_alive()


@pytest.mark.parametrize("workers", [0, -1])
def test_a_pool_of_no_workers_is_refused(workers: int) -> None:
    """As ProcessPoolExecutor(max_workers=0) does, with the value named."""
    with pytest.raises(ValueError, match=f"workers must be at least 1, got {workers}"):
        Pool(workers=workers)


def test_a_client_does_not_spin_or_hang_once_its_pool_is_gone(
    namespace: str, tmp_path: Path
) -> None:
    """After its pool stops, a client's task fails at once with
    PoolNotRunning, its thread stays idle, and shutdown() returns.

    Regression: the client's loop spun at 100 % of a core and shutdown()
    never returned."""
    embedded = Pool(workers=1, namespace=namespace)
    client = embedded.__enter__()
    try:
        other = Client(namespace)
        assert other.submit(sample_tasks.square, 2).result(timeout=30) == 4
    finally:
        embedded.close()
    with pytest.raises(RuntimeError, match="after shutdown"):
        client.submit(sample_tasks.square, 3)
    future = other.submit(sample_tasks.square, 3)
    with pytest.raises(PoolNotRunning):
        future.result(timeout=30)
    tid = other._runner._thread.native_id
    assert tid is not None
    before = _cpu_ticks(tid)
    threading.Event().wait(0.5)  # an interval to measure the thread's CPU over
    assert _cpu_ticks(tid) - before <= 10  # 0.1 s of CPU at most, idle is ~0
    other.shutdown()


def _cpu_ticks(tid: int) -> int:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_a_client_of_a_dead_pool_fails_at_once(namespace: str) -> None:
    """Where only a SIGKILLed pool's files remain, a client is told that no
    pool runs there, instead of trying to reach its dead dispatcher."""
    pool = RunningPool(namespace, "--workers", "1")
    try:
        pool.wait_for("ready ")
        os.kill(pool.proc.pid, signal.SIGKILL)
        pool.proc.wait(10)
        wait_until(lambda: processes_mentioning(namespace) == [])
    finally:
        pool.close()
    assert (paths.namespace_dir(namespace, create=False) / "address").exists()
    with pytest.raises(PoolNotRunning, match="its last pool died"):
        Client(namespace)
    assert reclaim(namespace)


# -- the behaviours CPython's executor tests check, with our own code ---------


def _capture(*args: object, **kwargs: object) -> tuple[object, object]:
    return args, kwargs


class _Owner:
    def method(self) -> None:
        pass


def test_submit_passes_self_and_fn_as_keywords(executor: Client) -> None:
    """As CPython's test_submit_keyword: ``self`` and ``fn`` are the task's
    keywords; without a positional callable, submit raises TypeError."""
    assert executor.submit(sample_tasks.mul, 2, y=8).result(30) == 16
    got = executor.submit(_capture, 1, self=2, fn=3).result(30)
    assert got == ((1,), {"self": 2, "fn": 3})
    with pytest.raises(TypeError):
        executor.submit(fn=_capture, arg=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        executor.submit(arg=1)  # type: ignore[call-arg]


def test_map_raises_at_the_failing_call_after_the_ones_before(
    executor: Client,
) -> None:
    results = executor.map(divmod, [1, 1, 1, 1], [2, 3, 0, 5])
    assert next(results) == (0, 1) and next(results) == (0, 1)
    with pytest.raises(ZeroDivisionError):
        next(results)


def test_no_stale_reference_to_a_submitted_callable(executor: Client) -> None:
    """As CPython's test_no_stale_references: a bound method's object is
    collected once its future is dropped and the task is done."""
    owner = _Owner()
    collected = threading.Event()
    gone = weakref.ref(owner, lambda _: collected.set())
    executor.submit(owner.method)  # the future is dropped at once
    del owner
    for _ in range(60):
        gc.collect()
        if collected.wait(0.5):
            break
    assert collected.is_set() and gone() is None


def test_shutdown_right_after_a_map_it_never_read(executor: Client) -> None:
    """As CPython's test_shutdown_race_issue12456: no hang."""
    executor.map(str, [2] * (WORKERS + 1))
    executor.shutdown()


@pytest.mark.parametrize("workers", [0, -1])
def test_a_pool_of_no_workers_is_a_value_error(workers: int) -> None:
    """ProcessPoolExecutor(max_workers=0) is a ValueError; so is Pool(workers=0)
    (its message names our setting)."""
    with pytest.raises(ValueError, match="workers must be at least 1"):
        Pool(workers=workers)
