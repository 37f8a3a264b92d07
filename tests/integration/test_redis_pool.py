"""A pool whose workers register in Redis (`pool up --discovery`), with
workers of other "hosts" (other loopback addresses) joining it over TCP."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import grpc
import pytest
import redis

from discovery import list_workers, paths
from discovery.redis import registered
from pool import Client
from pool.client.rendezvous import locate
from tests.support import sample_tasks
from tests.support.helpers import ROOT, LineReader, python_module, wait_until
from tests.support.pools import (
    dashboard_url,
    http_get,
    metrics_of,
    pool_command,
    processes_mentioning,
    running_pool,
    self_signed,
)
from tests.support.redis_server import RedisServer
from workers.protocol import auth

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


# A remote worker's grace on SIGTERM, and how much longer its exit is waited
# for. A draining worker waits up to its grace for the fetch of each large
# value it holds for a client of another host, and a value nobody fetches
# (its task ran again elsewhere, as at least once allows, after its answer
# was lost) keeps it that long: its exit is waited for past its grace, so
# that only a worker that does not keep to its grace fails the test.
REMOTE_GRACE_S = 10
REMOTE_EXIT_MARGIN_S = 20


@contextmanager
def remote_worker(namespace: str, url: str, host: str, *options: str) -> Iterator[int]:
    """A worker started by hand, as on another host: TCP on ``host``,
    registered in Redis, with the tag "remote" and a grace of
    :data:`REMOTE_GRACE_S` (``options`` may set another). Its pid."""
    proc = python_module(
        *("workers", "--namespace", namespace, "--discovery", url),
        *("--host", host, "--tags", "remote", "--grace-s", str(REMOTE_GRACE_S)),
        *options,
    )
    try:
        LineReader(proc.stdout).wait_for("READY ", 30)
        yield proc.pid
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(REMOTE_GRACE_S + REMOTE_EXIT_MARGIN_S)
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


def test_a_hung_host_drops_and_its_tasks_finish_elsewhere(
    namespace: str, redis_server: RedisServer
) -> None:
    """A worker of another host SIGSTOPped mid-map (a hung host: its
    connections stay open, it answers nothing) drops once its lease runs
    out, and every task finishes, those it held on the other worker."""
    url = redis_server.url
    with running_pool(namespace, "--workers", "1", "--discovery", url) as pool:
        with (
            remote_worker(namespace, url, "127.0.0.2") as hung,
            remote_worker(namespace, url, "127.0.0.3") as other,
            Client(namespace, tags=("remote",)) as client,
        ):
            pool.lines.wait_counts({"worker-added ": 2}, 30)  # (the 2 joining)
            busy = client.map(sample_tasks.pid_after, [0.05] * 60, chunksize=1)
            first = next(busy)
            os.kill(hung, signal.SIGSTOP)
            try:
                rest = [first, *busy]
                dropped = pool.wait_for("worker-dropped ", 30)
            finally:
                os.kill(hung, signal.SIGCONT)  # (so that it can stop)
            assert len(rest) == 60 and set(rest) <= {hung, other}
            assert rest[-1] == other
            assert f"pid={hung} " in dropped


def test_a_worker_on_another_host_can_serve_tls(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A worker with --tls-cert/--tls-key on 127.0.0.2, and a pool whose
    dispatcher trusts its CA (--tls-ca): tasks run there; the worker does
    not speak plain text. Two more entries with the same tag, as anyone who
    can write to Redis could publish, are never sent a task (nor the
    token): a plain-text worker on 127.0.0.3, and a unix socket outside the
    pool's directory. `pool up` says why, once each."""
    cert, key = self_signed(tmp_path, "127.0.0.2")
    url = redis_server.url
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    with running_pool(
        namespace, "--workers", "1", "--discovery", url, "--tls-ca", str(cert)
    ) as pool:
        with (
            remote_worker(namespace, url, "127.0.0.2", *tls) as remote,
            remote_worker(namespace, url, "127.0.0.3"),
            _published(url, namespace, f"unix:{tmp_path}/elsewhere.sock"),
            Client(namespace, tags=("remote",)) as client,
        ):
            added = pool.wait_for("worker-added ", 30)
            address = added.split("address=")[1].split()[0]
            refusals = {
                line.split(" at ", 1)[1].split(":", 1)[0]: line.split(": ", 2)[2]
                for line in pool.lines.wait_counts({"[dispatcher ": 2}, 30)
                if line.startswith("[dispatcher ")
            }
            assert refusals == {
                "unix": f"its unix socket is outside the pool's directory "
                f"{paths.namespace_dir(namespace, create=False)}\n",
                "127.0.0.3": "it does not serve TLS, and the pool requires it "
                "(--tls-ca)\n",
            }
            pids = client.map(sample_tasks.pid_after, [0.0] * 8, chunksize=1)
            assert set(pids) == {remote}
            plain = grpc.insecure_channel(address)
            try:
                with pytest.raises(grpc.FutureTimeoutError):
                    grpc.channel_ready_future(plain).result(timeout=2)
            finally:
                plain.close()


@contextmanager
def _published(url: str, namespace: str, address: str) -> Iterator[None]:
    """A worker entry with the tag "remote" at ``address``, which nothing
    serves, published in Redis by a process of its own until exit."""
    agent = python_module(
        *("tests.support.redis_agent", url, namespace, "3", "1", address, "remote"),
        stdin=True,
    )
    try:
        LineReader(agent.stdout).wait_for("READY ", 30)
        yield
    finally:
        assert agent.stdin is not None and agent.stdout is not None
        agent.stdin.close()  # a clean exit: it drops its worker
        agent.wait(30)
        agent.stdout.close()


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


