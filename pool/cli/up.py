"""``pool up``: start a pool and show its workers' lifecycle.

Its flags are :class:`~pool.supervisor.settings.PoolSettings`' fields, with
their help and defaults (:mod:`workers.settings`). On a terminal, a live
view whose title shows the dispatcher's queue length, asked once a second;
else one plain line an event.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

import uvloop
from grpc import aio

from discovery import backends
from pool.cli.common import Commands, UsageError, command
from pool.client.rendezvous import Locator
from pool.dispatcher_pb2 import ListWorkersRequest
from pool.dispatcher_pb2_grpc import DispatcherStub
from pool.errors import PoolError
from pool.supervisor.orchestration import Supervisor
from pool.supervisor.settings import PoolSettings
from pool.supervisor.view import LiveView, PlainView, View
from workers.common.serving import CannotListen, check_host
from workers.common.spec import SettingError, add_arguments, from_arguments
from workers.protocol import auth

TICK_S = 1.0  # how often `up` asks the dispatcher for its queue length


UP = """start a pool and show its workers' lifecycle

Start a dispatcher and WORKERS workers in NAMESPACE and show every worker
added, updated and dropped. Ctrl-C (or SIGTERM, or `pool down`) drains and
leaves nothing behind; a second Ctrl-C stops at once.
"""


def add(commands: Commands) -> None:
    add_arguments(command(commands, "up", run, UP), PoolSettings)


def run(args: argparse.Namespace) -> int:
    if args.host is not None:
        try:
            check_host(args.host)
        except CannotListen as exc:
            raise UsageError(f"--host: {exc}") from None
    try:
        settings = from_arguments(
            PoolSettings, args, capture_output=True, paths=_import_paths(args.paths)
        )
    except SettingError as exc:
        raise UsageError(f"{exc} (see --help)") from None
    backends.check_reachable(settings.discovery_url)  # (before any process)
    view: View
    if sys.stdout.isatty():
        view = LiveView(settings.namespace, paths=settings.paths)
    else:
        view = PlainView()
    try:
        uvloop.run(_up(settings, view))
    finally:
        view.close()
    return 0


def _import_paths(given: Sequence[str]) -> tuple[str, ...]:
    """The workers' first import directories: the ``--path`` ones, then this
    directory (where a user's ``tasks.py`` is when they type ``pool up``).

    :raises UsageError: for a path that is not a directory.
    """
    found = []
    for path in given:
        if not os.path.isdir(path):
            raise UsageError(f"--path {path!r} is not a directory")
        found.append(os.path.abspath(path))
    return tuple(dict.fromkeys([*found, os.getcwd()]))


async def _up(settings: PoolSettings, view: View) -> None:
    stop, kill_now = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            kill_now.set()
        else:
            stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    if not isinstance(view, LiveView):  # plain lines show no queue: no ticker
        await Supervisor(settings, view).run(stop, kill_now)
        return
    async with asyncio.TaskGroup() as group:
        ticking = group.create_task(_tick(settings.namespace, view))
        try:
            await Supervisor(settings, view).run(stop, kill_now)
        finally:
            ticking.cancel()


async def _tick(namespace: str, view: View) -> None:
    """Once a second, tell the view the dispatcher's queue length."""
    locator = Locator(namespace)
    channel: aio.Channel | None = None
    address = ""
    try:
        while True:
            await asyncio.sleep(TICK_S)  # a ticker, not a wait for an event
            queued = None
            try:
                target = await locator.locate()
                if target.address != address or channel is None:
                    if channel is not None:
                        await channel.close()
                    address = target.address
                    channel = await locator.channel(target)
                stub = DispatcherStub(channel)  # type: ignore[no-untyped-call]
                reply = await stub.ListWorkers(
                    ListWorkersRequest(),
                    metadata=auth.call_metadata(target.token),
                    timeout=TICK_S,
                )
                queued = reply.queued
            except (PoolError, aio.AioRpcError):
                pass  # not up yet, or stopping: the view says "?"
            view.tick(queued)
    finally:
        if channel is not None:
            await channel.close()
