"""``pool down``: drain and stop a running pool, as Ctrl-C on ``pool up`` does."""

from __future__ import annotations

import argparse
import os
import select
import signal

from discovery import owner_pid
from pool.cli.common import Commands, add_namespace, command
from pool.errors import PoolError

DOWN_TIMEOUT_S = 60.0


DOWN = """drain and stop a running pool

Ask the pool of NAMESPACE to drain and stop (as Ctrl-C on `pool up` does),
and wait until it has. With no pool running there is nothing to stop: it
says so and exits 0.
"""


def add(commands: Commands) -> None:
    down = command(commands, "down", run_down, DOWN)
    add_namespace(down)
    help = f"how long to wait for it to stop (default {DOWN_TIMEOUT_S:g})"
    down.add_argument(
        "--timeout-s", type=float, default=DOWN_TIMEOUT_S, metavar="SECONDS", help=help
    )


def run_down(args: argparse.Namespace) -> int:
    pid = owner_pid(args.namespace)
    if pid is None:
        print(f"nothing to stop: no pool is running in namespace {args.namespace!r}")
        return 0
    fd = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGTERM)
        exited, _, _ = select.select([fd], [], [], args.timeout_s)
        if not exited:
            raise PoolError(
                f"the pool (pid {pid}) did not stop within {args.timeout_s:g} s; "
                f"`kill -9 {pid}` stops it at once"
            )
    finally:
        os.close(fd)
    print(f"stopped pool {args.namespace!r} (pid {pid})")
    return 0
