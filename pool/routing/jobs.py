"""What the routing engine's parts pass each other: a :class:`Job` (a task
from its submission to its result), the :class:`Owner` that hears of its
fate (a client stream), the :class:`Link` that carries it to a worker, the
:class:`LinkEvents` a link reports (to the router, which decides: links
carry), and :class:`Ends`, told of every job's end if its runner wants
(the dispatcher's dashboard). A link's end is the end of its ``run``.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from discovery import WorkerInfo
from workers.protocol.stream import Withdraw
from workers.protocol.worker_pb2 import Chunk, FetchRequest, Result, Task

# Why a job's worker was asked to give it back: as its client asked (see
# workers.protocol.stream.Withdraw), or to move it ("requeue": a free
# worker, a higher priority).
Withdrawal = Withdraw | Literal["requeue"]


class Owner(Protocol):
    """Whoever submitted a job (a client stream) and hears of its fate."""

    def on_started(self, job: Job) -> None: ...
    def on_result(self, job: Job, result: Result) -> None: ...
    def on_wanted(self, job: Job, source: str) -> None:
        """The job, whose arguments its client holds, was sent to the
        worker ``source``: ask the client to upload them there."""


class Ends(Protocol):
    """Told of every job's end (the dispatcher's dashboard counts them)."""

    def finished(self, job: Job, result: Result, worker: WorkerInfo | None) -> None:
        """``job`` ended with ``result``, from ``worker`` if one ran it."""


class LinkEvents(Protocol):
    """What a link reports about its worker's tasks."""

    def on_connected(self, link: Link) -> None:
        """The stream reached the worker: it may be sent tasks."""

    def on_started(self, link: Link, task_ids: Iterable[int]) -> None:
        """The worker started these tasks (reported with its results)."""

    def on_results(self, link: Link, results: Iterable[Result]) -> None:
        """One message's results from the worker (none, if it only told
        how many tasks it holds for other dispatchers: ``link.others``)."""


class Link(abc.ABC):
    """A stream to one worker, as the router uses it: what the router reads
    and writes of every link, kept here once, and what it asks of each kind
    (:class:`~pool.routing.links.WorkerLink`; the unit tests' played one).
    """

    def __init__(self, info: WorkerInfo, rtt_s: float) -> None:
        self.info = info
        self.in_flight = InFlight(self)  # what it has sent and not had answered
        self.done = 0
        self.dropped = False  # discovery dropped the worker; its stream may finish
        self.pace_s = 0.0  # how long its tasks run (0: not known yet)
        self.rtt_s = rtt_s  # a round trip to it
        self.progressed_at = 0.0  # when it last reported a start (or, idle, was sent)
        self.others = 0  # tasks its worker holds for other dispatchers, last told
        self.connected = False  # its stream reached the worker
        self.refused: str | None = None  # why the worker refused this dispatcher
        self.broke: str | None = None  # why its stream last broke otherwise

    def describe(self) -> str:
        return f"worker pid {self.info.pid} ({str(self.info.uid)[:8]})"

    @property
    def slots(self) -> int:
        """Tasks its worker runs at once."""
        return self.info.capacity

    @property
    def load(self) -> int:
        """Tasks its worker holds: ours in flight, and the others'."""
        return len(self.in_flight) + self.others

    @property
    @abc.abstractmethod
    def ready(self) -> bool:
        """It takes tasks."""

    @property
    @abc.abstractmethod
    def free(self) -> int:
        """Tasks it may still be sent: its slots, and what hides a round
        trip ahead of them, less what it holds."""

    @abc.abstractmethod
    def send(self, job: Job) -> None:
        """Send ``job`` to its worker (``in_flight.add``)."""

    @abc.abstractmethod
    def take_back(self, job: Job) -> bool:
        """Take ``job`` back if it is not written to the worker yet (out of
        ``in_flight``, then): whether it was."""

    @abc.abstractmethod
    def cancel(self, task_id: int, kind: Withdraw = "cancel") -> None:
        """Ask its worker to withdraw ``task_id`` (see
        :data:`~workers.protocol.stream.Withdraw`)."""

    @abc.abstractmethod
    async def run(self) -> None:
        """The stream, until it ends (:meth:`close`, or the worker goes)."""

    @abc.abstractmethod
    def close(self) -> None:
        """End :meth:`run`."""

    @abc.abstractmethod
    def fetch(self, request: FetchRequest) -> AsyncIterator[Chunk]:
        """A value its worker holds (:mod:`workers.protocol.transfer`)."""

    @abc.abstractmethod
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
    # Why its worker was asked to withdraw it, if it was (see Withdrawal).
    withdrawing: Withdrawal | None = None
    sent_at: float = 0.0  # when it was written to its current link
    started_at: float = 0.0  # when its current worker's start was heard of
    finished: bool = False  # answered (or cancelled while queued)

    @property
    def asked(self) -> Withdraw | None:
        """How its client asked its worker to withdraw it, if it did."""
        return None if self.withdrawing == "requeue" else self.withdrawing

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


class InFlight(dict[int, Job]):
    """The tasks one link has sent to its worker and not had answered, by
    the dispatcher's task id.

    The invariant, kept here: a job is in a link's ``in_flight`` exactly
    while its ``link`` names that link. Only these three methods change
    either (the router, the stealing and the link itself call them); the
    rest only read. (A dict: the router reads it on every task.)
    """

    __slots__ = ("_link",)

    def __init__(self, link: Link) -> None:
        super().__init__()
        self._link = link

    def add(self, job: Job) -> None:
        """``job`` is sent to this link's worker: a new attempt there."""
        job.link, job.started, job.withdrawing = self._link, False, None
        self[job.task.id] = job

    def remove(self, task_id: int) -> Job | None:
        """The job ``task_id`` leaves (answered, or taken back), if here."""
        job = self.pop(task_id, None)
        if job is not None:
            job.link = None
        return job

    def remove_all(self) -> list[Job]:
        """Every job leaves (the worker is lost, or the pool stops), in the
        order they were sent."""
        jobs = list(self.values())
        self.clear()
        for job in jobs:
            job.link = None
        return jobs


# What the router calls to link a newly discovered worker.
Connect = Callable[[WorkerInfo, LinkEvents], Link]