def test_a_client_of_another_machine_finds_the_pool_through_redis(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A pool on Redis with its dispatcher on TCP announces it there; from a
    "machine" with a runtime directory of its own, `pool submit`, `pool
    workers` and `pool watch` given --discovery reach it, with the token
    from a file; without the token it says how to give one; once the pool
    stops, nothing is announced. Without the token, or with another, it
    says how to give the right one."""
    url = redis_server.url
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": str(elsewhere)}
    env.pop(auth.TOKEN_ENV, None)

    def there(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pool", *args, "-n", namespace, "--discovery", url],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env=env,
        )

    options = ["--discovery", url, "--host", "127.0.0.1", "--token-file", str(token)]
    call = ["tests.support.sample_tasks:pid_after", "0"]
    with running_pool(namespace, "--workers", "2", *options):
        pids = {info.pid for info in registered(url, namespace)}
        assert len(pids) == 2
        done = there(
            "submit",
            "tests.support.sample_tasks:pid_after",
            "0",
            "--token-file",
            str(token),
        )
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) in pids
        listed = there("workers", "--token-file", str(token)).stdout.splitlines()
        assert sorted(line.split()[0] for line in listed) == [
            "dispatcher",
            "worker",
            "worker",
        ]
        assert {int(line.split("pid=")[1].split()[0]) for line in listed[:2]} == pids
        watched = there("watch", "--timeout-s", "3").stdout
        assert watched.count("worker-added ") == 2
        refused = (
            f"pool: error: the pool in namespace {namespace!r} refused this client:"
        )
        tokenless = there("submit", *call)
        assert tokenless.returncode == 1
        assert tokenless.stderr.startswith(f"{refused} this machine has no token")
        assert "--token-file PATH" in tokenless.stderr
        wrong = tmp_path / "wrong"
        wrong.write_text(secrets.token_hex(32))
        wrong.chmod(0o600)
        mistaken = there("submit", *call, "--token-file", str(wrong))
        assert mistaken.returncode == 1
        assert mistaken.stderr.startswith(f"{refused} it does not take our token")
        with Client(namespace, discovery_url=url, token_file=str(token)) as client:
            assert set(client.map(sample_tasks.pid_after, [0.0] * 8)) <= pids
    gone = there(
        "submit",
        "tests.support.sample_tasks:pid_after",
        "0",
        "--token-file",
        str(token),
    )
    assert gone.returncode == 1
    assert f"no dispatcher is announced in {url}" in gone.stderr


def test_the_dispatcher_can_serve_tls_to_clients_of_other_machines(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """`pool up --host 127.0.0.1 --tls-cert PEM --tls-key PEM --tls-ca PEM`:
    the port it announces in Redis serves TLS and refuses plain text; its
    worker serves TLS with the same certificate; a client of another machine
    given the CA runs tasks through it (and 20 MiB payloads each way, in
    chunks); this machine's clients reach the
    pool by its unix socket, as without --host. Half of it (a certificate
    without a CA) is a usage error."""
    cert, key = self_signed(tmp_path, "127.0.0.1")
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    url = redis_server.url
    tls = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(cert)]
    options = ["--discovery", url, "--token-file", str(token), "--host", "127.0.0.1"]
    store = redis.Redis(port=redis_server.port)
    try:
        with running_pool(namespace, "--workers", "1", *options, *tls):
            name = f"shmp:{{{namespace}}}:dispatchers"
            [only] = cast(list[bytes], store.hvals(name))  # before "ready"
            announced = json.loads(only)
            assert announced["tls"] is True
            assert announced["address"].startswith("127.0.0.1:")
            plain = grpc.insecure_channel(announced["address"])
            try:
                with pytest.raises(grpc.FutureTimeoutError):
                    grpc.channel_ready_future(plain).result(timeout=2)
            finally:
                plain.close()
            worker = registered(url, namespace)[0].pid
            remote = Client(
                namespace, discovery_url=url, token_file=str(token), tls_ca=str(cert)
            )
            with remote:
                assert remote.submit(sample_tasks.pid_after, 0.0).result(30) == worker
                # Large payloads cross in chunks, over TLS both hops.
                big = 20 * 2**20
                assert remote.submit(bytes, big).result(60) == bytes(big)
                assert remote.submit(len, b"z" * big).result(60) == big
            assert locate(namespace)[0].startswith("unix:")
            with Client(namespace) as local:
                assert local.submit(sample_tasks.pid_after, 0.0).result(30) == worker
            assert registered(url, namespace)[0].extra["tls"] == "1"
    finally:
        store.close()
    half = pool_command("up", "-n", namespace, "--host", "127.0.0.1", *tls[:4])
    assert half.returncode == 2
    assert half.stderr.startswith("pool: error: with --host, --tls-cert and --tls-ca")


def test_a_dashboard_on_redis_covers_the_workers_of_other_hosts(
    namespace: str, redis_server: RedisServer
) -> None:
    """With --discovery, the dashboard's page state and /metrics count the
    workers that joined from other hosts, and the tasks they ran."""
    url = redis_server.url
    up = ("--workers", "1", "--discovery", url, "--dashboard", "127.0.0.1:0")
    with running_pool(namespace, *up) as pool:
        page = dashboard_url(pool)
        with remote_worker(namespace, url, "127.0.0.2") as other:
            ready = "shmpool_workers{status=ready}"
            wait_until(lambda: metrics_of(page)[ready] == 2)
            state = json.loads(http_get(page + "api/state")[2])
            pids = {row["pid"] for row in state["workers"].values()}
            assert other in pids and len(pids) == 2
            with Client(namespace, tags=("remote",)) as client:
                done = client.map(sample_tasks.pid_after, [0] * 5, chunksize=1)
                assert set(done) == {other}
            ok = "shmpool_tasks_total{outcome=ok}"
            wait_until(lambda: metrics_of(page)[ok] == 5)
