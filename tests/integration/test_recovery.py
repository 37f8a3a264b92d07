"""No submitted task is lost when workers die under it."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading

import pytest

from discovery import list_workers, paths
from pool import Client, Pool, WorkerLost
from tests.support import sample_tasks
from tests.support.helpers import ROOT, children_of, runs, wait_until
from tests.support.pools import RunningPool, processes_mentioning, running_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_map_survives_a_kill_every_300_ms() -> None:
    """2,000 tasks of a few ms run while a worker is SIGKILLed every 300 ms:
    every result arrives, right and in order."""
    embedded = Pool(workers=4)
    with embedded as client:
        done = threading.Event()
        kills: list[int] = []

        def killer() -> None:
            rng = random.Random(7)
            while not done.wait(0.3):
                pids = [w.pid for w in list_workers(embedded.namespace)]
                if pids:
                    victim = rng.choice(pids)
                    kills.append(victim)
                    os.kill(victim, signal.SIGKILL)

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            results = list(client.map(sample_tasks.work, range(2000), timeout=150))
        finally:
            done.set()
            thread.join()
        assert results == [x * x for x in range(2000)]
        assert kills, "no worker was killed"


def test_poison_task_fails_after_max_attempts() -> None:
    """A task that kills every worker it runs on fails with WorkerLost after 3
    attempts, naming the workers it took down; the pool serves the next."""
    with Pool(workers=2) as client:
        with pytest.raises(
            WorkerLost, match=r"lost with its worker 3 time\(s\)"
        ) as lost:
            client.submit(sample_tasks.die).result(timeout=60)
        assert len(lost.value.workers) == 3
        for worker in lost.value.workers:  # each named, with how it died
            assert re.fullmatch(r"worker pid \d+ \([0-9a-f]{8}\): exit code 3", worker)
        assert client.submit(sample_tasks.square, 6).result(timeout=60) == 36


def test_sigkilled_supervisor_leaves_nothing_running_and_is_replaced(
    namespace: str,
) -> None:
    """SIGKILL the supervisor: its workers, its dispatcher and its zygote
    exit by themselves within
    seconds; a new `pool up` on the namespace reclaims what the dead pool
    left, serves, and leaves nothing when it stops."""
    first = RunningPool(namespace, "--workers", "2")
    try:
        zygote = int(first.wait_for("zygote-ready ").split("pid=")[1])
        first.wait_for("ready ")
        children = [p for p in processes_mentioning(namespace) if p != first.proc.pid]
        assert len(children) == 3  # a dispatcher and two workers
        helpers = [p for p in children_of(first.proc.pid) if p not in children]
        assert helpers == [zygote]  # (the fork server: nothing of multiprocessing's)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
        wait_until(lambda: processes_mentioning(namespace) == [], 10)
        wait_until(lambda: not any(runs(p) for p in helpers), 10)
        assert (paths.SHM_DIR / paths.segment_name(namespace)).exists()  # stale
    finally:
        first.close()
    with running_pool(namespace, "--workers", "2"), Client(namespace) as client:
        assert client.submit(sample_tasks.square, 7).result(timeout=30) == 49
    assert not (paths.SHM_DIR / paths.segment_name(namespace)).exists()
    assert not paths.namespace_dir(namespace, create=False).exists()


def test_dispatcher_killed_midway_is_restarted_and_clients_reconnect(
    namespace: str,
) -> None:
    """SIGKILL the dispatcher while a client's map runs: the supervisor
    restarts it, the client reconnects and sends its unanswered tasks again,
    and every result arrives, right and in order."""
    with running_pool(namespace, "--workers", "3") as pool, Client(namespace) as client:
        started = [s for s in pool.lines.seen if s.startswith("dispatcher-started ")]
        dispatcher = int(started[0].split("pid=")[1])
        results = client.map(sample_tasks.work, range(600), timeout=120)
        first = next(results)
        os.kill(dispatcher, signal.SIGKILL)
        assert [first, *results] == [x * x for x in range(600)]
        pool.lines.wait_counts({"dispatcher-exited ": 1, "dispatcher-started ": 1}, 30)
        assert client.submit(sample_tasks.square, 5).result(timeout=30) == 25


def test_worker_killed_while_the_pool_starts_is_retried(namespace: str) -> None:
    """A worker killed as soon as it registers, before the supervisor has its
    ready line, is started again: `pool up` does not give up."""
    pool = RunningPool(namespace, "--workers", "2")
    try:
        line = pool.wait_for("worker-added ", 30)
        os.kill(int(line.split("pid=")[1].split()[0]), signal.SIGKILL)
        pool.wait_for("ready ", 60)
        with Client(namespace) as client:
            assert client.submit(sample_tasks.square, 8).result(timeout=30) == 64
    finally:
        pool.close()


@pytest.mark.timeout(120)
def test_children_start_cleanly_in_a_program_that_imported_grpc_first() -> None:
    """An embedded pool in a program that imported grpc before pool (so gRPC
    registered its fork handlers) replaces 64 killed workers, and no child
    crashes between its start and its exec.

    Regression: children spawned through the event loop's fork ran gRPC's
    fork handlers and some died of SIGSEGV before they could exec."""
    run = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-m", "tests.support.grpc_first"],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "Fatal Python error" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 0 and run.stdout.strip() == "replaced 64", run.stderr
