"""docker-compose.yml, tested without a container engine: the file is valid
(`docker-compose config`), and its topology runs as local processes, each
service's command and environment taken from the file with loopback
addresses for the service names, and tasks go through it."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import yaml

from pool import Client
from tests.support import sample_tasks
from tests.support.helpers import ROOT, LineReader, children_of, wait_until
from tests.support.pools import http_get
from tests.support.redis_server import RedisServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

COMPOSE = ROOT / "docker-compose.yml"
SINGLE_HOST = ROOT / "docker-compose.single-host.yml"
WORKERS = 2  # --scale worker=2


def _services(compose: Path = COMPOSE) -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(compose.read_text())["services"]
    return services


@pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (.ci/run installs Debian's)",
)
@pytest.mark.parametrize("compose", [COMPOSE, SINGLE_HOST], ids=lambda p: p.name)
def test_the_compose_file_is_valid(compose: Path, tmp_path: Path) -> None:
    shutil.copy(compose, tmp_path / compose.name)
    shutil.copy(ROOT / "Dockerfile", tmp_path / "Dockerfile")
    (tmp_path / "token").write_text(secrets.token_hex(32))
    (tmp_path / "token").chmod(0o600)
    (tmp_path / "tasks").mkdir()
    done = subprocess.run(
        ["docker-compose", "-f", compose.name, "config", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def _local(command: list[str], names: dict[str, str]) -> list[str]:
    """A service's command as a local process: our interpreter, and each
    service name and container path replaced by its local stand-in."""
    argv = []
    for arg in command:
        for name, local in names.items():
            arg = arg.replace(name, local)
        argv.append(arg)
    if argv[0] == "pool":
        return [sys.executable, "-m", "pool", *argv[1:]]
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    return argv


@contextmanager
def _service(argv: list[str], environment: dict[str, str]) -> Iterator[LineReader]:
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **environment},
    )
    try:
        yield LineReader(proc.stdout)
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def test_the_compose_topology_runs_tasks(
    namespace: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """redis (a real server), the two dispatchers (each in a runtime
    directory of its own, as in a container) and two workers, as the file
    says; a client that finds a dispatcher through Redis, as the file's
    header says, submits through it and the workers run it; once the first
    dispatcher stops, clients go through the second."""
    services = _services()
    assert set(services) == {"redis", "dispatcher", "dispatcher-2", "worker"}
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    key = tmp_path / "dashboard-key"
    key.write_text(secrets.token_hex(32))
    key.chmod(0o600)
    port, second_port = free_port(), free_port()
    names = {
        "redis://redis:6379": redis_server.url,
        "/run/secrets/pool_token": str(token),
        "/run/secrets/dashboard_key": str(key),
        "--namespace=default": f"--namespace={namespace}",
        "--port=7070": f"--port={port}",
        "localhost:7070": f"127.0.0.1:{port}",
        "--port=7071": f"--port={second_port}",
        "localhost:7071": f"127.0.0.1:{second_port}",
        "--dashboard=0.0.0.0:8787": "--dashboard=0.0.0.0:0",
        "--dashboard=0.0.0.0:8788": "--dashboard=0.0.0.0:0",
    }

    def dispatcher_service(name: str) -> AbstractContextManager[LineReader]:
        runtime = tmp_path / name  # (a container's own file system)
        runtime.mkdir(mode=0o700)
        environment = services[name].get("environment", {})
        return _service(
            _local(services[name]["command"], names),
            {**environment, "XDG_RUNTIME_DIR": str(runtime)},
        )

    with ExitStack() as stack:
        first = ExitStack()
        dispatcher = first.enter_context(dispatcher_service("dispatcher"))
        stack.enter_context(first)
        ready = dispatcher.wait_for("ready ", 30)
        second = stack.enter_context(dispatcher_service("dispatcher-2"))
        second.wait_for("ready ", 30)
        for _ in range(WORKERS):
            stack.enter_context(
                _service(
                    _local(services["worker"]["command"], names),
                    services["worker"].get("environment", {}),
                )
            )
        dispatcher.wait_counts({"worker-added ": WORKERS}, 30)
        # A client of the machine the ports are published on, as the header says.
        remote = Client(
            namespace, discovery_url=redis_server.url, token_file=str(token)
        )
        with remote as client:
            assert list(client.map(sample_tasks.square, range(200))) == [
                x * x for x in range(200)
            ]
            pids = set(client.map(sample_tasks.pid_after, [0.2] * 8))
            assert len(pids) == WORKERS
        # Its dashboard, on all addresses, asks for its key (not the token).
        page = ready.split("dashboard=")[1].split()[0].replace("0.0.0.0", "127.0.0.1")
        assert http_get(page + "metrics")[0] == 401
        bearer = {"Authorization": f"Bearer {token.read_text()}"}
        assert http_get(page + "metrics", bearer)[0] == 401
        bearer = {"Authorization": f"Bearer {key.read_text()}"}
        metrics = http_get(page + "metrics", bearer)[2]
        assert f'shmpool_workers{{status="ready"}} {WORKERS}.0' in metrics
        first.close()  # `docker compose stop dispatcher`
        for _ in range(3):
            with Client(
                namespace, discovery_url=redis_server.url, token_file=str(token)
            ) as client:
                assert client.submit(sample_tasks.square, 7).result(30) == 49


@contextmanager
def _container(argv: list[str]) -> Iterator[int]:
    """``argv`` as pid 1 of a pid namespace of its own; stopped as `docker
    stop` does, with SIGTERM to it (unshare ignores SIGTERM), then SIGKILL.
    Its pid outside."""
    unshare = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        wait_until(lambda: bool(children_of(unshare.pid)) or unshare.poll() is not None)
        inside = children_of(unshare.pid)
        yield inside[0] if inside else -1
    finally:
        for pid in children_of(unshare.pid) if unshare.poll() is None else []:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        try:
            unshare.wait(60)
        except subprocess.TimeoutExpired:
            unshare.kill()  # (--kill-child: its child goes with it)
            unshare.wait()


def _pid_namespaces_allowed() -> bool:
    """Whether this process may start one in a pid namespace of its own."""
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--pid", "--fork", "--kill-child", "true"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(
    not _pid_namespaces_allowed(),
    reason="needs `unshare --pid` (root) to give each worker its own pids",
)
def test_the_single_host_topology_tells_deaths_by_lock_files(namespace: str) -> None:
    """The single-host file's services as local processes sharing this
    machine's /dev/shm (the shared IPC namespace) and one runtime directory
    (the shared volume), each worker in a pid namespace of its own, as in a
    container, so its published pid (1) means nothing to the dispatcher.
    Tasks run on both workers; one SIGKILLed is dropped (told by its lock
    file) and the tasks go on, on the other."""
    services = _services(SINGLE_HOST)
    assert set(services) == {"dispatcher", "worker"}
    assert services["worker"]["ipc"] == "service:dispatcher"
    names = {"--namespace=default": f"--namespace={namespace}"}
    with ExitStack() as stack:
        dispatcher = stack.enter_context(
            _service(_local(services["dispatcher"]["command"], names), {})
        )
        dispatcher.wait_for("ready ", 30)
        for _ in range(WORKERS):
            argv = _local(services["worker"]["command"], names)
            stack.enter_context(_container(argv))
        added = dispatcher.wait_counts({"worker-added ": WORKERS}, 30)
        assert all(" pid=1 " in line for line in added if "worker-added" in line)
        with Client(namespace) as client:
            pids = set(client.map(sample_tasks.host_pid_after, [0.2] * 8))
            assert len(pids) == WORKERS
            busy = client.map(sample_tasks.host_pid_after, [0.05] * 60, chunksize=1)
            first = next(busy)
            victim = sorted(pids)[0]
            os.kill(victim, signal.SIGKILL)
            rest = [first, *busy]
            assert len(rest) == 60 and set(rest) <= pids
            assert rest[-1] != victim
            dispatcher.wait_for("worker-dropped ", 30)
            after = set(client.map(sample_tasks.host_pid_after, [0.0] * 8))
            assert after == pids - {victim}
