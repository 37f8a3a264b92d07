"""What a client keeps in shared memory: :class:`Store`.

A client on its pool's machine pickles a large argument into a segment of
its own (:mod:`workers.protocol.payload`), and a worker writes a large
value into one the client owns. The store counts, for each segment, the
payloads that name it: each pending task's arguments (a :class:`Hold`,
until its answer) and each ``put`` reference (:mod:`pool.client.refs`,
until released or no longer referenced). When the last lets go, the
segment becomes a spare (:mod:`pool.client.arena`), written again for a
later payload of its size, or lent to a task for its value; or, if it is
small or the spares are full, it is unlinked (what a reader still maps
stays mapped). A buffer already in a segment is not written again
(:mod:`pool.client.copies`).

A value is mapped when it arrives (:meth:`Store.adopt`): one a worker wrote
becomes the client's, named as a spare. Values nobody will read (their
task was cancelled, or a dispatcher or worker died with them in flight)
are unlinked by :meth:`Store.sweep`, which the connection runs every
second; a dead client's are reaped by its pool
(:func:`workers.protocol.owners.reap`).
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any, Final

from pool.client.arena import Arena
from pool.client.copies import Copies
from pool.client.refs import RELEASED, ObjectRef, Packing, current
from workers.protocol import payload, segments, shipping
from workers.protocol.errors import SharedMemoryFull
from workers.protocol.owners import DataOwner
from workers.protocol.payload import INLINE_MAX
from workers.protocol.segments import SEGMENT_RE, Written
from workers.protocol.worker_pb2 import Data, Segment, Task

SWEEP_S: Final = 1.0
NO_STORE: Final = (
    "the pool of namespace {namespace!r} does not share this machine's memory "
    "(its workers may run elsewhere): pass the value to each task instead"
)
MAX_KEYS: Final = 256  # callables whose values' size it remembers


@dataclass(frozen=True, slots=True)
class Hold:
    """What one task (or reference) holds of its client's store."""

    names: tuple[str, ...] = ()  # segments it names, one count each
    key: str = ""  # what it calls: the store learns how large its values are
    lend: Segment | None = None  # a spare lent for its value (in ``names``)


HOLD_NOTHING: Final = Hold()


