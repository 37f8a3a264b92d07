"""Starting the supervisor's children, hearing them say READY, and ending them.

Children are usually forked by the zygote (:mod:`pool.supervisor.zygote`); :func:`spawn`
is the slow way, used while the zygote is down: a fresh interpreter,
started with :class:`subprocess.Popen`, which on Linux
execs through ``vfork``: no ``pthread_atfork`` handler runs in between.
The event loop's own spawn (libuv's ``fork``) runs them, and gRPC registers
handlers whenever it was imported before ``GRPC_ENABLE_FORK_SUPPORT=0`` was
set, as in a program that imports grpc before pool; such children crashed
before they could exec. A child's exit is awaited on a pidfd, so any number
of coroutines may wait for it. Caller: the supervisor
(:mod:`pool.supervisor.orchestration`), on its loop.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, Self

from discovery.errors import Facts
from pool.errors import PoolError
from workers.common.pipes import first_line
from workers.common.serving import READY_PREFIX
from workers.common.spec import to_argv
from workers.initializer import INIT_FAILED_PREFIX
from workers.protocol.worker_pb2 import Failure

START_TIMEOUT_S: Final = 30.0
BACKOFF_S: Final = (0.1, 10.0)  # first delay, cap
DISPATCHER_STOP_S: Final = 15.0  # it waits for its last results, then ends
# After a second Ctrl-C the workers are killed at once, but the dispatcher
# still gets this long to tell each client how its tasks ended.
HURRIED_DISPATCHER_STOP_S: Final = 2.0


@dataclass(eq=False)
class Child:
    """A process the supervisor starts and restarts, and what it said when
    ready. ``entry`` (``module:function``) is what the zygote runs with
    ``settings``; the slow way runs ``python -m module`` with the same
    settings as flags (:func:`workers.settings.to_argv`)."""

    name: str
    entry: str
    settings: Any  # WorkerSettings or DispatcherSettings, descriptors aside
    process: Process | None = None
    ready: dict[str, Any] = field(default_factory=dict)
    failures: int = 0

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else 0

    @property
    def kind(self) -> str:
        return self.name.split("-")[0]

    @property
    def label(self) -> str:
        """How its output is prefixed: ``w3`` for worker-3."""
        kind, _, number = self.name.partition("-")
        return f"w{number}" if kind == "worker" else kind

    def argv(self, fds: dict[str, int]) -> list[str]:
        """The command line that starts it the slow way, given ``fds``."""
        module = self.entry.partition(":")[0]
        given = dataclasses.replace(self.settings, **fds)
        return [sys.executable, "-m", module, *to_argv(given)]


def restart_delay(failures: int) -> float:
    """Seconds before restarting a child that failed to start ``failures``
    times in a row: none for the first restart, then 0.1 s doubling to 10 s."""
    if failures <= 0:
        return 0.0
    first, cap = BACKOFF_S
    return float(min(cap, first * 2 ** (failures - 1)))


def next_start(child: Child, *, restart: bool, stopping: bool) -> float | None:
    """After ``child`` exited: how long to wait before starting it again, or
    None not to (the pool is stopping, or restarts are off). Back off only
    for a child that died before it was ready (counted in ``failures``); one
    that served is replaced at once, and its count starts again."""
    if stopping or not restart:
        return None
    child.failures = 0 if child.ready else child.failures + 1
    return restart_delay(child.failures)


@dataclass
class ChildPipes:
    """The pipes a child is started with (:meth:`open`). It is given the
    write ends (``given``, by setting name) and the control pipe's read end;
    the supervisor keeps ``ready`` (its READY line), and for the dispatcher
    ``report`` (its reports) and ``control`` (the write end of its orders),
    and with captured output, ``output``. -1: none."""

    given: dict[str, int]
    ready: int
    report: int = -1
    output: int = -1
    control: int = -1

    @classmethod
    def open(cls, parent_fd: int, *, dispatcher: bool, output: bool) -> Self:
        """``parent_fd``: the supervisor's pidfd on itself, which it keeps."""
        ready, ready_write = os.pipe()
        pipes = cls({"ready_fd": ready_write, "parent_fd": parent_fd}, ready)
        if dispatcher:
            pipes.given["control_fd"], pipes.control = os.pipe()
            pipes.report, pipes.given["report_fd"] = os.pipe()
        if output:
            pipes.output, pipes.given["output_fd"] = os.pipe()
        return pipes

    def close_given(self) -> None:
        """Close the child's ends here (it has its own now, or never will)."""
        for name, fd in self.given.items():
            if name != "parent_fd":  # (the supervisor's own, for every child)
                os.close(fd)

    def close_kept(self) -> None:
        """Close the ends kept for a child that did not start."""
        for fd in (self.ready, self.report, self.output):
            if fd >= 0:
                os.close(fd)


