"""How a ``map``'s calls are cut into tasks, for both clients
(:class:`MapPlan`): one call a task, chunks of a given size, or adaptive
chunks sized by how long the first calls ran (:func:`auto_chunksize`);
and what each of its tasks says of the map (:class:`InMap`).
No I/O; :meth:`pool.client.executor.Client.map` and
:meth:`pool.client.async_client.AsyncClient.map` send what is planned here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Final, NamedTuple

from workers.protocol import payload
from workers.protocol.worker_pb2 import MapPart

# map's adaptive chunks (see Client.map): the first calls go one per task,
PROBE_CALLS: Final = 8
# and the first of them to answer says how long a call runs, unless one has
# run this long without an answer (a long call: one per task, then); a pool
# slow to take them (busy, or starting) is waited for up to PROBE_MAX_S;
PROBE_WAIT_S: Final = 0.05
PROBE_MAX_S: Final = 1.0
# then the rest go in chunks that run about this long in the worker (a task
# costs about 0.2 ms of CPU over the three processes it crosses, and a
# one-call probe overstates a short call many times over),
CHUNK_TARGET_S: Final = 0.02
# and in at least this many chunks, so that every worker gets its share
# (multiprocessing.Pool.map makes 4 a worker: 32 for 8),
MIN_CHUNKS: Final = 32
# each carrying about this many bytes of arguments at most. A chunk of at
# least MIN_TIMED_CALLS calls times a call for the next map of its callable.
MAX_CHUNK_BYTES: Final = 1 << 20
MIN_TIMED_CALLS: Final = 16

Args = tuple[Any, ...]  # a call's positional arguments


class InMap(NamedTuple):
    """A task of a map: which map it is of (``part``: its id and total, for
    the dashboard; each task sets its own ``calls``) and whether its
    arguments are a chunk of calls or one call's (:func:`calls_in`)."""

    part: MapPart
    chunk: bool


def calls_in(args: Args, chunk: bool) -> int:
    """The calls a task of these arguments carries (a chunk's: its slice of
    each column, :func:`_slices`)."""
    return len(args[0][0]) if chunk and args[0] else 1


def auto_chunksize(
    per_call_s: float | None, calls: int, per_call_bytes: int = 0
) -> int:
    """How many calls of ``per_call_s`` each (None: not known in time) to
    send per task when ``calls`` are left: enough to run about
    :data:`CHUNK_TARGET_S`, but at least :data:`MIN_CHUNKS` chunks, and
    no more than :data:`MAX_CHUNK_BYTES` of arguments of ``per_call_bytes``."""
    if per_call_s is None or per_call_s >= CHUNK_TARGET_S:
        return 1
    size = int(CHUNK_TARGET_S / max(per_call_s, 1e-7))
    size = min(size, MAX_CHUNK_BYTES // max(per_call_bytes, 1))
    return max(1, min(size, calls // MIN_CHUNKS))


# A map's arguments, one sequence per iterable: a list of its values, or
# the range or tuple it was.
Columns = list[list[Any] | range | tuple[Any, ...]]


def _call_bytes(columns: Columns) -> int:
    """The pickled size of the last call's arguments, as a sample (0 if they
    do not pickle: the chunk that holds them will fail as they would). Its
    large buffers are counted, not copied."""
    try:
        last = tuple(column[-1] for column in columns)
        if not last:
            return 0
        pickled, buffers = payload.dumps(last)
        return len(pickled) + sum(b.raw().nbytes for b in buffers.taken)
    except Exception:
        return 0


def _columns(iterables: tuple[Iterable[Any], ...]) -> Columns:
    """A map's arguments by position, as long as its shortest iterable (a
    ``range`` or a tuple as it is: it cannot change, and a slice of a range
    pickles as its bounds)."""
    if len(iterables) == 1:
        only = iterables[0]
        return [only if isinstance(only, range | tuple) else list(only)]
    calls = list(zip(*iterables, strict=False))
    return [list(column) for column in zip(*calls, strict=True)] if calls else []


def _slices(columns: Columns, start: int, size: int) -> Iterator[tuple[Columns]]:
    """Each chunk's task arguments: its slice of every column."""
    calls = len(columns[0]) if columns else 0
    for at in range(start, calls, size):
        yield ([column[at : at + size] for column in columns],)


class MapPlan:
    """How a map's calls travel, for both clients.

    One task per call with ``chunksize=1``, and by default under a per-task
    time limit (so that the limit stays per call). Else in chunks (a task
    whose callable runs once per call,
    :func:`workers.protocol.codec.run_chunk`), each carrying its slice of
    every argument's values as one pickle (a list per iterable, not a tuple
    per call; a range's or a tuple's slice as it is): of ``chunksize``
    calls, or, by default, adaptive: the first :data:`PROBE_CALLS` calls
    one per chunk, whose first answer says how long a call runs
    (:func:`auto_chunksize`), then the rest.

    :raises ValueError: for a ``chunksize`` below 1.
    """

    def __init__(
        self,
        iterables: tuple[Iterable[Any], ...],
        chunksize: int | None,
        *,
        per_task_limit: bool,
    ) -> None:
        if chunksize is not None and chunksize < 1:
            raise ValueError(f"chunksize must be at least 1, got {chunksize}")
        if chunksize is None and per_task_limit:
            chunksize = 1
        self.chunked = chunksize != 1
        self.adaptive = chunksize is None
        self._size = chunksize
        self._columns = _columns(iterables)
        self.calls = len(self._columns[0]) if self._columns else 0

    def first(self, per_call_s: float | None = None) -> list[tuple[Any, ...]]:
        """The arguments of the tasks to send now: every call (one per
        task), every chunk, or the probes of an adaptive plan; with
        ``per_call_s`` (known from an earlier map), every chunk of an
        adaptive plan, sized by it, and no probe."""
        if not self.chunked:
            return list(zip(*self._columns, strict=True))
        if self.adaptive and per_call_s is not None:
            self.adaptive = False
            size = auto_chunksize(per_call_s, self.calls, _call_bytes(self._columns))
            return list(_slices(self._columns, 0, size))
        if self._size is None:
            return list(itertools.islice(_slices(self._columns, 0, 1), PROBE_CALLS))
        return list(_slices(self._columns, 0, self._size))

    def rest(self, per_call_s: float | None) -> list[tuple[Any, ...]]:
        """An adaptive plan's other chunks, once the probes took
        ``per_call_s`` a call (None: not known in time)."""
        if not self.adaptive:
            return []
        probed = min(PROBE_CALLS, self.calls)
        size = auto_chunksize(
            per_call_s, self.calls - probed, _call_bytes(self._columns)
        )
        return list(_slices(self._columns, probed, size))
