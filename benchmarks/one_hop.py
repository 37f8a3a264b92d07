"""What one hop per task would give, measured ahead of building it: the
dispatcher's own engine run in the client's process.

    python -m benchmarks.one_hop [--runs 5] [--samples 500]

Each run, on one ``Pool(workers=8)``: a ``Client``'s round trip p50 and
``submit`` rate (256 in flight), as tasks go today (two hops: client,
dispatcher, worker); the same no-ops through a
:class:`~pool.routing.placement.Router` (the dispatcher's queue, links,
losses and stealing, one pump a loop turn as the dispatcher pumps once a
message) run on a loop in this process, its links straight to the
workers' ``Run`` streams (one hop), each result handed to a bare owner
(no client futures, no thread hop: the engine alone), in a process of its
own, and the round trip of the same with a coroutine no-op, which a worker
runs on its loop (a plain call goes to a slot thread and back: the
difference is that hand-off); the raw floors of one and two grpc.aio
hops (:mod:`pool.bench.floor`); and
``ProcessPoolExecutor(8)``, the same ways. Prints each run, then the
medians and their ratios. The design it measures ahead of is "One hop per
task" in ``docs/architecture.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import itertools
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import uvloop

from discovery import backends
from pool import Client, Pool
from pool.bench import floor
from pool.bench.measures import async_round_trips_ms, round_trips_ms, submit_rate
from pool.bench.tasks import async_noop, noop
from pool.client.core import Submissions
from pool.dispatcher import admission
from pool.routing.jobs import Job
from pool.routing.links import WorkerLink
from pool.routing.placement import Router
from workers.protocol import auth
from workers.protocol.worker_pb2 import Result, Task

IN_FLIGHT = 256
SUBMITS = 10_000
WORKERS = 8
Row = dict[str, float]


class _Engine:
    """Calls of ``fn`` (a no-op) submitted through ``router``, each answered
    on a future of this loop; the router's owner of every job."""

    def __init__(self, router: Router, fn: Callable[[], object]) -> None:
        self._router = router
        submissions = Submissions()
        submission, self._code, _ = submissions.make(submissions.reference(fn), (), {})
        self._task = submission.task
        self._waiting: dict[int, asyncio.Future[Result]] = {}
        self._ids = itertools.count(1)
        self._pumping = False

    def submit(self) -> asyncio.Future[Result]:
        task = Task()
        task.CopyFrom(self._task)
        task.id = next(self._ids)
        answered = asyncio.get_running_loop().create_future()
        self._waiting[task.id] = answered
        self._router.submit(Job(task, frozenset(), self, task.id, self._code))
        if not self._pumping:  # (once a loop turn, for every job of the turn)
            self._pumping = True
            asyncio.get_running_loop().call_soon(self._pump)
        return answered

    def _pump(self) -> None:
        self._pumping = False
        self._router.pump()

    def on_started(self, job: Job) -> None:
        pass

    def on_wanted(self, job: Job, source: str) -> None:
        raise RuntimeError("a no-op has no arguments to upload")

    def on_result(self, job: Job, result: Result) -> None:
        self._waiting.pop(job.client_id).set_result(result)


async def _rate(submit: Callable[[], asyncio.Future[Result]]) -> float:
    """Tasks a second, ``IN_FLIGHT`` unanswered at a time, ``SUBMITS`` in all."""
    started = time.perf_counter()
    pending = {submit() for _ in range(IN_FLIGHT)}
    sent, done = len(pending), 0
    while pending:
        finished, pending = await asyncio.wait(
            pending, return_when=asyncio.FIRST_COMPLETED
        )
        done += len(finished)
        more = min(len(finished), SUBMITS - sent)
        sent += more
        pending |= {submit() for _ in range(more)}
    return done / (time.perf_counter() - started)


