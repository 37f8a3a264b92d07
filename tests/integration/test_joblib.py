"""joblib's ``shm-pool`` backend (pool/joblib.py) on real pools: scikit-learn
gives what loky gives, ``n_jobs`` caps what is in the pool, an exception
cancels the rest, a killed worker loses nothing, large arrays cross once
through shared memory; and joblib's own backend-agnostic tests, run on it."""

from __future__ import annotations

import functools
import gc
import os
import pickle
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from joblib import Parallel, delayed, parallel_config
from joblib.parallel import BACKENDS, register_parallel_backend
from joblib.test import test_parallel as theirs

import pool.joblib
from discovery import paths
from pool import Client, Pool
from pool.cli.inspect import dispatcher_view
from pool.client.rendezvous import Locator
from tests.support import joblib_tasks
from tests.support.helpers import DEADLINE_S, ROOT, wait_until
from workers.protocol import owners

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MIB = 2**20


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """A pool of 4 workers for the module, as joblib's ``shm-pool`` backend
    (joblib's tests name the backend only; each would start a pool)."""
    with Pool(workers=4) as shared:
        register_parallel_backend(
            pool.joblib.BACKEND,
            functools.partial(pool.joblib.ShmPoolBackend, client=shared),
        )
        try:
            yield shared
        finally:
            register_parallel_backend(pool.joblib.BACKEND, pool.joblib.ShmPoolBackend)


@pytest.mark.timeout(300)
def test_scikit_learn_on_a_pool_of_its_own_gives_what_loky_gives() -> None:
    """cross_val_score, GridSearchCV and a RandomForestClassifier with
    n_jobs=-1, on ``parallel_config(backend="shm-pool", workers=2)``, equal
    loky's (run in a process of its own: loky keeps its workers); the pool
    it started stops once the configuration is let go of (the autouse check
    finds no process left)."""
    loky = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tests.support import joblib_tasks; joblib_tasks.print_fits()",
        ],
        capture_output=True,
        check=True,
        # (A fresh interpreter imports scikit-learn and starts loky's
        # workers: over 10 s once in CI beside a busy core.)
        timeout=DEADLINE_S * 6,
    )
    with parallel_config(backend=pool.joblib.BACKEND, workers=2):
        assert joblib_tasks.fits() == pickle.loads(loky.stdout)
    gc.collect()


# scikit-learn's own tests of n_jobs, and those that failed on the pool
# when n_jobs=None ran there (a warning or a count in the caller, an object
# dtype that a pickle loses).
SKLEARN_TESTS = (
    ("sklearn.inspection.tests.test_permutation_importance", ""),
    ("sklearn.neighbors.tests.test_neighbors", "radius_neighbors_regressor or n_jobs"),
    ("sklearn.model_selection.tests.test_validation", "scor or n_jobs or parallel"),
)


def _sklearn_outcomes(tmp_path: Path, *plugin: str) -> dict[str, str]:
    """Each test of :data:`SKLEARN_TESTS` and how it ended (PASSED, FAILED,
    ...), run by pytest in a process of its own (with ``plugin``)."""
    outcomes: dict[str, str] = {}
    for module, selection in SKLEARN_TESTS:
        isolated = [
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
        ]
        chosen = ["--pyargs", module, *(["-k", selection] if selection else [])]
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rA", *isolated, *plugin, *chosen],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
        for line in done.stdout.splitlines():
            outcome, _, test = line.partition(" ")
            if outcome in ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"):
                outcomes[f"{module}::{test.split(' - ')[0].lstrip(':')}"] = outcome
    return outcomes


@pytest.mark.timeout(900)
def test_scikit_learns_own_tests_end_on_the_pool_as_on_joblibs_default(
    tmp_path: Path,
) -> None:
    """scikit-learn's own tests of n_jobs (:data:`SKLEARN_TESTS`), run with
    ``parallel_config(backend="shm-pool", workers=2)`` around the session,
    end each as they end on joblib's default backend: n_jobs=None runs in
    the caller, where joblib runs it."""
    theirs = _sklearn_outcomes(tmp_path)
    ours = _sklearn_outcomes(tmp_path, "-p", "tests.support.sklearn_on_pool")
    assert len(theirs) > 50 and "PASSED" in theirs.values()
    differ = {t: (theirs.get(t), ours.get(t)) for t in theirs.keys() | ours.keys()}
    assert {t: o for t, o in differ.items() if o[0] != o[1]} == {}


