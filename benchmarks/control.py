"""Control over running work, beside pebble (and ``ProcessPoolExecutor``):
a cancel that tells the truth, time limits and force-cancels that stop the
work, priorities, retries, and fair shares between clients.

    python -m benchmarks.control [--runs 5] [--pools 20] [--busy]

Each pool has 2 workers: ours a ``pool.Pool(workers=2)``, pebble's a
``ProcessPool(max_workers=2)``, the standard library's a
``ProcessPoolExecutor(2)``; calls are :mod:`benchmarks.control_tasks`.
With ``--busy``, a process spins on one core beside it all.

- cancel, in ``--pools`` fresh pools: both workers held by a call that
  waits for a flag file; once both run, 40 calls submitted; 0.5 s later
  each future's ``cancel()``; then the flag. How many calls whose cancel said True ran
  (all pools), and the fewest cancels that said True in one pool.
- time limit, medians of ``--runs``: two calls that spin for ever with a
  1 s limit; from their submit to the last ``TimeoutError``; from the
  limit to 8 trivial calls submitted then all done; and the cores the
  pool's processes burn in the 0.5 s after (0: the work stopped).
- force-cancel, medians of ``--runs``: a spinning call stopped (ours:
  ``client.cancel([f], force=True)``; pebble: ``f.cancel()``, which ends
  its worker); until its future is cancelled; until two calls that each
  wait for the other have both run (the pool's two slots back); the cores
  burnt in the 0.3 s after.
- priorities (ours; pebble has none): both workers held, 20 calls of
  priority 0 then 5 of priority 10, the flag 0.5 s later: in how many of
  ``--runs`` the 5 started before any of the 20.
- retries (ours; pebble has none): a call that fails twice, with
  ``retries=2``: its value, and its time over a call that succeeds at once.
- fair shares: ``pool bench --scale``'s clients table
  (:func:`pool.bench.scale.by_clients`): 16 client processes on one
  ``Pool(8)``, the slowest's rate over the fastest's, and their total over
  one client's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from benchmarks import control_tasks as tasks
from pool import Pool


class Peer:
    """One pool of 2 workers, as the rows use it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._stack = contextlib.ExitStack()
        if kind == "shm-pool":
            self._client = self._stack.enter_context(Pool(workers=2))
        elif kind == "pebble":
            import pebble

            self._pebble = pebble.ProcessPool(max_workers=2)
            self._stack.callback(self._pebble.join)
            self._stack.callback(self._pebble.stop)
        else:
            ppe = concurrent.futures.ProcessPoolExecutor(2)
            self._ppe = self._stack.enter_context(ppe)

    def submit(
        self, fn: Callable[..., Any], *args: Any, timeout: float | None = None
    ) -> concurrent.futures.Future[Any]:
        if self.kind == "shm-pool":
            client = (
                self._client.options(task_timeout_s=timeout)
                if timeout
                else self._client
            )
            return client.submit(fn, *args)
        if self.kind == "pebble":
            scheduled: concurrent.futures.Future[Any] = self._pebble.schedule(
                fn, args=args, timeout=timeout
            )
            return scheduled
        return self._ppe.submit(fn, *args)

    def stop(self, future: concurrent.futures.Future[Any]) -> bool:
        if self.kind == "shm-pool":
            return self._client.cancel([future], force=True)[0]
        return future.cancel()  # (pebble ends the worker of a running call)

    def close(self) -> None:
        self._stack.close()


def _cores_used(window_s: float) -> float:
    """The CPU this process's descendants burn over ``window_s``, in cores
    (those alive at both ends: one that exits meanwhile burns nothing)."""
    before = _descendants_cpu_s()
    time.sleep(window_s)  # (a measuring window, not a wait for an event)
    after = _descendants_cpu_s()
    burnt = sum(after[pid] - before[pid] for pid in after.keys() & before.keys())
    return burnt / window_s


