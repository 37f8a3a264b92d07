"""References to objects a client stored in shared memory
(:class:`ObjectRef`, from ``Client.put``), and the pickling under way that
notes the references it meets (:class:`Packing`).

A reference pickles to a call of :func:`workers.protocol.payload.deref`
with where its object lies, so a task that takes it, at any depth of its
arguments, receives the object itself, mapped. Pickled by its client's
store, it also holds its segments for the task (so that they outlive a
reference dropped while the task runs); pickled for another client or
pool, or once released, it is a clear error. :meth:`ObjectRef.get` is
the object again.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Final

from workers.protocol import payload
from workers.protocol.payload import Buffers
from workers.protocol.worker_pb2 import Data

if TYPE_CHECKING:
    from pool.client.store import Hold, Store

RELEASED: Final = (
    "this ObjectRef was released (or its client closed); put the object "
    "again with client.put(obj)"
)
current = threading.local()  # .packing: the Packing under way in a thread


class Packing(Buffers):
    """One pickling by a client's store: its out-of-band buffers, and the
    references it names; ``current.packing`` in its thread while it runs."""

    __slots__ = ("refs", "store")

    def __init__(self, store: Store) -> None:
        self.taken = []  # (Buffers.__init__, inline: once per task)
        self.store = store
        self.refs: list[ObjectRef] = []

    def clear(self) -> None:
        super().clear()
        self.refs.clear()


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

    def get(self) -> Any:
        """The object, as a task receives it: mapped from shared memory, not
        copied (a write changes only this process's pages), or unpickled
        from the reference if it is small; ``ray.get`` of a ``put``. (Here,
        not on the client: dask takes any "Client" with a ``get`` for its
        own distributed client, and ``scheduler=client`` would break.)

        :raises ValueError: if it was released (or its client closed).
        """
        if self.released:
            raise ValueError(RELEASED)
        return payload.loads(self.data)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        if self.released:
            raise ValueError(RELEASED)
        packing: Packing | None = getattr(current, "packing", None)
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