def test_n_jobs_caps_the_batches_in_the_pool(client: Client, tmp_path: Path) -> None:
    """Parallel(n_jobs=2) on 4 workers: 2 calls in the pool (none more
    waits in its queue), and never more than 2 run at once."""
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    ran.mkdir()
    calls = [delayed(joblib_tasks.counted)(str(ran), i, str(gate)) for i in range(12)]
    out: list[Any] = []
    parallel = Parallel(n_jobs=2, batch_size=1, backend=pool.joblib.BACKEND)
    runner = threading.Thread(target=lambda: out.append(parallel(calls)))
    runner.start()
    try:
        wait_until(lambda: len(list(ran.glob("start-*"))) >= 2)
        view = dispatcher_view(Locator(client.namespace))
        assert view is not None
        assert sum(view.in_flight.values()) + view.queued == 2
    finally:
        gate.touch()
        runner.join(DEADLINE_S)
    assert out == [list(range(12))]
    assert max(int(seen.name.split("_")[1]) for seen in ran.glob("seen-*")) <= 2


def test_an_exception_cancels_what_no_worker_started(
    client: Client, tmp_path: Path
) -> None:
    """The first call raises: Parallel raises it, with the worker's
    traceback as its cause, and the calls no worker had started, in the
    pool or waiting for room, never run (the pool answers later tasks
    before any of them would)."""
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    ran.mkdir()
    calls = [
        delayed(joblib_tasks.fails_first)(str(ran), i, str(gate)) for i in range(40)
    ]
    parallel = Parallel(
        n_jobs=8, batch_size=1, pre_dispatch="all", backend=pool.joblib.BACKEND
    )
    with pytest.raises(ValueError, match=r"^call 0 fails$") as raised:
        parallel(calls)
    cause = "".join(traceback.format_exception(raised.value.__cause__))
    assert "in fails_first" in cause
    # Once Parallel raised, every call no worker had started is withdrawn
    # (each cancel waited for the pool's word): the dispatcher holds only
    # the calls that started, and each of those leaves its start file.
    view = dispatcher_view(Locator(client.namespace))
    assert view is not None and view.queued == 0
    began = sum(view.in_flight.values())
    wait_until(lambda: len(list(ran.glob("start-*"))) == began)
    gate.touch()
    assert list(client.map(abs, range(-8, 0), chunksize=1)) == list(range(8, 0, -1))
    # 3 workers had started a call, and the one whose call failed may have
    # started one more before the cancel came; none started after it.
    assert began <= 4
    assert len(list(ran.glob("start-*"))) == began


def test_a_worker_killed_mid_parallel_loses_no_call(
    client: Client, tmp_path: Path
) -> None:
    """A call SIGKILLs its worker: it runs again elsewhere, and Parallel
    returns every value."""
    marker = str(tmp_path / "killed")
    got = Parallel(n_jobs=-1, backend=pool.joblib.BACKEND)(
        delayed(joblib_tasks.dies_once)(marker, i) for i in range(200)
    )
    assert got == [i * i for i in range(200)]
    assert Path(marker).exists()


def test_generators_and_a_parallel_inside_a_task(client: Client) -> None:
    """return_as="generator" and "generator_unordered" give every value; a
    Parallel inside a task runs sequentially there, unless told otherwise."""
    ordered = Parallel(n_jobs=-1, backend=pool.joblib.BACKEND, return_as="generator")
    assert list(ordered(delayed(pow)(i, 2) for i in range(50))) == [
        i * i for i in range(50)
    ]
    unordered = Parallel(
        n_jobs=-1, backend=pool.joblib.BACKEND, return_as="generator_unordered"
    )
    assert sorted(unordered(delayed(pow)(i, 3) for i in range(50))) == [
        i**3 for i in range(50)
    ]
    with parallel_config(backend=pool.joblib.BACKEND):
        inner = Parallel(n_jobs=2)(
            delayed(joblib_tasks.inner_backends)() for _ in range(2)
        )
    assert inner == [("SequentialBackend", "ThreadingBackend", [0, 1, 2])] * 2


