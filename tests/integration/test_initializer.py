"""``initializer`` and ``initargs``, as ProcessPoolExecutor takes them, on
real pools: run once in each worker before its first task, again in each
replacement; a failing one stops the restarts and fails every task with
InitializerFailed, which carries the initializer's own exception."""

from __future__ import annotations

import os
import signal
import traceback
from pathlib import Path

import pytest

import pool
from pool import Client
from tests.support import sample_tasks
from tests.support.helpers import DEADLINE_S, run_script, wait_until
from tests.support.pools import running_pool

pytestmark = pytest.mark.integration


@pytest.mark.timeout(90)
def test_pool_up_initializer_runs_in_each_worker_and_each_replacement(
    namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "init"
    init = ["--initializer", "tests.support.sample_tasks:set_base"]
    args = ["--initarg", "41", "--initarg", str(log)]
    with running_pool(namespace, "--workers", "2", *init, *args):
        with Client(namespace) as client:
            base, pid = client.submit(sample_tasks.read_base).result(DEADLINE_S)
            assert base == "41"
            assert len(log.read_text().split()) == 2  # once in each worker
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: len(log.read_text().split()) == 3)  # the replacement
            results = [client.submit(sample_tasks.read_base) for _ in range(20)]
            assert {f.result(DEADLINE_S)[0] for f in results} == {"41"}


@pytest.mark.timeout(90)
def test_a_failing_initializer_fails_every_task_with_its_own_exception(
    namespace: str,
) -> None:
    init = [
        "--initializer",
        "tests.support.sample_tasks:refuse_to_start",
        "--initarg",
        "no",
    ]
    with running_pool(namespace, "--workers", "2", *init) as up:
        assert " workers=0 " in up.ready_line  # (none started)
        with Client(namespace) as client:
            for fn in (sample_tasks.read_base, os.getpid):
                with pytest.raises(pool.errors.InitializerFailed) as raised:
                    client.submit(fn).result(timeout=DEADLINE_S)
                failed = raised.value
                assert isinstance(failed.exception, RuntimeError)
                assert str(failed.exception) == "cannot start: no"
                assert "refuse_to_start" in str(failed)
                trace = "".join(traceback.format_exception(failed))
                assert 'raise RuntimeError(f"cannot start: {why}")' in trace


@pytest.mark.timeout(90)
def test_pool_takes_any_callable_as_initializer() -> None:
    """Pool(initializer=, initargs=) with a partial and a non-string argument."""
    import functools

    init = functools.partial(sample_tasks.set_base, log="")
    with pool.Pool(workers=1, initializer=init, initargs=("7",)) as client:
        assert client.submit(sample_tasks.read_base).result(DEADLINE_S)[0] == "7"


SCRIPT_GLOBALS = """
import concurrent.futures
import multiprocessing

import pool

MODEL = None
COUNT = 0


def load(name):
    global MODEL
    MODEL = name


def use(_):
    return MODEL


def bump():
    global COUNT
    COUNT += 1
    return COUNT


def read():
    return COUNT


def shout():
    return MODEL + "!"


def run(executor):
    models = sorted({executor.submit(use, i).result() for i in range(8)})
    counts = [executor.submit(bump).result(), executor.submit(read).result()]
    return models, counts, executor.submit(shout).result()


if __name__ == "__main__":
    theirs = concurrent.futures.ProcessPoolExecutor(
        1, multiprocessing.get_context("spawn"), initializer=load, initargs=("small",)
    )
    with theirs:
        print("ppe", run(theirs))
    with pool.Pool(workers=1, initializer=load, initargs=("small",)) as ours:
        print("pool", run(ours), ours.submit(lambda: (MODEL, COUNT)).result())
    with pool.Pool(workers=2, initializer=load, initargs=("small",)) as ours:
        print("two", sorted({ours.submit(use, i).result() for i in range(8)}))
    print("client", MODEL, COUNT)
"""


@pytest.mark.timeout(120)
def test_a_scripts_functions_share_its_globals_in_the_worker(tmp_path: Path) -> None:
    """A script's initializer sets a global its tasks read, and a task's
    global is seen by the next task on that worker, as under
    ProcessPoolExecutor (run beside it): the script's functions share one
    namespace in each worker, however they travel (a lambda too); the
    client's own globals are untouched."""
    expected = "(['small'], [1, 1], 'small!')"
    assert run_script(tmp_path, "script.py", SCRIPT_GLOBALS, timeout_s=100) == [
        f"ppe {expected}",
        f"pool {expected} ('small', 1)",
        "two ['small']",
        "client None 0",
    ]
