"""No submitted task is lost when workers die under it."""

from __future__ import annotations

import os
import random
import signal
import threading

import pytest

from discovery import list_workers
from pool import Pool, WorkerLost
from tests import sample_tasks

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
        assert all(w.startswith("worker pid ") for w in lost.value.workers)
        assert client.submit(sample_tasks.square, 6).result(timeout=60) == 36
