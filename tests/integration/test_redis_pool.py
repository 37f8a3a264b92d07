"""A pool whose workers register in Redis (`pool up --discovery`), with
workers of other "hosts" (other loopback addresses) joining it over TCP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
import redis

from discovery import list_workers
from pool import Client
from tests import sample_tasks
from tests.helpers import ROOT, LineReader, wait_until
from tests.pools import pool_command, processes_mentioning, running_pool
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@contextmanager
def remote_worker(namespace: str, url: str, host: str, *options: str) -> Iterator[int]:
    """A worker started by hand, as on another host: TCP on ``host``,
    registered in Redis, with the tag "remote". Its pid."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "workers", "--namespace", namespace),
            *("--discovery", url, "--host", host, "--tags", "remote", *options),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        LineReader(proc.stdout).wait_for("READY ", 30)
        yield proc.pid
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()


def test_a_pool_on_redis_runs_tasks_on_workers_of_other_hosts(
    namespace: str, redis_server: RedisServer
) -> None:
    """Workers register in Redis, not in shared memory; two more on
    127.0.0.2 and 127.0.0.3 join and take tagged tasks; one of them
    SIGKILLed mid-map drops when its lease runs out (3 s), `pool up` shows
    it, and every task still finishes, on the other."""
    url = redis_server.url
    store = redis.Redis(port=redis_server.port)
    try:
        with running_pool(namespace, "--workers", "1", "--discovery", url) as pool:
            assert list_workers(namespace) == []  # not in shared memory
            assert store.hlen(f"shmp:{{{namespace}}}:workers") == 1
            with (
                remote_worker(namespace, url, "127.0.0.2") as second,
                remote_worker(namespace, url, "127.0.0.3") as third,
                Client(namespace, tags=("remote",)) as client,
            ):
                pool.lines.wait_counts({"worker-added ": 2}, 30)  # (the 2 joining)
                pids = set(client.map(sample_tasks.pid_after, [0.2] * 8))
                assert pids == {second, third}
                busy = client.map(sample_tasks.pid_after, [0.05] * 60, chunksize=1)
                first = next(busy)
                os.kill(second, signal.SIGKILL)
                rest = [first, *busy]
                assert len(rest) == 60 and set(rest) <= {second, third}
                assert rest[-1] == third
                dropped = pool.wait_for("worker-dropped ", 30)
                assert f"pid={second} " in dropped
    finally:
        store.close()


def _self_signed(directory: Path, ip: str) -> tuple[Path, Path]:
    """A certificate for ``ip`` (its own CA) and its key, made by openssl."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes"),
            *("-keyout", str(key), "-out", str(cert), "-days", "1"),
            *("-subj", f"/CN={ip}", "-addext", f"subjectAltName=IP:{ip}"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def test_a_worker_on_another_host_can_serve_tls(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A worker with --tls-cert/--tls-key on 127.0.0.2, and a pool whose
    dispatcher trusts its CA (--tls-ca): tasks run there; the worker does
    not speak plain text."""
    cert, key = _self_signed(tmp_path, "127.0.0.2")
    url = redis_server.url
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    with running_pool(
        namespace, "--workers", "1", "--discovery", url, "--tls-ca", str(cert)
    ) as pool:
        with (
            remote_worker(namespace, url, "127.0.0.2", *tls) as remote,
            Client(namespace, tags=("remote",)) as client,
        ):
            added = pool.wait_for("worker-added ", 30)
            address = added.split("address=")[1].split()[0]
            assert client.submit(sample_tasks.pid_after, 0.0).result(30) == remote
            plain = grpc.insecure_channel(address)
            try:
                with pytest.raises(grpc.FutureTimeoutError):
                    grpc.channel_ready_future(plain).result(timeout=2)
            finally:
                plain.close()


def test_an_unreachable_registry_is_one_line(namespace: str) -> None:
    """No Redis where --discovery points: one line, exit 1, nothing started."""
    done = pool_command("up", "-n", namespace, "--discovery", "redis://127.0.0.1:1")
    assert done.returncode == 1
    assert done.stderr.startswith(
        "pool: error: cannot reach the registry at redis://127.0.0.1:1: "
    )
    assert done.stderr.count("\n") == 1
    assert processes_mentioning(namespace) == []


def test_a_redis_restart_mid_run_loses_no_task(
    namespace: str, redis_server: RedisServer
) -> None:
    """Redis stops while a map runs and starts again with its data lost;
    tasks are submitted while it is down, and a worker of another host is
    SIGKILLed meanwhile. Every task completes; the pool's workers are put
    back in Redis; `pool up` shows one drop, the dead worker's, and no
    other drop or second add (a restart is not a death)."""
    url = redis_server.url
    store = redis.Redis(port=redis_server.port)
    try:
        with running_pool(namespace, "--workers", "2", "--discovery", url) as pool:
            with (
                remote_worker(namespace, url, "127.0.0.2") as doomed,
                Client(namespace) as client,
            ):
                pool.wait_for("worker-added ")  # (the remote one)
                busy = client.map(sample_tasks.pid_after, [0.02] * 100, chunksize=1)
                first = next(busy)
                redis_server.stop()
                os.kill(doomed, signal.SIGKILL)
                during = [client.submit(sample_tasks.pid_after, 0.0) for _ in range(20)]
                redis_server.start()
                assert len([first, *busy]) == 100
                assert all(isinstance(f.result(30), int) for f in during)
                dropped = pool.wait_for("worker-dropped ", 30)
                assert f"pid={doomed} " in dropped
                assert (
                    sum(line.startswith("worker-dropped ") for line in pool.lines.seen)
                    == 1
                )
                assert (
                    sum(line.startswith("worker-added ") for line in pool.lines.seen)
                    == 3
                )
                wait_until(lambda: store.hlen(f"shmp:{{{namespace}}}:workers") == 2)
                assert client.submit(sample_tasks.pid_after, 0.0).result(30) != doomed
    finally:
        store.close()
