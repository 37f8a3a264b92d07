"""What happens to results when a pool stops, or its program exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from discovery import owner_pid, paths
from pool import Client, Pool
from pool.errors import PoolStopping
from tests.support import sample_tasks
from tests.support.helpers import ROOT, LineReader, wait_until
from tests.support.pools import processes_mentioning, running_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _python(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _leftovers(namespace: str) -> list[str]:
    found = []
    if (paths.SHM_DIR / paths.segment_name(namespace)).exists():
        found.append("segment")
    if paths.namespace_dir(namespace, create=False).exists():
        found.append("runtime directory")
    found += [f"process {pid}" for pid in processes_mentioning(namespace)]
    return found


def test_a_drain_delivers_every_result_a_worker_finishes(
    namespace: str, tmp_path: Path
) -> None:
    """SIGINT while tasks run: they finish and their callers get their
    results (through Client and through `pool submit`); tasks that no
    worker had (here: past what the workers take) fail at once with
    PoolStopping, while the others still run.

    Regression: the dispatcher dropped a draining worker's link on its
    worker-dropped event, before reading its last results, and the callers
    got PoolNotRunning for tasks that had run."""
    gate = str(tmp_path / "gate")
    started, done = str(tmp_path / "started"), str(tmp_path / "done")
    cli_started, cli_done = str(tmp_path / "cli-started"), str(tmp_path / "cli-done")
    with (
        running_pool(namespace, "--workers", "3") as pool,
        Client(namespace) as client,
    ):
        running = client.submit(sample_tasks.started_then_gated, started, gate, done, 7)
        cli = _python(
            "-m", "pool", "submit", "-n", namespace,
            "tests.support.sample_tasks:started_then_gated",
            repr(cli_started), repr(gate), repr(cli_done), "8",
        )  # fmt: skip
        try:
            wait_until(lambda: os.path.exists(started) and os.path.exists(cli_started))
            # 3 workers run one task each and hold one more: the rest wait.
            more = [client.submit(sample_tasks.gated, gate, i) for i in range(40)]
            wait_until(lambda: sum(f.running() for f in more) >= 1)
            pool.proc.send_signal(signal.SIGINT)
            pool.wait_for("stopping ")
            # A task a worker took is RUNNING until the gate opens; the rest fail.
            wait_until(lambda: all(f.running() or f.done() for f in more))
            never_sent = [f for f in more if f.done()]
            assert len(never_sent) >= 40 - 3 * 4
            for future in never_sent:
                with pytest.raises(
                    PoolStopping, match=r"never sent to a worker|never ran"
                ):
                    future.result(timeout=0)
            assert not running.done()
            Path(gate).touch()
            for i, future in enumerate(more):
                if future not in never_sent:
                    assert future.result(timeout=30) == i
            assert running.result(timeout=30) == 7 and os.path.exists(done)
            out, err = cli.communicate(timeout=30)
            assert (cli.returncode, out, err) == (0, "8\n", "")
            assert os.path.exists(cli_done)
        finally:
            Path(gate).touch()
            cli.kill()
            cli.communicate()
        assert pool.proc.wait(30) == 0
    assert _leftovers(namespace) == []


@pytest.mark.parametrize("mode", ["client", "pool"])
def test_pending_futures_are_waited_for_at_interpreter_exit(
    mode: str, make_namespace: Callable[[], str], tmp_path: Path
) -> None:
    """A program that ends with a task in flight waits for it, as with the
    standard executors; after that, submit raises RuntimeError. An embedded
    pool left open is then stopped, leaving nothing behind.

    Regression: the client's daemon thread died with the program and the
    embedded pool's segment and files stayed for ever."""
    namespace, gate = make_namespace(), str(tmp_path / "gate")
    serving = Pool(workers=1) if mode == "client" else None
    target = serving.namespace if serving is not None else namespace
    if serving is not None:
        serving.__enter__()
    try:
        program = _python("-m", "tests.support.at_exit", mode, target, gate)
        assert program.stdout is not None
        lines = LineReader(program.stdout)
        lines.wait_for("exiting", 60)
        Path(gate).touch()
        assert program.wait(60) == 0, program.stderr.read() if program.stderr else ""
        rest = [lines.next() for _ in range(2)]
        assert rest == [
            "result 42\n",
            "submit cannot schedule new futures after interpreter shutdown\n",
        ]
    finally:
        if serving is not None:
            serving.close()
    assert _leftovers(namespace) == []


def test_a_killed_programs_pool_is_swept_when_the_next_pool_starts(
    namespace: str,
) -> None:
    """SIGKILL a program while its embedded pool runs: its workers and
    dispatcher exit by themselves, and the next pool to start, whatever its
    namespace, removes the segment and files it left."""
    program = _python("-m", "tests.support.at_exit", "killed", namespace, "-")
    assert program.stdout is not None
    try:
        LineReader(program.stdout).wait_for("ready", 60)
        os.kill(program.pid, signal.SIGKILL)
        program.wait(10)
    finally:
        program.kill()
        program.communicate()
    wait_until(lambda: processes_mentioning(namespace) == [], 20)
    assert owner_pid(namespace) is None
    assert _leftovers(namespace) == ["segment", "runtime directory"]
    with Pool(workers=1) as client:
        assert client.submit(sample_tasks.square, 4).result(timeout=30) == 16
        assert _leftovers(namespace) == []
