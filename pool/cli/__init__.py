"""``python -m pool``: start, use, watch and stop a pool.

Each command prints one clear line and exits non-zero on error, never a
traceback. ``up`` owns the pool it starts; the other commands find it by
namespace through the private runtime directory.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import importlib.util
import os
import select
import signal
import sys
import uuid
from collections.abc import AsyncIterable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import uvloop
from grpc import aio

import discovery
from discovery import (
    DiscoveryError,
    DiscoveryEvent,
    Subscriber,
    backends,
    list_workers,
    namespaces,
    owner_pid,
    paths,
    sweep_dead,
)
from discovery.errors import InvalidNamespace
from pool.client.executor import Client
from pool.client.rendezvous import Locator, locate
from pool.dispatcher.queue import MAX_QUEUED
from pool.dispatcher_pb2 import ListWorkersRequest
from pool.dispatcher_pb2_grpc import DispatcherStub
from pool.errors import PoolError, PoolNotRunning
from pool.supervisor.orchestration import Options, Supervisor
from pool.supervisor.view import LiveView, PlainView, View, describe, line
from pool.supervisor.zygote import sweep_temp_dirs
from workers.protocol import auth
from workers.protocol.codec import MAX_ARGS_BYTES
from workers.protocol.errors import BadTask, TaskError
from workers.serving import LOOPBACK, MAX_ARGS_LIMIT, CannotListen, check_host

DOWN_TIMEOUT_S = 60.0
TICK_S = 1.0  # how often `up` asks the dispatcher for its queue length


class UsageError(Exception):
    """A command-line argument that cannot be used as given."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pool",
        description="A local worker pool whose workers find each other through "
        "shared memory. Start one with `up`, use it with `submit` or "
        "pool.Client, stop it with `down` (or Ctrl-C).",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {discovery.__version__}"
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
        help="worker processes `pool up` starts and keeps (default: one per CPU; "
        "0 is allowed with --discovery or --external-workers, for a pool whose "
        "workers all join from elsewhere)",
    )
    up.add_argument(
        "--external-workers",
        action="store_true",
        help="workers also join from elsewhere on this machine (`python -m "
        "workers -n NAMESPACE`, say in containers that share its IPC namespace "
        "and runtime directory): allows --workers 0",
    )
    up.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="tasks each worker runs at once (default 1)",
    )
    up.add_argument("--tags", default="", help="comma-separated worker tags")
    up.add_argument(
        "--path",
        action="append",
        default=[],
        metavar="DIR",
        help="add a directory workers import task modules from (repeatable); "
        "the directory `pool up` runs in is always one, after those given",
    )
    up.add_argument(
        "--discovery",
        metavar="URL",
        help="register workers in Redis at redis://HOST:PORT instead of this "
        "machine's shared memory, so workers on other hosts can join (default: "
        "shared memory)",
    )
    up.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="the CA that signed the certificates of workers serving TLS "
        "(`python -m workers --tls-cert ... --tls-key ...`); once given, the "
        "dispatcher takes no worker on TCP without TLS (default: the system's "
        "roots, and plain-text workers are taken)",
    )
    up.add_argument(
        "--token-file",
        metavar="PATH",
        help="use the token in PATH (shared with workers on other hosts, which "
        "read it with `python -m workers --token-file`) instead of a fresh one; "
        "$SHMPOOL_TOKEN also gives it",
    )
    up.add_argument(
        "--reload",
        action="store_true",
        help="a worker imports a task's module again when its source file has "
        "changed, so an edit takes effect without a restart (only that module, "
        "not the ones it imports)",
    )
    up.add_argument(
        "--host",
        nargs="?",
        const=LOOPBACK,
        help=f"listen on TCP instead of unix sockets, at HOST (default {LOOPBACK}, "
        "this machine only; any other address exposes the pool: read SECURITY.md)",
    )
    up.add_argument(
        "--port",
        type=int,
        default=0,
        help="with --host: the dispatcher's TCP port, where clients connect "
        "(default: a free one)",
    )
    up.add_argument(
        "--advertise",
        metavar="HOST[:PORT]",
        help="with --host and --discovery: the dispatcher's address that clients "
        "of other machines are given, for NAT and containers (default: the bound "
        "address, or this host's name when --host is 0.0.0.0 or ::)",
    )
    up.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="with --host: serve TLS on the TCP ports with this certificate (and "
        "--tls-key): the dispatcher's, for clients of other machines (this "
        "machine's use its unix socket), and its workers'",
    )
    up.add_argument("--tls-key", metavar="PEM", help="the key of --tls-cert")
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
    up.add_argument(
        "--stuck-grace-s",
        type=float,
        default=60.0,
        help="replace a worker whose every thread is held by a task that timed "
        "out or was cancelled, once it has been so this long (default 60)",
    )
    up.add_argument(
        "--max-queued",
        type=int,
        default=MAX_QUEUED,
        help="tasks that may wait for a worker in the dispatcher; past it, "
        f"clients wait to send more (default {MAX_QUEUED})",
    )
    up.set_defaults(run=cmd_up)

    submit = commands.add_parser(
        "submit",
        help="run one task and print its result",
        description="Run MODULE:FUNC(ARG, ..., NAME=ARG, ...) in the pool and print "
        "the result's repr. Each ARG is a Python literal: 42, 'text', [1, 2], "
        "{'a': 1}; NAME=ARG passes it by keyword (after the positional ones). "
        "Exits 1 if the task raises, saying what it raised.",
    )
    _namespace(submit)
    _remote(submit)
    submit.add_argument("function", metavar="MODULE:FUNC")
    submit.add_argument("args", nargs="*", metavar="ARG")
    submit.add_argument(
        "--timeout-s",
        type=float,
        metavar="SECONDS",
        help="fail the task if it runs longer than this (default: no limit)",
    )
    submit.set_defaults(run=cmd_submit)

    workers = commands.add_parser(
        "workers",
        help="list the registered workers (read from shared memory), with what "
        "the dispatcher has sent each and has queued",
        description="List the workers registered in NAMESPACE's shared memory, "
        "one line each (a table on a terminal): pid, address, status, tasks "
        "running and done, and how many the dispatcher has sent each; then "
        "how many tasks wait in the dispatcher.",
    )
    _namespace(workers)
    _remote(workers)
    workers.set_defaults(run=cmd_workers)

    watch = commands.add_parser(
        "watch",
        help="print worker events as they happen (Ctrl-C to stop)",
        description="Print each worker-added, worker-updated and worker-dropped "
        "event of NAMESPACE as it happens, one line each, until Ctrl-C. A "
        "namespace with no pool yet is waited for.",
    )
    _namespace(watch)
    _remote(watch, token=False)
    watch.add_argument(
        "--timeout-s",
        type=float,
        metavar="SECONDS",
        help="stop after this long; exit 1 if no pool showed a worker by then "
        "(default: until Ctrl-C)",
    )
    watch.set_defaults(run=cmd_watch)

    down = commands.add_parser(
        "down",
        help="drain and stop a running pool",
        description="Ask the pool of NAMESPACE to drain and stop (as Ctrl-C on "
        "`pool up` does), and wait until it has. With no pool running there is "
        "nothing to stop: it says so and exits 0.",
    )
    _namespace(down)
    down.add_argument(
        "--timeout-s",
        type=float,
        default=DOWN_TIMEOUT_S,
        metavar="SECONDS",
        help="how long to wait for it to stop (default 60)",
    )
    down.set_defaults(run=cmd_down)

    ls = commands.add_parser(
        "ls",
        help="list this user's pools, and what dead ones left",
        description="List every pool in this user's runtime directory: its "
        "namespace, owner pid (or `dead` for leftovers of a pool that was "
        "killed), workers, shared-memory segment and runtime directory, so a "
        "segment seen in /dev/shm can be traced to its pool. Segments of this "
        "user that no pool here names are listed too (another runtime "
        "directory's, or a leak).",
    )
    ls.add_argument(
        "--clean",
        action="store_true",
        help="remove what dead pools left (segments and files); live pools "
        "are never touched",
    )
    ls.set_defaults(run=cmd_ls)

    bench = commands.add_parser(
        "bench",
        help="measure speed and memory, side by side with the standard pools",
        description="Run the standard benchmark set (start, round trip, submit "
        "and map throughput, CPU-bound work, memory, replacement of a killed "
        "worker) against a pool started in this process, or a running one "
        "with --namespace, and print medians; with --peers, beside "
        "ProcessPoolExecutor and multiprocessing.Pool of as many workers, as "
        "ratios. See benchmarks/README.md for what each figure means.",
    )
    bench.add_argument(
        "-n",
        "--namespace",
        help="measure this running pool (default: start one in this process; "
        "start, replacement and CPU-bound figures need that)",
    )
    bench.add_argument(
        "--workers", type=int, default=8, help="workers of each pool (default 8)"
    )
    bench.add_argument(
        "--runs", type=int, default=3, help="runs to take the median of (default 3)"
    )
    bench.add_argument(
        "--tasks",
        type=int,
        default=100_000,
        help="no-op tasks of the map figure (default 100000)",
    )
    bench.add_argument(
        "--peers",
        action="store_true",
        help="measure ProcessPoolExecutor and multiprocessing.Pool too",
    )
    bench.add_argument(
        "--chart",
        metavar="PNG",
        help="also write a bar chart of the ratios (needs --peers and the "
        "`bench` extra: pip install 'shm-pool[bench]')",
    )
    bench.set_defaults(run=cmd_bench)
    return parser


