"""What a newcomer does with `pool up`, run the way they would: see a
task's print, edit a task module and see the change, import their own code
from where they are, and trace a segment in /dev/shm to its pool."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from discovery import list_workers, paths
from pool import Client
from tests.support import sample_tasks
from tests.support.helpers import DEADLINE_S, ROOT, wait_until
from tests.support.pools import none_registered, pool_command, running_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_tasks_print_shows_in_pool_up_prefixed_by_its_worker(
    namespace: str,
) -> None:
    """stdout and stderr of a worker come out of `pool up` line by line as
    `[wN pid=P] text`, P being the worker that ran the task."""
    with running_pool(namespace, "--workers", "2") as pool:
        with Client(namespace) as client:
            assert client.submit(sample_tasks.speak, "hello there").result(30) == 11
        pids = {info.pid for info in list_workers(namespace)}
        said = pool.wait_for("[w").rstrip("\n")
        match = re.fullmatch(r"\[w(\d) pid=(\d+)\] hello there", said)
        assert match is not None, said
        assert int(match[2]) in pids
        prefix = f"[w{match[1]} pid={match[2]}]"
        assert pool.wait_for("[w") == f"{prefix} hello there (stderr)\n"


TASKS_V1 = "def version():\n    return 1\n"
TASKS_V2 = "def version():\n    return 'two'\n"


def test_edit_a_task_module_and_see_the_change(namespace: str, tmp_path: Path) -> None:
    """`pool up --reload`, started in the directory of the user's tasks.py
    (no PYTHONPATH, no --path): an edit shows in the next task."""
    (tmp_path / "mytasks.py").write_text(TASKS_V1)
    with running_pool(namespace, "--workers", "1", "--reload", cwd=tmp_path) as pool:
        assert f"path={tmp_path}\n" in pool.ready_line
        first = pool_command("submit", "-n", namespace, "mytasks:version")
        assert (first.returncode, first.stdout) == (0, "1\n"), first.stderr
        (tmp_path / "mytasks.py").write_text(TASKS_V2)
        second = pool_command("submit", "-n", namespace, "mytasks:version")
        assert (second.returncode, second.stdout) == (0, "'two'\n"), second.stderr


def test_path_adds_where_workers_import_from(namespace: str, tmp_path: Path) -> None:
    """--path DIR adds to where workers import from, before the directory
    `pool up` runs in; without it, a module elsewhere is not found and the
    error says where the worker looks."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "mytasks.py").write_text(TASKS_V1)
    with running_pool(namespace, "--workers", "1", "--path", str(code)) as pool:
        assert f"path={code}:{ROOT}\n" in pool.ready_line  # (it runs in ROOT)
        done = pool_command("submit", "-n", namespace, "mytasks:version")
        assert (done.returncode, done.stdout) == (0, "1\n"), done.stderr
    other = namespace + "-b"
    try:
        with running_pool(other, "--workers", "1", cwd=tmp_path):
            missing = pool_command("submit", "-n", other, "mytasks:version")
            assert missing.returncode == 1
            assert "cannot import module 'mytasks'" in missing.stderr
            assert f"working directory {str(tmp_path)!r}" in missing.stderr
            assert "--path" in missing.stderr and "ship_modules" in missing.stderr
    finally:
        assert not (paths.SHM_DIR / paths.segment_name(other)).exists()


def test_pool_ls_traces_a_segment_to_its_pool_and_cleans_dead_ones(
    namespace: str,
) -> None:
    segment = paths.SHM_DIR / paths.segment_name(namespace)
    with running_pool(namespace, "--workers", "2") as pool:
        listed = pool_command("ls")
        mine = [line for line in listed.stdout.splitlines() if segment.name in line]
        assert mine == [
            f"pool namespace={namespace} owner={pool.proc.pid} workers=2 "
            f"segment={segment} runtime={paths.namespace_dir(namespace, create=False)} "
            f"data=0"
        ]
        pool.proc.send_signal(signal.SIGKILL)
        pool.proc.wait(DEADLINE_S)
        wait_until(lambda: none_registered(namespace), timeout_s=DEADLINE_S)
        dead = pool_command("ls").stdout
        assert f"pool namespace={namespace} owner=dead workers=-" in dead
        # `ls` alone removes nothing. (What it lists is the runtime directory's;
        # the registry segment, a pool started elsewhere meanwhile may reap.)
        assert paths.namespace_dir(namespace, create=False).exists()
        cleaned = pool_command("ls", "--clean")
        assert f"removed what the dead pool {namespace!r} left" in cleaned.stdout
        assert namespace not in cleaned.stdout.split("left", 1)[1]
    assert not segment.exists()
    assert not paths.namespace_dir(namespace, create=False).exists()
    assert not os.path.exists(segment)
