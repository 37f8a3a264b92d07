"""A flood of tasks is held back at the client, not buffered by the
dispatcher: its queue and its memory stay bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from pool import Client
from pool.dispatcher_pb2 import ListWorkersRequest
from tests.support import sample_tasks
from tests.support.helpers import wait_until
from tests.support.pools import running_pool
from tests.support.rpc import dispatcher_stub
from workers.protocol.stream import MAX_UNANSWERED

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FLOOD = 200_000


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _dispatcher_state(namespace: str) -> tuple[int, int]:
    """Tasks queued in the dispatcher, and tasks its workers have."""
    with dispatcher_stub(namespace) as (stub, metadata):
        reply = stub.ListWorkers(ListWorkersRequest(), metadata=metadata, timeout=30)
    return reply.queued, sum(w.in_flight for w in reply.workers)


def test_a_flood_of_tasks_keeps_the_dispatcher_bounded(
    namespace: str, tmp_path: Path
) -> None:
    """200,000 tasks to 2 workers that do not finish: the client writes no
    more than its window unanswered, so the dispatcher holds at most that,
    and its memory stays within 100 MB of what it was idle; the rest waits
    in the client. Cancelled, the flood leaves at once: every call but the
    two the workers run is cancelled by the time shutdown returns.

    Regression: tasks waiting in gRPC's buffers could not be withdrawn,
    and the dispatcher read the cancels only after them."""
    gate = str(tmp_path / "gate")
    with running_pool(namespace, "--workers", "2") as pool:
        line = next(s for s in pool.lines.seen if s.startswith("dispatcher-started"))
        dispatcher = int(line.split("pid=")[1])
        idle_mb = _rss_mb(dispatcher)
        try:
            with Client(namespace) as client:
                futures = [
                    client.submit(sample_tasks.gated, gate, i) for i in range(FLOOD)
                ]
                bound = MAX_UNANSWERED
                wait_until(lambda: sum(_dispatcher_state(namespace)) >= bound, 60)
                held = sum(_dispatcher_state(namespace))
                grown_mb = _rss_mb(dispatcher) - idle_mb
                print(f"dispatcher: idle {idle_mb:.1f} MB, +{grown_mb:.1f} MB with")
                print(f"{held} of {FLOOD} tasks in hand")
                assert held <= bound
                assert grown_mb < 100
                client.shutdown(wait=False, cancel_futures=True)
                assert sum(not f.cancelled() for f in futures) == 2
                Path(gate).touch()
                wait_until(lambda: all(f.done() for f in futures), 60)
        finally:
            Path(gate).touch()
