"""``python -m pool``: start, use, watch and stop a pool.

Each command prints one clear line and exits non-zero on error, never a
traceback. ``up`` owns the pool it starts; the other commands find it by
namespace through the private runtime directory.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import os
import select
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import uvloop

from discovery import DiscoveryError, Subscriber, list_workers, paths
from pool.client import Client
from pool.errors import PoolError, PoolNotRunning
from pool.supervisor import Options, Supervisor, owner_pid
from pool.view import LiveView, PlainView, View, describe, line
from workers.lifecycle import LOOPBACK, MAX_ARGS_LIMIT
from workers.tasks import MAX_ARGS_BYTES, BadTask, TaskError

DOWN_TIMEOUT_S = 60.0


class UsageError(Exception):
    """A command-line argument that cannot be used as given."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pool",
        description="A local worker pool whose workers find each other through "
        "shared memory. Start one with `up`, use it with `submit` or "
        "pool.Client, stop it with `down` (or Ctrl-C).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser(
        "up",
        help="start a pool and show its workers' lifecycle",
        description="Start a dispatcher and WORKERS workers in NAMESPACE and show "
        "every worker added, updated and dropped. Ctrl-C (or SIGTERM, or "
        "`pool down`) drains and leaves nothing behind; a second Ctrl-C "
        "stops at once.",
    )
    _namespace(up)
    up.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes (default: one per CPU)",
    )
    up.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="tasks each worker runs at once (default 1)",
    )
    up.add_argument("--tags", default="", help="comma-separated worker tags")
    up.add_argument(
        "--host",
        nargs="?",
        const=LOOPBACK,
        help=f"listen on TCP instead of unix sockets, at HOST (default {LOOPBACK}, "
        "this machine only; any other address exposes the pool: read SECURITY.md)",
    )
    up.add_argument(
        "--max-args-bytes",
        type=int,
        default=MAX_ARGS_BYTES,
        help="largest pickled arguments a task may carry; a larger one fails "
        f"with RESOURCE_EXHAUSTED (default {MAX_ARGS_BYTES})",
    )
    up.add_argument(
        "--no-restart",
        action="store_true",
        help="report dead workers but do not replace them",
    )
    up.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        help="how long draining workers may finish tasks (default 30)",
    )
    up.add_argument(
        "--capacity",
        type=int,
        default=128,
        help="registry slots (default 128, or twice --workers)",
    )
    up.add_argument(
        "--no-worker-timeout-s",
        type=float,
        default=30.0,
        help="fail a task that finds no worker this long (default 30)",
    )
    up.set_defaults(run=cmd_up)

    submit = commands.add_parser(
        "submit",
        help="run one task and print its result",
        description="Run MODULE:FUNC(ARG, ...) in the pool and print the result's "
        "repr. Each ARG is a Python literal: 42, 'text', [1, 2], {'a': 1}.",
    )
    _namespace(submit)
    submit.add_argument("function", metavar="MODULE:FUNC")
    submit.add_argument("args", nargs="*", metavar="ARG")
    submit.add_argument("--timeout-s", type=float, help="fail the task after this")
    submit.set_defaults(run=cmd_submit)

    workers = commands.add_parser(
        "workers", help="list the registered workers (read from shared memory)"
    )
    _namespace(workers)
    workers.set_defaults(run=cmd_workers)

    watch = commands.add_parser(
        "watch", help="print worker events as they happen (Ctrl-C to stop)"
    )
    _namespace(watch)
    watch.set_defaults(run=cmd_watch)

    down = commands.add_parser("down", help="drain and stop a running pool")
    _namespace(down)
    down.add_argument(
        "--timeout-s",
        type=float,
        default=DOWN_TIMEOUT_S,
        help="how long to wait for it to stop (default 60)",
    )
    down.set_defaults(run=cmd_down)
    return parser


def _namespace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n",
        "--namespace",
        default="default",
        help="the pool's namespace (default: default)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        paths.validate_namespace(args.namespace)
        return run(args)
    except KeyboardInterrupt:
        return 130
    except (PoolError, DiscoveryError, TaskError, UsageError, OSError) as exc:
        print(f"pool: error: {exc}", file=sys.stderr)
        return 1


def cmd_up(args: argparse.Namespace) -> int:
    if args.workers < 0 or args.concurrency < 1:
        raise UsageError("--workers must be 0 or more and --concurrency 1 or more")
    if not 0 <= args.max_args_bytes <= MAX_ARGS_LIMIT:
        raise UsageError(f"--max-args-bytes must be 0 to {MAX_ARGS_LIMIT}")
    options = Options(
        namespace=args.namespace,
        workers=args.workers,
        concurrency=args.concurrency,
        tags=tuple(t for t in args.tags.split(",") if t),
        host=args.host,
        restart=not args.no_restart,
        grace_s=args.grace_s,
        capacity=args.capacity,
        no_worker_timeout_s=args.no_worker_timeout_s,
        max_args_bytes=args.max_args_bytes,
    )
    view: View = LiveView(args.namespace) if sys.stdout.isatty() else PlainView()
    try:
        uvloop.run(_up(options, view))
    finally:
        view.close()
    return 0


async def _up(options: Options, view: View) -> None:
    stop, kill_now = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            kill_now.set()
        else:
            stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    await Supervisor(options, view).run(stop, kill_now)


def cmd_submit(args: argparse.Namespace) -> int:
    values = [_literal(text) for text in args.args]
    client = Client(args.namespace, task_timeout_s=args.timeout_s)
    try:
        result = client.submit(args.function, *values).result()
    except (PoolError, BadTask):
        raise
    except Exception as exc:
        print(f"pool: the task raised {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.shutdown()
    print(repr(result))
    return 0


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise UsageError(
            f"argument {text!r} is not a Python literal; quote text as \"'{text}'\""
        ) from None


def cmd_workers(args: argparse.Namespace) -> int:
    infos = sorted(list_workers(args.namespace), key=lambda info: info.pid)
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(infos)} workers in {args.namespace!r}")
        columns = ("pid", "uid", "address", "status", "running", "done")
        for column in columns:
            table.add_column(column)
        for info in infos:
            fields = describe(info)
            table.add_row(*(str(fields[c]) for c in columns))
        Console().print(table)
    else:
        for info in infos:
            print(line("worker", describe(info)))
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    view = PlainView()

    async def follow() -> None:
        async for event in Subscriber(args.namespace):
            view.event(event)

    if owner_pid(args.namespace) is None:
        print(f"waiting for a pool in namespace {args.namespace!r}", file=sys.stderr)
    uvloop.run(follow())
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    pid = owner_pid(args.namespace)
    if pid is None:
        raise PoolNotRunning(args.namespace)
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
