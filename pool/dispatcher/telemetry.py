"""What the dispatcher tells the supervisor's dashboard about its tasks.

With a dashboard (``--telemetry``), the router tells :class:`Telemetry` of
every task's end (:meth:`Telemetry.finished`), and the server writes
:meth:`Telemetry.report` to the supervisor every :data:`REPORT_S`, one JSON
line on the report pipe. It keeps, bounded whatever the rate of tasks:

- the count of ended tasks by outcome, since the dispatcher started
  (:data:`OUTCOMES`: ``lost`` is a task failed with ``WorkerLost`` or
  ``PoolStopping``, ``cancelled`` one its client cancelled);
- a histogram of how long tasks ran (the worker's own measure,
  ``Result.run_us``), cumulative, in :data:`DURATION_BUCKETS_S`;
- the task stream since the last report: a bar per task in a lane per
  worker slot. A task that starts within :data:`MERGE_GAP_MS` of the end
  of the lane's last bar, of the same function and outcome, extends that
  bar (its ``n`` counts the tasks), and past :data:`MAX_BARS` bars a
  report merges every task into its lane's last bar: at 10,000 tasks/s a
  report stays a few kilobytes;
- at most :data:`MAX_FAILURES` failures a report, with their remote
  tracebacks cut to :data:`MAX_TRACEBACK_CHARS`;
- each map's calls done and failed, of its total (its tasks carry a
  ``MapPart``), for the last :data:`MAX_MAPS` maps; a report carries those
  that moved since the last, and a map leaves once all its calls ended.

Its cost per task is a few dict and list operations on the dispatcher's
loop: about 1 us, and 2 us of the dispatcher's CPU in all, measured by
``benchmarks/dashboard.py`` (docs/benchmarks.md).
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from typing import Any, Final
from uuid import UUID

import grpc

from discovery import WorkerInfo
from pool.routing.jobs import Job, Link
from workers.protocol import codec
from workers.protocol.worker_pb2 import Failure, MapPart, Result

REPORT_S: Final = 0.5
OUTCOMES: Final = ("ok", "error", "cancelled", "lost")
DURATION_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
MERGE_GAP_MS: Final = 5.0  # (a pixel of the page's 30 s stream is about 30 ms)
MAX_BARS: Final = 2000
MAX_FAILURES: Final = 5
MAX_TRACEBACK_CHARS: Final = 4000
MAX_MAPS: Final = 64
_BUCKETS_US: Final = tuple(round(bound * 1e6) for bound in DURATION_BUCKETS_S)
_LOST: Final = frozenset({"pool.errors.WorkerLost", "pool.errors.PoolStopping"})

# A bar: [start_ms, end_ms, label index, tasks, failed (0 or 1)].
Bar = list[Any]


def outcome_of(result: Result) -> str:
    """One of :data:`OUTCOMES`."""
    return _failed_outcome(result.failure) if result.HasField("failure") else "ok"


def _failed_outcome(failure: Failure) -> str:
    if codec.status_of(failure) == grpc.StatusCode.CANCELLED:
        return "cancelled"
    return "lost" if failure.type in _LOST else "error"


class Telemetry:
    """See the module docstring. :meth:`finished` runs once per task, on the
    dispatcher's loop: it is kept to about a microsecond."""

    def __init__(self) -> None:
        self.since = time.time()  # (a restarted dispatcher reports a new one)
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.buckets = [0] * (len(DURATION_BUCKETS_S) + 1)  # the last: +Inf
        self._run_us = 0  # their sum
        self._lanes: dict[tuple[UUID, int], list[Bar]] = {}
        self._lane_pids: dict[tuple[UUID, int], int] = {}
        self._labels: dict[str, int] = {}
        self._bars = 0
        self._failures: list[dict[str, Any]] = []
        self._failures_left_out = 0
        # A map's [label, calls done, of them failed, total], by its id.
        self._maps: OrderedDict[str, list[Any]] = OrderedDict()
        self._maps_moved: set[str] = set()

    @property
    def duration_sum_s(self) -> float:
        return self._run_us / 1e6

    def finished(self, job: Job, result: Result, worker: WorkerInfo | None) -> None:
        """``job`` ended with ``result``, from ``worker`` if one ran it."""
        failed = result.HasField("failure")
        outcome = _failed_outcome(result.failure) if failed else "ok"
        self.outcomes[outcome] += 1
        if run_us := result.run_us:
            self.buckets[bisect.bisect_left(_BUCKETS_US, run_us)] += 1
            self._run_us += run_us
        task = job.task
        label = task.function or task.label or "(shipped)"
        if task.HasField("map") and outcome != "cancelled":
            self._mapped(task.map, label, outcome != "ok")
        if worker is None or not (run_us or outcome == "error"):
            return
        if (index := self._labels.get(label)) is None:
            index = self._labels[label] = len(self._labels)
        self._bar((worker.uid, result.slot), worker.pid, run_us, index, failed)
        if outcome == "error":
            self._failed(result.failure, label, worker)

    def _bar(
        self, lane: tuple[UUID, int], pid: int, run_us: int, label: int, failed: bool
    ) -> None:
        end_ms = time.time() * 1e3  # (the browser's clock: wall time)
        start_ms = end_ms - run_us / 1e3
        bars = self._lanes.get(lane)
        if bars is None:
            bars = self._lanes[lane] = []
            self._lane_pids[lane] = pid
        else:
            last = bars[-1]
            if self._bars >= MAX_BARS or (
                last[2] == label
                and last[4] == failed
                and start_ms - last[1] <= MERGE_GAP_MS
            ):
                last[1] = max(last[1], end_ms)
                last[3] += 1
                last[4] = last[4] or failed
                return
        bars.append([start_ms, end_ms, label, 1, failed])
        self._bars += 1

    def _mapped(self, part: MapPart, label: str, failed: bool) -> None:
        """A task of a map ended (its chunk's calls count as failed only if
        the whole task failed: the dispatcher does not read its values)."""
        counts = self._maps.get(part.id)
        if counts is None:
            counts = self._maps[part.id] = [label, 0, 0, part.total]
            while len(self._maps) > MAX_MAPS:
                self._maps_moved.discard(self._maps.popitem(last=False)[0])
        counts[1] += part.calls
        counts[2] += part.calls if failed else 0
        self._maps_moved.add(part.id)

    def _moved_maps(self) -> list[dict[str, Any]]:
        """The maps that moved since the last report; those done, forgotten."""
        moved = []
        for map_id in self._maps_moved:
            label, done, failed, total = self._maps[map_id]
            moved.append(
                {
                    "id": map_id,
                    "label": label,
                    "done": done,
                    "failed": failed,
                    "total": total,
                }
            )
            if done >= total:
                del self._maps[map_id]
        self._maps_moved = set()
        return moved

    def _failed(self, failure: Failure, label: str, worker: WorkerInfo | None) -> None:
        if len(self._failures) >= MAX_FAILURES:
            self._failures_left_out += 1
            return
        self._failures.append(
            {
                "t": time.time() * 1e3,
                "function": label,
                "type": failure.type,
                "message": failure.message[:MAX_TRACEBACK_CHARS],
                "traceback": failure.traceback[-MAX_TRACEBACK_CHARS:],
                "pid": worker.pid if worker is not None else None,
            }
        )

    def report(self, links: dict[Any, Link], queued: dict[int, int]) -> dict[str, Any]:
        """What happened since the last report, and the totals (what waits
        in the queue, by priority: ``queued``); starts the next report's
        stream and failures afresh."""
        running = sum(
            1
            for link in links.values()
            for job in link.in_flight.values()
            if job.started
        )
        lanes = [
            {
                "uid": str(uid),
                "pid": self._lane_pids[uid, slot],
                "slot": slot,
                "bars": [[round(b[0], 1), round(b[1], 1), *b[2:]] for b in bars],
            }
            for (uid, slot), bars in self._lanes.items()
        ]
        report = {
            "t": time.time() * 1e3,
            "since": self.since,
            "queued": sum(queued.values()),
            "queued_by_priority": {str(p): n for p, n in queued.items()},
            "running": running,
            "outcomes": dict(self.outcomes),
            "buckets": list(self.buckets),
            "duration_sum_s": self.duration_sum_s,
            "labels": list(self._labels),
            "lanes": lanes,
            "failures": self._failures,
            "failures_left_out": self._failures_left_out,
            "maps": self._moved_maps(),
        }
        self._lanes, self._lane_pids, self._labels = {}, {}, {}
        self._bars, self._failures, self._failures_left_out = 0, [], 0
        return report
