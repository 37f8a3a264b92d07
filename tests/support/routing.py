"""A played router world for the dispatcher's unit tests: a real
:class:`~pool.routing.placement.Router` over fake links (:class:`FakeLink`)
whose workers the test plays: they take, start, answer, refuse and die."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from discovery import DiscoveryEvent, WorkerInfo
from pool.routing.jobs import Job, Link, LinkEvents
from pool.routing.placement import Router
from workers.protocol import codec
from workers.protocol.stream import Withdraw
from workers.protocol.worker_pb2 import Chunk, FetchRequest, Result, Task


class FakeLink(Link):
    """A worker's stream that the test plays: it takes, answers and dies."""

    def __init__(
        self,
        info: WorkerInfo,
        router: LinkEvents,
        refusal: str | None = None,
        unreachable: str | None = None,
    ) -> None:
        super().__init__(info, rtt_s=0.001)
        self.router = router
        self._refusal = refusal  # the worker refuses this dispatcher so
        self._unreachable = unreachable  # the stream breaks before reaching it so
        self.written: list[Job] = []  # what reached the worker
        self.unwritten: list[Job] = []  # sent, not yet written
        self.cancels: list[int] = []
        self.cancelled_at: list[float] = []  # (time.monotonic() of each)
        self.stops: list[int] = []
        self.abandons: list[int] = []
        self.ahead = 0  # what it may hold past its slots
        self._ended = asyncio.Event()

    @property
    def ready(self) -> bool:
        return (
            not self._ended.is_set()
            and not self.dropped
            and (self.info.status == "ready")
        )

    @property
    def free(self) -> int:
        return self.slots + self.ahead - self.load

    def send(self, job: Job) -> None:
        job.task.attempt = job.attempts + 1
        self.in_flight.add(job)
        self.unwritten.append(job)

    def take_back(self, job: Job) -> bool:
        if job not in self.unwritten:
            return False
        self.unwritten.remove(job)
        self.in_flight.remove(job.task.id)
        return True

    def cancel(self, task_id: int, kind: Withdraw = "cancel") -> None:
        {"cancel": self.cancels, "stop": self.stops, "abandon": self.abandons}[
            kind
        ].append(task_id)
        self.cancelled_at.append(time.monotonic())

    async def run(self) -> None:
        if self._refusal is not None:  # (as a worker that refuses the token)
            self.refused = self._refusal
            return
        if self._unreachable is not None:  # (as an address that does not resolve)
            self.broke = self._unreachable
            return
        self.connected = True
        self.router.on_connected(self)  # (ready from the start, as its stream)
        await self._ended.wait()

    def close(self) -> None:
        self._ended.set()

    def fetch(self, request: FetchRequest) -> AsyncIterator[Chunk]:
        raise LookupError("a played worker holds no values")

    async def upload(self, chunks: AsyncIterator[Chunk]) -> None:
        raise LookupError("a played worker takes no arguments")

    # -- what the test makes the worker do ------------------------------------

    def write(self) -> list[Job]:
        """The sent tasks reach the worker."""
        for job in self.unwritten:
            job.sent_at = time.monotonic()
        self.written += self.unwritten
        written, self.unwritten = self.unwritten, []
        return written

    def start(self, *jobs: Job) -> None:
        self.router.on_started(self, [job.task.id for job in jobs])

    def answer(self, job: Job, value: Any) -> None:
        self.router.on_results(
            self, [Result(id=job.task.id, value=pickle.dumps(value))]
        )

    def withdrawn(self, job: Job) -> None:
        """The worker gives back a task it held unstarted."""
        withdrawn = Result(id=job.task.id, failure=codec.cancelled())
        self.router.on_results(self, [withdrawn])

    def tell_others(self, count: int) -> None:
        """The worker holds ``count`` tasks for other dispatchers now."""
        self.others = count
        self.router.on_results(self, [])

    def refuse(self, job: Job) -> None:
        self.router.on_results(self, [Result(id=job.task.id, failure=codec.rejected())])


class Owner:
    """A client stream: what it heard about each of its jobs."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.results: dict[int, Result] = {}

    def on_started(self, job: Job) -> None:
        self.started.append(job.client_id)

    def on_wanted(self, job: Job, source: str) -> None:
        raise AssertionError("no task of these tests has its arguments held")

    def on_result(self, job: Job, result: Result) -> None:
        assert job.client_id not in self.results, "answered twice"
        self.results[job.client_id] = result

    def value(self, client_id: int) -> Any:
        result = self.results[client_id]
        assert result.HasField("value"), result.failure
        return pickle.loads(result.value)

    def error(self, client_id: int) -> BaseException:
        result = self.results[client_id]
        assert result.HasField("failure"), result
        return codec.exception_of(result.failure)


class World:
    """A router, its fake links by worker name, and one owner."""

    def __init__(
        self,
        router: Router,
        links: dict[uuid.UUID, FakeLink],
        refusals: dict[uuid.UUID, str],
        unreachable: dict[uuid.UUID, str],
        linked: list[uuid.UUID],
    ) -> None:
        self.router, self._links, self.owner = router, links, Owner()
        self.refusals = refusals  # what each worker refuses this dispatcher with
        self.unreachable = unreachable  # why each worker's stream does not reach it
        self.linked = linked  # each worker's uid, every time a link is made to it
        self.infos: dict[str, WorkerInfo] = {}
        self._next_id = 0

    def add(
        self, name: str, capacity: int = 2, tags: frozenset[str] = frozenset()
    ) -> FakeLink:
        """A worker appears in discovery."""
        pid = 100 + len(self.infos)
        info = WorkerInfo(
            uuid.uuid4(), f"unix:/{name}", pid, "1", tags, capacity=capacity
        )
        self.infos[name] = info
        self.router.on_event(DiscoveryEvent("worker-added", info))
        return self.link(name)

    def link(self, name: str) -> FakeLink:
        return self._links[self.infos[name].uid]

    def submit(
        self, tags: tuple[str, ...] = (), priority: int = 0, timeout_s: float = 0.0
    ) -> Job:
        self._next_id += 1
        task = Task(function="m:f", priority=priority, timeout_s=timeout_s)
        job = Job(task, frozenset(tags), self.owner, self._next_id)
        self.router.submit(job)
        self.router.pump()
        return job


@asynccontextmanager
async def world(**options: Any) -> AsyncIterator[World]:
    links: dict[uuid.UUID, FakeLink] = {}
    refusals: dict[uuid.UUID, str] = {}
    unreachable: dict[uuid.UUID, str] = {}
    linked: list[uuid.UUID] = []

    def connect(info: WorkerInfo, router: LinkEvents) -> FakeLink:
        links[info.uid] = FakeLink(
            info, router, refusals.get(info.uid), unreachable.get(info.uid)
        )
        linked.append(info.uid)
        return links[info.uid]

    alive = options.pop("alive", lambda namespace, uid: False)
    async with Router("ns", connect, is_alive=alive, **options) as router:
        yield World(router, links, refusals, unreachable, linked)


async def settle() -> None:
    """Let the router's own tasks (link ends, failures) take their step."""
    for _ in range(5):
        await asyncio.sleep(0)


def with_status(info: WorkerInfo, status: str) -> WorkerInfo:
    return dataclasses.replace(info, status=status)  # type: ignore[arg-type]


async def until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.01)  # polled within the caller's deadline
