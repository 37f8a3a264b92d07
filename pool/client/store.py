"""What a client keeps in shared memory: :class:`Store`, and the
references to objects put there, :class:`ObjectRef`.

A client on its pool's machine pickles a large argument into a segment of
its own (:mod:`workers.protocol.payload`), and a worker writes a large
result into one named for the client. The store counts, for each segment it
owns, the payloads that name it: each pending task's arguments, and each
``put`` reference. A task holds what it names from its submission until
its answer; a reference, until it is released or no longer referenced.
The last to let go unlinks it; what a reader still maps stays mapped.

A buffer already in one of its segments (the same object, still alive,
with the same bytes) is not written again: ``map(f, [a] * 16)`` writes
``a`` once. Within one call of ``map`` the object is trusted not to have
changed (as ``ProcessPoolExecutor`` trusts it not to change before its
feeder thread pickles it); a later call compares the bytes first.

A result is mapped when it arrives (:meth:`Store.adopt`) and its name
unlinked at once. Results nobody will read (their task was cancelled, or a
dispatcher or worker died with them in flight) are unlinked by
:meth:`Store.sweep`, which the connection runs every second; a dead
client's are reaped by its pool (:func:`workers.protocol.segments.reap`).
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import threading
import weakref
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from workers.protocol import payload, segments, shipping
from workers.protocol.payload import Buffers
from workers.protocol.segments import DataOwner, Written
from workers.protocol.worker_pb2 import Data

Hold = tuple[str, ...]  # the segments a payload names, one count each
SWEEP_S: Final = 1.0
NO_STORE: Final = (
    "the pool of namespace {namespace!r} does not share this machine's memory "
    "(its workers may run elsewhere): pass the value to each task instead"
)
_RELEASED: Final = (
    "this ObjectRef was released (or its client closed); put the object "
    "again with client.put(obj)"
)

_packing = threading.local()  # .current: the _Packing under way in a thread


@dataclass(eq=False, slots=True)
class _Copy:
    """A buffer written into a segment: where, and by which object."""

    exporter: weakref.ref[Any]
    written: Written
    offset: int
    epoch: int  # the map call that wrote or checked it last (0: none)


@dataclass(eq=False)
class _Packing(Buffers):
    """One pickling's out-of-band buffers and the references it names."""

    store: Store
    refs: list[ObjectRef] = field(default_factory=list)

    def __post_init__(self) -> None:
        Buffers.__init__(self)

    def clear(self) -> None:
        super().clear()
        self.refs.clear()


