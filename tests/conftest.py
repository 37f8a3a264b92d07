"""Shared fixtures: an isolated runtime directory, unique namespaces, and an
autouse check that each test leaves no segment (the registry's, or a data
segment or lock of its payloads), no runtime file and no child process
behind (cleaning up even when it fails)."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from discovery import paths
from tests.support.browser import CHROMIUM, launch
from tests.support.helpers import children_of
from tests.support.pools import processes_mentioning
from tests.support.redis_server import RedisServer

_RUNTIME = tempfile.mkdtemp(prefix="shmp-test-runtime-")
os.chmod(_RUNTIME, 0o700)
os.environ["XDG_RUNTIME_DIR"] = _RUNTIME  # children inherit it


@pytest.fixture
def make_namespace() -> Iterator[Callable[[], str]]:
    """A factory of namespaces unique to this test, checked for leaks after."""
    made: list[str] = []

    def make() -> str:
        name = f"t-{uuid.uuid4().hex[:16]}"
        made.append(name)
        return name

    yield make
    problems = []
    for name in made:
        for pid in processes_mentioning(name):
            problems.append(f"process {pid} of namespace {name} left running")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        segment = paths.SHM_DIR / paths.segment_name(name)
        if segment.exists():
            problems.append(f"segment {segment} left behind")
            segment.unlink()
        for data in sorted(paths.SHM_DIR.glob(f"{segment.name}.*")):
            problems.append(f"data segment or lock {data} left behind")
            data.unlink(missing_ok=True)
        directory = paths.namespace_dir(name, create=False)
        if directory.exists():
            problems.append(f"runtime files left: {sorted(os.listdir(directory))}")
            paths.remove_namespace_dir(name)
    assert not problems, problems


@pytest.fixture
def namespace(make_namespace: Callable[[], str]) -> str:
    return make_namespace()


@pytest.fixture(autouse=True)
def no_stray_children() -> Iterator[None]:
    """Children a test started must be gone when it ends (a wider fixture's,
    such as a module's pool, are not the test's)."""
    before = set(children_of(os.getpid()))
    yield
    # multiprocessing's resource tracker, which a test of shared memory or of
    # a standard pool starts, is this process's for its life.
    strays = [
        pid
        for pid in children_of(os.getpid())
        if pid not in before and not _resource_tracker(pid)
    ]
    for pid in strays:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert not strays, f"test left child processes {strays}"


def _resource_tracker(pid: int) -> bool:
    """Whether ``pid`` runs multiprocessing's resource tracker (as its
    command line says: what multiprocessing starts it with)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"multiprocessing.resource_tracker" in command


@pytest.fixture(scope="session", autouse=True)
def private_runtime_dir() -> Iterator[None]:
    """Remove the session's runtime directory after every other teardown."""
    yield
    runtime = Path(_RUNTIME)
    for entry in sorted(runtime.rglob("*"), reverse=True):
        entry.rmdir() if entry.is_dir() else entry.unlink()
    runtime.rmdir()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server of this test's own, stopped after it."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (Debian's, driven by Playwright)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (.ci/run installs Debian's)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            yield browser
        finally:
            browser.close()
