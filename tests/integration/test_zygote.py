"""Pool processes are forked from the zygote, inherit nothing they should
not, and still start (the slow way) while a dead zygote is restarted."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from discovery import list_workers
from pool import Client
from tests.support import sample_tasks
from tests.support.helpers import ROOT, run_script, runs, wait_until
from tests.support.pools import RunningPool, processes_mentioning, running_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

_SYS_KCMP, _KCMP_FILE = 312, 0  # x86-64
_libc = ctypes.CDLL(None, use_errno=True)


def same_open_file(pid_a: int, fd_a: int, pid_b: int, fd_b: int) -> bool:
    """Whether two descriptors are one open file (kcmp(2)): what a fork
    shares, where opening the same path twice does not."""
    return bool(_libc.syscall(_SYS_KCMP, pid_a, pid_b, _KCMP_FILE, fd_a, fd_b) == 0)


def fds_of(pid: int) -> list[int]:
    return [int(name) for name in os.listdir(f"/proc/{pid}/fd")]


def ppid_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def gone(pid: int) -> bool:
    """Whether ``pid`` is reaped (not even a zombie is left)."""
    return not Path(f"/proc/{pid}").exists()


def state_of(pid: int) -> str:
    """R (running), S (waiting), Z (a zombie), ... (Linux /proc)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def field(line: str, name: str) -> int:
    return int(line.split(f"{name}=")[1].split()[0])


def inherited(child: int, ancestors: list[int]) -> Iterator[tuple[int, str]]:
    """The child's descriptors that are open files of an ancestor, other
    than stdout, stderr and the pidfd of its supervisor (``--parent-fd``)."""
    for fd in fds_of(child):
        if fd in (1, 2):
            continue
        try:
            target = os.readlink(f"/proc/{child}/fd/{fd}")
        except FileNotFoundError:  # closed since it was listed: not inherited
            continue
        shared = [
            (pid, theirs)
            for pid in ancestors
            for theirs in fds_of(pid)
            if same_open_file(child, fd, pid, theirs)
        ]
        if shared and target != "anon_inode:[pidfd]":
            yield fd, target
        if target == "anon_inode:[pidfd]" and not shared:
            yield fd, "a pidfd that is not its supervisor's"


def first_zygote(up: RunningPool) -> int:
    return next(field(line, "pid") for line in up.lines.seen if "zygote-ready" in line)


def workers_started(up: RunningPool) -> list[int]:
    return [field(line, "pid") for line in up.lines.seen if "worker-started" in line]


# Killed a round: a task of one may go to the other before its death is seen,
# and count an attempt on each (a slot was free for it), but never a third.
# (With all 16 at once, one task could go from corpse to corpse and rightly
# fail with WorkerLost in one round: seen once in ten loaded runs.)
KILLED_A_ROUND = 2