class ChildFailed(PoolError):
    """A child process exited or hung before it was ready."""


class InitializerFailedInChild(Facts, ChildFailed):
    """A worker's initializer raised: ``failure`` (a serialized Failure of
    InitializerFailed, in base64) is what it reported."""

    name: str
    failure: str

    def __str__(self) -> str:
        message = Failure.FromString(base64.b64decode(self.failure)).message
        return f"{self.name}: {message}"


MAX_INITIALIZER_FAILURES: Final = 3


class InitializerFailures:
    """Workers whose initializer failed, in a row: at
    :data:`MAX_INITIALIZER_FAILURES` the pool is ``broken`` (it starts no
    more workers, and its dispatcher fails every task with the failure)."""

    def __init__(self) -> None:
        self.in_a_row = 0
        self.broken: str | None = None  # the failure, once broken

    def failed(self, failure: str) -> bool:
        """Count one; whether the pool is broken now (and was not)."""
        self.in_a_row += 1
        if self.broken is None and self.in_a_row >= MAX_INITIALIZER_FAILURES:
            self.broken = failure
            return True
        return False

    def succeeded(self) -> None:
        self.in_a_row = 0


class Process(Protocol):
    """A child process: started the slow way (:class:`Spawned`) or forked by
    the zygote (:class:`pool.supervisor.zygote.Forked`)."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def send_signal(self, signum: int) -> None: ...

    def kill(self) -> None: ...


class ChildProcess:
    """What both kinds of child share: an exit to wait for, and a kill."""

    pid: int
    _exit: asyncio.Future[int]

    async def wait(self) -> int:
        """Wait for the child to exit; its status."""
        return await asyncio.shield(self._exit)

    def send_signal(self, signum: int) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Spawned(ChildProcess):
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

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` unless the child has been reaped."""
        if self._popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

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


async def read_ready(fd: int, process: Process, name: str) -> dict[str, Any]:
    """The READY line a child writes to ``fd`` (which this closes).

    :raises ChildFailed: if it exits first, or says nothing in time.
    """
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            text = await first_line(fd)
    except TimeoutError:
        raise ChildFailed(
            f"{name} was not ready within {START_TIMEOUT_S:g} s"
        ) from None
    finally:
        os.close(fd)
    if text.startswith(READY_PREFIX):
        return json.loads(text[len(READY_PREFIX) :])  # type: ignore[no-any-return]
    if text.startswith(INIT_FAILED_PREFIX):
        await process.wait()
        raise InitializerFailedInChild(name, text[len(INIT_FAILED_PREFIX) :].strip())
    code = await process.wait()
    raise ChildFailed(f"{name} exited before it was ready ({describe_exit(code)})")


async def terminate(
    processes: Sequence[Process], grace_s: float, kill_now: asyncio.Event
) -> None:
    """SIGTERM, wait up to ``grace_s`` (or until ``kill_now``), SIGKILL, reap."""
    alive = [p for p in processes if p.returncode is None]
    for process in alive:
        process.send_signal(signal.SIGTERM)
    async with asyncio.TaskGroup() as group:
        exited = group.create_task(_wait_all(alive))
        hurry = group.create_task(kill_now.wait())
        await asyncio.wait(
            {exited, hurry}, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED
        )
        hurry.cancel()
        for process in alive:
            process.kill()


async def stop_dispatcher(process: Process, kill_now: asyncio.Event) -> None:
    """Stop the dispatcher, which first delivers the results it has: it gets
    :data:`DISPATCHER_STOP_S`, or :data:`HURRIED_DISPATCHER_STOP_S` once
    ``kill_now`` is set."""
    if kill_now.is_set():
        grace_s, hurry = HURRIED_DISPATCHER_STOP_S, asyncio.Event()
    else:
        grace_s, hurry = DISPATCHER_STOP_S, kill_now
    await terminate([process], grace_s, hurry)


async def kill(process: Process) -> None:
    """SIGKILL ``process`` and reap it."""
    process.kill()
    await process.wait()


async def _wait_all(processes: Sequence[Process]) -> None:
    for process in processes:
        await process.wait()


def describe_exit(code: int) -> str:
    """How a child ended, in words: ``exit code 3``, ``killed by SIGKILL``."""
    return (
        f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    )


def exit_fields(code: int) -> dict[str, Any]:
    """How a child ended, as fields of a view line."""
    return {"signal": signal.Signals(-code).name} if code < 0 else {"code": code}
