"""progress= on real pools: a bar on a pseudo-terminal that reaches 100 %,
nothing on a pipe or under $CI, and tqdm's own bar when tqdm is passed,
failures counted (pool/client/progress.py)."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.helpers import DEADLINE_S, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MAP = """
import pool

with pool.Pool(workers=2) as client:
    total = sum(client.map(abs, range(-3000, 0), progress=True))
print("done", total)
"""

AS_COMPLETED = """
import tqdm

import pool


def odd_fails(x):
    if x % 2:
        raise ValueError(x)
    return x


with pool.Pool(workers=2) as client:
    futures = [client.submit(odd_fails, i) for i in range(10)]
    done = list(pool.as_completed(futures, progress=tqdm.tqdm))
print("done", len(done))
"""

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    return {**env, "PYTHONPATH": str(ROOT), "TERM": "xterm", "COLUMNS": "120", **extra}


def _on_a_terminal(script: Path, **extra: str) -> str:
    """What ``script`` wrote to a pseudo-terminal (its stdout and stderr),
    escapes removed, once it exited."""
    leader, follower = os.openpty()
    child = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=follower,
        stderr=follower,
        env=_env(**extra),
    )
    os.close(follower)
    seen = bytearray()
    deadline = time.monotonic() + DEADLINE_S * 6
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # (EIO: the terminal's other end closed)
                break
            if not chunk:
                break
            seen += chunk
        assert child.wait(DEADLINE_S) == 0, seen.decode(errors="replace")
    finally:
        os.close(leader)
        if child.poll() is None:
            child.kill()
            child.wait()
    return ANSI.sub("", seen.decode(errors="replace"))


def _on_a_pipe(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=DEADLINE_S * 6,
    )


def test_a_map_draws_a_bar_to_100_percent_on_a_terminal(tmp_path: Path) -> None:
    script = tmp_path / "map.py"
    script.write_text(MAP)
    shown = _on_a_terminal(script)
    assert re.search(r"abs .*3000/3000 +100% .* 0 failed", shown), shown
    assert "done 4501500" in shown


def test_no_bar_on_a_pipe_or_under_ci(tmp_path: Path) -> None:
    """On a pipe, only what the script prints; on a terminal with $CI set,
    the same."""
    script = tmp_path / "map.py"
    script.write_text(MAP)
    done = _on_a_pipe(script)
    assert (done.returncode, done.stdout, done.stderr) == (0, "done 4501500\n", "")
    assert _on_a_terminal(script, CI="true").strip() == "done 4501500"


def test_tqdm_passed_is_the_bar_with_failures_counted(tmp_path: Path) -> None:
    script = tmp_path / "as_completed.py"
    script.write_text(AS_COMPLETED)
    done = _on_a_pipe(script)
    assert (done.returncode, done.stdout) == (0, "done 10\n"), done.stderr
    last = done.stderr.replace("\r", "\n").strip().splitlines()[-1]
    assert re.match(r"as_completed: 100%\|.*\| 10/10 \[.*, failed=5\]$", last), last
