"""What becomes of the tasks of a worker that was lost (its stream ended):
:func:`fates`, for :class:`~pool.routing.placement.Router`, which does
what it says. No I/O.

A worker starts tasks in the order it got them and reports starts after
the fact (with its results): as many of the first unreported ones as it
had slots free may have run. A task that started there, or may have,
counts an attempt; one held behind busy slots does not. Then, in order:

- its client asked to stop or abandon it, or to cancel it and it never
  ran there: it is answered cancelled (its client's cancel holds);
- it ran there past its time limit: it started (or may have, and was sent
  that long ago) before that, with no answer. The worker ended to stop
  it, and its answer did not arrive; or a call that held the GIL kept the
  worker's loop from reporting anything, and the kernel ended it
  (:mod:`workers.alarm`). It fails with
  :class:`~workers.protocol.errors.TaskTimeout`, and never runs again;
- at ``max_attempts`` it fails with :class:`~pool.errors.WorkerLost`; lost
  unstarted :data:`MAX_UNTAKEN_LOSSES` times, too;
- else it goes back to the front of the queue, to run elsewhere.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Final

from pool.routing.jobs import Job, Link

MAX_UNTAKEN_LOSSES: Final = 10


class Fate(enum.Enum):
    """What becomes of one task of a lost worker."""

    AGAIN = "again"  # back to the queue's front: it runs elsewhere
    CANCELLED = "cancelled"
    TIMED_OUT = "timed-out"
    ATTEMPTS_SPENT = "attempts-spent"  # WorkerLost, naming how each died
    UNTAKEN_TOO_OFTEN = "untaken-too-often"


def fates(
    link: Link, jobs: list[Job], max_attempts: int, now: float
) -> Iterator[tuple[Job, Fate, bool]]:
    """Each unfinished job of the lost ``link`` (``jobs``, as it sent
    them), its fate, and whether it counted an attempt: the last sent
    first, so that those queued again keep their order at its front."""
    free = link.slots - sum(job.started for job in jobs)
    unreported = [job for job in jobs if not job.started and not job.finished]
    maybe = set(unreported[: max(free, 0)])
    for job in reversed(jobs):
        if not job.finished:
            fate, taken = _fate(job, link, job in maybe, max_attempts, now)
            yield job, fate, taken


def _fate(
    job: Job, link: Link, maybe: bool, max_attempts: int, now: float
) -> tuple[Fate, bool]:
    taken = job.started or maybe
    if job.withdrawing in ("stop", "abandon") or (
        job.withdrawing == "cancel" and not taken
    ):
        return Fate.CANCELLED, taken
    limit = job.task.timeout_s
    since = job.started_at if job.started else job.sent_at if maybe else now
    if limit > 0 and since and now - since >= limit:
        return Fate.TIMED_OUT, taken
    job.lost(link.info, maybe)
    if job.attempts >= max_attempts:
        return Fate.ATTEMPTS_SPENT, taken
    if job.untaken_losses >= MAX_UNTAKEN_LOSSES:
        return Fate.UNTAKEN_TOO_OFTEN, taken
    return Fate.AGAIN, taken
