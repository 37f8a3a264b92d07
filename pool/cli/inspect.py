"""``pool workers``, ``pool watch`` and ``pool ls``: what runs, as it happens,
and what dead pools left. They read the registry and ask the dispatcher;
none changes a pool (``ls --clean`` removes only what dead ones left)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterable
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import uvloop

from discovery import (
    DiscoveryError,
    DiscoveryEvent,
    Subscriber,
    backends,
    list_workers,
    namespaces,
    owner_pid,
    paths,
    reap_registries,
    sweep_dead,
)
from pool.cli.common import Commands, add_namespace, add_remote, command, remote_url
from pool.client.rendezvous import Locator, Target
from pool.dispatcher_pb2 import ListWorkersRequest
from pool.dispatcher_pb2_grpc import DispatcherStub
from pool.errors import PoolNotRunning
from pool.supervisor.view import (
    PlainView,
    describe,
    line,
    shorten_left,
)
from workers.protocol import auth, owners

WORKERS = """list the registered workers (from shared memory, or Redis), with
what the dispatchers have sent each and have queued

List the workers registered in NAMESPACE's shared memory (or, with
--discovery, in Redis), one line each (a table on a terminal): pid,
address, status, tasks running and done, and how many the dispatchers have
sent each; then each dispatcher (a pool on Redis may have several), how
many tasks wait in it and how many clients it serves.
"""
WATCH = """print worker events as they happen (Ctrl-C to stop)

Print each worker-added, worker-updated and worker-dropped event of
NAMESPACE as it happens, one line each, until Ctrl-C. A namespace with no
pool yet is waited for.
"""
WATCH_TIMEOUT = """stop after this long; exit 1 if no pool showed a worker by
then (default: until Ctrl-C)"""
LS = """list this user's pools, and what dead ones left

