"""Whether a task can find a worker: :class:`Matching`, for
:class:`~pool.routing.placement.Router`, which answers what it refuses.
No I/O.

A task whose tags no registered worker has waits for one, up to
``no_worker_timeout_s`` (:meth:`Matching.expired`), until every worker of
the pool has started (the supervisor says so, :attr:`Matching.started`):
from then on it fails at once with :class:`~pool.errors.NoWorkerAvailable`,
which names the tags the workers have. A pool none of whose workers can
start (their initializer fails, :attr:`Matching.broken`) fails every task
with that failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final
from uuid import UUID

import grpc

from pool.errors import NoWorkerAvailable
from pool.routing.jobs import Job, Link
from pool.routing.queue import TaskQueue
from workers.protocol import codec
from workers.protocol.worker_pb2 import Failure, Result

NO_WORKER_TIMEOUT_S: Final = 30.0


class Matching:
    """What the router refuses a task, its links being ``links``."""

    def __init__(self, links: Mapping[UUID, Link], no_worker_timeout_s: float) -> None:
        self._links, self._limit_s = links, no_worker_timeout_s
        self.started = False  # every worker of the pool has started once
        self.broken: Failure | None = None  # no worker can start: fail all

    def refusal(self, job: Job) -> Result | None:
        """The answer of a job that can find no worker now, if it cannot."""
        if self.broken is not None:
            return Result(id=job.task.id, failure=self.broken)
        if self.unmatched(job):
            known = frozenset().union(*(k.info.tags for k in self._links.values()))
            tags = tuple(sorted(job.tags))
            return _no_worker(job, NoWorkerAvailable(tags, 0.0, tuple(sorted(known))))
        return None

    def unmatched(self, job: Job) -> bool:
        """Whether the pool has started and no registered worker has the
        job's tags (else it may yet find one)."""
        if not (self.started and job.tags and self._links):
            return False
        return not any(job.tags <= k.info.tags for k in self._links.values())

    def expired(self, queue: TaskQueue) -> list[tuple[Job, Result]]:
        """Take out of ``queue`` the jobs that have had no matching ready
        worker for ``no_worker_timeout_s``, with their answers (called about
        once a second: a task fails up to a second late)."""
        ready = [link.info.tags for link in self._links.values() if link.ready]
        return [
            (
                job,
                _no_worker(
                    job, NoWorkerAvailable(tuple(sorted(job.tags)), self._limit_s)
                ),
            )
            for job in queue.expired(ready, self._limit_s)
        ]


def _no_worker(job: Job, error: NoWorkerAvailable) -> Result:
    failure = codec.failure_of(error, grpc.StatusCode.DEADLINE_EXCEEDED, remote=False)
    return Result(id=job.task.id, failure=failure)
