"""What one end of a task stream has to say, handed to its writer at once.

Both ends of a task stream (a worker answering its dispatcher, a
dispatcher answering its client) put results and started task ids in as
they come, and one writer task takes them out as :class:`ResultBatch`
messages: each write carries everything that was ready at that moment. A
worker also tells each dispatcher how many tasks it holds for the others
(:meth:`Outbox.others`), with the next message or in one of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

from workers.protocol.worker_pb2 import Result, ResultBatch, Want

# A batch is cut after this many bytes of results: with one more result of
# up to MAX_ARGS_LIMIT (64 MiB), it stays under gRPC's 128 MiB. (The same
# as workers.protocol.stream.MAX_BATCH_BYTES, which imports this module.)
MAX_BATCH_BYTES: Final = 64 * 1024 * 1024


class Outbox:
    """Results and started ids in from callbacks, batches out to one writer."""

    def __init__(self) -> None:
        self._results: list[Result] = []
        self._bytes = 0  # of the results' values and failures
        self._started: list[int] = []
        self._wants: list[Want] = []  # (a dispatcher's, to its client)
        self._others: int | None = None  # a new count to tell, if any
        self._told_others = 0  # the count last told (0 until one is)
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, result: Result) -> None:
        self._results.append(result)
        self._bytes += len(result.value)
        if result.HasField("failure"):
            self._bytes += result.failure.ByteSize()
        self._ready.set()

    def start(self, task_id: int) -> None:
        """Tell the reader that the task ``task_id`` has started."""
        self._started.append(task_id)
        self._ready.set()

    def want(self, want: Want) -> None:
        """Ask the client for a task's arguments (to a worker)."""
        self._wants.append(want)
        self._ready.set()

    def others(self, count: int) -> None:
        """Tell the reader how many tasks its worker holds for other
        streams, if that changed since it was last told."""
        if count == self._told_others:
            self._others = None  # (changed back before it was told)
        elif count != self._others:
            self._others = count
            self._ready.set()

    def close(self) -> None:
        """No more items: :meth:`batches` ends once it has handed out the rest."""
        self._closed = True
        self._ready.set()

    async def batches(self) -> AsyncIterator[ResultBatch]:
        """Everything put since the last batch, as soon as there is some.

        A batch is handed over in the same step of the loop that took it
        out, so whatever the consumer notes on receiving it matches it.
        """
        while True:
            await self._ready.wait()
            await asyncio.sleep(0)  # what else is ready joins the batch
            self._ready.clear()
            if self._bytes > MAX_BATCH_BYTES:
                for batch in self._cut():
                    yield batch
            elif self._results or self._started or self._wants:
                batch = ResultBatch(results=self._results, started=self._started)
                if self._wants:
                    batch.wants.extend(self._wants)
                self._results, self._started, self._wants = [], [], []
                self._bytes = 0
                yield self._tell_others(batch)
            elif self._others is not None:
                yield self._tell_others(ResultBatch())
            if self._closed and not (self._results or self._started):
                return

    def _cut(self) -> list[ResultBatch]:
        """What is ready, as batches of about :data:`MAX_BATCH_BYTES` each
        (the started ids with the first)."""
        batches = [ResultBatch(started=self._started, wants=self._wants)]
        size = 0
        for result in self._results:
            result_size = len(result.value) + result.failure.ByteSize()
            if batches[-1].results and size + result_size > MAX_BATCH_BYTES:
                batches.append(ResultBatch())
                size = 0
            batches[-1].results.append(result)
            size += result_size
        self._results, self._started, self._wants = [], [], []
        self._bytes = 0
        self._tell_others(batches[0])
        return batches

    def _tell_others(self, batch: ResultBatch) -> ResultBatch:
        if self._others is not None:
            batch.others = self._told_others = self._others
            self._others = None
        return batch
