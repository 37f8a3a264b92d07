"""Nothing of the data plane leaks, whoever dies: a client killed while it
writes, a worker killed while it reads an argument or writes a result, the
dispatcher killed with large tasks in flight, the supervisor killed. Every
task that can finish finishes once with its value, a running pool reclaims
a dead process's segments, and a stopped one leaves none. Each kill is
repeated 20 times."""

from __future__ import annotations

import functools
import os
import random
import signal
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from discovery import paths
from pool import Client, PoolNotRunning
from tests.support import data_tasks
from tests.support.helpers import DEADLINE_S, python_module, wait_until
from tests.support.pools import none_registered, pool_command, running_pool
from workers.protocol import owners, segments

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROUNDS = 20
MIB = 2**20


def _data_names(namespace: str) -> list[str]:
    """The namespace's data segments (locks aside) in /dev/shm."""
    key = paths.segment_name(namespace)
    return [n for n in owners.names(f"{key}.") if segments.SEGMENT_RE.fullmatch(n)]


def _foreign(namespace: str) -> list[str]:
    """The namespace's segments that their owner did not write: values
    written by workers, not yet taken over by their client. Once nothing
    runs, none is left; a client's own (its spares) stay until it closes."""
    found = [segments.SEGMENT_RE.fullmatch(n) for n in _data_names(namespace)]
    return [m[0] for m in found if m and m[2] != m[3]]


def _none_named(prefix: str) -> bool:
    return not list(owners.names(prefix))


def _writing_or_done(namespace: str, future: Future[object]) -> bool:
    """Whether a segment of the namespace is being written (a new one, or a
    spare lent for the value), or the task is done."""
    unfinished = any(not segments.finished(n) for n in _data_names(namespace))
    return unfinished or future.done()


def _any_running(futures: list[Future[Any]]) -> bool:
    return any(f.running() for f in futures)


@contextmanager
def _client(namespace: str) -> Iterator[Client]:
    with Client(namespace) as client:
        yield client
    assert not _data_names(namespace), "the client left segments behind"


def test_a_client_killed_while_it_writes_leaves_nothing(namespace: str) -> None:
    """A client SIGKILLed at a random point of its large submits: within a
    second or two the pool has reclaimed all of its segments and its lock,
    and it serves the next client."""
    rng = random.Random(1)
    with running_pool(namespace, "--workers", "2"):
        for _ in range(ROUNDS):
            sender = python_module("tests.support.data_client", namespace)
            assert sender.stdout is not None
            owner = sender.stdout.readline().split()[1]
            for _ in range(rng.randint(1, 4)):
                assert sender.stdout.readline().startswith("writing")
            sender.send_signal(signal.SIGKILL)
            sender.wait(DEADLINE_S)
            gone = f"{paths.segment_name(namespace)}.{owner}"
            wait_until(functools.partial(_none_named, gone), timeout_s=DEADLINE_S)
        with _client(namespace) as client:
            a = np.ones(MIB)
            assert client.submit(data_tasks.total, a).result(DEADLINE_S) == MIB


def test_a_worker_killed_while_it_reads_an_argument_costs_one_attempt(
    namespace: str, tmp_path: Path
) -> None:
    """A worker SIGKILLed while it maps a task's argument: the task runs
    again elsewhere and its value arrives, once; nothing is left but the
    client's own segments (its spares), which go when it closes."""
    with running_pool(namespace, "--workers", "2"), _client(namespace) as client:
        for round_ in range(ROUNDS):
            a = np.full(MIB, float(round_))
            started, gate = tmp_path / f"started-{round_}", tmp_path / f"gate-{round_}"
            future = client.submit(
                data_tasks.mapped_then_gated, str(started), str(gate), a
            )
            wait_until(started.exists)
            pid = int(started.read_text())
            started.unlink()
            os.kill(pid, signal.SIGKILL)
            wait_until(started.exists)  # the next attempt has mapped it too
            gate.touch()
            assert future.result(DEADLINE_S) == float(a.sum())
            assert not _foreign(namespace)


def test_a_worker_killed_while_it_writes_a_result_leaves_nothing_half_written(
    namespace: str, tmp_path: Path
) -> None:
    """A worker SIGKILLed while it writes a large result: the pool removes
    the half-written segment within a second or two, the task runs again,
    and its value arrives whole, once."""
    with running_pool(namespace, "--workers", "2"), _client(namespace) as client:
        for round_ in range(ROUNDS):
            pid_file = tmp_path / f"pid-{round_}"
            future = client.submit(data_tasks.pid_then_ones, str(pid_file), 32 * MIB)
            wait_until(pid_file.exists)
            pid = int(pid_file.read_text())
            writing = functools.partial(_writing_or_done, namespace, future)
            wait_until(writing)
            os.kill(pid, signal.SIGKILL)
            value = future.result(DEADLINE_S * 3)
            assert value.shape == (32 * MIB,) and value[0] == value[-1] == 1.0
            del value
            wait_until(lambda: not _foreign(namespace), timeout_s=DEADLINE_S)


def test_a_dispatcher_killed_with_20_large_tasks_in_flight_loses_none(
    namespace: str, tmp_path: Path
) -> None:
    """The dispatcher SIGKILLed while 20 tasks of large arguments wait in
    its workers: its replacement runs them again (the client sends them
    again), each value arrives once, and no segment is left once done."""
    with running_pool(namespace, "--workers", "2") as pool:
        with _client(namespace) as client:
            for round_ in range(ROUNDS):
                gate = tmp_path / f"gate-{round_}"
                arrays = [np.full(MIB // 4, float(i + round_)) for i in range(20)]
                futures = [
                    client.submit(data_tasks.sum_when, str(gate), a) for a in arrays
                ]
                wait_until(functools.partial(_any_running, futures))
                os.kill(pool.dispatcher_pid(), signal.SIGKILL)
                pool.lines.wait_counts(
                    {"dispatcher-exited ": 1, "dispatcher-started ": 1}, 30
                )
                gate.touch()
                sums = [f.result(DEADLINE_S * 3) for f in futures]
                assert sums == [float(a.sum()) for a in arrays]
                del arrays, futures
                wait_until(lambda: not _foreign(namespace), timeout_s=DEADLINE_S)


@pytest.mark.timeout(600)
def test_a_supervisor_killed_with_large_tasks_in_flight_leaves_nothing(
    namespace: str, tmp_path: Path
) -> None:
    """``pool up`` SIGKILLed while tasks of large results run: its processes
    end (a task they finish as they drain delivers its value, whole; the rest
    fail with PoolNotRunning), and once the client has closed and ``pool ls
    --clean`` has swept the dead pool, nothing of the namespace is left in
    /dev/shm."""
    for round_ in range(ROUNDS):
        gate = tmp_path / f"gate-{round_}"
        with running_pool(namespace, "--workers", "1") as pool:
            with Client(namespace) as client:
                futures = [
                    client.submit(data_tasks.ones_when, str(gate), MIB)
                    for _ in range(3)
                ]
                wait_until(functools.partial(_any_running, futures))
                pool.proc.send_signal(signal.SIGKILL)
                pool.proc.wait(DEADLINE_S)
                gate.touch()  # (the worker, draining, finishes what it runs)
                for future in futures:
                    with suppress(PoolNotRunning):
                        assert future.result(DEADLINE_S * 3).sum() == MIB
        wait_until(lambda: none_registered(namespace), timeout_s=DEADLINE_S)
        cleaned = pool_command("ls", "--clean")
        assert cleaned.returncode == 0, cleaned.stderr
        key = paths.segment_name(namespace)
        assert not list(owners.names(key)), list(owners.names(key))