async def _through_router(namespace: str, samples: int) -> Row:
    """The round trip (ms) and rate (/s) of no-ops through a router of
    this process, linked straight to the pool's workers."""
    token = auth.read_token(namespace)
    router = Router(
        namespace,
        WorkerLink.connector(token, None),
        is_alive=backends.liveness_for(None),
    )
    engine, coroutines = _Engine(router, noop), _Engine(router, async_noop)
    async with router, asyncio.TaskGroup() as group:
        following = group.create_task(admission.follow(namespace, router, None, False))
        while sum(link.ready for link in router.links.values()) < WORKERS:
            await asyncio.sleep(0.01)  # (a benchmark's wait, not a test's)
        for warming in (engine, coroutines):
            await async_round_trips_ms(warming.submit, 50)
        row = {
            "rtt": statistics.median(
                await async_round_trips_ms(engine.submit, samples)
            ),
            "rtt_coroutine": statistics.median(
                await async_round_trips_ms(coroutines.submit, samples)
            ),
            "rate": await _rate(engine.submit),
        }
        following.cancel()
        router.stop_taking()
        await router.finish(1.0)
    return row


def _router_in_own_process(namespace: str, samples: int) -> Row:
    """:func:`_through_router` in a process of its own, as a client would
    run it (gRPC's asyncio poller serves one loop a process)."""
    argv = [sys.executable, "-m", "benchmarks.one_hop", "--engine", namespace]
    argv += ["--samples", str(samples)]
    out = subprocess.run(argv, check=True, capture_output=True).stdout.split()
    return dict(zip(("rtt", "rtt_coroutine", "rate"), map(float, out), strict=True))


def _one_run(client: Client, samples: int) -> dict[str, Row]:
    rows = {
        "Client (two hops)": {
            "rtt": statistics.median(round_trips_ms(client, samples)),
            "rate": submit_rate(client, SUBMITS),
        },
    }
    one_hop = _router_in_own_process(client.namespace, samples)
    rows["Router in the client (one hop)"] = {
        "rtt": one_hop["rtt"],
        "rate": one_hop["rate"],
    }
    rows["the same, a coroutine no-op (no slot thread)"] = {
        "rtt": one_hop["rtt_coroutine"]
    }
    with concurrent.futures.ProcessPoolExecutor(WORKERS) as peer:
        peer.submit(noop).result()
        rows["ProcessPoolExecutor(8)"] = {
            "rtt": statistics.median(round_trips_ms(peer, samples)),
            "rate": submit_rate(peer, SUBMITS),
        }
    for hops in (1, 2):
        rtt = statistics.median(floor.measure(samples, hops=hops)) * 1e3
        rows[f"floor: {hops} raw gRPC hop{'s' if hops > 1 else ''}"] = {"rtt": rtt}
    return rows


def _report(runs: list[dict[str, Row]]) -> None:
    medians = {
        name: {
            figure: statistics.median(run[name][figure] for run in runs)
            for figure in runs[0][name]
        }
        for name in runs[0]
    }
    one_hop = medians["Router in the client (one hop)"]
    print(f"medians of {len(runs)} run(s):")
    for name, row in medians.items():
        rate = f", {row['rate']:,.0f} tasks/s" if "rate" in row else ""
        ratio = one_hop["rtt"] / row["rtt"]
        print(
            f"  {name}: round trip {row['rtt']:.3f} ms{rate}; "
            f"one hop's round trip over it {ratio:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--engine", metavar="NAMESPACE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:  # (the one-hop half, in its own process)
        row = uvloop.run(_through_router(args.engine, args.samples))
        print(row["rtt"], row["rtt_coroutine"], row["rate"])
        return
    runs = []
    with Pool(workers=WORKERS) as client:
        client.submit(noop).result()
        for run in range(args.runs):
            runs.append(_one_run(client, args.samples))
            line = "; ".join(
                f"{name} {row['rtt']:.3f} ms"
                + (f" {row['rate']:,.0f}/s" if "rate" in row else "")
                for name, row in runs[-1].items()
            )
            print(f"run {run + 1}: {line}", flush=True)
    _report(runs)


if __name__ == "__main__":
    main()
