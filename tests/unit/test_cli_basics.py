"""The command line's own basics, without a pool: its version, and the
``pool`` console script installed with the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import discovery
import pool


def test_the_version_is_the_package_version() -> None:
    assert pool.__version__ == discovery.__version__
    run = subprocess.run(
        [sys.executable, "-m", "pool", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0
    assert run.stdout.strip() == f"pool {discovery.__version__}"


def test_the_console_script_runs_the_command_line() -> None:
    script = Path(sys.executable).parent / "pool"
    if not script.exists():
        found = shutil.which("pool")
        if found is None:
            pytest.fail("the `pool` console script is not installed")
        script = Path(found)
    run = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0
    assert run.stdout.startswith("usage: pool ")


def test_submit_takes_positional_then_keyword_literals() -> None:
    from pool.cli.common import UsageError
    from pool.cli.submit import _call

    assert _call(["1", "'a=b'", "x=[1, 2]", "y={'k': None}"]) == (
        [1, "a=b"],
        {"x": [1, 2], "y": {"k": None}},
    )
    with pytest.raises(UsageError, match="follows a keyword one"):
        _call(["x=1", "2"])
    with pytest.raises(UsageError, match="is not a Python literal"):
        _call(["x=oops"])


@pytest.mark.parametrize("dont_write", [True, False])
def test_bench_says_when_pools_would_compile_our_modules_as_they_start(
    tmp_path: Path, dont_write: bool
) -> None:
    """With bytecode neither cached (an empty cache prefix) nor written,
    `pool bench` warns that its start figures include compiling; where
    bytecode is written, it says nothing."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path)
    if dont_write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    code = "from pool.cli.bench import _uncompiled; print(_uncompiled())"
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    if dont_write:
        assert run.stdout.startswith("note: PYTHONDONTWRITEBYTECODE is set")
        assert "python -m compileall -q " in run.stdout
    else:
        assert run.stdout == "None\n"
