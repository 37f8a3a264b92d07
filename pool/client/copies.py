"""What a client has written into its segments, by the object each buffer
came from: a buffer already there is not written again.

``map(f, [a] * 16)`` pickles ``a`` sixteen times, and a loop of ``submit``
calls may pass the same array each time. Each large buffer written is
remembered by its exporting object (a weak reference: the object itself,
still alive) and size. When the same object comes again while its segment
lives, the payload names that segment instead of writing a copy. Within
one call of ``map`` (:meth:`Copies.one_call`) the object is trusted not to
have changed, as ``ProcessPoolExecutor`` trusts it not to change before
its feeder thread pickles it; otherwise its bytes are compared with the
segment's first (a read of it, about a quarter of the cost of a write).

The :class:`~pool.client.store.Store` calls it under its own lock, but for
:meth:`Copies.one_call`, which only marks the calling thread.
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from workers.protocol.segments import Written

Key = tuple[int, int, bool]  # the exporter's id, the size, read-only


@dataclass(eq=False, slots=True)
class Copy:
    """A buffer written into a segment: where, and by which object."""

    exporter: weakref.ref[Any]
    written: Written
    offset: int
    epoch: int  # the map call that wrote or checked it last (0: none)


def _key(buffer: pickle.PickleBuffer) -> tuple[Key, Any]:
    view = memoryview(buffer)
    return (id(view.obj), view.nbytes, view.readonly), view.obj


class Copies:
    """The buffers in a client's segments (see the module docstring)."""

    def __init__(self) -> None:
        self._by_key: dict[Key, Copy] = {}
        self._in: dict[str, list[Key]] = {}  # segment: the keys of its copies
        self._epochs = itertools.count(1)
        self._local = threading.local()  # .epoch: the map call under way

    @contextlib.contextmanager
    def one_call(self) -> Iterator[None]:
        """Within this block (one ``map`` call), a buffer written once is
        trusted to hold the same bytes when its object comes again."""
        self._local.epoch = next(self._epochs)
        try:
            yield
        finally:
            self._local.epoch = 0

    @property
    def epoch(self) -> int:
        return getattr(self._local, "epoch", 0)

    def find(self, buffer: pickle.PickleBuffer) -> Copy | None:
        """Where the object of ``buffer`` was written, if it still lives."""
        key, exporter = _key(buffer)
        copy = self._by_key.get(key)
        if copy is None or copy.exporter() is not exporter:
            return None
        return copy

    def trusted(self, copy: Copy) -> bool:
        """Whether ``copy`` was written or checked within this map call."""
        return bool(self.epoch) and copy.epoch == self.epoch

    def checked(self, copy: Copy) -> None:
        copy.epoch = self.epoch

    def remember(
        self, buffer: pickle.PickleBuffer, written: Written, offset: int
    ) -> None:
        key, exporter = _key(buffer)
        try:
            ref = weakref.ref(exporter)
        except TypeError:
            return  # (an object without weak references is not looked for)
        self._by_key[key] = Copy(ref, written, offset, self.epoch)
        self._in.setdefault(written.name, []).append(key)

    def forget(self, name: str) -> None:
        """The segment ``name`` holds none of them any more."""
        for key in self._in.pop(name, ()):
            copy = self._by_key.get(key)
            if copy is not None and copy.written.name == name:
                del self._by_key[key]

    def clear(self) -> None:
        self._by_key.clear()
        self._in.clear()