def _descendants_cpu_s() -> dict[int, float]:
    """Each descendant's CPU time so far, by pid."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
                times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        mine |= frontier
    return {pid: times[pid] for pid in mine - _NOT_MEASURED}


def cancel_round(kind: str) -> tuple[int, int]:
    """One fresh pool of the cancel row: (cancelled calls that ran, cancels
    that said True)."""
    with tempfile.TemporaryDirectory() as scratch:
        flag = Path(scratch, "flag")
        peer = Peer(kind)
        try:
            held = [Path(scratch, f"held-{i}") for i in range(2)]
            holders = [peer.submit(tasks.wait_for, str(flag), str(h)) for h in held]
            while not all(h.exists() for h in held):
                time.sleep(0.005)  # (polls what the holders' workers write)
            marks = [Path(scratch, f"mark-{i}") for i in range(40)]
            futures = [peer.submit(tasks.mark, str(m)) for m in marks]
            time.sleep(0.5)  # (the scenario: cancel half a second later)
            said = [future.cancel() for future in futures]
            flag.touch()
            for future in [
                *holders,
                *(f for f, s in zip(futures, said, strict=True) if not s),
            ]:
                future.result(timeout=60)
        finally:
            peer.close()  # (what still runs ends first: a lie shows)
        lied = sum(m.exists() and s for m, s in zip(marks, said, strict=True))
        return lied, sum(said)


def timeout_round(kind: str) -> tuple[float, float, float]:
    """(submit to the last TimeoutError, the limit to 8 calls done, cores
    burnt after) for two spinning calls with a 1 s limit."""
    peer = Peer(kind)
    try:
        peer.submit(tasks.nop).result(timeout=60)
        start = time.monotonic()
        spins = [peer.submit(tasks.spin, timeout=1.0) for _ in range(2)]
        for spin in spins:
            if not isinstance(spin.exception(timeout=60), TimeoutError):
                raise RuntimeError(f"{kind}: no TimeoutError: {spin.exception()!r}")
        answered = time.monotonic() - start
        small = [peer.submit(tasks.nop, i) for i in range(8)]
        assert [f.result(timeout=60) for f in small] == list(range(8))
        done = time.monotonic() - (start + 1.0)
        return answered, done, _cores_used(0.5)
    finally:
        peer.close()


def force_round(kind: str, scratch: Path) -> tuple[float, float, float]:
    """(stop to cancelled, stop to two slots back, cores burnt after)."""
    peer = Peer(kind)
    try:
        peer.submit(tasks.nop).result(timeout=60)
        spin = peer.submit(tasks.spin)
        while not spin.running():
            time.sleep(0.001)  # (polls the future's state)
        time.sleep(0.2)  # (it spins in its worker by then)
        start = time.monotonic()
        if not peer.stop(spin):
            raise RuntimeError(f"{kind}: the running call was not stopped")
        concurrent.futures.wait([spin], timeout=60)
        stopped = time.monotonic() - start
        meet = [peer.submit(tasks.meet, str(scratch), a, b) for a, b in ("ab", "ba")]
        assert [f.result(timeout=60) for f in meet] == ["a", "b"]
        back = time.monotonic() - start
        for name in "ab":
            Path(scratch, name).unlink()
        return stopped, back, _cores_used(0.3)
    finally:
        peer.close()


def priority_round(scratch: Path) -> bool:
    """Whether 5 calls of priority 10 start before 20 of priority 0 sent first."""
    flag, log = scratch / "flag", scratch / "log"
    with Pool(workers=2) as client:
        holders = [client.submit(tasks.wait_for, str(flag)) for _ in range(2)]
        low = [client.submit(tasks.started, str(log), "low") for _ in range(20)]
        urgent = client.options(priority=10)
        high = [urgent.submit(tasks.started, str(log), "high") for _ in range(5)]
        time.sleep(0.5)  # (the scenario: the flag half a second later)
        flag.touch()
        for future in [*holders, *low, *high]:
            future.result(timeout=60)
    order = log.read_text().split()
    flag.unlink()
    log.unlink()
    return order[:5] == ["high"] * 5


def retry_round(run: int) -> tuple[int, float]:
    """(the value of a call that failed twice, with retries=2; its time over
    a call that succeeds at once)."""
    with Pool(workers=2) as client:
        again = client.options(retries=2, retry_on=ConnectionError)
        for _ in range(2):  # (its module imported in both workers)
            client.submit(tasks.fails_until, f"warm-{run}", 0).result(timeout=60)
        start = time.monotonic()
        client.submit(tasks.fails_until, f"plain-{run}", 0).result(timeout=60)
        plain = time.monotonic() - start
        start = time.monotonic()
        value = again.submit(tasks.fails_until, f"again-{run}", 2).result(timeout=60)
        retried = time.monotonic() - start
    return value, retried / plain


_NOT_MEASURED: set[int] = set()  # (the --busy process)


def _busy() -> subprocess.Popen[bytes]:
    """A process that spins on one core (beside the benchmark, not counted
    among the pool's processes)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    _NOT_MEASURED.add(busy.pid)
    return busy


def _medians(rows: Sequence[Sequence[float]]) -> list[float]:
    return [statistics.median(column) for column in zip(*rows, strict=True)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--pools", type=int, default=20)
    parser.add_argument("--busy", action="store_true", help="keep one core busy")
    parser.add_argument(
        "--peers", default="shm-pool,pebble,ppe", help="which pools (comma-separated)"
    )
    args = parser.parse_args(argv)
    peers = args.peers.split(",")
    busy = _busy() if args.busy else None
    try:
        _report(peers, args.runs, args.pools)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def _report(peers: list[str], runs: int, pools: int) -> None:
    print(f"cancel, {pools} fresh pools each | cancelled that ran | fewest of 40")
    for kind in peers:
        rounds = [cancel_round(kind) for _ in range(pools)]
        print(f"{kind} | {sum(r[0] for r in rounds)} | {min(r[1] for r in rounds)}")
    print(f"1 s limit, medians of {runs} | to TimeoutError | limit to 8 done | cores")
    for kind in [k for k in peers if k != "ppe"]:
        answered, done, cores = _medians([timeout_round(kind) for _ in range(runs)])
        print(f"{kind} | {answered:.3f} | {done:.3f} | {cores:.2f}")
    print(
        f"force-cancel, medians of {runs} | to cancelled s | to 2 slots s | cores after"
    )
    with tempfile.TemporaryDirectory() as scratch:
        for kind in [k for k in peers if k != "ppe"]:
            rows = [force_round(kind, Path(scratch)) for _ in range(runs)]
            stopped, back, cores = _medians(rows)
            print(f"{kind} | {stopped:.3f} | {back:.3f} | {cores:.2f}")
        if "shm-pool" in peers:
            first = sum(priority_round(Path(scratch)) for _ in range(runs))
            print(f"priorities: the 5 started first in {first} of {runs} runs")
            value, ratio = _medians([retry_round(i) for i in range(runs)])
            print(f"retries=2: value {value:.0f}, {ratio:.2f}x a call that succeeds")
    if "shm-pool" in peers:
        _fairness(runs)


def _fairness(runs: int) -> None:
    from pool.bench import scale

    rows = scale.by_clients(runs)
    one, sixteen = rows[1]["total"], rows[16]
    print(
        f"16 clients on Pool(8), medians of {runs}: slowest/fastest "
        f"{sixteen['fair']:.2f}, total {sixteen['total'] / one:.2f}x one client's "
        f"({sixteen['total']:,.0f}/s against {one:,.0f}/s)"
    )


if __name__ == "__main__":
    main()
