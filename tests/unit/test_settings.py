"""Settings declared once: each process's dataclass checks its values, its
command line is built from it, and the zygote's slow path gives a child the
same settings as flags."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from pool.dispatcher.settings import DispatcherSettings
from pool.supervisor.settings import PoolSettings
from workers.common.options import FromParent, Listening
from workers.common.spec import SettingError, add_arguments, parse, to_argv
from workers.settings import WorkerSettings


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"grace_s": -1.0}, r"^grace_s must be at least 0, got -1.0$"),
        ({"concurrency": 0}, r"^concurrency must be at least 1, got 0$"),
        ({"port": 70000}, r"^port must be 0 to 65535, got 70000$"),
        ({"max_args_bytes": -1}, r"^max_args_bytes must be 0 to \d+, got -1$"),
        ({"namespace": "../etc"}, r"^invalid namespace '\.\./etc'"),
        ({"port": 7070}, r"^--port, --advertise and --tls-cert go with --host"),
        ({"token_file": "/no/such"}, r"^--token-file '/no/such': no such file$"),
        ({"token_file": "/"}, r"^--token-file '/' is a directory$"),
    ],
)
def test_a_bad_worker_setting_is_named(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(SettingError, match=message):
        WorkerSettings(**changes)  # type: ignore[arg-type]


def test_the_pool_checks_the_same_values_as_its_children() -> None:
    """One declaration: the pool refuses what its worker would refuse, with
    the same words (a SettingError is a ValueError)."""
    for changes in ({"grace_s": -1.0}, {"concurrency": 0}, {"max_queued": 0}):
        with pytest.raises(ValueError) as pool_error:
            PoolSettings(**changes)
        child = WorkerSettings if "max_queued" not in changes else DispatcherSettings
        with pytest.raises(ValueError) as child_error:
            child(**changes)
        assert str(pool_error.value) == str(child_error.value)


def test_the_pool_composes_what_its_children_are_given(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.touch()
    key.touch()
    pool = PoolSettings(
        namespace="ns-1",
        concurrency=3,
        tags=("gpu", "big"),
        grace_s=5.0,
        host="127.0.0.1",
        port=7070,
        tls_cert=str(cert),
        tls_key=str(key),
        tls_ca=str(cert),
        max_queued=9,
    )
    worker, dispatcher = pool.worker(), pool.dispatcher()
    assert (worker.namespace, worker.concurrency, worker.tags) == (
        "ns-1",
        3,
        ("gpu", "big"),
    )
    assert (worker.grace_s, worker.tls_cert, worker.port) == (5.0, str(cert), 0)
    assert (dispatcher.port, dispatcher.max_queued, dispatcher.tls_ca) == (
        7070,
        9,
        str(cert),
    )


@pytest.mark.parametrize(
    "settings",
    [
        WorkerSettings(),
        WorkerSettings(
            namespace="x",
            concurrency=4,
            tags=("a", "b"),
            paths=("/tmp",),
            reload=True,
            host="127.0.0.1",
            grace_s=0.5,
            ready_fd=7,
        ),
        DispatcherSettings(namespace="y", no_worker_timeout_s=1.5, control_fd=3),
        # Regression: --telemetry took a value, and gave the string "True".
        DispatcherSettings(telemetry=True, host="127.0.0.1", port=7070),
    ],
    ids=["worker-defaults", "worker", "dispatcher", "dispatcher-telemetry"],
)
def test_the_slow_path_gives_a_child_the_same_settings(settings: object) -> None:
    """What the zygote would hand a child as a dataclass, a fresh
    interpreter gets as flags: parsing to_argv gives it back."""
    cls = type(settings)
    assert parse(cls, to_argv(settings), prog="t", description="") == settings


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60
    )


def test_bad_values_exit_2_on_every_command_line(tmp_path: Path) -> None:
    """Regressions: `pool up --grace-s -1` was accepted; a missing
    --token-file exited 1; `python -m workers` refused the -n that `pool up
    --help` tells users to give it."""
    up = _run("-m", "pool", "up", "--grace-s", "-1")
    assert up.returncode == 2
    assert (
        up.stderr == "pool: error: grace_s must be at least 0, got -1.0 (see --help)\n"
    )
    missing = str(tmp_path / "token")
    up = _run("-m", "pool", "up", "--token-file", missing)
    assert (up.returncode, up.stderr.count("\n")) == (2, 1)
    assert f"--token-file {missing!r}: no such file" in up.stderr
    submit = _run(
        "-m", "pool", "submit", "--discovery", "redis://127.0.0.1:1",
        "--token-file", missing, "math:sqrt", "4",
    )  # fmt: skip
    assert submit.returncode == 2
    assert f"--token-file {missing!r}: no such file" in submit.stderr
    worker = _run("-m", "workers", "-n", "../x")
    assert worker.returncode == 2
    assert "invalid namespace '../x'" in worker.stderr


@pytest.mark.parametrize("cls", [WorkerSettings, DispatcherSettings, PoolSettings])
def test_help_shows_a_shared_group_under_its_title(cls: type) -> None:
    """A group that several processes take (how they listen) is declared
    once and shown after the process's own flags, under its title."""
    parser = argparse.ArgumentParser(prog="t")
    add_arguments(parser, cls)
    text = parser.format_help()
    title = text.index(f"\n{Listening.TITLE}:\n")
    # (`-n NAMESPACE, --namespace NAMESPACE` up to 3.12, `-n, --namespace
    # NAMESPACE` since: argparse names the metavar once.)
    assert text.index("\n  -n") < title < text.index("\n  --host [HOST]")
    assert text.index("\n  --tls-key PEM") > title


def test_help_shows_an_extended_group_under_its_title() -> None:
    """The pipes that only the dispatcher is given by its parent are shown
    with the descriptors every child is given, under that group's title."""
    parser = argparse.ArgumentParser(prog="t")
    add_arguments(parser, DispatcherSettings)
    text = parser.format_help()
    title = text.index(f"\n{FromParent.TITLE}:\n")
    own = text[: text.index("\n\n", text.index("\n  -n"))]
    for flag in ("--parent-fd N", "--control-fd N", "--report-fd N", "--telemetry"):
        assert text.index(f"\n  {flag}") > title
        assert f"\n  {flag}" not in own
