"""What one end of a task stream has to say, handed to its writer at once.

Both ends of a task stream (a worker answering its dispatcher, a
dispatcher answering its client) put results and started task ids in as
they come, and one writer task takes them out as :class:`ResultBatch`
messages: each write carries everything that was ready at that moment.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from workers.protocol.worker_pb2 import Result, ResultBatch


class Outbox:
    """Results and started ids in from callbacks, batches out to one writer."""

    def __init__(self) -> None:
        self._results: list[Result] = []
        self._started: list[int] = []
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, result: Result) -> None:
        self._results.append(result)
        self._ready.set()

    def start(self, task_id: int) -> None:
        """Tell the reader that the task ``task_id`` has started."""
        self._started.append(task_id)
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
            if self._results or self._started:
                batch = ResultBatch(results=self._results, started=self._started)
                self._results, self._started = [], []
                yield batch
            if self._closed and not (self._results or self._started):
                return
