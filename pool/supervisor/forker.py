"""The zygote's own side: a small fork server, and what a child it forks
runs first.

The supervisor (:class:`pool.supervisor.zygote.Zygote`) starts this as a
fresh interpreter, with one end of a ``SOCK_SEQPACKET`` socket pair as its
only channel, and :func:`serve` imports :mod:`pool.supervisor.preload`
and then waits. Each request is one message: a :class:`Request`, pickled,
with descriptors passed beside it (``socket.send_fds``): first the write
end of a *status pipe* of the caller's, then those the child is given.
The server forks; the parent writes the child's pid to the status pipe,
and, once it reaps the child (on ``SIGCHLD``, through the signal wakeup
descriptor), its exit status (``-N`` for signal N), then closes it.

The socket pair has no name in the file system, and only the supervisor
holds its end (and, with it, whatever the supervisor's process forks
itself), so there is nothing to authenticate and nothing to clean up.
The server exits when the supervisor's end closes or is shut down (the
supervisor stopped it), or when the supervisor dies (its pidfd); the
children it forked keep running, and their status pipes close unwritten.
Only public means are used: ``os.fork``, ``socket.send_fds``/``recv_fds``,
``signal.set_wakeup_fd``, ``os.pidfd_open``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import selectors
import shlex
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import setproctitle

from workers.common.spec import to_argv

STATUS: Final = struct.Struct("q")  # a pid, then an exit status
MAX_REQUEST: Final = 1 << 20  # bytes of one pickled request
MAX_FDS: Final = 64  # descriptors passed with one request


class Request(NamedTuple):
    """What a child runs: ``entry`` (``"module:function"``, or None for a
    probe that exits at once), called with ``settings`` (a dataclass)
    whose fields ``fields`` are set to the descriptors passed, in order;
    and where: the caller's import path and working directory."""

    entry: str | None
    settings: Any
    fields: tuple[str, ...]
    sys_path: tuple[str, ...]
    cwd: str


def request_of(entry: str | None, settings: Any, fds: Mapping[str, int]) -> bytes:
    """A request, as sent: this process's import path (``""`` made the
    working directory, as it means now) and working directory."""
    cwd = os.getcwd()
    sys_path = tuple(cwd if p == "" else p for p in sys.path)
    return pickle.dumps(Request(entry, settings, tuple(fds), sys_path, cwd))


def serve(channel_fd: int) -> None:
    """The fork server's main: fork a child per request until the channel
    closes or the supervisor (its parent) ends. Runs in the zygote process.

    (A process the supervisor forked, a ``ProcessPoolExecutor``'s worker
    say, holds the supervisor's end of the channel too: the supervisor
    shuts the socket down to stop this, and if it is killed, its pidfd
    says so.)"""
    import pool.supervisor.preload  # noqa: F401  (before any fork)

    channel = socket.socket(fileno=channel_fd)
    parent = os.pidfd_open(os.getppid())
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (the wakeup fd is what counts)
    waiting: dict[int, int] = {}  # pid -> its status pipe
    with selectors.DefaultSelector() as selector:
        selector.register(channel, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        selector.register(parent, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj == wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 4096)
                    _reap(waiting)
                elif key.fileobj == parent or not _serve_one(channel, waiting):
                    for status in waiting.values():
                        os.close(status)
                    return


def _serve_one(channel: socket.socket, waiting: dict[int, int]) -> bool:
    """Fork the child one request asks for; False once the channel closed."""
    try:
        data, fds, _, _ = socket.recv_fds(channel, MAX_REQUEST, MAX_FDS)
    except ConnectionError:
        return False
    if not data:
        return False
    status, given = fds[0], fds[1:]
    pid = os.fork()
    if pid == 0:
        _child(data, given)
    for fd in given:
        os.close(fd)
    with contextlib.suppress(OSError):  # (a caller that gave up reads nothing)
        os.write(status, STATUS.pack(pid))
    waiting[pid] = status
    _reap(waiting)
    return True


def _reap(waiting: dict[int, int]) -> None:
    """Write the status of every child that exited to its pipe."""
    while waiting:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status = waiting.pop(pid)
        with contextlib.suppress(OSError):
            os.write(status, STATUS.pack(os.waitstatus_to_exitcode(code)))
        os.close(status)


def _child(data: bytes, given: list[int]) -> None:
    """In the forked child: never returns to the server's loop."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        code = _enter(pickle.loads(data), given)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _enter(request: Request, given: list[int]) -> int:
    """Shed what the zygote held, take the caller's path and directory,
    then run the entry: its exit status."""
    keep = {0, 1, 2, *given}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            with contextlib.suppress(OSError):  # (listdir's own, now closed)
                os.close(int(name))
    null = os.open(os.devnull, os.O_RDONLY)  # stdin: not the zygote's
    os.dup2(null, 0)
    os.close(null)
    os.setsid()
    sys.path[:] = request.sys_path
    os.chdir(request.cwd)
    if request.entry is None:  # the probe that tells the zygote is warm
        return 0
    fds = dict(zip(request.fields, given, strict=True))
    settings = dataclasses.replace(request.settings, **fds)
    module, _, function = request.entry.partition(":")
    # What `ps` shows: the command that would have started it the slow way.
    setproctitle.setproctitle(
        shlex.join([sys.executable, "-m", module, *to_argv(settings)])
    )
    run = getattr(__import__(module, fromlist=[function]), function)
    return _exit_code(run(settings))


def _exit_code(code: object) -> int:
    """As the interpreter reads ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
