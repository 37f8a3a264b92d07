"""Who owns a namespace is told by a lock, never by a pid."""

from __future__ import annotations

import functools
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from discovery import (
    LocalDiscovery,
    NamespaceInUse,
    owner_pid,
    paths,
    reclaim,
    sweep_dead,
)
from discovery.registry import Registry
from tests.support.helpers import ROOT, LineReader, agent, wait_until
from tests.support.pools import (
    RunningPool,
    pool_command,
    processes_mentioning,
    running_pool,
)

pytestmark = pytest.mark.integration

_OWNER_PID_AT = 28  # the registry header's owner pid field


def _segment(namespace: str) -> os.PathLike[str]:
    return paths.SHM_DIR / paths.segment_name(namespace)


def _create_and_kill(namespace: str) -> None:
    """Create the namespace in another process, then SIGKILL it."""
    with agent("publish", namespace, "--create") as owner:
        owner.expect("ready")
        assert owner_pid(namespace) == owner.pid
        owner.kill()
    assert owner_pid(namespace) is None
    assert os.path.exists(_segment(namespace))  # what the dead owner left


def test_a_dead_owner_is_replaced_even_when_its_pid_is_alive_again(
    namespace: str,
) -> None:
    """A namespace whose owner was killed, and whose recorded owner pid now
    names a live process (the pid was reused), is claimed by the next
    LocalDiscovery: a new segment replaces the old one.

    Regression: reclaim trusted `kill(pid, 0)` on the recorded pid, and so
    refused a dead owner's namespace as in use."""
    _create_and_kill(namespace)
    registry = Registry.attach(namespace)
    try:
        struct.pack_into("<I", registry._view, _OWNER_PID_AT, os.getpid())
        old = os.stat(_segment(namespace)).st_ino
    finally:
        registry.close()
    assert reclaim(namespace) is True
    assert not os.path.exists(_segment(namespace))
    _create_and_kill(namespace)
    with LocalDiscovery(namespace, exclusive=True) as owned:
        assert owned.created and owner_pid(namespace) == os.getpid()
        assert os.stat(_segment(namespace)).st_ino != old
    assert not os.path.exists(_segment(namespace))


def test_a_live_owner_is_never_taken_over(namespace: str) -> None:
    """While its owner lives, a namespace is attached to, never replaced;
    an exclusive claim is refused with the owner's pid; reclaim refuses."""
    with agent("publish", namespace, "--create") as owner:
        owner.expect("ready")
        before = os.stat(_segment(namespace)).st_ino
        with LocalDiscovery(namespace) as attached:
            assert not attached.created
        with pytest.raises(NamespaceInUse, match=f"live process {owner.pid}"):
            LocalDiscovery(namespace, exclusive=True).__enter__()
        with pytest.raises(NamespaceInUse):
            reclaim(namespace)
        assert os.stat(_segment(namespace)).st_ino == before
        owner.stop()
    assert not os.path.exists(_segment(namespace))


def test_sweep_removes_dead_namespaces_only(
    make_namespace: Callable[[], str],
) -> None:
    """sweep_dead removes the segment and files of every namespace whose
    owner died, and leaves alone a live one and one nobody ever owned."""
    dead, alive, unowned = make_namespace(), make_namespace(), make_namespace()
    _create_and_kill(dead)
    paths.namespace_dir(unowned)  # as a subscriber waiting for it makes it
    with LocalDiscovery(alive):
        assert dead in sweep_dead()
        assert not os.path.exists(_segment(dead))
        assert not paths.namespace_dir(dead, create=False).exists()
        assert os.path.exists(_segment(alive))
        assert paths.namespace_dir(unowned, create=False).exists()
    paths.remove_namespace_dir(unowned)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sweeper", ["pool ls --clean", "a pool that starts"])
def test_what_a_killed_pool_left_is_reaped_whatever_its_runtime_directory(
    sweeper: str, make_namespace: Callable[[], str], request: pytest.FixtureRequest
) -> None:
    """A pool and its client SIGKILLed with data in shared memory, both in a
    runtime directory of their own: `pool ls --clean`, or a pool that
    starts, with another runtime directory removes the pool's registry and
    the client's data and locks; a live pool of a third runtime directory
    keeps everything. Regression: the registry stayed, listed as
    pool=unknown, and no later pool removed it."""
    dead, alive = make_namespace(), make_namespace()
    # (Short paths: a unix socket's must fit in 108 bytes.)
    theirs, third = (Path(tempfile.mkdtemp(prefix="shmp-rd-")) for _ in range(2))
    for directory in (theirs, third):
        request.addfinalizer(functools.partial(shutil.rmtree, directory))
    key = paths.segment_name(dead)
    with running_pool(alive, "--workers", "1", runtime_dir=third) as live:
        _kill_with_data(dead, theirs)
        left = [n for n in os.listdir(paths.SHM_DIR) if n.startswith(key)]
        assert key in left and len(left) >= 3, left  # registry, data, a lock
        if sweeper == "pool ls --clean":
            done = pool_command("ls", "--clean")
            assert done.returncode == 0, done.stderr
            assert f"removed the registry {key} of a dead pool" in done.stdout
        else:
            with running_pool(make_namespace(), "--workers", "1"):
                pass
        assert [n for n in os.listdir(paths.SHM_DIR) if n.startswith(key)] == []
        assert (paths.SHM_DIR / paths.segment_name(alive)).exists()
        assert live.proc.poll() is None


def _kill_with_data(namespace: str, runtime_dir: Path) -> None:
    """A pool of ``namespace`` in ``runtime_dir``, and a client of it holding
    an array in shared memory: both SIGKILLed; its children gone after them."""
    pool = RunningPool(namespace, "--workers", "1", runtime_dir=runtime_dir)
    try:
        pool.wait_for("ready ", 60)
        client = subprocess.Popen(
            [sys.executable, "-m", "tests.support.data_client", namespace, "--hold"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir)},
        )
        assert client.stdout is not None
        with client.stdout:
            try:
                # (Held, not sent: a task's arguments go once it is answered.)
                LineReader(client.stdout).wait_for("holding", 60)
            finally:
                client.kill()
                client.wait()
    finally:
        pool.proc.kill()
        pool.close()
    wait_until(lambda: processes_mentioning(namespace) == [], 30)
