"""Leaks under churn: start a pool, kill random parts of it, start again.

CI runs a few cycles; the full soak is ``SHMP_SOAK_CYCLES=200 python -m pytest
-s -o faulthandler_timeout=0 tests/integration/test_soak.py`` (about 4
minutes here; ``SHMP_SOAK_SEED`` replays a run).
"""

from __future__ import annotations

import os
import random
import re
import signal
from collections import Counter
from contextlib import suppress
from pathlib import Path

import pytest

from discovery import list_workers, paths
from pool import Client
from tests.support import sample_tasks
from tests.support.helpers import Agent, agent, wait_until
from tests.support.pools import RunningPool, processes_mentioning

CYCLES = int(os.environ.get("SHMP_SOAK_CYCLES", "6"))
SEED = int(os.environ.get("SHMP_SOAK_SEED", random.randrange(1 << 32)))
VICTIMS = ["worker", "workers", "dispatcher", "supervisor", "everything", "nothing"]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _fds(pid: int) -> list[str]:
    """What the process's open descriptors lead to (pipes and sockets by
    kind only)."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with suppress(OSError):
            found.append(re.sub(r":\[\d+\]$", "", os.readlink(f"/proc/{pid}/fd/{fd}")))
    return sorted(found)


def _clean_pool(namespace: str, subscriber: Agent | None = None) -> None:
    """Start a pool (reclaiming whatever a dead one left) and drain it, once
    ``subscriber`` (if given) has seen its worker: a worker whose whole life
    falls between two of a subscriber's looks is not reported at all."""
    pool = RunningPool(namespace, "--workers", "1")
    try:
        pool.wait_for("ready ")
        if subscriber is not None:
            _until_added(subscriber, {str(w.uid) for w in list_workers(namespace)})
        assert pool.stop(signal.SIGINT) == 0
    finally:
        pool.close()
    wait_until(lambda: not paths.namespace_dir(namespace, create=False).exists())


def _kill(pool: RunningPool, victim: str, rng: random.Random) -> None:
    """SIGKILL ``victim``: a part of the running pool."""
    workers = [w.pid for w in list_workers(pool.namespace)]
    pids = {
        "worker": [rng.choice(workers)],
        "workers": workers,
        "dispatcher": [pool.dispatcher_pid()],
        "supervisor": [pool.proc.pid],
        "everything": [pool.proc.pid, pool.dispatcher_pid(), *workers],
        "nothing": [],
    }[victim]
    for pid in pids:
        # (A worker may be gone already: it exits once its supervisor dies.)
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _until_added(subscriber: Agent, uids: set[str]) -> None:
    """Read the subscriber's events until it has reported each of ``uids``."""
    while uids:
        event = subscriber.expect("event", timeout_s=15)
        if event["type"] == "worker-added":
            uids.discard(event["uid"])


def _until_dropped(subscriber: Agent) -> None:
    """Read the subscriber's events until one worker was added and dropped."""
    while subscriber.expect("event", timeout_s=15)["type"] != "worker-dropped":
        pass


def _cycle(namespace: str, subscriber: Agent, rng: random.Random) -> tuple[str, int]:
    """One pool's life: start, serve, lose a random part, stop or be gone.
    What it lost, and its supervisor's pid."""
    pool = RunningPool(namespace, "--workers", "2")
    try:
        pool.wait_for("ready ")
        _until_added(subscriber, {str(w.uid) for w in list_workers(namespace)})
        if rng.random() < 0.5:
            with Client(namespace) as client:
                assert client.submit(sample_tasks.square, 6).result(timeout=30) == 36
        victim = rng.choice(VICTIMS)
        _kill(pool, victim, rng)
        if victim in {"supervisor", "everything"}:
            assert pool.proc.wait(10) == -signal.SIGKILL
        elif rng.random() < 0.5:
            assert pool.stop(signal.SIGINT) == 0  # drain what is left
        else:
            pool.stop(signal.SIGKILL)
        others = {pool.proc.pid, subscriber.pid}
        wait_until(lambda: not set(processes_mentioning(namespace)) - others, 15)
        return victim, pool.proc.pid
    finally:
        pool.close()


@pytest.mark.timeout(60 + 25 * CYCLES)
def test_soak_start_kill_restart_leaves_nothing(namespace: str) -> None:
    """CYCLES pools in one namespace, each losing a random part (workers, the
    dispatcher, the supervisor) by SIGKILL: each new pool reclaims what the
    last one left, a long-lived subscriber follows them all with no growth
    in its descriptors or mappings, and at the end nothing is left at all.

    Regression: a subscriber stayed on a dead pool's segment after a new
    pool reclaimed the namespace, and never saw the new pool's workers."""
    rng = random.Random(SEED)
    print(f"soak: {CYCLES} cycles, SHMP_SOAK_SEED={SEED}")
    with agent("subscribe", namespace, "0.2") as subscriber:
        subscriber.expect("ready")
        _clean_pool(namespace, subscriber)  # followed a pool's whole life
        _until_dropped(subscriber)
        fds_before = _fds(subscriber.pid)
        cycles = [_cycle(namespace, subscriber, rng) for _ in range(CYCLES)]
        _clean_pool(namespace)  # reclaims what the last one left
        with suppress(TimeoutError):
            wait_until(lambda: len(_fds(subscriber.pid)) <= len(fds_before), 5)
        fds_after = _fds(subscriber.pid)
        # No growth. (Fewer is no leak: a subscriber that found no inotify
        # instance free at its last wait polls instead, with no watch open.)
        grown = Counter(fds_after) - Counter(fds_before)
        assert not grown, f"before {fds_before}, after {fds_after}"
        maps = Path(f"/proc/{subscriber.pid}/maps").read_text()
        assert "/dev/shm/shmp-" not in maps  # no segment still mapped
        assert processes_mentioning(namespace) == [subscriber.pid]
    print(f"soak: killed {', '.join(victim for victim, _ in cycles)}")
    # Only what this test made: other pools may run on the machine meanwhile.
    assert not (paths.SHM_DIR / paths.segment_name(namespace)).exists()
    assert not paths.namespace_dir(namespace, create=False).exists()
