"""Who can reach a running pool: its files are private, its sockets sit in
the 0700 directory, TCP binds loopback unless told otherwise and still needs
the token, and another user can do nothing to it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from discovery import Publisher, list_workers, paths
from pool import Client
from pool.client.rendezvous import locate
from pool.dispatcher_pb2 import ListWorkersRequest
from pool.dispatcher_pb2_grpc import DispatcherStub
from tests.support import sample_tasks
from tests.support.pools import running_pool
from tests.support.streams import make_info
from workers.common.serving import is_loopback
from workers.protocol import auth
from workers.protocol.worker_pb2 import TaskBatch
from workers.protocol.worker_pb2_grpc import WorkerStub

pytestmark = pytest.mark.integration

NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.timeout(60)
def test_files_and_sockets_are_private(namespace: str) -> None:
    """The runtime and namespace directories are 0700, the token is 32 random
    bytes in a 0600 file, the segment is 0600, and every unix socket lives
    inside the namespace's directory."""
    with running_pool(namespace, "--workers", "2"):
        directory = paths.namespace_dir(namespace, create=False)
        assert _mode(directory.parent) == _mode(directory) == 0o700
        token_file = directory / auth.TOKEN_FILE
        assert _mode(token_file) == 0o600
        token = token_file.read_text()
        assert len(bytes.fromhex(token)) == 32
        assert _mode(paths.SHM_DIR / paths.segment_name(namespace)) == 0o600
        address, _ = locate(namespace)
        addresses = [address, *(w.address for w in list_workers(namespace))]
        assert len(addresses) == 3
        for target in addresses:
            assert target.startswith("unix:")
            path = Path(target.removeprefix("unix:"))
            assert path.parent == directory and stat.S_ISSOCK(os.lstat(path).st_mode)
            assert os.lstat(path).st_uid == os.geteuid()


@pytest.mark.timeout(60)
def test_tcp_binds_loopback_and_still_needs_the_token(namespace: str) -> None:
    """`pool up --host` listens on 127.0.0.1 only; a call there with no
    token, or one that is almost right, is UNAUTHENTICATED; the right one
    works."""
    with running_pool(namespace, "--workers", "1", "--host"):
        address, token = locate(namespace)
        worker = list_workers(namespace)[0].address
        for target in (address, worker):
            host = target.rsplit(":", 1)[0]
            assert host == "127.0.0.1" and is_loopback(host)
        near_misses = [
            (),
            auth.call_metadata(""),
            auth.call_metadata(token[:-1]),
            auth.call_metadata(token[:-1] + ("0" if token[-1] != "0" else "1")),
            auth.call_metadata(token + "0"),
            auth.call_metadata(token.upper()),
            (("authorization", token),),  # without "Bearer "
        ]
        with grpc.insecure_channel(address) as channel:
            dispatcher = DispatcherStub(channel)  # type: ignore[no-untyped-call]
            for metadata in near_misses:
                with pytest.raises(grpc.RpcError) as refused:
                    dispatcher.ListWorkers(
                        ListWorkersRequest(), metadata=metadata, timeout=10
                    )
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            reply = dispatcher.ListWorkers(
                ListWorkersRequest(), metadata=auth.call_metadata(token), timeout=10
            )
            assert len(reply.workers) == 1
        with grpc.insecure_channel(worker) as channel:
            run = WorkerStub(channel).Run  # type: ignore[no-untyped-call]
            for metadata in near_misses:
                with pytest.raises(grpc.RpcError) as refused:
                    list(run(iter([TaskBatch()]), metadata=metadata, timeout=10))
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with Client(namespace) as client:
            assert client.submit(sample_tasks.square, 9).result(timeout=30) == 81


def test_loopback_is_recognised() -> None:
    """Only names of this machine count as loopback."""
    assert all(
        map(is_loopback, ["127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost"])
    )
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.com", ""]))


def _as_user(uid: int, attempts: dict[str, Callable[[], object]]) -> dict[str, str]:
    """Run each attempt in a child that has become ``uid``; what each raised
    (its class name) or "ok"."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        outcome: dict[str, str] = {}
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            for name, attempt in attempts.items():
                try:
                    attempt()
                    outcome[name] = "ok"
                except Exception as exc:
                    outcome[name] = type(exc).__name__
            os.write(write, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_another_user_can_neither_connect_read_nor_publish(
    namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unprivileged user (nobody) cannot list the pool's directory, read
    its token, connect to its sockets, open its segment, signal its
    processes or publish into its namespace; the pool is untouched."""
    with running_pool(namespace, "--workers", "1"):
        directory = paths.namespace_dir(namespace, create=False)
        address, _ = locate(namespace)
        worker = list_workers(namespace)[0]
        segment = paths.SHM_DIR / paths.segment_name(namespace)
        before = segment.read_bytes()

        def connect(target: str) -> None:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(target.removeprefix("unix:"))

        async def publish() -> None:
            async with Publisher(namespace) as publisher:
                await publisher.publish("worker-added", make_info())

        attempts: dict[str, Callable[[], object]] = {
            "list": lambda: os.listdir(directory),
            "token": lambda: (directory / auth.TOKEN_FILE).read_bytes(),
            "dispatcher": lambda: connect(address),
            "worker": lambda: connect(worker.address),
            "segment": lambda: os.open(segment, os.O_RDONLY),
            "signal": lambda: os.kill(worker.pid, 0),
            "publish": lambda: asyncio.run(publish()),
        }
        home = tempfile.mkdtemp(prefix="shmp-nobody-")  # its own runtime dir
        try:
            os.chown(home, NOBODY, NOBODY)
            monkeypatch.setenv("XDG_RUNTIME_DIR", home)
            outcome = _as_user(NOBODY, attempts)
        finally:
            monkeypatch.undo()
            shutil.rmtree(home)
        assert outcome == {
            "list": "PermissionError",
            "token": "PermissionError",
            "dispatcher": "PermissionError",
            "worker": "PermissionError",
            "segment": "PermissionError",
            "signal": "PermissionError",
            "publish": "NamespaceNotFound",  # its namespaces are its own
        }
        assert segment.read_bytes() == before
        assert list_workers(namespace) == [worker]
        with Client(namespace) as client:
            assert client.submit(sample_tasks.square, 4).result(timeout=30) == 16