def test_forked_workers_inherit_nothing_through_64_replacements(
    namespace: str, tmp_path: Path
) -> None:
    """Of 16 workers, two are SIGKILLed at a time, 32 times, while 100 tasks
    that wait for a file hold every worker: each of the 64 replacements is
    forked by the zygote, registers, shares no open file with the zygote or
    the supervisor but stdout, stderr and the supervisor's pidfd, and no
    child ever exits but those killed; once the file is made, every result
    is right."""
    with running_pool(namespace, "--workers", "16") as up:
        zygote = next(
            field(line, "pid") for line in up.lines.seen if "zygote-ready" in line
        )
        supervisor = up.proc.pid
        with Client(namespace) as client:
            killed: list[int] = []  # (a list: the kernel may reuse a pid)
            for round_ in range(64 // KILLED_A_ROUND):
                gate = tmp_path / f"gate-{round_}"
                busy = [
                    client.submit(sample_tasks.gated, str(gate), i) for i in range(100)
                ]
                before = {w.uid: w.pid for w in list_workers(namespace)}
                gone = sorted(before, key=before.__getitem__)[:KILLED_A_ROUND]
                for uid in gone:  # (stopped first: see tests/support/grpc_first.py)
                    os.kill(before[uid], signal.SIGSTOP)
                for uid in gone:
                    os.kill(before[uid], signal.SIGKILL)
                killed += [before[uid] for uid in gone]

                def replaced(gone: list[uuid.UUID] = gone) -> bool:
                    """16 workers registered, none of those killed (known by
                    uid: the kernel may give a pid again), and the supervisor
                    has read each one's READY line (it may lag the registry:
                    a worker killed before that is a start that failed, not
                    a start)."""
                    now = {w.uid: w.pid for w in list_workers(namespace)}
                    up.lines.drain()
                    started = set(workers_started(up))
                    return (
                        len(now) == 16
                        and not now.keys() & set(gone)
                        and set(now.values()) <= started
                    )

                wait_until(replaced, timeout_s=60)
                for worker in list_workers(namespace):
                    if worker.uid in before:
                        continue
                    up.lines.drain()
                    notes = [line for line in up.lines.seen if "zygote" in line]
                    assert ppid_of(worker.pid) == zygote, notes
                    assert list(inherited(worker.pid, [zygote, supervisor])) == []
                    assert os.readlink(f"/proc/{worker.pid}/fd/0") == "/dev/null"
                gate.touch()
                assert [f.result(timeout=60) for f in busy] == list(range(100))
        up.stop()
        while up.lines.next():  # the rest of its output
            pass
        exits = [line for line in up.lines.seen if line.startswith("worker-exited")]
        assert len(killed) == 64 and len(workers_started(up)) == 80, up.lines.seen
        crashed = [
            line
            for line in exits
            if field(line, "pid") in killed and "signal=SIGKILL" not in line
        ]
        assert crashed == []
        assert not [line for line in up.lines.seen if "start-failed" in line]


def test_workers_start_the_slow_way_until_a_dead_zygote_is_back(
    namespace: str,
) -> None:
    """SIGKILL the zygote: workers that die meanwhile are replaced by fresh
    interpreters (children of the supervisor), a new zygote comes up, and
    the workers after it are forked again. Tried until a replacement falls
    in the window while the new zygote imports."""
    with running_pool(namespace, "--workers", "4") as up:
        supervisor = up.proc.pid
        zygote = next(
            field(line, "pid") for line in up.lines.seen if "zygote-ready" in line
        )
        slow = 0
        for _ in range(5):
            os.kill(zygote, signal.SIGKILL)
            up.wait_for("zygote-exited")
            victims = {w.pid for w in list_workers(namespace)}
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            zygote = field(up.wait_for("zygote-ready"), "pid")

            def replaced(gone: set[int] = victims) -> bool:
                now = {w.pid for w in list_workers(namespace)}
                return len(now) == 4 and not now & gone

            wait_until(replaced, timeout_s=60)
            parents = [ppid_of(w.pid) for w in list_workers(namespace)]
            assert set(parents) <= {supervisor, zygote}
            slow += parents.count(supervisor)
            with Client(namespace) as client:
                assert list(client.map(sample_tasks.square, range(20))) == [
                    x * x for x in range(20)
                ]
            if slow:
                break
        assert slow, "no worker fell in the window while the zygote restarted"
        # Once it is back, a replacement is forked again.
        before = {w.pid for w in list_workers(namespace)}
        victim = before.pop()
        os.kill(victim, signal.SIGKILL)

        def one_new() -> bool:
            now = {w.pid for w in list_workers(namespace)}
            return len(now) == 4 and victim not in now

        wait_until(one_new, timeout_s=30)
        (new,) = {w.pid for w in list_workers(namespace)} - before
        assert ppid_of(new) == zygote


def test_a_worker_forked_as_the_pool_stops_is_killed_not_left_running(
    namespace: str, tmp_path: Path
) -> None:
    """A worker dies, and the fork of its replacement returns only once the
    pool has begun to stop, while a task still drains: the replacement is
    killed there, never started, never left behind. (The supervisor, then
    the zygote, are held with SIGSTOP so that the replacement is asked for
    before the stop and forked after it.)"""
    said, gate = tmp_path / "said", tmp_path / "gate"
    with running_pool(namespace, "--workers", "2") as up, Client(namespace) as client:
        zygote, supervisor = first_zygote(up), up.proc.pid
        draining = client.submit(sample_tasks.pid_then_gated, str(said), str(gate))
        wait_until(said.exists)
        busy = int(said.read_text())
        other = next(w.pid for w in list_workers(namespace) if w.pid != busy)
        os.kill(supervisor, signal.SIGSTOP)
        try:
            os.kill(other, signal.SIGKILL)
            # Reaped, and its death written to the supervisor: the zygote
            # (one thread) waits again for what comes next.
            wait_until(lambda: gone(other) and state_of(zygote) == "S")
            os.kill(zygote, signal.SIGSTOP)
            try:
                os.kill(supervisor, signal.SIGCONT)
                up.wait_for("worker-exited")  # (its replacement is asked for)
                up.proc.send_signal(signal.SIGINT)
                up.wait_for("stopping")  # (the busy worker drains until the gate)
            finally:
                os.kill(zygote, signal.SIGCONT)
        finally:
            os.kill(supervisor, signal.SIGCONT)
        gate.touch()
        assert draining.result(60) == 0  # (delivered as the pool drained)
        up.wait_for("stopped")
        assert up.proc.wait(60) == 0
        assert processes_mentioning(namespace) == []
        seen = up.lines.seen
        since = seen[next(i for i, s in enumerate(seen) if s.startswith("stopping")) :]
        assert [s for s in since if "-started" in s] == [], since


def test_a_script_without_a_main_guard_is_not_run_again_in_the_workers(
    tmp_path: Path,
) -> None:
    """Unlike ProcessPoolExecutor under spawn or forkserver, the workers do
    not import the caller's __main__: a script that starts a pool at its
    top level runs once, and its tasks run."""
    script = tmp_path / "unguarded.py"
    marker = tmp_path / "runs"
    script.write_text(
        "import pool\n"
        "from tests.support import sample_tasks\n"
        f"with open({str(marker)!r}, 'a') as out:\n"
        "    out.write('ran\\n')\n"
        "with pool.Pool(workers=2) as client:\n"
        "    print(sum(client.map(sample_tasks.square, range(10))))\n"
    )
    run = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "285"
    assert marker.read_text() == "ran\n"


CANCELLED_START = """
import asyncio, os, sys, threading
sys.path.insert(0, {root!r})
import uvloop
from pool.supervisor.zygote import Zygote
from tests.support.helpers import children_of, wait_until
from tests.support.sample_tasks import HoldFd

async def main():
    zygote = Zygote()
    await zygote.start()
    # The thread that asks the forkserver holds on to the child it got
    # until the start is cancelled.
    forked, release = threading.Event(), threading.Event()
    launch = zygote._launch

    def held(*args):
        child = launch(*args)
        forked.set()
        release.wait(30)
        return child

    zygote._launch = held
    r, w = os.pipe()  # (the child, if left running, waits for w to close)
    try:
        spawning = asyncio.ensure_future(
            zygote.spawn(
                "tests.support.sample_tasks:read_to_eof", HoldFd(), {{"fd": r}}
            )
        )
        await asyncio.to_thread(forked.wait, 30)
        spawning.cancel()  # (while its thread has the child's pid in hand)
        release.set()
        try:
            await spawning
        except asyncio.CancelledError:
            print("cancelled")
        await asyncio.to_thread(wait_until, lambda: not children_of(zygote.pid), 30)
        print("no child left")
    finally:
        os.close(r)
        os.close(w)
        zygote.close()

uvloop.run(main())
"""


def test_a_child_forked_for_a_cancelled_start_is_killed(tmp_path: Path) -> None:
    """A start cancelled while the zygote forks (a pool closing as it
    heals) leaves no child behind: the fork it asked for is killed."""
    lines = run_script(tmp_path, "cancel.py", CANCELLED_START.format(root=str(ROOT)))
    assert lines == ["cancelled", "no child left"]


# A pool in a process that forks (a ProcessPoolExecutor of the fork method,
# the default on Linux before 3.14): the fork holds the supervisor's end of
# the zygote's socket until the file {gate} appears.
FORKED_BESIDE = """
import logging, multiprocessing, os, signal, sys, time
sys.path.insert(0, {root!r})
from pool import Pool

said = []


class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())


def hold(gate):
    deadline = time.monotonic() + 120
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)  # (a child waiting for the test's file)


if __name__ == "__main__":
    logging.getLogger("pool.supervisor").addHandler(Keep())
    pool = Pool(namespace={namespace!r}, workers=1)
    with pool as client:
        assert client.submit(abs, -2).result(60) == 2
        forks = multiprocessing.get_context("fork")
        fork = forks.Process(target=hold, args=({gate!r},))
        fork.start()
        log = pool.log.getvalue().splitlines()
        zygote = [s for s in log if s.startswith("zygote-ready")][0]
        print(zygote.split("pid=")[1], fork.pid, flush=True)
        if sys.argv[1:] == ["kill"]:
            os.kill(os.getpid(), signal.SIGKILL)
    print("killed" if any("killed" in s for s in said) else "stopped", flush=True)
    open({gate!r}, "w").close()
    fork.join()
"""


def test_a_closing_pool_stops_its_zygote_though_a_fork_holds_its_socket(
    namespace: str, tmp_path: Path
) -> None:
    """The pool shuts the zygote's socket down: the zygote stops by itself
    though a process forked from the pool's own still holds the socket.
    Regression: it waited for the last holder, so the pool killed it after
    5 s (and hung for good, with multiprocessing's fork server)."""
    script = FORKED_BESIDE.format(
        root=str(ROOT), namespace=namespace, gate=str(tmp_path / "gate")
    )
    lines = run_script(tmp_path, "beside.py", script)
    zygote, _ = map(int, lines[0].split())
    assert lines[1:] == ["stopped"]
    assert not runs(zygote)


def test_a_killed_pools_zygote_ends_though_a_fork_holds_its_socket(
    namespace: str, tmp_path: Path
) -> None:
    """SIGKILL the pool's process while a process forked from it still
    holds the zygote's socket: the zygote ends anyway (it watches its
    parent), and the next pool on the namespace starts. Regression: it ran
    for as long as the fork did."""
    gate = tmp_path / "gate"
    script = tmp_path / "killed.py"
    script.write_text(
        FORKED_BESIDE.format(root=str(ROOT), namespace=namespace, gate=str(gate))
    )
    run = subprocess.Popen(
        [sys.executable, str(script), "kill"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert run.stdout is not None
    with run.stdout:  # (the fork keeps it open: its first line, not its end)
        zygote, fork = map(int, run.stdout.readline().split())
        try:
            assert run.wait(60) == -signal.SIGKILL
            wait_until(lambda: not runs(zygote), 10)
        finally:
            gate.touch()  # (the fork ends)
            wait_until(lambda: not runs(fork), 30)
            # (The next pool reclaims what the killed one left.)
            with running_pool(namespace, "--workers", "1"), Client(namespace) as c:
                assert c.submit(sample_tasks.square, 3).result(timeout=30) == 9
