"""The zygote: a pre-imported interpreter every pool process is forked from.

:class:`Zygote` starts a small fork server of ours (:mod:`pool.supervisor.forker`)
as a fresh interpreter that imports :mod:`pool.supervisor.preload` (grpc,
protobuf, uvloop, the worker and the dispatcher, with
``GRPC_ENABLE_FORK_SUPPORT=0``) and creates no gRPC object, loop, thread
or lock. Each child it forks first closes every descriptor it was not
given and starts its own session; only then does the worker's or the
dispatcher's ``main`` create its loop, its locks and its server. A program's
own ``multiprocessing`` forkserver is not touched.

Unlike ``ProcessPoolExecutor``, the caller's ``__main__`` is not imported
again in the child: a pool process runs our code, and needs no
``if __name__ == "__main__"`` guard in the user's script. It does get the
caller's ``sys.path`` and working directory.

A child forked this way is not ours to reap: the fork server reaps it and
writes its exit status to a pipe (the *status pipe*) that :class:`Forked`
watches; signals go through a pidfd opened as soon as the pid is known, so
they never reach a reused pid. Caller: :mod:`pool.supervisor.orchestration`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from pool.errors import PoolError
from pool.supervisor.children import Child, ChildProcess, Process, spawn
from pool.supervisor.forker import STATUS, request_of

log = logging.getLogger("pool.supervisor")

# How the fork server starts: with this process's import path, so that it
# imports the same pool (and the caller's modules resolve as here).
SERVER_CODE: Final = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from pool.supervisor.forker import serve; serve(int(sys.argv[2]))"
)
STOP_GRACE_S: Final = 5.0


class ZygoteUnavailable(PoolError, RuntimeError):
    """The zygote is not running; start the process the slow way."""


class Forked(ChildProcess):
    """A process the zygote forked for us: signalled through a pidfd, and
    its exit status read from the fork server's status pipe."""

    def __init__(self, pid: int, sentinel: int) -> None:
        self.pid = pid
        self._loop = asyncio.get_running_loop()
        self._sentinel = sentinel
        self._returncode: int | None = None
        self._exit: asyncio.Future[int] = self._loop.create_future()
        try:
            self._pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already: its status is on the way
            self._pidfd = -1
        self._loop.add_reader(sentinel, self._on_status)

    @property
    def returncode(self) -> int | None:
        """The exit status once known (``-N`` for signal N)."""
        return self._returncode

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` unless the child has exited."""
        if self._returncode is None and self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def _on_status(self) -> None:
        self._loop.remove_reader(self._sentinel)
        try:
            code = read_status(self._sentinel)
        except (OSError, EOFError):
            # The fork server died before it reaped the child: wait on the
            # pidfd instead; how the child ended is not known.
            code = 255
            if self._pidfd >= 0 and not _exited(self._pidfd):
                self._loop.add_reader(self._pidfd, self._on_orphan_exit)
                return
        self._finish(code)

    def _on_orphan_exit(self) -> None:
        self._loop.remove_reader(self._pidfd)
        self._finish(255)

    def _finish(self, code: int) -> None:
        os.close(self._sentinel)
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        self._returncode = code
        self._exit.set_result(code)


class Zygote:
    """One fork server with the preload imported; see the module docstring.

    ``ready`` is true from a successful :meth:`start` until the server is
    seen dead (:meth:`watch` then starts another).
    """

    def __init__(self, on_change: Callable[[str, int], None] = lambda *_: None) -> None:
        """:param on_change: called with ``("ready", pid)`` each time a
        fork server is warm and ``("exited", pid)`` when one is seen dead."""
        self._on_change = on_change
        self.ready = False
        self.pid = 0
        self._server: subprocess.Popen[bytes] | None = None
        self._channel: socket.socket | None = None  # our end of its socket pair
        self._pidfd = -1  # of the running server

    async def start(self) -> None:
        """Start the fork server and wait until it forks (its imports done).

        :raises ZygoteUnavailable: if it cannot start or fork.
        """
        try:
            await asyncio.to_thread(self._start_server)
            probe = await self._fork(None, None, {})
        except (OSError, EOFError, ValueError) as exc:
            raise ZygoteUnavailable(f"the zygote did not start: {exc}") from exc
        code = await probe.wait()
        if code != 0:
            raise ZygoteUnavailable(f"the zygote's first child exited with {code}")
        self.ready = True
        self._on_change("ready", self.pid)

    def _start_server(self) -> None:
        """Start a fork server (blocking), after reaping one that exited."""
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            argv = [sys.executable, "-c", SERVER_CODE, json.dumps(sys.path)]
            self._server = subprocess.Popen(
                [*argv, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
            )
        self._channel = ours
        self.pid = self._server.pid
        self._pidfd = os.pidfd_open(self.pid)

    async def watch(self) -> None:
        """Restart the fork server whenever it dies, until cancelled."""
        delay = 0.1
        while True:
            if self.ready:
                await _readable(self._pidfd)
                self.ready = False  # meanwhile, children start the slow way
                self._on_change("exited", self.pid)
            with contextlib.suppress(ZygoteUnavailable):
                await self.start()
                delay = 0.1
                continue
            await asyncio.sleep(delay)  # the back-off itself
            delay = min(delay * 2, 10.0)

    async def spawn(self, entry: str, settings: Any, fds: Mapping[str, int]) -> Forked:
        """Fork a child that runs ``entry`` (``"module:function"``, called
        with ``settings``, a dataclass, whose fields named in ``fds`` are set
        to the child's copies of those descriptors; its return value is the
        exit status). ``fds`` stay open here.

        :raises ZygoteUnavailable: if the zygote is not running.
        """
        if not self.ready or _exited(self._pidfd):
            self.ready = False
            raise ZygoteUnavailable("the zygote is not running")
        try:
            return await self._fork(entry, settings, fds)
        except (OSError, EOFError) as exc:
            if _exited(self._pidfd):  # else this one failed, not the zygote
                self.ready = False  # (and watch starts another)
            raise ZygoteUnavailable(f"the zygote did not fork: {exc!r}") from exc

    async def _fork(
        self, entry: str | None, settings: Any, fds: Mapping[str, int]
    ) -> Forked:
        request = request_of(entry, settings, fds)
        launch = asyncio.ensure_future(
            asyncio.to_thread(self._launch, request, list(fds.values()))
        )
        try:
            pid, status = await asyncio.shield(launch)
        except asyncio.CancelledError:
            # The thread still sends ``fds``, which the caller closes once
            # this returns; a child it forks now has no owner: kill it.
            while not launch.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([launch])
            if not launch.cancelled() and launch.exception() is None:
                Forked(*launch.result()).kill()
            raise
        return Forked(pid, status)

    def _launch(self, request: bytes, fds: list[int]) -> tuple[int, int]:
        """Ask the fork server for a child (blocking): its pid, and the
        pipe its exit status will come on."""
        if self._channel is None:
            raise EOFError("the zygote is stopped")
        status, write = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                socket.send_fds(self._channel, [request], [write, *fds])
            finally:
                os.close(write)
            return read_status(status), status
        except BaseException:
            os.close(status)
            raise

    def close(self) -> None:
        """Stop the fork server (blocking; children it forked keep running)."""
        self.ready = False
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        if self._channel is not None:
            # The server exits when it reads the end: a shutdown, which
            # reaches it even where a fork of this process holds the socket.
            with contextlib.suppress(OSError):
                self._channel.shutdown(socket.SHUT_RDWR)
            self._channel.close()
            self._channel = None
        if self._server is not None:
            try:
                self._server.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("the zygote did not stop within %g s: killed", STOP_GRACE_S)
                self._server.kill()
                self._server.wait()
            self._server = None


def read_status(fd: int) -> int:
    """One number the fork server wrote to a status pipe (blocking).

    :raises EOFError: if the pipe closed first.
    """
    data = os.read(fd, STATUS.size)
    if len(data) != STATUS.size:
        raise EOFError("the zygote closed the status pipe")
    return int(STATUS.unpack(data)[0])


def _exited(pidfd: int) -> bool:
    """Whether the process ``pidfd`` names has exited (without waiting)."""
    return bool(select.select([pidfd], [], [], 0)[0])


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def fork_or_spawn(
    zygote: Zygote | None, child: Child, fds: dict[str, int], view: Any
) -> Process:
    """Fork ``child`` from ``zygote``; while it is down, start a fresh
    interpreter instead (slower, and otherwise the same). ``view`` is told
    of a fork that failed."""
    if zygote is not None and zygote.ready:
        try:
            return await zygote.spawn(child.entry, child.settings, fds)
        except ZygoteUnavailable as exc:
            view.note("zygote-failed", name=child.name, error=str(exc))
    return spawn(child.argv(fds), pass_fds=list(fds.values()))