List every pool in this user's runtime directory: its namespace, owner pid
(or `dead` for leftovers of a pool that was killed), workers, shared-memory
segment, runtime directory, and the bytes its large arguments and results
hold in /dev/shm now (`data`: segments named after its own), so a segment
seen in /dev/shm can be traced to its pool. Segments of this user that no
pool here names are listed too (another runtime directory's, or a leak).
"""
CLEAN = """remove what dead pools left (segments and files; a registry segment
of a pool of another runtime directory too, once nobody holds it), and the
data segments of dead clients and workers; live ones are never touched"""


def add(commands: Commands) -> None:
    workers = command(commands, "workers", run_workers, WORKERS)
    add_namespace(workers)
    add_remote(workers)
    watch = command(commands, "watch", run_watch, WATCH)
    add_namespace(watch)
    add_remote(watch, token=False)
    watch.add_argument("--timeout-s", type=float, metavar="SECONDS", help=WATCH_TIMEOUT)
    ls = command(commands, "ls", run_ls, LS)
    ls.add_argument("--clean", action="store_true", help=CLEAN)


def run_workers(args: argparse.Namespace) -> int:
    locator = Locator(args.namespace, remote_url(args), args.token_file, args.tls_ca)
    if locator.discovery_url is None:
        if owner_pid(args.namespace) is None:
            raise PoolNotRunning(args.namespace)
        infos = list_workers(args.namespace)
    else:
        from discovery.redis import registered

        backends.check_reachable(locator.discovery_url)
        infos = registered(locator.discovery_url, args.namespace)
    infos = sorted(infos, key=lambda info: (info.pid, info.address))
    asked = ((t, ask_dispatcher(locator, t)) for t in _targets(locator))
    views = [(target, view) for target, view in asked if view is not None]
    columns = ["pid", "uid", "address", "status", "running", "done", "rss"]
    if views:
        columns.append("in_flight")
    rows = []
    for info in infos:
        fields = describe(info)
        if views:
            sent = (view.in_flight.get(str(info.uid), 0) for _, view in views)
            fields["in_flight"] = sum(sent)
        rows.append(fields)
    if sys.stdout.isatty():
        title = f"{_count(len(infos), 'worker')} in {args.namespace!r}" + "".join(
            f", {v.queued} queued{_by_priority(v, ' (%s)')} at {t.address} "
            f"({_count(v.clients, 'client')})"
            for t, v in views
        )
        _print_workers(title, columns, rows)
        return 0
    for fields in rows:
        print(line("worker", {c: fields[c] for c in columns}))
    for target, view in views:
        about = {"address": target.address, "queued": view.queued}
        if by := _by_priority(view, "%s"):
            about["by_priority"] = by.replace(" ", "")
        print(line("dispatcher", about | {"clients": view.clients}))
    return 0


def _by_priority(view: DispatcherView, form: str) -> str:
    """What waits by priority (``10: 3, 0: 20``), highest first, in
    ``form``; empty while every task waiting has priority 0."""
    waiting = sorted(view.queued_by_priority.items(), reverse=True)
    if not any(priority for priority, _ in waiting):
        return ""
    return form % ", ".join(f"{priority}: {n}" for priority, n in waiting)


class DispatcherView(NamedTuple):
    """What one dispatcher answers: what it has sent each worker (by uid),
    how many tasks wait in it, how many clients it serves, and what each
    worker last said it holds for other dispatchers (by uid)."""

    in_flight: dict[str, int]
    queued: int
    clients: int
    others: dict[str, int]
    queued_by_priority: dict[int, int]


def dispatcher_view(locator: Locator) -> DispatcherView | None:
    """The pool's dispatcher's :class:`DispatcherView`, or None when no
    dispatcher answers (of several, one of them)."""
    try:
        return ask_dispatcher(locator, locator.locate_now())
    except PoolNotRunning:
        return None


def _targets(locator: Locator) -> list[Target]:
    """Every dispatcher of the pool (several, on Redis, may serve it)."""
    try:
        return locator.all_now()
    except PoolNotRunning:
        return []


def ask_dispatcher(locator: Locator, target: Target) -> DispatcherView | None:
    """:func:`dispatcher_view` of the dispatcher ``target``."""
    with locator.blocking_channel(target) as channel:
        stub = DispatcherStub(channel)  # type: ignore[no-untyped-call]
        try:
            reply = stub.ListWorkers(
                ListWorkersRequest(),
                metadata=auth.call_metadata(target.token),
                timeout=5,
            )
        except grpc.RpcError:
            return None
    in_flight = {str(uuid.UUID(bytes=s.info.uid)): s.in_flight for s in reply.workers}
    others = {str(uuid.UUID(bytes=s.info.uid)): s.others for s in reply.workers}
    by_priority = dict(reply.queued_by_priority)
    return DispatcherView(in_flight, reply.queued, reply.clients, others, by_priority)


def run_watch(args: argparse.Namespace) -> int:
    view = PlainView()
    seen = 0

    url = remote_url(args)
    events: AsyncIterable[DiscoveryEvent] = Subscriber(args.namespace)
    if url is not None:
        from discovery.redis import RedisSubscriber

        events = RedisSubscriber(url, args.namespace)

    async def follow() -> None:
        nonlocal seen
        async with asyncio.timeout(args.timeout_s):
            async for event in events:
                seen += 1
                view.event(event)

    if url is None and owner_pid(args.namespace) is None:
        print(f"waiting for a pool in namespace {args.namespace!r}", file=sys.stderr)
    try:
        uvloop.run(follow())
    except TimeoutError:
        if not seen:
            raise PoolNotRunning(
                args.namespace, f"none started within {args.timeout_s:g} s"
            ) from None
    return 0


def run_ls(args: argparse.Namespace) -> int:
    if args.clean:
        for namespace in sweep_dead():
            print(f"removed what the dead pool {namespace!r} left")
        for name in reap_registries():  # (of pools of other runtime directories)
            print(f"removed the registry {name} of a dead pool")
        if reaped := owners.reap():
            print(f"removed {len(reaped)} data segments and locks of dead processes")
    rows = []
    for entry in namespaces():
        workers: object = "-"
        if entry.owner_pid is not None:
            with contextlib.suppress(DiscoveryError):
                workers = len(list_workers(entry.namespace))
        rows.append(
            {
                "namespace": entry.namespace,
                "owner": entry.owner_pid or "dead",
                "workers": workers,
                "segment": entry.segment if entry.segment_exists else "-",
                "runtime": entry.directory,
                "data": owners.used_bytes(entry.segment.name),
            }
        )
    # (A namespace's data segments and locks are named after its segment.)
    named = {e.segment.name for e in namespaces()}
    strays = [p for p in _own_segments() if p.name.partition(".")[0] not in named]
    if sys.stdout.isatty():
        _print_table(rows, strays)
        return 0
    for row in rows:
        print(line("pool", row))
    for path in strays:
        print(line("segment", {"path": path, "pool": "unknown"}))
    return 0


def _own_segments() -> list[Path]:
    """This user's pool segments in /dev/shm."""
    try:
        found = list(paths.SHM_DIR.glob(f"{paths.SEGMENT_PREFIX}*"))
    except OSError:
        return []
    mine = []
    for path in found:
        with contextlib.suppress(OSError):
            if path.stat().st_uid == os.geteuid():
                mine.append(path)
    return sorted(mine)


def _print_table(rows: list[dict[str, Any]], strays: list[Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{_count(len(rows), 'pool')} in {paths.runtime_dir()}")
    for column in ("namespace", "owner", "workers", "segment", "runtime", "data"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(str(value) for value in row.values()))
    console = Console()
    console.print(table)
    for path in strays:
        console.print(
            f"{path}: no pool in this runtime directory names it (another "
            f"runtime directory's, or a leak)"
        )


def _count(n: int, noun: str) -> str:
    """``1 pool``, ``2 pools``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _print_workers(title: str, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """The workers as a table that fits the terminal: every column but the
    address whole (the uid left out if need be), and the address shortened
    from the left to what is left (its end tells workers apart: a socket's
    name, a port)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    widths = {c: max([len(c), *(len(str(row[c])) for row in rows)]) for c in columns}
    room = console.width - sum(w + 3 for c, w in widths.items() if c != "address") - 4
    if room < 16 and "uid" in columns:  # (a unix socket's name holds it too)
        columns = [c for c in columns if c != "uid"]
        room += widths.pop("uid") + 3
    room = max(12, room)
    table = Table(title=title)
    for column in columns:
        table.add_column(column, no_wrap=True, min_width=min(widths[column], room))
    for row in rows:
        row = {**row, "address": shorten_left(str(row["address"]), room)}
        table.add_row(*(str(row[c]) for c in columns))
    console.print(table)