class Store:
    """A client's segments; see the module docstring. Thread-safe."""

    def __init__(self, owner: DataOwner) -> None:
        self.owner = owner
        self.host = segments.host_id()
        self._lock = threading.Lock()
        self._holders: dict[str, int] = {}  # segment: payloads naming it
        self._copies: dict[tuple[int, int, bool], _Copy] = {}
        self._copies_in: dict[str, list[tuple[int, int, bool]]] = {}
        self._epochs = itertools.count(1)
        self._local = threading.local()  # .epoch: the map call under way
        self.closed = False

    @contextlib.contextmanager
    def one_call(self) -> Iterator[None]:
        """Within this block (one ``map`` call), a buffer written once is
        trusted to hold the same bytes when its object comes again."""
        self._local.epoch = next(self._epochs)
        try:
            yield
        finally:
            self._local.epoch = 0

    def pack(self, value: Any, *, by_value: bool = False) -> tuple[bytes | Data, Hold]:
        """``value`` pickled: its bytes, or where it lies in shared memory;
        and the segments it holds until :meth:`release`.

        :raises SharedMemoryFull: if it does not fit.
        :raises ValueError: if it names a released reference, or another's.
        :raises Exception: whatever pickling raises.
        """
        packing = _Packing(self)
        _packing.current = packing
        try:
            pickled = shipping.dumps(value, by_value=by_value, out_of_band=packing)
        finally:
            _packing.current = None
        refs = self._hold_refs(packing.refs)
        if payload.in_message(pickled, packing):
            return pickled, refs
        try:
            data, hold = self._write(pickled, packing.taken)
        except BaseException:
            self.release(refs)
            raise
        return data, hold + refs

    def _hold_refs(self, refs: list[ObjectRef]) -> Hold:
        names = tuple(s.name for ref in refs for s in ref.data.segments)
        with self._lock:
            if any(name not in self._holders for name in names):
                raise ValueError(_RELEASED)
            for name in names:
                self._holders[name] += 1
        return names

    def _write(
        self, pickled: bytes, buffers: list[pickle.PickleBuffer]
    ) -> tuple[Data, Hold]:
        """Write what is not in a segment yet into a new one: the pickle if
        it is large, and each buffer not found (:meth:`_find`)."""
        inline = len(pickled) < payload.INLINE_MAX
        found = [self._find(buffer) for buffer in buffers]
        hold = tuple(copy.written.name for copy in found if copy is not None)
        fresh = [b.raw() for b, copy in zip(buffers, found, strict=True) if not copy]
        parts = fresh if inline else [memoryview(pickled), *fresh]
        written = None
        try:
            if parts:
                written = self.owner.write(self.owner.name(self.owner.id, "a"), parts)
        except BaseException:
            self.release(hold)
            raise
        builder = payload.Builder(pickled, pickle_inline=inline)
        offsets = iter(written.offsets if written else ())
        if written and not inline:
            builder.part(written, next(offsets), len(pickled))
        for buffer, copy in zip(buffers, found, strict=True):
            length = memoryview(buffer).nbytes
            if copy is not None:
                builder.part(copy.written, copy.offset, length)
            else:
                assert written is not None
                offset = next(offsets)
                builder.part(written, offset, length)
                self._remember(buffer, written, offset)
        if written is not None:
            with self._lock:
                self._holders[written.name] = 1
            hold += (written.name,)
        return builder.data, hold

    def _find(self, buffer: pickle.PickleBuffer) -> _Copy | None:
        """Where ``buffer`` already lies, held once more for the caller;
        None if it is nowhere (or its bytes changed since)."""
        view = memoryview(buffer)
        key = (id(view.obj), view.nbytes, view.readonly)
        epoch = getattr(self._local, "epoch", 0)
        with self._lock:
            copy = self._copies.get(key)
            if copy is None or copy.exporter() is not view.obj:
                return None
            self._holders[copy.written.name] += 1
        if epoch and copy.epoch == epoch:
            return copy
        if segments.same_content(copy.written.name, copy.offset, buffer.raw()):
            copy.epoch = epoch
            return copy
        self.release((copy.written.name,))
        return None

    def _remember(
        self, buffer: pickle.PickleBuffer, written: Written, offset: int
    ) -> None:
        view = memoryview(buffer)
        try:
            exporter = weakref.ref(view.obj)
        except TypeError:
            return  # (an object without weak references is not looked for)
        key = (id(view.obj), view.nbytes, view.readonly)
        epoch = getattr(self._local, "epoch", 0)
        with self._lock:
            self._copies[key] = _Copy(exporter, written, offset, epoch)
            self._copies_in.setdefault(written.name, []).append(key)

    def release(self, hold: Hold) -> None:
        """Let go of what a payload held; unlink what nobody holds now."""
        gone = []
        with self._lock:
            for name in hold:
                left = self._holders.get(name, 0) - 1
                if left > 0:
                    self._holders[name] = left
                    continue
                self._holders.pop(name, None)
                for key in self._copies_in.pop(name, ()):
                    copy = self._copies.get(key)
                    if copy is not None and copy.written.name == name:
                        del self._copies[key]
                gone.append(name)
        for name in gone:
            segments.unlink(name)

    def put(self, value: Any) -> ObjectRef:
        """``value`` stored once, behind a reference (a small one in the
        reference itself)."""
        packed, hold = self.pack(value)
        if isinstance(packed, bytes):
            packed = Data(host=segments.host_id(), pickle=packed)
        return ObjectRef(self, packed, hold)

    def adopt(self, data: Data) -> Any:
        """A result in shared memory: map it, unpickle it, unlink its names."""
        try:
            return payload.loads(data)
        finally:
            self.discard(data)

    def discard(self, data: Data) -> None:
        """Unlink the result segments of ours that ``data`` names."""
        for segment in data.segments:
            found = segments.SEGMENT_RE.fullmatch(segment.name)
            if found and self.owner.owns(segment.name) and found[3] != self.owner.id:
                segments.unlink(segment.name)

    def sweep(self, pending: Container[int]) -> None:
        """Unlink results for us that no pending task will read (their
        task ended otherwise: cancelled, or answered by another attempt)."""
        for name in segments.names(self.owner.prefix):
            found = segments.SEGMENT_RE.fullmatch(name)
            if not found or found[3] == self.owner.id or found[4][0] != "r":
                continue
            task_id = found[4][1:].partition("-")[0]
            if task_id.isdigit() and int(task_id) not in pending:
                segments.unlink(name)

    def close(self) -> None:
        """Unlink every segment of this client's. Never raises."""
        self.closed = True
        with self._lock:
            self._holders.clear()
            self._copies.clear()
            self._copies_in.clear()
        self.owner.close()


class ObjectRef:
    """An object stored once in a pool's shared memory (``Client.put``).

    Pass it to tasks, as an argument or inside one at any depth: each
    receives the object itself, mapped, not copied. It is released by
    :meth:`release`, once nothing references it, or with its client; a task
    that names it holds it until the task ends.
    """

    __slots__ = ("__weakref__", "_blob", "_finalizer", "_store", "data")

    def __init__(self, store: Store, data: Data, hold: Hold) -> None:
        self._store, self.data = store, data
        self._blob = data.SerializeToString()
        self._finalizer = weakref.finalize(self, store.release, hold)

    @property
    def released(self) -> bool:
        return not self._finalizer.alive or self._store.closed

    def release(self) -> None:
        """Let go of it now (tasks that name it keep it until they end)."""
        self._finalizer()

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        if self.released:
            raise ValueError(_RELEASED)
        packing: _Packing | None = getattr(_packing, "current", None)
        if packing is not None:
            if packing.store is not self._store:
                raise ValueError(
                    "this ObjectRef belongs to another client or pool; pass it "
                    "to tasks of the client whose put() made it"
                )
            packing.refs.append(self)
        return payload.deref, (self._blob,)

    def __repr__(self) -> str:
        size = payload.size_of(self.data)
        state = " released" if self.released else ""
        return f"<ObjectRef {size} bytes in shared memory{state}>"
