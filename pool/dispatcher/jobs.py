"""What the dispatcher's parts pass each other: a :class:`Job` (a task from
its submission to its result), the :class:`Owner` that hears of its fate
(a client stream), the :class:`Link` that carries it to a worker, and the
:class:`LinkEvents` a link reports (to the router, which decides: links
carry). A link's end is the end of its ``run``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from discovery import WorkerInfo
from workers.protocol.worker_pb2 import Chunk, FetchRequest, Result, Task

Withdrawal = Literal["cancel", "requeue"]


class Owner(Protocol):
    """Whoever submitted a job (a client stream) and hears of its fate."""

    def on_started(self, job: Job) -> None: ...
    def on_result(self, job: Job, result: Result) -> None: ...
    def on_wanted(self, job: Job, source: str) -> None:
        """The job, whose arguments its client holds, was sent to the
        worker ``source``: ask the client to upload them there."""


class LinkEvents(Protocol):
    """What a link reports about its worker's tasks."""

    def on_connected(self, link: Link) -> None:
        """The stream reached the worker: it may be sent tasks."""

    def on_started(self, link: Link, task_ids: Iterable[int]) -> None:
        """The worker started these tasks (reported with its results)."""

    def on_results(self, link: Link, results: Iterable[Result]) -> None:
        """One message's results from the worker (none, if it only told
        how many tasks it holds for other dispatchers: ``link.others``)."""


class Link(Protocol):
    """A stream to one worker, as the router uses it."""

    info: WorkerInfo
    in_flight: dict[int, Job]  # by the dispatcher's task id
    done: int
    dropped: bool  # discovery dropped the worker; its stream may still finish
    pace_s: float  # how long its tasks run (0: not known yet)
    rtt_s: float  # a round trip to it
    progressed_at: float  # when it last reported a start (or was sent work, idle)
    others: int  # tasks its worker holds for other dispatchers, last told

    @property
    def load(self) -> int:
        """Tasks its worker holds: ours in flight, and the others'."""

    @property
    def ready(self) -> bool: ...
    @property
    def slots(self) -> int:
        """Tasks its worker runs at once."""

    @property
    def free(self) -> int:
        """Tasks it may still be sent: its slots, and what hides a round
        trip ahead of them, less what it holds."""

    def send(self, job: Job) -> None: ...
    def withdraw(self, job: Job) -> bool: ...
    def cancel(self, task_id: int) -> None: ...
    async def run(self) -> None: ...
    def close(self) -> None: ...
    def fetch(self, request: FetchRequest) -> AsyncIterator[Chunk]:
        """A value its worker holds (:mod:`workers.protocol.transfer`)."""

    async def upload(self, chunks: AsyncIterator[Chunk]) -> None:
        """A task's arguments, to its worker."""


@dataclass(eq=False, slots=True)
class Job:
    """A task in the dispatcher's hands, from submission to its result."""

    task: Task  # its id is the dispatcher's own
    tags: frozenset[str]
    owner: Owner
    client_id: int
    code: bytes = b""  # its function's pickle, if it ships one (see shipping)
    attempts: int = 0  # workers lost after it had started there
    untaken_losses: int = 0  # workers lost before it started there
    lost_on: tuple[WorkerInfo, ...] = ()  # (a tuple: no list per task)
    unplaceable_since: float | None = None
    link: Link | None = None
    started: bool = False  # its current link's worker started it
    # Why its worker was asked to withdraw it, if it was: "cancel" (its
    # client's), or "requeue" (for a worker that is free).
    withdrawing: Withdrawal | None = None
    sent_at: float = 0.0  # when it was written to its current link
    finished: bool = False  # answered (or cancelled while queued)

    def lost(self, info: WorkerInfo, may_have_started: bool) -> bool:
        """Its worker (``info``) was lost: an attempt if it had started there
        or ``may_have_started`` (its start report may not have left), else a
        loss untaken. Whether it counted an attempt."""
        self.withdrawing = None
        taken, self.started = self.started or may_have_started, False
        if taken:
            self.attempts += 1
            self.lost_on += (info,)
        else:
            self.untaken_losses += 1
        return taken


# What the router calls to link a newly discovered worker.
Connect = Callable[[WorkerInfo, LinkEvents], Link]
