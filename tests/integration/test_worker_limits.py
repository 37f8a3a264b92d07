"""The limits people bring from ProcessPoolExecutor and Dask, on a real
pool: ``--max-tasks-per-child`` and ``--max-memory``. A worker past its
limit retires and is replaced; no task is lost or run twice."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest

import pool
from pool import Client
from tests.support import sample_tasks
from tests.support.helpers import DEADLINE_S
from tests.support.pools import running_pool

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_max_tasks_per_child_replaces_workers_and_runs_each_task_once(
    namespace: str, tmp_path: Path
) -> None:
    """60 tasks on 2 workers that retire after 4: every result comes back,
    each task ran exactly once (its own note in the log), and no process
    ran more than 4."""
    log = str(tmp_path / "log")
    with running_pool(namespace, "--workers", "2", "--max-tasks-per-child", "4"):
        with Client(namespace) as client:
            futures = [client.submit(sample_tasks.noted, log, 0, x) for x in range(60)]
            assert [f.result(timeout=DEADLINE_S) for f in futures] == [
                x * x for x in range(60)
            ]
    notes = [line.split() for line in Path(log).read_text().splitlines()]
    assert sorted(int(x) for x, _ in notes) == list(range(60))  # once each
    per_pid = collections.Counter(pid for _, pid in notes)
    assert max(per_pid.values()) <= 4 and len(per_pid) >= 15


@pytest.mark.timeout(120)
def test_a_worker_over_max_memory_after_a_task_is_replaced(namespace: str) -> None:
    """A task leaks 300 MB, which takes its worker past a limit of 300 MB
    (and stays under the 450 MB at which a running task is stopped): its
    result comes back, and the next task runs in a fresh worker."""
    with running_pool(namespace, "--workers", "1", "--max-memory", "300MB"):
        with Client(namespace) as client:
            leaked = client.submit(sample_tasks.keep_memory, 300).result(DEADLINE_S)
            after = client.submit(os.getpid).result(timeout=DEADLINE_S)
            assert after != leaked
            assert client.submit(os.getpid).result(timeout=DEADLINE_S) == after


@pytest.mark.timeout(150)
def test_a_task_that_blows_through_max_memory_is_not_retried_for_ever(
    namespace: str,
) -> None:
    """A task that takes 2 GB under a limit of 200 MB ends its worker each
    time it runs: it fails with WorkerLost after its attempts, and the pool
    runs the next task."""
    with running_pool(namespace, "--workers", "1", "--max-memory", "200MB"):
        with Client(namespace) as client:
            future = client.submit(sample_tasks.hold_memory, 2000, 60)
            with pytest.raises(pool.WorkerLost):
                future.result(timeout=DEADLINE_S * 3)
            assert client.submit(sample_tasks.square, 7).result(DEADLINE_S) == 49


def test_a_max_memory_below_a_fresh_workers_own_is_named(namespace: str) -> None:
    """A limit a worker is over before any task (10 MB) would replace it
    after every task: each worker says so, with a size that would do."""
    with running_pool(namespace, "--workers", "1", "--max-memory", "10MB") as up:
        # (written before the worker is ready, but on another pipe than its
        # ready line: it may come before or after the pool's)
        warned = [line for line in up.lines.seen if line.startswith("[w0 ")]
        warning = warned[0] if warned else up.wait_for("[w0 ")
        assert "max_memory (10 MB) is below this worker's own memory" in warning
        assert "every worker retires after each task; give more" in warning
