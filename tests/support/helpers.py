"""Starting helper processes and waiting on them, always with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 10.0


class LineReader:
    """Lines of a child's output, read on a thread, taken with a deadline."""

    def __init__(self, stream: Any) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        with contextlib.suppress(ValueError, OSError):  # closed under us
            for line in stream:
                self._lines.put(line)
        self._lines.put("")  # end of output

    def next(self, timeout_s: float = DEADLINE_S) -> str:
        """The next line ('' at the end of output); fails past the deadline."""
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no line within {timeout_s} s") from None
        self.seen.append(line)
        return line

    def drain(self) -> list[str]:
        """Every line already read (without waiting), noted as seen."""
        taken = []
        with contextlib.suppress(queue.Empty):
            while True:
                taken.append(self._lines.get_nowait())
        self.seen += taken
        return taken

    def wait_for(self, prefix: str, timeout_s: float = DEADLINE_S) -> str:
        """The next line starting with ``prefix``, within the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.next(max(0.0, deadline - time.monotonic()))
            if not line:
                raise EOFError(f"output ended before {prefix!r}: {self.seen[-20:]}")
            if line.startswith(prefix):
                return line

    def wait_counts(
        self, wanted: dict[str, int], timeout_s: float = DEADLINE_S
    ) -> list[str]:
        """Lines until, for each prefix, that many lines started with it."""
        deadline = time.monotonic() + timeout_s
        counts = dict.fromkeys(wanted, 0)
        taken = []
        while any(counts[p] < n for p, n in wanted.items()):
            line = self.next(max(0.0, deadline - time.monotonic()))
            if not line:
                raise EOFError(f"output ended before {wanted}: {self.seen[-20:]}")
            taken.append(line)
            for prefix in wanted:
                counts[prefix] += line.startswith(prefix)
        return taken


class Agent:
    """A child Python process that speaks JSON lines on stdin and stdout."""

    def __init__(self, *args: str, prefix: Sequence[str] = ()) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "tests.support.agents", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=ROOT,
            text=True,
            bufsize=1,
        )
        self.pid = self.proc.pid
        self._lines = LineReader(self.proc.stdout)

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout_s: float = DEADLINE_S) -> dict[str, Any]:
        """The next line the agent prints, parsed; fails past the deadline."""
        line = self._lines.next(timeout_s)
        if not line:
            self.proc.wait(DEADLINE_S)
            raise EOFError(f"agent {self.pid} exited: {self.stderr()}")
        message: dict[str, Any] = json.loads(line)
        if "error" in message:
            raise AssertionError(f"agent {self.pid} failed: {message['error']}")
        return message

    def expect(self, kind: str, timeout_s: float = DEADLINE_S) -> dict[str, Any]:
        message = self.read(timeout_s)
        assert message.get("kind") == kind, message
        return message

    def call(self, **command: Any) -> dict[str, Any]:
        self.send(**command)
        return self.expect("ok")

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()

    def stop(self) -> int:
        """Close its stdin (it exits cleanly), killing it past the deadline."""
        if self.proc.stdin and not self.proc.stdin.closed:
            with suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            return self.proc.wait(DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait(DEADLINE_S)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(DEADLINE_S)


@contextmanager
def agent(*args: str, prefix: Sequence[str] = ()) -> Iterator[Agent]:
    """An agent (run under the command ``prefix``, if any) that is stopped,
    or killed, whatever the test does."""
    a = Agent(*args, prefix=prefix)
    try:
        yield a
    finally:
        if a.proc.poll() is None:
            a.kill()
        for stream in (a.proc.stdin, a.proc.stdout, a.proc.stderr):
            if stream is not None:
                with suppress(OSError):
                    stream.close()


def python_module(*args: str, stdin: bool = False) -> subprocess.Popen[str]:
    """``python -m ARGS`` from the project's root, its stdout a text pipe
    (and its stdin, with ``stdin``); stderr is dropped."""
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def wait_until(predicate: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    """Poll ``predicate`` (with back-off) until it holds or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def runs(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    """Live child pids of ``pid`` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(OSError):
            found += [int(p) for p in (task / "children").read_text().split()]
    return found


def run_script(
    directory: Path, name: str, text: str, timeout_s: float = 120
) -> list[str]:
    """Run ``text`` as the script ``name`` in ``directory``, by path from
    another directory (so its module is ``__main__``, with no PYTHONPATH to
    find it by); the lines it printed.

    :raises AssertionError: with its stderr, if it exits with an error.
    """
    script = directory / name
    script.write_text(text)
    elsewhere = directory / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()
