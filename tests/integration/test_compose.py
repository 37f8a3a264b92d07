"""docker-compose.yml, tested without a container engine: the file is valid
(`docker-compose config`), and its topology runs as local processes, each
service's command and environment taken from the file with loopback
addresses for the service names, and tasks go through it."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from pool import Client
from tests import sample_tasks
from tests.helpers import ROOT, LineReader
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

COMPOSE = ROOT / "docker-compose.yml"
WORKERS = 2  # --scale worker=2


def _services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


@pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (.ci/run installs Debian's)",
)
def test_the_compose_file_is_valid(tmp_path: Path) -> None:
    shutil.copy(COMPOSE, tmp_path / COMPOSE.name)
    shutil.copy(ROOT / "Dockerfile", tmp_path / "Dockerfile")
    (tmp_path / "token").write_text(secrets.token_hex(32))
    (tmp_path / "tasks").mkdir()
    done = subprocess.run(
        ["docker-compose", "config", "-q"],
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
    """redis (a real server), the dispatcher and two workers, as the file
    says; a client submits through the dispatcher and the workers run it."""
    services = _services()
    assert set(services) == {"redis", "dispatcher", "worker"}
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    names = {
        "redis://redis:6379": redis_server.url,
        "/run/secrets/pool_token": str(token),
        "--namespace=default": f"--namespace={namespace}",
    }
    with ExitStack() as stack:
        dispatcher = stack.enter_context(
            _service(
                _local(services["dispatcher"]["command"], names),
                services["dispatcher"].get("environment", {}),
            )
        )
        dispatcher.wait_for("ready ", 30)
        for _ in range(WORKERS):
            stack.enter_context(
                _service(
                    _local(services["worker"]["command"], names),
                    services["worker"].get("environment", {}),
                )
            )
        dispatcher.wait_counts({"worker-added ": WORKERS}, 30)
        with Client(namespace) as client:
            assert list(client.map(sample_tasks.square, range(200))) == [
                x * x for x in range(200)
            ]
            pids = set(client.map(sample_tasks.pid_after, [0.2] * 8))
            assert len(pids) == WORKERS
