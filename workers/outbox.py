"""An outbox that hands a stream writer everything ready at once.

Both ends of a task stream (a worker answering its dispatcher, a
dispatcher answering its client) put results in as they finish and write
them out in as few messages as the reader allows: each write carries every
result that was ready at that moment.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Outbox(Generic[T]):
    """Items in from callbacks, lists of them out to one writer."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, item: T) -> None:
        self._items.append(item)
        self._ready.set()

    def close(self) -> None:
        """No more items: :meth:`batches` ends once it has handed out the rest."""
        self._closed = True
        self._ready.set()

    async def batches(self) -> AsyncIterator[list[T]]:
        """Every item put since the last batch, as soon as there is one."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            items, self._items = self._items, []
            if items:
                yield items
            if self._closed and not self._items:
                return
