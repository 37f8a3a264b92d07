"""Large data across machines, beside the same pool sharing memory and
``ProcessPoolExecutor``, in one run.

    python -m benchmarks.across [--runs 5] [--sizes 8,64,256]

"Across" is a pool on Redis (its own ``redis-server``, as the tests start
one) whose one worker is of another "host": TCP on 127.0.0.2, sharing no
memory with the client, so that payloads of 8 MiB or more cross in 4 MiB
chunks through the dispatcher (``workers/protocol/transfer.py``). Beside
it, ``Pool(workers=1)`` (shared memory) and ``ProcessPoolExecutor(1)``
(a pipe). Numpy float64 arrays, one task at a time, the tasks and timing
of ``benchmarks/bigdata.py`` (:func:`pool.bench.bigdata.timed`); medians.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from pool import Client
from pool.bench.bigdata import MB, SCENARIOS, ExecutorRunner, Runner, timed
from pool.client.embedded import Pool
from tests.support.helpers import LineReader
from tests.support.redis_server import RedisServer


@contextlib.contextmanager
def _started(argv: list[str], ready: str) -> Iterator[subprocess.Popen[str]]:
    """A process of ours, once it printed a line starting with ``ready``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        LineReader(proc.stdout).wait_for(ready, 60)
        yield proc
    finally:
        proc.terminate()
        proc.wait(60)


@contextlib.contextmanager
def across() -> Iterator[Runner]:
    """A client of a pool whose one worker shares no memory with it."""
    namespace = f"bench-across-{secrets.token_hex(4)}"
    server = RedisServer()
    server.start()
    try:
        found = ["--discovery", server.url]
        up = ["pool", "up", "-n", namespace, "--workers", "0", *found]
        worker = ["workers", "--namespace", namespace, *found]
        with (
            _started(up, "ready "),
            _started([*worker, "--host", "127.0.0.2", "--concurrency", "1"], "READY "),
            Client(namespace) as client,
        ):
            yield ExecutorRunner(client)
    finally:
        server.close()


@contextlib.contextmanager
def opened(name: str) -> Iterator[Runner]:
    if name == "across":
        with across() as runner:
            yield runner
    elif name == "shared":
        with Pool(workers=1) as client:
            yield ExecutorRunner(client)
    else:
        with concurrent.futures.ProcessPoolExecutor(1) as executor:
            yield ExecutorRunner(executor)


NAMES = {
    "across": "shm-pool across machines (chunks)",
    "shared": "shm-pool, shared memory",
    "ppe": "ProcessPoolExecutor(1)",
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.across")
    parser.add_argument("--runs", type=int, default=5, help="per figure (median)")
    parser.add_argument("--sizes", default="8,64,256", help="MB, comma-separated")
    args = parser.parse_args()
    sizes = [int(x) * MB for x in args.sizes.split(",")]
    times: dict[str, dict[tuple[str, int], float]] = {}
    for name in NAMES:
        print(f"measuring {NAMES[name]} ...", file=sys.stderr)
        with opened(name) as runner:
            times[name] = {
                (s.key, n): timed(runner, s, n, args.runs)
                for n in sizes
                for s in SCENARIOS
            }
    print(f"\none worker each, one task at a time, median of {args.runs}\n")
    print("| payload | " + " | ".join(NAMES.values()) + " | across / PPE, in time |")
    print("| --- |" + " --: |" * (len(NAMES) + 1))
    for n in sizes:
        for s in SCENARIOS:
            row: list[Any] = [f"{times[name][s.key, n]:.3f} s" for name in NAMES]
            ratio = times["across"][s.key, n] / times["ppe"][s.key, n]
            cells = " | ".join(row)
            print(f"| {n // MB} MB {s.label} | {cells} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
