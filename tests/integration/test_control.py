"""Control over running work, in a real pool: time limits and stops end the
work (a plain function's worker ends and is replaced), a cancel says True
only for a call that never runs, and options give calls a time limit, a
priority and retries.

Calls that must stay put wait on gate files the test creates; nothing here
waits on a clock. A call that runs where it must not leaves a file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from discovery import list_workers
from pool import AsyncClient, Client, Pool, TaskTimeout
from pool.dispatcher_pb2 import ListWorkersRequest
from tests.support import sample_tasks
from tests.support.helpers import ROOT, run_script, wait_until
from tests.support.rpc import dispatcher_stub
from tests.support.streams import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEADLINE_S = 60.0  # for what must happen; only a broken pool waits this long


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Path]:
    """A gate file, opened at the end whatever the test did."""
    try:
        yield tmp_path / "gate"
    finally:
        (tmp_path / "gate").touch()


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def _pids(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def _worker_pids(namespace: str) -> set[int]:
    return {w.pid for w in list_workers(namespace)}


def _queued_by_priority(namespace: str) -> dict[int, int]:
    with dispatcher_stub(namespace) as (stub, metadata):
        reply = stub.ListWorkers(ListWorkersRequest(), metadata=metadata, timeout=10)
    return dict(reply.queued_by_priority)


def _running(future: concurrent.futures.Future[Any]) -> concurrent.futures.Future[Any]:
    wait_until(future.running, DEADLINE_S)
    return future


def test_calls_over_their_limit_stop_and_their_workers_are_replaced(
    tmp_path: Path,
) -> None:
    """Two calls that spin for ever, on a Pool(2), each with a 0.5 s limit:
    each fails with TaskTimeout, the process that ran it is gone (the work
    stopped), two new workers take their places, and calls after run.

    The defect this guards against: the worker answered TaskTimeout and went
    on spinning, its slot stuck for a minute."""
    pids = tmp_path / "pids"
    with Pool(workers=2) as client:
        timed = client.options(task_timeout_s=0.5)
        spins = [timed.submit(sample_tasks.spin, str(pids)) for _ in range(2)]
        for spin in spins:
            with pytest.raises(TaskTimeout, match=r"ran over its 0\.5 s"):
                spin.result(timeout=DEADLINE_S)
        ran_in = _pids(pids)
        assert len(ran_in) == 2
        wait_until(lambda: all(map(_gone, ran_in)), DEADLINE_S)
        assert list(client.map(sample_tasks.square, range(8))) == [
            x * x for x in range(8)
        ]
        wait_until(
            lambda: (
                len(fresh := _worker_pids(client.namespace)) == 2
                and not fresh & set(ran_in)
            ),
            DEADLINE_S,
        )


def test_a_call_that_holds_the_gil_past_its_limit_is_ended_by_the_kernel(
    tmp_path: Path,
) -> None:
    """A call that holds the GIL (one long C loop) keeps its worker's loop
    from ending it at its limit; the kernel does, a second later (the
    worker's alarm): the call fails with TaskTimeout and is not run again,
    and the pool serves on.

    The defect this guards against: the worker never answered (its loop
    never ran), and a loss without a start report was retried three times
    (WorkerLost, "killed by SIGALRM")."""
    pids = tmp_path / "pids"
    with Pool(workers=1) as client:
        timed = client.options(task_timeout_s=0.3)
        with pytest.raises(TaskTimeout):
            timed.submit(sample_tasks.hold_gil, str(pids)).result(timeout=DEADLINE_S)
        assert client.submit(sample_tasks.square, 3).result(timeout=DEADLINE_S) == 9
        (ran_in,) = _pids(pids)
        assert _gone(ran_in) and ran_in not in _worker_pids(client.namespace)


def test_an_ended_workers_calls_go_elsewhere_and_the_one_beside_runs_again(
    tmp_path: Path, gate: Path
) -> None:
    """One worker runs two calls at once (concurrency 2) and holds more;
    one call passes its limit, so the worker ends. What it held runs on its
    replacement, and the call beside, killed with it, runs there again (its
    start noted twice): every other call gets its value."""
    runs, pids = tmp_path / "runs", tmp_path / "pids"
    with Pool(workers=1, concurrency=2) as client:
        beside = _running(
            client.submit(sample_tasks.noted_then_gated, str(runs), str(gate), 7)
        )
        spin = client.options(task_timeout_s=0.5).submit(sample_tasks.spin, str(pids))
        held = [client.submit(sample_tasks.square, i) for i in range(4)]
        with pytest.raises(TaskTimeout):
            spin.result(timeout=DEADLINE_S)
        (first,) = _pids(pids)
        wait_until(lambda: runs.read_text().split() == ["7", "7"], DEADLINE_S)
        assert [f.result(timeout=DEADLINE_S) for f in held] == [0, 1, 4, 9]
        gate.touch()
        assert beside.result(timeout=DEADLINE_S) == 7
        assert _gone(first) and first not in _worker_pids(client.namespace)


def test_a_stop_ends_a_running_call_and_its_future_is_cancelled(
    tmp_path: Path,
) -> None:
    """A call that spins is not cancelled by a plain cancel (it runs); with
    force=True it is stopped: its future is cancelled, its process gone,
    and the pool is back to its two slots. A pending call stops too."""
    pids = tmp_path / "pids"
    with Pool(workers=2) as client:
        spin = _running(client.submit(sample_tasks.spin, str(pids)))
        assert not spin.cancel() and client.cancel([spin]) == [False]
        assert client.cancel([spin], force=True) == [True]
        assert spin.cancelled() and spin.done()
        with pytest.raises(concurrent.futures.CancelledError):
            spin.result(0)
        wait_until(lambda: len(_pids(pids)) == 1 and _gone(_pids(pids)[0]))
        wait_until(lambda: client.max_workers == 2, DEADLINE_S)
        done = client.submit(sample_tasks.square, 3)
        assert client.cancel([done], force=True) in ([True], [False])
        assert done.cancelled() or done.result(timeout=DEADLINE_S) == 9
        assert client.submit(sample_tasks.square, 4).result(timeout=DEADLINE_S) == 16


def test_a_coroutine_is_cancelled_by_its_limit_and_by_a_stop_in_its_worker(
    tmp_path: Path,
) -> None:
    """A coroutine over its limit, or stopped, is cancelled on its worker's
    loop (it sees CancelledError): the worker itself goes on serving."""
    started, cancelled = tmp_path / "started", tmp_path / "cancelled"
    done = tmp_path / "done"
    args = (str(started), str(cancelled), str(done))
    with Pool(workers=1) as client:
        (worker,) = _worker_pids(client.namespace)
        timed = client.options(task_timeout_s=0.3)
        with pytest.raises(TaskTimeout):
            timed.submit(sample_tasks.async_until_cancelled, *args).result(
                timeout=DEADLINE_S
            )
        wait_until(cancelled.exists, DEADLINE_S)
        cancelled.unlink()
        call = _running(client.submit(sample_tasks.async_until_cancelled, *args))
        assert client.cancel([call], force=True) == [True] and call.cancelled()
        wait_until(cancelled.exists, DEADLINE_S)
        assert client.submit(sample_tasks.square, 5).result(timeout=DEADLINE_S) == 25
        assert _worker_pids(client.namespace) == {worker} and not done.exists()


def test_a_cancel_never_says_yes_to_a_call_that_runs(
    tmp_path: Path, gate: Path
) -> None:
    """Both workers of a Pool(2) are held; of forty calls submitted after,
    each is cancelled as soon as it is sent, and the gate opens the moment
    the cancels return: every call whose cancel said True never ran, and at
    least 36 of 40 said True, in each of three rounds.

    The defect this guards against: cancel() said True at once, while the
    worker that held the call unstarted could still start it (8 to 34 of 40
    ran so, in six pools)."""
    with Pool(workers=2) as client:
        for round_ in range(3):
            round_gate = gate.with_name(f"gate-{round_}")
            holders = [
                _running(client.submit(sample_tasks.gated_pid, str(round_gate)))
                for _ in range(2)
            ]
            marks = [tmp_path / f"mark-{round_}-{i}" for i in range(40)]
            futures = [client.submit(sample_tasks.mark, str(m)) for m in marks]
            said = [future.cancel() for future in futures]
            round_gate.touch()
            for future, cancelled in zip(
                [*holders, *futures], [False] * 2 + said, strict=True
            ):
                if not cancelled:
                    future.result(timeout=DEADLINE_S)
            ran = [m.exists() for m in marks]
            assert not any(r and s for r, s in zip(ran, said, strict=True))
            assert sum(said) >= 36, said


async def test_async_client_cancel_says_which_calls_never_run(
    tmp_path: Path, gate: Path
) -> None:
    """AsyncClient.cancel on tasks awaiting calls: True for those not
    started (their tasks end cancelled and the calls never run), False for
    a running one (its task goes on to the value); with force=True a
    running call is stopped and its task ends cancelled."""
    started, done, pids = tmp_path / "started", tmp_path / "done", tmp_path / "pids"
    marks = [tmp_path / f"mark-{i}" for i in range(4)]
    with Pool(workers=1) as pool:
        async with AsyncClient(pool.namespace) as client:
            running = asyncio.ensure_future(
                client.submit(
                    sample_tasks.started_then_gated,
                    str(started),
                    str(gate),
                    str(done),
                    3,
                )
            )
            await eventually(started.exists)
            waiting = [
                asyncio.ensure_future(client.submit(sample_tasks.mark, str(m)))
                for m in marks
            ]
            await asyncio.sleep(0)  # each sends its call
            assert await client.cancel([*waiting, running]) == [True] * 4 + [False]
            gate.touch()
            assert await running == 3
            for task in waiting:
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert not any(m.exists() for m in marks)
            spin = asyncio.ensure_future(client.submit(sample_tasks.spin, str(pids)))
            await eventually(lambda: bool(_pids(pids)))
            assert await client.cancel([spin], force=True) == [True]
            with pytest.raises(asyncio.CancelledError):
                await spin


def test_higher_priority_calls_start_first(tmp_path: Path, gate: Path) -> None:
    """The worker held; 20 calls of priority 0, then 5 of priority 10: the
    dispatcher takes back the low call the worker held unstarted, and once
    the gate opens, the 5 start before any of the 20, which then start in the
    order they came.

    One worker of one slot, so the log's order is the order the calls
    started: with two, a body can write its line after the next call on the
    other worker wrote its own, though the dispatcher started it first."""
    log = tmp_path / "log"
    with Pool(workers=1) as client:
        holder = _running(client.submit(sample_tasks.gated_pid, str(gate)))
        low = [
            client.submit(sample_tasks.started_log, str(log), f"low-{i}")
            for i in range(20)
        ]
        urgent = client.options(priority=10)
        high = [
            urgent.submit(sample_tasks.started_log, str(log), f"high-{i}")
            for i in range(5)
        ]
        wait_until(lambda: _queued_by_priority(client.namespace) == {0: 20, 10: 4})
        gate.touch()
        for future in [holder, *low, *high]:
            future.result(timeout=DEADLINE_S)
    order = log.read_text().split()
    assert order == [f"high-{i}" for i in range(5)] + [f"low-{i}" for i in range(20)]


def test_retries_run_a_call_again_on_the_exceptions_named(tmp_path: Path) -> None:
    """A call that fails twice succeeds with retries=2; with retries=1 it
    raises the second failure, noting the first; an exception not named is
    raised at once; no retry is made without retry_on."""
    with Pool(workers=1) as client:
        twice = client.options(retries=2, retry_on=ConnectionError)
        assert (
            twice.submit(sample_tasks.flaky, str(tmp_path / "a"), 2, 7).result(
                timeout=DEADLINE_S
            )
            == 7
        )
        once = client.options(retries=1, retry_on=(ConnectionError,))
        with pytest.raises(ConnectionError, match=r"^call 2 failed") as raised:
            once.submit(sample_tasks.flaky, str(tmp_path / "b"), 2, 7).result(
                timeout=DEADLINE_S
            )
        assert raised.value.__notes__ == [
            "retried 1 time(s); the earlier attempts raised:\n"
            "  attempt 1: ConnectionError: call 1 failed"
        ]
        other = client.options(retries=3, retry_on=KeyError)
        with pytest.raises(ConnectionError, match=r"^call 1 failed$"):
            other.submit(sample_tasks.flaky, str(tmp_path / "c"), 1, 7).result(
                timeout=DEADLINE_S
            )
        assert (tmp_path / "c").read_text() == "1"
        with pytest.raises(ValueError, match=r"retries=2 retries nothing"):
            client.options(retries=2)


def test_retries_match_an_exception_class_of_a_script(tmp_path: Path) -> None:
    """A script's own exception class (shipped by value, as its function)
    is the one retried: a call of the script that fails twice succeeds."""
    script = """
import os, sys
from pool import Pool

class Flaky(Exception):
    pass

def flaky(path):
    calls = int(open(path).read()) if os.path.exists(path) else 0
    open(path, "w").write(str(calls + 1))
    if calls < 2:
        raise Flaky(f"call {calls + 1}")
    return calls + 1

with Pool(workers=1) as client:
    again = client.options(retries=2, retry_on=Flaky)
    print(again.submit(flaky, sys.argv[0] + ".count").result(timeout=60))
"""
    assert run_script(tmp_path, "script.py", script) == ["3"]


def test_options_give_a_view_of_the_same_client(tmp_path: Path, gate: Path) -> None:
    """client.options(...) is an Executor on the same connection: its calls
    carry its options, a callable's own keywords stay its own, bad values
    are refused by name, and its shutdown ends only what it sent."""
    with Pool(workers=2) as pool, Client(pool.namespace) as client:
        view = client.options(priority=3, tags=())
        assert view.submit(sample_tasks.call, 1, timeout_s=2).result(
            timeout=DEADLINE_S
        ) == sample_tasks.call(1, timeout_s=2)
        assert list(view.map(sample_tasks.square, range(3))) == [0, 1, 4]
        with pytest.raises(ValueError, match=r"task_timeout_s must be a positive"):
            client.options(task_timeout_s=-1)
        with pytest.raises(TypeError, match=r"retry_on takes exception types"):
            client.options(retries=1, retry_on=(ValueError, "KeyError"))  # type: ignore[arg-type]
        held = view.submit(sample_tasks.gated_pid, str(gate))
        view.shutdown(wait=False)
        with pytest.raises(RuntimeError, match="after shutdown"):
            view.submit(sample_tasks.square, 2)
        assert client.submit(sample_tasks.square, 2).result(timeout=DEADLINE_S) == 4
        gate.touch()
        assert held.result(timeout=DEADLINE_S) > 0
        client.shutdown()
        with pytest.raises(RuntimeError, match="after shutdown"):
            client.options(priority=1).submit(sample_tasks.square, 2)


def test_the_readmes_stopping_example_runs_as_written(tmp_path: Path) -> None:
    """The README's ``stop.py``, taken from the README itself and run by
    path: it prints what its comments say."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\n", readme.index("Save this as `stop.py`")) + 10
    code = readme[start : readme.index("```\n", start)]
    assert run_script(tmp_path, "stop.py", code) == [
        "stopped: the task ran over its 1 s",
        "False",
        "[True]",
        "True",
        "1024",
        "3",
    ]
