"""Payloads: a call's arguments or a task's value, pickled, in the message
or, when large, in shared memory.

Pickle protocol 5 with out-of-band buffers (``buffer_callback``; through
cloudpickle too, for what travels by value): a buffer of at least
:data:`BUFFER_MIN` bytes (a numpy array's data, a pandas block's) is not
copied into the pickle but written once, by the process that pickles, into
a segment of /dev/shm (:mod:`workers.protocol.segments`); so is a pickle
of at least :data:`INLINE_MAX` bytes (a large ``bytes``, a dict of a
million entries). The message carries a :class:`Data` saying where each
part lies. The reader maps the segments copy-on-write and unpickles with
``buffers=``: a numpy array arrives as a writable view of the mapping, with
no copy, and a write copies only the pages written (:func:`loads`).
Smaller payloads travel in the message, as they always have.

Who writes what, for whom, and for how long:

- a client writes its calls' arguments (and ``put`` objects) into segments
  it owns, and unlinks each once no pending task or reference names it
  (:class:`pool.client.store.Store`);
- a worker writes a large value into a segment named for the client that
  submitted the task (``Task.home``, :class:`Sink`), when it shares the
  client's host; the client maps it and unlinks its name at once.

Callers: :mod:`workers.protocol.codec` (arguments and values, both ends),
the client's store.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from workers.protocol import segments, shipping
from workers.protocol.owners import DataOwner
from workers.protocol.segments import Written
from workers.protocol.worker_pb2 import Data, Home, Segment

# From this size a buffer goes into shared memory, and so does a pickle
# (benchmarks/bigdata.py measures where shared memory wins).
BUFFER_MIN: Final = 256 << 10
INLINE_MAX: Final = 256 << 10


class Buffers:
    """The ``buffer_callback`` of one pickling: it takes out of the pickle,
    in order, each buffer of at least :data:`BUFFER_MIN` bytes."""

    __slots__ = ("taken",)

    def __init__(self) -> None:
        self.taken: list[pickle.PickleBuffer] = []

    def __call__(self, buffer: pickle.PickleBuffer) -> bool:
        view = memoryview(buffer)
        if view.nbytes < BUFFER_MIN or not view.contiguous:
            return True  # in the pickle
        self.taken.append(buffer)
        return False

    def clear(self) -> None:
        self.taken.clear()


def dumps(value: Any, *, by_value: bool = False) -> tuple[bytes, Buffers]:
    """``value`` pickled, and the buffers taken out of the pickle."""
    buffers = Buffers()
    return shipping.dumps(value, by_value=by_value, out_of_band=buffers), buffers


def in_message(pickled: bytes, buffers: Buffers) -> bool:
    """Whether a pickling travels as plain bytes (nothing in shared memory)."""
    return not buffers.taken and len(pickled) < INLINE_MAX


class Builder:
    """A :class:`Data` being put together: segments, then parts in order."""

    def __init__(self, pickled: bytes, *, pickle_inline: bool = True) -> None:
        self.data = Data(host=segments.host_id())
        if pickle_inline:
            self.data.pickle = pickled
        self._index: dict[str, int] = {}

    def segment(self, written: Written) -> int:
        """The index of ``written`` among the data's segments."""
        if (index := self._index.get(written.name)) is None:
            index = self._index[written.name] = len(self.data.segments)
            self.data.segments.append(
                Segment(name=written.name, nonce=written.nonce, size=written.size)
            )
        return index

    def part(self, written: Written, offset: int, length: int) -> None:
        self.data.parts.add(segment=self.segment(written), offset=offset, length=length)


def write(
    writer: DataOwner,
    name: str,
    pickled: bytes,
    buffers: Sequence[memoryview],
    into: Segment | None = None,
) -> Data:
    """Write a pickling's buffers, and its pickle if large (else it stays in
    the message), into the segment ``into`` lent for it, unless it is no
    longer what its nonce says (or a reader maps it); else into the new
    segment ``name``.

    :raises SharedMemoryFull: if they do not fit (nothing is left of it).
    """
    inline = len(pickled) < INLINE_MAX
    parts = list(buffers) if inline else [memoryview(pickled), *buffers]
    written = writer.rewrite(into.name, parts, into.nonce) if into else None
    if written is None:
        written = writer.write(name, parts)
    builder = Builder(pickled, pickle_inline=inline)
    for part, offset in zip(parts, written.offsets, strict=True):
        builder.part(written, offset, part.nbytes)
    return builder.data


def loads(data: Data) -> Any:
    """Unpickle a payload in shared memory: each out-of-band buffer a view
    of its segment, mapped copy-on-write, so writable unless it was
    read-only where it was pickled (a write changes only this process's
    pages). The mappings live as long as the views made of them.

    :raises DataGone: if a segment is not there any more.
    """
    maps = [segments.attach(s.name, s.nonce, s.size) for s in data.segments]
    views = []
    for part in data.parts:
        end = part.offset + part.length
        views.append(memoryview(maps[part.segment])[part.offset : end])
    pickled = data.pickle if data.pickle else views.pop(0)
    return pickle.loads(pickled, buffers=views)


def deref(blob: bytes) -> Any:
    """The object a ``put`` reference names (what it unpickles to)."""
    return loads(Data.FromString(blob))


def size_of(data: Data) -> int:
    """The bytes a payload holds in shared memory and in the message."""
    return sum(s.size for s in data.segments) + len(data.pickle)


@dataclass(frozen=True, slots=True)
class Sink:
    """Where a worker writes a value too large for a message: a segment
    that the client of the task owns, named after the task."""

    writer: DataOwner
    owner: str
    tag: int
    lend: Segment | None = None  # a spare of the client's, to write into

    @classmethod
    def of(cls, writer: DataOwner | None, home: Home) -> Sink | None:
        """The sink of a task's ``home``, if this process can write there."""
        if writer is None or not home.owner or home.host != segments.host_id():
            return None
        lend = home.lend if home.HasField("lend") else None
        return cls(writer, home.owner, home.tag, lend)

    def name(self) -> str:
        return self.writer.name(self.owner, f"r{self.tag}")