def _namespace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n",
        "--namespace",
        default="default",
        help="the pool's namespace (default: default)",
    )


def _remote(parser: argparse.ArgumentParser, *, token: bool = True) -> None:
    """Options to reach a pool of another machine through its Redis."""
    parser.add_argument(
        "--discovery",
        metavar="URL",
        help="reach the pool through the Redis it registers in (`pool up "
        "--discovery redis://HOST:PORT`), from any machine (default: the pool "
        "of this machine)",
    )
    if token:
        parser.add_argument(
            "--token-file",
            metavar="PATH",
            help="with --discovery: the pool's token (else $SHMPOOL_TOKEN, else "
            "this machine's pool's)",
        )
        parser.add_argument(
            "--tls-ca",
            metavar="PEM",
            help="with --discovery: the CA of a dispatcher that serves TLS "
            "(`pool up --tls-cert`; default: the system's roots)",
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        # (`bench` has none by default, and `ls` none at all)
        if getattr(args, "namespace", None) is not None:
            try:
                paths.validate_namespace(args.namespace)
            except InvalidNamespace as exc:
                raise UsageError(str(exc)) from None
        return run(args)
    except KeyboardInterrupt:
        return 130
    except UsageError as exc:  # argparse's convention: 2 for how it was called
        print(f"pool: error: {exc}", file=sys.stderr)
        return 2
    except (PoolError, DiscoveryError, TaskError, OSError) as exc:
        print(f"pool: error: {exc}", file=sys.stderr)
        return 1


def cmd_bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pool import bench

    if args.workers < 1 or args.runs < 1 or args.tasks < 1:
        raise UsageError("--workers, --runs and --tasks must be at least 1")
    if args.chart and not args.peers:
        raise UsageError("--chart draws the ratios to the peers: add --peers")
    if args.chart and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--chart needs matplotlib: pip install 'shm-pool[bench]'")
    if args.namespace is not None:
        Client(args.namespace).shutdown()  # a clear error if it is not running
    settings = bench.Settings(
        workers=args.workers,
        runs=args.runs,
        tasks=args.tasks,
        namespace=args.namespace,
        peers=args.peers,
    )
    console = Console()
    results = bench.run(settings, console)
    console.print(bench.table(results, settings))
    if args.chart:
        bench.chart(results, args.chart)
        console.print(f"chart: {args.chart}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    if not 0 <= args.max_args_bytes <= MAX_ARGS_LIMIT:
        raise UsageError(f"--max-args-bytes must be 0 to {MAX_ARGS_LIMIT}")
    if args.host is not None:
        try:
            check_host(args.host)
        except CannotListen as exc:
            raise UsageError(f"--host: {exc}") from None
    elif args.port or args.advertise or args.tls_cert:
        raise UsageError("--port, --advertise and --tls-cert go with --host (TCP)")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0 to 65535, got {args.port}")
    try:
        options = Options(
            namespace=args.namespace,
            workers=args.workers,
            external_workers=args.external_workers,
            concurrency=args.concurrency,
            tags=tuple(t for t in args.tags.split(",") if t),
            host=args.host,
            port=args.port,
            advertise=args.advertise,
            restart=not args.no_restart,
            grace_s=args.grace_s,
            capacity=args.capacity,
            no_worker_timeout_s=args.no_worker_timeout_s,
            max_args_bytes=args.max_args_bytes,
            stuck_grace_s=args.stuck_grace_s,
            max_queued=args.max_queued,
            capture_output=True,
            paths=_import_paths(args.path),
            reload=args.reload,
            discovery_url=args.discovery,
            token_file=args.token_file,
            tls_ca=os.path.abspath(args.tls_ca) if args.tls_ca else None,
            tls=(os.path.abspath(args.tls_cert), os.path.abspath(args.tls_key))
            if args.tls_cert
            else None,
        )
    except ValueError as exc:
        raise UsageError(f"{exc} (see --help)") from None
    backends.check_reachable(options.discovery_url)  # (before any process)
    view: View
    if sys.stdout.isatty():
        view = LiveView(args.namespace, paths=options.paths)
    else:
        view = PlainView()
    try:
        uvloop.run(_up(options, view))
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
    if not isinstance(view, LiveView):  # plain lines show no queue: no ticker
        await Supervisor(options, view).run(stop, kill_now)
        return
    try:
        async with asyncio.TaskGroup() as group:
            ticking = group.create_task(_tick(options.namespace, view))
            try:
                await Supervisor(options, view).run(stop, kill_now)
            finally:
                ticking.cancel()
    except BaseExceptionGroup as group:  # (the ticker never fails)
        raise group.exceptions[0] from None


async def _tick(namespace: str, view: View) -> None:
    """Once a second, tell the view the dispatcher's queue length."""
    channel: aio.Channel | None = None
    address = ""
    try:
        while True:
            await asyncio.sleep(TICK_S)  # a ticker, not a wait for an event
            queued = None
            try:
                where, token = locate(namespace)
                if where != address or channel is None:
                    if channel is not None:
                        await channel.close()
                    address, channel = where, aio.insecure_channel(where)
                stub = DispatcherStub(channel)  # type: ignore[no-untyped-call]
                reply = await stub.ListWorkers(
                    ListWorkersRequest(),
                    metadata=auth.call_metadata(token),
                    timeout=TICK_S,
                )
                queued = reply.queued
            except (PoolError, aio.AioRpcError):
                pass  # not up yet, or stopping: the view says "?"
            view.tick(queued)
    finally:
        if channel is not None:
            await channel.close()


def cmd_submit(args: argparse.Namespace) -> int:
    positional, keywords = _call(args.args)
    client = Client(
        args.namespace,
        task_timeout_s=args.timeout_s,
        discovery_url=_url(args),
        token_file=args.token_file,
        tls_ca=args.tls_ca,
    )
    try:
        result = client.submit(args.function, *positional, **keywords).result()
    except (PoolError, BadTask):
        raise
    except (Exception, SystemExit) as exc:  # (the task's own SystemExit too)
        text = " ".join(str(exc).split())
        print(f"pool: the task raised {type(exc).__name__}: {text}", file=sys.stderr)
        return 1
    finally:
        client.shutdown()
    sys.set_int_max_str_digits(0)  # the whole number, however long
    try:
        printed = repr(result)
    except Exception as exc:
        raise PoolError(
            f"the task's result (a {type(result).__name__}) cannot be printed: "
            f"its repr raised {type(exc).__name__}"
        ) from None
    print(printed)
    return 0


def _call(texts: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments from ``ARG`` and ``NAME=ARG`` texts."""
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    for text in texts:
        name, equals, value = text.partition("=")
        if equals and name.isidentifier():
            keywords[name] = _literal(value)
        elif keywords:
            raise UsageError(f"positional argument {text!r} follows a keyword one")
        else:
            positional.append(_literal(text))
    return positional, keywords


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise UsageError(
            f"argument {text!r} is not a Python literal; quote text as \"'{text}'\""
        ) from None


def _url(args: argparse.Namespace) -> str | None:
    try:
        return backends.check_url(args.discovery)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_workers(args: argparse.Namespace) -> int:
    locator = Locator(args.namespace, _url(args), args.token_file, args.tls_ca)
    if locator.discovery_url is None:
        if owner_pid(args.namespace) is None:
            raise PoolNotRunning(args.namespace)
        infos = list_workers(args.namespace)
    else:
        from discovery.redis import registered

        backends.check_reachable(locator.discovery_url)
        infos = registered(locator.discovery_url, args.namespace)
    infos = sorted(infos, key=lambda info: (info.pid, info.address))
    routing = _dispatcher_view(locator)
    columns = ["pid", "uid", "address", "status", "running", "done"]
    if routing is not None:
        columns.append("in_flight")
    rows = []
    for info in infos:
        fields = describe(info)
        if routing is not None:
            fields["in_flight"] = routing[0].get(str(info.uid), 0)
        rows.append(fields)
    queued = f", {routing[1]} queued" if routing is not None else ""
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(infos)} workers in {args.namespace!r}{queued}")
        for column in columns:
            table.add_column(column)
        for fields in rows:
            table.add_row(*(str(fields[c]) for c in columns))
        Console().print(table)
        return 0
    for fields in rows:
        print(line("worker", {c: fields[c] for c in columns}))
    if routing is not None:
        print(line("dispatcher", {"queued": routing[1]}))
    return 0


def _dispatcher_view(locator: Locator) -> tuple[dict[str, int], int] | None:
    """What the dispatcher has sent each worker (by uid) and has queued, or
    None when no dispatcher answers."""
    try:
        target = locator.locate_now()
        channel = (
            grpc.secure_channel(target.address, locator.credentials())
            if target.tls
            else grpc.insecure_channel(target.address)
        )
    except PoolNotRunning:
        return None
    with channel:
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
    return in_flight, reply.queued


def cmd_watch(args: argparse.Namespace) -> int:
    view = PlainView()
    seen = 0

    url = _url(args)
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


def cmd_ls(args: argparse.Namespace) -> int:
    if args.clean:
        for namespace in sweep_dead():
            print(f"removed what the dead pool {namespace!r} left")
        sweep_temp_dirs()
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
            }
        )
    named = {e.segment.name for e in namespaces()}
    strays = [p for p in _own_segments() if p.name not in named]
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

    table = Table(title=f"{len(rows)} pools in {paths.runtime_dir()}")
    for column in ("namespace", "owner", "workers", "segment", "runtime"):
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


def cmd_down(args: argparse.Namespace) -> int:
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
