"""Arguments and results near and over what a message carries (gRPC's
128 MiB), against a real pool on this machine: they travel through shared
memory, so none is refused, and any number of large tasks pass, however
many are written at once."""

from __future__ import annotations

import os

import pytest

from pool import Client
from tests.support.helpers import DEADLINE_S
from tests.support.pools import running_pool

pytestmark = pytest.mark.integration

MIB = 2**20


@pytest.mark.timeout(120)
def test_arguments_over_a_message_pass_through_shared_memory(namespace: str) -> None:
    """200 MiB of arguments (a ``bytes``: a pickle with no buffer to lend,
    so the pickle itself goes into shared memory) reach the worker whole;
    the next task of the same client runs."""
    with running_pool(namespace, "--workers", "1"):
        with Client(namespace) as client:
            blob = b"x" * (200 * MIB)
            future = client.submit(len, blob)
            assert future.result(timeout=DEADLINE_S) == 200 * MIB
            assert client.submit(len, b"x" * 10).result(timeout=DEADLINE_S) == 10


@pytest.mark.timeout(180)
def test_large_arguments_and_results_written_together_all_arrive(
    namespace: str,
) -> None:
    """Four tasks of 50 MiB each go out together (200 MiB, over one
    message), and four results of 40 MiB come back together: every one
    arrives."""
    with running_pool(namespace, "--workers", "2"):
        with Client(namespace) as client:
            blobs = [bytes([i]) * (50 * MIB) for i in range(4)]
            sizes = [client.submit(len, blob) for blob in blobs]
            del blobs
            assert [f.result(timeout=DEADLINE_S * 2) for f in sizes] == [50 * MIB] * 4
            made = [client.submit(bytes, 40 * MIB) for _ in range(4)]
            for future in made:
                assert len(future.result(timeout=DEADLINE_S * 2)) == 40 * MIB
                del future


@pytest.mark.timeout(120)
def test_a_result_over_a_message_arrives_and_the_worker_stays(
    namespace: str,
) -> None:
    """A task returns 100 MiB: it arrives whole, through shared memory; the
    same worker runs the next task."""
    with running_pool(namespace, "--workers", "1"):
        with Client(namespace) as client:
            pid = client.submit(os.getpid).result(timeout=DEADLINE_S)
            value = client.submit(bytes, 100 * MIB).result(timeout=DEADLINE_S)
            assert value == bytes(100 * MIB)
            assert client.submit(os.getpid).result(timeout=DEADLINE_S) == pid
