"""The command line's own basics, without a pool: its version, and the
``pool`` console script installed with the package."""

from __future__ import annotations

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
