"""``/metrics``: the pool in Prometheus' text format, from ``prometheus_client``.

A collector reads the :class:`~pool.supervisor.dashboard.board.Board` at
each scrape (the dispatcher's totals, which it reports twice a second, and
the workers discovery shows, on every host with ``--discovery``); the
drop-time histogram is observed here, as the board sees each drop. Every
name is under ``shmpool_``; docs/reference.md lists them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pool.dispatcher.telemetry import DURATION_BUCKETS_S
from pool.supervisor.dashboard.board import Board

STATUSES = ("ready", "draining", "stuck")  # always exported, 0 or not
DROP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class Metrics:
    """The registry ``/metrics`` serves; :meth:`drop_seen` observes a drop."""

    def __init__(self, board: Board) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_BoardCollector(board))
        self._drops = Histogram(
            "shmpool_worker_drop_seconds",
            "How long from a worker's death (its exit, seen through its pidfd) "
            "until discovery dropped it; the supervisor's own workers",
            buckets=DROP_BUCKETS_S,
            registry=self.registry,
        )

    def drop_seen(self, seconds: float) -> None:
        self._drops.observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _BoardCollector(Collector):
    def __init__(self, board: Board) -> None:
        self._board = board

    def collect(self) -> Iterator[Metric]:
        board = self._board
        workers = GaugeMetricFamily(
            "shmpool_workers", "Workers registered, by status", labels=["status"]
        )
        counts = dict.fromkeys(STATUSES, 0)
        for row in board.workers.values():
            if not row["gone_at"]:
                counts[row["status"]] = counts.get(row["status"], 0) + 1
        for status, count in counts.items():
            workers.add_metric([status], count)
        yield workers
        tasks = CounterMetricFamily(
            "shmpool_tasks",
            "Tasks ended, by outcome (lost: WorkerLost or PoolStopping; a map "
            "chunk counts once)",
            labels=["outcome"],
        )
        for outcome, count in board.outcomes.items():
            tasks.add_metric([outcome], count)
        yield tasks
        yield GaugeMetricFamily(
            "shmpool_queued_tasks",
            "Tasks waiting in the dispatcher for a worker",
            value=board.queued or 0,
        )
        yield GaugeMetricFamily(
            "shmpool_running_tasks", "Tasks workers have started", value=board.running
        )
        yield _durations(board)
        yield CounterMetricFamily(
            "shmpool_worker_restarts",
            "Workers the supervisor started again after one ended",
            value=board.restarts,
        )


def _durations(board: Board) -> HistogramMetricFamily:
    """How long tasks ran: the board's buckets, made cumulative."""
    bounds = (*map(str, DURATION_BUCKETS_S), "+Inf")
    cumulative = list(itertools.accumulate(board.buckets))
    return HistogramMetricFamily(
        "shmpool_task_duration_seconds",
        "How long tasks ran, as their workers measured it",
        buckets=list(zip(bounds, cumulative, strict=True)),
        sum_value=board.duration_sum_s,
    )
