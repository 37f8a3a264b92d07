"""Running ``python -m pool`` for tests: start, read its lines, always stop."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from discovery import NamespaceNotFound, list_workers
from tests.support.helpers import DEADLINE_S, ROOT, LineReader


def pool_command(
    *args: str, timeout_s: float = DEADLINE_S, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run one ``python -m pool`` command to completion."""
    return subprocess.run(
        [sys.executable, "-m", "pool", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=cwd,
        env=_env(),
    )


def _env(runtime_dir: Path | None = None) -> dict[str, str]:
    """The environment of a ``python -m pool``, with ``runtime_dir`` as its
    machine's runtime directory if given (a "host" of its own)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if runtime_dir is not None:
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    return env


class RunningPool:
    """A ``python -m pool up`` process and the lines it prints."""

    def __init__(
        self,
        namespace: str,
        *args: str,
        cwd: Path = ROOT,
        runtime_dir: Path | None = None,
    ) -> None:
        self.namespace = namespace
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pool", "up", "--namespace", namespace, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=cwd,
            env=_env(runtime_dir),
        )
        assert self.proc.stdout is not None
        self.lines = LineReader(self.proc.stdout)
        self.ready_line = ""  # (running_pool waits for it)

    def wait_for(self, prefix: str, timeout_s: float = 30.0) -> str:
        """The next line starting with ``prefix`` (skipping others)."""
        return self.lines.wait_for(prefix, timeout_s)

    def dispatcher_pid(self) -> int:
        """The pid of its dispatcher (the last started, as its lines say)."""
        started = [s for s in self.lines.seen if s.startswith("dispatcher-started ")]
        return int(started[-1].split("pid=")[1])

    def stop(self, signum: int = signal.SIGINT, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        """Stop it (killing it if it will not stop) and close its pipes."""
        if self.proc.poll() is None:
            try:
                self.stop()
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def running_pool(
    namespace: str, *args: str, cwd: Path = ROOT, runtime_dir: Path | None = None
) -> Iterator[RunningPool]:
    """A pool that is ready on entry and stopped (or killed) on exit."""
    pool = RunningPool(namespace, *args, cwd=cwd, runtime_dir=runtime_dir)
    try:
        pool.ready_line = pool.wait_for("ready ")
        yield pool
    finally:
        pool.close()


@contextmanager
def watching(namespace: str) -> Iterator[LineReader]:
    """The lines of a `pool watch` of the namespace, stopped on exit."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "pool", "watch", "-n", namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=_env(),
    )
    try:
        yield LineReader(watch.stdout)
    finally:
        watch.kill()
        watch.wait()
        assert watch.stdout is not None
        watch.stdout.close()


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(entry.name))
    return found


def dashboard_url(pool: RunningPool) -> str:
    """The URL of the pool's dashboard, from its ready line."""
    found = re.search(r"dashboard=(\S+)", pool.ready_line)
    assert found, pool.ready_line
    return found.group(1)


def http_get(
    url: str,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, Any, str]:
    """Status, headers and body of a GET that follows no redirect (over TLS
    with ``context``, for an https URL)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(
        NoRedirect, urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(
            urllib.request.Request(url, headers=headers or {}), timeout=10
        ) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def metrics_of(url: str) -> dict[str, float]:
    """Each sample of ``/metrics`` by name and labels: ``name{k=v}``."""
    status, _, text = http_get(url + "metrics")
    assert status == 200, text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def self_signed(directory: Path, ip: str) -> tuple[Path, Path]:
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


def none_registered(namespace: str) -> bool:
    """No worker of ``namespace`` is registered. (A dead pool's registry
    may be gone: any pool that starts meanwhile reaps registries whose
    creator died, whatever runtime directory they ran in.)"""
    try:
        return not list_workers(namespace)
    except NamespaceNotFound:
        return True
