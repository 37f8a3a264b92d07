"""``pool bench --scale``: how the cost of small tasks grows with the pool.

Three tables (see ``benchmarks/README.md``), each of no-op tasks
(:mod:`pool.bench.tasks`), medians over ``runs``:

- by workers: ``Pool(workers=n)`` for each n of :data:`WORKERS`, its time
  to be ready, its round trip p50 and its ``submit`` rate (256 in
  flight), beside ``ProcessPoolExecutor(n)``'s rate in the same run;
- by clients: 1, 4 and 16 client processes sharing one ``Pool(8)``, all
  released at once, each keeping its share of 256 tasks in flight for
  :data:`CLIENT_S`; the total rate, the slowest client's over the
  fastest's, and the clients' CPU time per task (every thread of theirs,
  gRPC's included: on a machine with fewer cores than clients, what
  bounds their total);
- a deep queue: ``pending`` no-ops submitted behind 8 tasks that hold
  every worker; the memory each pending task takes in the client and in
  the dispatcher, how long a new client waits for the dispatcher's
  answer to a question (its workers) beside the same question idle, and,
  once the workers are let go, a new client's round trip (from a process
  of its own) while the backlog drains, beside the same idle.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from rich.table import Table

from pool.bench.measures import IN_FLIGHT, round_trips_ms, rtt_ms, submit_rate
from pool.bench.tasks import gate, noop
from pool.cli.inspect import dispatcher_view
from pool.client.embedded import Pool
from pool.client.executor import Client
from pool.client.rendezvous import Locator

WORKERS: Final = (1, 2, 8, 32, 128)
CLIENTS: Final = (1, 4, 16)
CLIENT_S: Final = 3.0
SUBMITS: Final = 10_000
DRAIN_RTT_SAMPLES: Final = 100  # (few: measured while a backlog drains)
Row = dict[str, float]


def by_workers(runs: int) -> dict[int, Row]:
    """For each pool size: ready (s), rtt (ms), submit and PPE submit (/s)."""
    samples: dict[int, dict[str, list[float]]] = {n: {} for n in WORKERS}
    for _ in range(runs):
        for n in WORKERS:
            for key, value in _one_size(n).items():
                samples[n].setdefault(key, []).append(value)
    return {n: _medians(figures) for n, figures in samples.items()}


def _one_size(n: int) -> Row:
    started = time.perf_counter()
    with Pool(workers=n) as client:
        ready = time.perf_counter() - started
        client.submit(noop).result()
        row = {"ready": ready, "rtt": rtt_ms(client), "submit": 0.0}
        row["submit"] = submit_rate(client, SUBMITS)
    with concurrent.futures.ProcessPoolExecutor(n) as peer:
        list(peer.map(noop, range(n)))  # (it starts its workers lazily)
        row["ppe"] = submit_rate(peer, SUBMITS)
    return row


def by_clients(runs: int) -> dict[int, Row]:
    """For each number of client processes: their total rate (/s), the
    slowest one's over the fastest one's, and their CPU time per task
    (µs)."""
    samples: dict[int, dict[str, list[float]]] = {k: {} for k in CLIENTS}
    for _ in range(runs):
        with Pool(workers=8) as client:
            client.submit(noop).result()
            for k in CLIENTS:
                rates, cores = zip(*_clients(client.namespace, k), strict=True)
                figures = samples[k]
                figures.setdefault("total", []).append(sum(rates))
                figures.setdefault("fair", []).append(min(rates) / max(rates))
                per_task_us = sum(cores) / sum(rates) * 1e6
                figures.setdefault("client_us", []).append(per_task_us)
    return {k: _medians(figures) for k, figures in samples.items()}


def _clients(namespace: str, k: int) -> list[tuple[float, float]]:
    """Start ``k`` client processes, release them together once all are
    connected, and return each one's rate and the cores it used."""
    share = str(max(16, IN_FLIGHT // k))
    with _client_processes(namespace, share, k) as procs:
        _release(procs)
        outputs = [proc.communicate(timeout=120)[0].split() for proc in procs]
        return [(float(rate), float(cores)) for rate, cores in outputs]


@contextlib.contextmanager
def _client_processes(
    namespace: str, mode: str, k: int = 1
) -> Iterator[list[subprocess.Popen[str]]]:
    """``k`` client processes of :func:`_client_main`, each connected and
    waiting to be released (killed if still running when the block ends)."""
    argv = [sys.executable, "-m", "pool.bench.scale", namespace, mode]
    procs = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(k)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a client process did not connect")
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _release(procs: list[subprocess.Popen[str]]) -> None:
    """Let the client processes go, together."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _client_main(namespace: str, mode: str) -> None:
    """One client process: say ready once connected, wait for go, then
    print its round trip p50 in ms (``mode`` "rtt", :func:`deep_queue`), or
    keep ``mode`` no-ops in flight for :data:`CLIENT_S` and print the rate
    and the cores it used (:func:`by_clients`; then ready comes after a
    first task answered)."""
    with Client(namespace) as client:
        if mode == "rtt":
            assert client.max_workers >= 1
        else:
            client.submit(noop).result()
        print("ready", flush=True)
        sys.stdin.readline()
        if mode == "rtt":
            times = round_trips_ms(client, DRAIN_RTT_SAMPLES)
            print(statistics.median(times), max(times), flush=True)
            return
        in_flight, done = int(mode), 0
        futures: list[concurrent.futures.Future[Any]] = []
        cpu = time.process_time()  # every thread's, gRPC's own included
        end = time.monotonic() + CLIENT_S
        while time.monotonic() < end:
            waited = len(futures)
            futures = [f for f in futures if not f.done()]
            done += waited - len(futures)  # (a whole window may end at once)
            futures += [client.submit(noop) for _ in range(in_flight - len(futures))]
            concurrent.futures.wait(futures, return_when="FIRST_COMPLETED")
        print(done / CLIENT_S, (time.process_time() - cpu) / CLIENT_S, flush=True)


def _new_client_rtt_ms(
    namespace: str, first: Callable[[], Any] = bool
) -> tuple[float, float]:
    """A new client process's round trip, p50 and slowest of
    :data:`DRAIN_RTT_SAMPLES` (ms), measured once it has connected and
    ``first`` has been called."""
    with _client_processes(namespace, "rtt") as procs:
        first()
        _release(procs)
        p50, slowest = procs[0].communicate(timeout=300)[0].split()
        return float(p50), float(slowest)


def deep_queue(pending: int) -> Row:
    """Memory per pending task (bytes) in the client and per task the
    dispatcher holds (how many it took: ``dispatcher_held``), the
    dispatcher's answer to a new client, loaded over idle (ratio), and a
    new client's round trip once the backlog drains, over idle (ratio)."""
    with tempfile.TemporaryDirectory() as scratch:
        opened = Path(scratch) / "open"
        embedded = Pool(workers=8, max_queued=pending + 1_000)
        with embedded as client:
            dispatcher = _dispatcher_pid(embedded.log.getvalue())
            idle = (
                _ask_slots_ms(client.namespace),
                _new_client_rtt_ms(client.namespace),
            )
            holders = [client.submit(gate, str(opened)) for _ in range(8)]
            before = (_rss(os.getpid()), _rss(dispatcher))
            futures = [client.submit(noop) for _ in range(pending)]
            held = _settled_count(client.namespace)
            gc.collect()
            after = (_rss(os.getpid()), _rss(dispatcher))
            loaded = _ask_slots_ms(client.namespace)
            draining = _new_client_rtt_ms(client.namespace, opened.touch)
            left = sum(1 for f in futures if not f.done())
            concurrent.futures.wait(futures + holders)
    return {
        "client_b": (after[0] - before[0]) / pending,
        "dispatcher_b": (after[1] - before[1]) / max(held, 1),
        "dispatcher_held": held,
        "answer": loaded / idle[0],
        "rtt": draining[0] / idle[1][0],
        "rtt_max": draining[1] / idle[1][0],
        "left": left,
    }


def _settled_count(namespace: str) -> int:
    """The tasks the dispatcher has (queued or on workers), once that count
    has stopped growing: it reads a client's stream only while it has room
    (``max_queued``), and the rest wait in the client."""
    counts = [-1]
    while len(counts) < 4 or counts[-1] != counts[-4]:
        time.sleep(0.2)  # (a benchmark's poll of a count, not a test's sync)
        view = dispatcher_view(Locator(namespace))
        held = -1 if view is None else view.queued + sum(view.in_flight.values())
        counts.append(held)
    return counts[-1]


def _ask_slots_ms(namespace: str) -> float:
    """A new client's first question to the dispatcher (how many slots its
    workers have), connection included: the median of 5 (ms)."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        with Client(namespace) as client:
            assert client.max_workers >= 1
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def _dispatcher_pid(log: str) -> int:
    for line in log.splitlines():
        if line.startswith("dispatcher-started "):
            return int(line.split("pid=")[1].split()[0])
    raise RuntimeError("the pool's log names no dispatcher")


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _medians(figures: dict[str, list[float]]) -> Row:
    return {key: statistics.median(values) for key, values in figures.items()}


def tables(runs: int, pending: int) -> list[Table]:
    """The three tables, measured now (see the module docstring)."""
    return [
        _workers_table(by_workers(runs), runs),
        _clients_table(by_clients(runs), runs),
        _queue_table(deep_queue(pending), pending),
    ]


def _table(title: str, columns: tuple[str, ...]) -> Table:
    grid = Table(title=title, title_justify="left")
    for column in columns:
        grid.add_column(column, justify="right")
    return grid


WORKER_COLUMNS: Final = (
    "workers",
    "ready (s)",
    "round trip (ms)",
    "submit (/s)",
    "PPE(n) submit (/s)",
    "ours / PPE",
)


def _workers_table(workers: dict[int, Row], runs: int) -> Table:
    grid = _table(
        f"by workers, no-ops, median of {runs}",
        WORKER_COLUMNS,
    )
    for n, row in workers.items():
        grid.add_row(
            str(n),
            f"{row['ready']:.2f}",
            f"{row['rtt']:.3f}",
            f"{row['submit']:,.0f}",
            f"{row['ppe']:,.0f}",
            f"{row['submit'] / row['ppe']:.2f}x",
        )
    return grid


def _clients_table(clients: dict[int, Row], runs: int) -> Table:
    grid = _table(
        f"client processes sharing Pool(8), {IN_FLIGHT} in flight in all, "
        f"median of {runs}",
        CLIENT_COLUMNS,
    )
    one = clients[CLIENTS[0]]["total"]
    for k, row in clients.items():
        grid.add_row(
            str(k),
            f"{row['total']:,.0f}",
            f"{row['total'] / one:.2f}x",
            f"{row['fair']:.2f}",
            f"{row['client_us']:.0f}",
        )
    return grid


CLIENT_COLUMNS: Final = (
    "clients",
    "total (/s)",
    "over one client",
    "slowest / fastest",
    "client CPU per task (µs)",
)


def _queue_table(deep: Row, pending: int) -> Table:
    grid = _table(
        f"{pending:,} no-ops pending behind 8 busy workers", ("figure", "value")
    )
    grid.add_row("client memory per pending task", f"{deep['client_b']:,.0f} B")
    grid.add_row(
        f"dispatcher memory per task it took ({deep['dispatcher_held']:,.0f})",
        f"{deep['dispatcher_b']:,.0f} B",
    )
    grid.add_row("a new client's first answer, loaded / idle", f"{deep['answer']:.2f}x")
    draining = f"while it drains ({deep['left']:,.0f} still pending after)"
    grid.add_row(
        f"a new client's round trip p50 {draining}, over idle p50",
        f"{deep['rtt']:.2f}x",
    )
    grid.add_row(
        f"its slowest of {DRAIN_RTT_SAMPLES}, over idle p50", f"{deep['rtt_max']:.2f}x"
    )
    return grid


if __name__ == "__main__":
    _client_main(sys.argv[1], sys.argv[2])
