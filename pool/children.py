"""Starting the supervisor's children and waiting for them on the loop.

:func:`spawn` starts a child with :class:`subprocess.Popen`, which on Linux
execs through ``vfork``: no ``pthread_atfork`` handler runs in between.
The event loop's own spawn (libuv's ``fork``) runs them, and gRPC registers
handlers whenever it was imported before ``GRPC_ENABLE_FORK_SUPPORT=0`` was
set, as in a program that imports grpc before pool; such children crashed
before they could exec. A child's exit is awaited on a pidfd, so any number
of coroutines may wait for it. Caller: :mod:`pool.supervisor`, on its loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence


class Spawned:
    """A child process started by :func:`spawn`; reaped once it exits."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._loop = asyncio.get_running_loop()
        self._exit: asyncio.Future[int] = self._loop.create_future()
        self._fd = os.pidfd_open(popen.pid)  # our unreaped child: never reused
        self._loop.add_reader(self._fd, self._on_exit)

    @property
    def returncode(self) -> int | None:
        """The exit status once it has been reaped (``-N`` for signal N)."""
        return self._popen.returncode

    async def wait(self) -> int:
        """Wait for the child to exit; its status."""
        return await asyncio.shield(self._exit)

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` unless the child has been reaped."""
        if self._popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _on_exit(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._exit.set_result(self._popen.wait())  # exited: returns at once


def spawn(argv: Sequence[str], *, pass_fds: Sequence[int] = ()) -> Spawned:
    """Start ``argv`` in a session of its own, stdin from /dev/null, and
    stdout and stderr shared with this process."""
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
    )
    return Spawned(popen)