def test_n_jobs_none_and_1_run_in_the_caller_as_on_joblibs_backends(
    client: Client,
) -> None:
    """``n_jobs=None`` (scikit-learn's default) and ``n_jobs=1`` run in this
    process, as joblib's own backends run them; ``parallel_config(n_jobs=-1)``
    or ``n_jobs=-1`` sends the calls to the pool."""
    here = os.getpid()
    calls = [delayed(os.getpid)() for _ in range(8)]
    with parallel_config(backend=pool.joblib.BACKEND, client=client):
        assert set(Parallel()(calls)) == {here}
        assert set(Parallel(n_jobs=1)(calls)) == {here}
        assert here not in set(Parallel(n_jobs=-1)(calls))
    with parallel_config(backend=pool.joblib.BACKEND, client=client, n_jobs=-1):
        assert here not in set(Parallel()(calls))


def test_a_large_array_crosses_once_however_many_calls_name_it(
    client: Client, tmp_path: Path
) -> None:
    """16 calls given one 8 MiB array hold one copy of it in shared memory
    while they run (the pool's own, so no other test's spares count)."""
    a = np.random.default_rng(0).random(8 * MIB // 8)
    gate = tmp_path / "gate"
    out: list[Any] = []
    parallel = Parallel(n_jobs=4, batch_size=1, backend=pool.joblib.BACKEND)
    runner = threading.Thread(
        target=lambda: out.append(
            parallel(delayed(joblib_tasks.total_when)(str(gate), a) for _ in range(16))
        )
    )
    runner.start()
    key = paths.segment_name(client.namespace)
    try:
        wait_until(lambda: owners.used_bytes(key) >= a.nbytes)
        assert owners.used_bytes(key) < 1.5 * a.nbytes
    finally:
        gate.touch()
        runner.join(DEADLINE_S)
    assert out == [[float(a.sum())] * 16]


def test_the_backend_refuses_two_pools_at_once() -> None:
    with pytest.raises(ValueError, match="not several"):
        pool.joblib.ShmPoolBackend("default", workers=2)
    assert BACKENDS[pool.joblib.BACKEND] is not None


# joblib's own tests that take a backend's name and hold for any backend.
# Left out: test_error_capture and test_parallel_as_context_manager's pool
# checks (they read loky's and multiprocessing's private workers),
# test_abort_backend, test_multiple_generator_call* and the timeout_fail
# tests (wall-clock bounds, and calls that sleep 10 s on workers the module
# shares), test_parallel_unordered_generator_returns_fastest_first (a call
# that sleeps 30 s).
JOBLIB_TESTS: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
    (theirs.test_simple_parallel, (2, 0)),
    (theirs.test_simple_parallel, (-1, 2)),
    (theirs.test_simple_parallel, (-2, 11)),
    (theirs.test_parallel_timeout_success, ()),
    (theirs.test_error_in_task_iterator, ()),
    (theirs.test_invalid_njobs, ()),
    (theirs.test_njobs_converted_to_int, ("2",)),
    (theirs.test_njobs_converted_to_int, (2.3,)),
    (theirs.test_deadlock_with_generator, ("generator", 2)),
    (theirs.test_deadlock_with_generator, ("generator_unordered", -1)),
    (theirs.test_batching_auto_subprocesses, ()),
    (theirs.test_backend_batch_statistics_reset, ()),
]


@pytest.mark.parametrize(
    ("test", "args"),
    JOBLIB_TESTS,
    ids=[f"{t.__name__}{list(a)}" for t, a in JOBLIB_TESTS],
)
def test_joblibs_own_backend_tests(
    client: Client, test: Callable[..., None], args: tuple[Any, ...]
) -> None:
    """joblib's test, with the backend it is given: ours."""
    test(pool.joblib.BACKEND, *args)