class Store:
    """A client's segments; see the module docstring. Thread-safe."""

    def __init__(self, owner: DataOwner) -> None:
        self.owner = owner
        self.host = segments.host_id()
        self._lock = threading.Lock()
        self._holders: dict[str, int] = {}  # segment: payloads naming it
        self._sizes: dict[str, int] = {}  # of those held and the spares
        self._copies = Copies()
        self._arena = Arena(owner.limit_bytes)
        self._maps = segments.Mappings()  # of the spares it writes again
        self._values: OrderedDict[str, int] = OrderedDict()  # key: size
        self._plain_holds: dict[str, Hold] = {}
        self.closed = False

    def one_call(self) -> contextlib.AbstractContextManager[None]:
        """See :meth:`pool.client.copies.Copies.one_call`."""
        return self._copies.one_call()

    def pack(
        self, value: Any, *, by_value: bool = False, key: str = ""
    ) -> tuple[bytes | Data, Hold]:
        """``value`` pickled: its bytes, or where it lies in shared memory;
        and what it holds until :meth:`release` (with a spare lent for the
        value of ``key``, the callable it is for, if its values are large).

        :raises SharedMemoryFull: if it does not fit.
        :raises ValueError: if it names a released reference, or another's.
        :raises Exception: whatever pickling raises.
        """
        packing = Packing(self)
        current.packing = packing
        try:
            pickled = shipping.dumps(value, by_value=by_value, out_of_band=packing)
        finally:
            current.packing = None
        if not (packing.refs or packing.taken) and len(pickled) < INLINE_MAX:
            # (The small task's path: nothing held, no lock taken.)
            hold = self._plain_holds.get(key)
            if hold is None or self._values.get(key):
                hold = self._plain(key)
            return pickled, hold
        names = self._hold_refs(packing.refs)
        packed: bytes | Data = pickled
        try:
            if not payload.in_message(pickled, packing):
                packed, written = self._write(pickled, packing.taken)
                names += written
            lend = self._lend(key) if key else None
        except BaseException:
            self.release(Hold(names))
            raise
        if lend is not None:
            names += (lend.name,)
        return packed, Hold(names, key, lend)

    def pack_task(self, task: Task, call: Any, by_value: bool, key: str) -> Hold:
        """Fill in a task's arguments (``call``, pickled: :meth:`pack`) and
        its home (where its value may go: a segment of ours, named after its
        id, or the spare lent for it); what it holds until answered."""
        packed, hold = self.pack(call, by_value=by_value, key=key)
        if isinstance(packed, bytes):
            task.args = packed
        else:
            task.data.CopyFrom(packed)
        home = task.home  # (its fields set one by one: a merge costs more)
        home.host, home.owner, home.tag = self.host, self.owner.id, task.id
        if hold.lend is not None:
            task.home.lend.CopyFrom(hold.lend)
        return hold

    def _plain(self, key: str) -> Hold:
        """What a small task holds: nothing but its key, and a spare lent
        for its value if that is large (one Hold a key, when nothing is)."""
        if key and self._values.get(key):
            lend = self._lend(key)
            if lend is not None:
                return Hold((lend.name,), key, lend)
        hold = self._plain_holds.get(key)
        if hold is None:
            hold = self._plain_holds[key] = Hold((), key)
            if len(self._plain_holds) > MAX_KEYS:
                self._plain_holds.clear()
        return hold

    def _hold_refs(self, refs: list[ObjectRef]) -> tuple[str, ...]:
        if not refs:
            return ()
        names = tuple(s.name for ref in refs for s in ref.data.segments)
        with self._lock:
            if any(name not in self._holders for name in names):
                raise ValueError(RELEASED)
            for name in names:
                self._holders[name] += 1
        return names

    def _write(
        self, pickled: bytes, buffers: list[pickle.PickleBuffer]
    ) -> tuple[Data, tuple[str, ...]]:
        """Write what is not in a segment yet: the pickle if it is large, and
        each buffer not found (:meth:`_find`), into a spare or a new segment;
        the data, and the segments it holds."""
        inline = len(pickled) < payload.INLINE_MAX
        found = [self._find(buffer) for buffer in buffers]
        hold = tuple(written.name for written, _ in filter(None, found))
        fresh = [b.raw() for b, at in zip(buffers, found, strict=True) if not at]
        parts = fresh if inline else [memoryview(pickled), *fresh]
        try:
            written = self._into_spare(parts) if parts else None
            if parts and written is None:
                written = self._hold_new(self._write_new(parts))
        except BaseException:
            self.release(Hold(hold))
            raise
        builder = payload.Builder(pickled, pickle_inline=inline)
        offsets = iter(written.offsets if written else ())
        if written and not inline:
            builder.part(written, next(offsets), len(pickled))
        for buffer, at in zip(buffers, found, strict=True):
            where = at or (written, next(offsets))
            assert where[0] is not None
            builder.part(where[0], where[1], memoryview(buffer).nbytes)
            if at is None:
                with self._lock:
                    self._copies.remember(buffer, where[0], where[1])
        return builder.data, hold + ((written.name,) if written else ())

    def _write_new(self, parts: list[memoryview]) -> Written:
        """A new segment holding ``parts`` (the spares dropped first if they
        leave no room for it).

        :raises SharedMemoryFull: if it does not fit even so.
        """
        try:
            return self.owner.write(self._new_name(), parts)
        except SharedMemoryFull:
            with self._lock:
                spares = self._arena.clear()
                for name in spares:
                    self._sizes.pop(name, None)
            if not spares:
                raise
        for name in spares:
            self._unlink(name)
        return self.owner.write(self._new_name(), parts)

    def _new_name(self) -> str:
        return self.owner.name(self.owner.id, "a")

    def _hold_new(self, written: Written) -> Written:
        with self._lock:
            self._holders[written.name] = 1
            self._sizes[written.name] = written.size
        return written

    def _find(self, buffer: pickle.PickleBuffer) -> tuple[Written, int] | None:
        """Where ``buffer`` already lies, held once more for the caller;
        None if it is nowhere (or its bytes changed since)."""
        with self._lock:
            copy = self._copies.find(buffer)
            if copy is None or copy.written.name not in self._holders:
                return None
            self._holders[copy.written.name] += 1
            if self._copies.trusted(copy):
                return copy.written, copy.offset
        if segments.same_content(copy.written.name, copy.offset, buffer.raw()):
            with self._lock:
                self._copies.checked(copy)
            return copy.written, copy.offset
        self.release(Hold((copy.written.name,)))
        return None

    def _into_spare(self, parts: list[memoryview]) -> Written | None:
        """``parts`` written into a spare that fits (held), if nobody maps
        one; None if none does."""
        need = segments.layout(parts)[0]
        return self._reuse(
            need, lambda name: self.owner.rewrite(name, parts, maps=self._maps)
        )

    def _lend(self, key: str) -> Segment | None:
        """A spare (held) for the value of a call of ``key``, if its last
        value was large and one fits; stamped, for its writer to check."""
        with self._lock:
            need = self._values.get(key, 0)
        lent = self._reuse(need, segments.stamp) if need else None
        if lent is None:
            return None
        return Segment(name=lent.name, nonce=lent.nonce, size=lent.size)

    def _reuse(self, need: int, use: Callable[[str], Written | None]) -> Written | None:
        """The first spare of ``need`` bytes that ``use`` can write (none
        can while a reader maps it), held; the others go back."""
        with self._lock:
            taken = list(self._arena.take(need))
        written = None
        for name, _, since in taken:
            if written is None and (written := use(name)) is not None:
                self._hold_new(written)
                continue
            with self._lock:
                kept = self._arena.keep(name, self._sizes.get(name, 0), since)
                if not kept:
                    self._sizes.pop(name, None)
            if not kept:
                self._unlink(name)
        return written

    def release(self, hold: Hold) -> None:
        """Let go of what a payload held: what nobody holds any more becomes
        a spare, or is unlinked."""
        if not hold.names:
            return
        gone = []
        with self._lock:
            for name in hold.names:
                left = self._holders.get(name, 0) - 1
                if left > 0:
                    self._holders[name] = left
                    continue
                self._holders.pop(name, None)
                self._copies.forget(name)
                if not self._arena.keep(name, self._sizes.get(name, 0)):
                    self._sizes.pop(name, None)
                    gone.append(name)
        for name in gone:
            self._unlink(name)

    def _unlink(self, name: str) -> None:
        self._maps.drop(name)
        segments.unlink(name)

    def put(self, value: Any) -> ObjectRef:
        """``value`` stored once, behind a reference (a small one in the
        reference itself)."""
        packed, hold = self.pack(value)
        if isinstance(packed, bytes):
            packed = Data(host=self.host, pickle=packed)
        return ObjectRef(self, packed, hold)

    def adopt(self, data: Data, key: str = "") -> Any:
        """A value in shared memory: map it and unpickle it; a segment a
        worker wrote becomes a spare of ours (renamed) once nobody maps it.
        The store learns the size of the values of ``key``."""
        try:
            return payload.loads(data)
        finally:
            if key:
                with self._lock:
                    self._values[key] = sum(s.size for s in data.segments)
                    self._values.move_to_end(key)
                    while len(self._values) > MAX_KEYS:
                        self._values.popitem(last=False)
            self._take_over(data)

    def _take_over(self, data: Data) -> None:
        """Make ours what a worker wrote for ``data``: renamed as a spare
        (written again once nobody maps it), or unlinked."""
        for segment in data.segments:
            found = SEGMENT_RE.fullmatch(segment.name)
            if not found or not self.owner.owns(segment.name):
                continue
            if found[3] == self.owner.id:  # a spare we lent: held until answered
                with self._lock:
                    self._sizes[segment.name] = segment.size
                continue
            name = self._new_name()
            try:
                segments.rename(segment.name, name)
            except OSError:
                self._unlink(segment.name)
                continue
            with self._lock:
                kept = self._arena.keep(name, segment.size)
                if kept:
                    self._sizes[name] = segment.size
            if not kept:
                self._unlink(name)

    def discard(self, data: Data) -> None:
        """Unlink what ``data`` holds for us that a worker wrote (nobody
        will read it); a spare we lent goes back when its task is answered."""
        for segment in data.segments:
            found = SEGMENT_RE.fullmatch(segment.name)
            if found and self.owner.owns(segment.name) and found[3] != self.owner.id:
                self._unlink(segment.name)

    def sweep(self, pending: Container[int], names: Iterable[str]) -> None:
        """Unlink values for us that no pending task will read (their task
        ended otherwise: cancelled, or answered by another attempt), and
        the spares kept too long. ``names`` are this client's segments, as
        :func:`~workers.protocol.owners.names` lists them (a scan of
        ``/dev/shm``, which the caller makes off its loop); what is pending
        is judged now."""
        for name in names:
            found = SEGMENT_RE.fullmatch(name)
            if not found or found[3] == self.owner.id or found[4][0] != "r":
                continue
            task_id = found[4][1:].partition("-")[0]
            if task_id.isdigit() and int(task_id) not in pending:
                self._unlink(name)
        with self._lock:
            expired = self._arena.expired(time.monotonic())
            for name in expired:
                self._sizes.pop(name, None)
        for name in expired:
            self._unlink(name)

    def close(self) -> None:
        """Unlink every segment of this client's. Never raises."""
        self.closed = True
        with self._lock:
            self._holders.clear()
            self._sizes.clear()
            self._copies.clear()
            self._arena.clear()
        self._maps.clear()
        self.owner.close()
