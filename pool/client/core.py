"""What :class:`~pool.client.executor.Client` and
:class:`~pool.client.async_client.AsyncClient` share: how a call becomes a
submission (:class:`Submissions`), how a result becomes a value
(:func:`outcome`), and how a map's calls are cut into tasks
(:class:`MapPlan`). No I/O; the connection (:mod:`pool.client.connection`)
carries what is made here.
"""

from __future__ import annotations

import itertools
import pickle
import types
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, TypedDict

from discovery import backends, paths
from pool.client.rendezvous import Locator
from pool.client.store import HOLD_NOTHING, Hold, Store
from pool.dispatcher_pb2 import Submission
from workers.protocol import codec, payload, shipping, transfer
from workers.protocol.worker_pb2 import MapPart, Result, Task

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
# The types a callable that travels by name has (and a "module:qualname"),
# and how many such callables a client remembers.
_NAMED: Final = frozenset({str, types.FunctionType, types.BuiltinFunctionType, type})
MAX_NAMED: Final = 4096


def outcome(result: Result, store: Store | None = None, key: str = "") -> Any:
    """The value a result carries (mapped from shared memory, through
    ``store``, if it lies there: a value of the callable ``key``), or raise
    the exception it carries."""
    if result.HasField("failure"):
        raise codec.exception_of(result.failure)
    if result.HasField("data"):
        if transfer.transfer_of(result) is not None:  # (fetched from elsewhere)
            fetched = transfer.ARRIVED.take(result.data)
            if fetched is None:
                raise RuntimeError("a value to fetch, not fetched")
            return transfer.loads(result.data, fetched)
        if store is None:
            raise RuntimeError("a value in shared memory, for a client without")
        return store.adopt(result.data, key)
    return pickle.loads(result.value)


def dropped(result: Result, store: Store | None) -> None:
    """A result nobody will read: what it holds in shared memory goes (and
    what was fetched of it)."""
    if result.HasField("data"):
        if transfer.transfer_of(result) is not None:
            transfer.ARRIVED.take(result.data)
        elif store is not None:
            store.discard(result.data)


Args = tuple[Any, ...]  # a call's positional arguments


def _pack(
    task: Task, ref: shipping.Reference, args: Args, kwargs: Any, store: Store | None
) -> Hold:
    """Put the call's arguments on ``task``: in its client's shared memory
    through ``store``, else in the message (or, past
    :data:`~workers.protocol.transfer.TRANSFER_MIN`, offered for upload)."""
    if store is not None:
        key = ref.name or ref.digest.hex()
        return store.pack_task(task, (args, dict(kwargs)), ref.by_value, key)
    pickled = codec.dump_call(args, dict(kwargs), by_value=ref.by_value)
    if len(pickled) >= transfer.TRANSFER_MIN:  # (uploaded when wanted)
        task.data.CopyFrom(transfer.OFFERED.hold(pickled))
    else:
        codec.check_call_size(pickled, ref.code)
        task.args = pickled
    return HOLD_NOTHING


def calls_in(args: Args, chunk: bool) -> int:
    """The calls a task of these arguments carries (a chunk's: its slice of
    each column, :func:`_slices`)."""
    return len(args[0][0]) if chunk and args[0] else 1


class Submissions:
    """What both clients put on a task: a fresh id, the callable (by name,
    or by value: see :mod:`workers.protocol.shipping`), the pickled call, and the
    client's tags and time limit.

    :param ship_modules: modules whose functions and classes travel by value
        (registered with cloudpickle for the life of the process).
    """

    def __init__(
        self,
        tags: Iterable[str],
        task_timeout_s: float | None,
        ship_modules: Iterable[types.ModuleType] = (),
    ) -> None:
        self._tags = tuple(tags)
        self.timeout_s = task_timeout_s or 0.0
        self._ids = itertools.count(1)
        self._maps = itertools.count(1)
        self._client = uuid.uuid4().hex[:8]  # (names its maps on the dashboard)
        self._ship_modules = tuple(_ship(module) for module in ship_modules)
        # How long one call of each callable ran in a map's last chunk (by
        # name, or digest): a later map of it skips the probes.
        self._per_call_s: dict[str | bytes, float] = {}
        # The callables that travel by name, found once each (a by-value
        # one is pickled at each call: its globals may have changed).
        self._by_name: dict[Callable[..., Any] | str, shipping.Reference] = {}

    def per_call_s(self, ref: shipping.Reference) -> float | None:
        """How long a call of ``ref`` ran in an earlier map, if known."""
        return self._per_call_s.get(ref.name or ref.digest)

    def timed(self, ref: shipping.Reference, chunk: codec.ChunkResult) -> None:
        """Note how long a chunk's calls ran (one of many calls, that is:
        a probe's single call overstates it many times over)."""
        if len(chunk.values) >= MIN_TIMED_CALLS:
            per_call = chunk.elapsed_s / len(chunk.values)
            self._per_call_s[ref.name or ref.digest] = per_call

    def reference(self, fn: Callable[..., Any] | str) -> shipping.Reference:
        """How ``fn`` travels (pickled once here if by value).

        :raises TypeError: if ``fn`` is neither a callable nor a name.
        :raises Exception: whatever pickling ``fn`` raises.
        """
        if type(fn) not in _NAMED:  # (may not hash, and is not named)
            if not callable(fn):
                raise TypeError(f"{type(fn).__name__!r} object is not callable")
            return shipping.reference(fn, self._ship_modules)
        if (ref := self._by_name.get(fn)) is None:
            ref = shipping.reference(fn, self._ship_modules)
            if ref.name and len(self._by_name) < MAX_NAMED:
                self._by_name[fn] = ref
        return ref

    def make(
        self,
        ref: shipping.Reference,
        args: Args,
        kwargs: Any,
        *,
        chunk: bool = False,
        store: Store | None = None,
        part: MapPart | None = None,
    ) -> tuple[Submission, bytes, Hold]:
        """A submission calling ``ref``, the code to ship with it, and what
        its arguments hold in shared memory (through ``store``, when the
        pool shares this machine's) until it is answered; ``part``: which
        map it is of, for the dashboard (:meth:`map_part`).

        :raises ArgumentsTooLarge: if its function would not fit a message.
        :raises SharedMemoryFull: if its arguments do not fit shared memory.
        :raises Exception: whatever pickling the arguments raises.
        """
        submission = Submission(tags=self._tags) if self._tags else Submission()
        task = submission.task  # (filled in place: no Task made and copied)
        task.id = next(self._ids)
        hold = _pack(task, ref, args, kwargs, store)
        if ref.name:
            task.function = ref.name
        if ref.digest:
            task.digest, task.label = ref.digest, ref.label
        if self.timeout_s:
            task.timeout_s = self.timeout_s
        if chunk:
            task.chunk = True
        if part is not None:
            task.map.CopyFrom(part)
            task.map.calls = calls_in(args, chunk)
        return submission, ref.code, hold

    def map_part(self, total: int) -> MapPart:
        """A new map's part, of ``total`` calls (each task sets its own
        ``calls``)."""
        return MapPart(id=f"{self._client}/{next(self._maps)}", total=total)


class ClientOptions(TypedDict, total=False):
    """What both clients take besides their namespace (see
    :class:`~pool.client.executor.Client` for each)."""

    tags: Iterable[str]
    task_timeout_s: float | None
    ship_modules: Iterable[types.ModuleType]
    discovery_url: str | None
    token_file: str | None
    tls_ca: str | None


def open_options(
    namespace: str, options: ClientOptions
) -> tuple[str, Locator, Submissions]:
    """A client's namespace, how it finds its pool, and how its calls go.

    :raises TypeError: for an option no client takes.
    :raises ValueError: for a bad namespace or discovery URL.
    """
    if unknown := options.keys() - ClientOptions.__annotations__.keys():
        raise TypeError(f"a client takes no option {', '.join(sorted(unknown))}")
    namespace = paths.validate_namespace(namespace)
    url = backends.check_url(options.get("discovery_url"))
    locator = Locator(namespace, url, options.get("token_file"), options.get("tls_ca"))
    submissions = Submissions(
        options.get("tags", ()),
        options.get("task_timeout_s"),
        options.get("ship_modules", ()),
    )
    return namespace, locator, submissions


def _ship(module: types.ModuleType) -> str:
    if not isinstance(module, types.ModuleType):
        raise TypeError(
            f"ship_modules takes modules (import them first), got "
            f"{type(module).__name__} {module!r}"
        )
    shipping.ship_by_value(module)
    return module.__name__


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


Columns = list[list[Any]]  # a map's arguments, one list per iterable


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
    """A map's arguments by position, as long as its shortest iterable."""
    if len(iterables) == 1:
        return [list(iterables[0])]
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
    per call): of ``chunksize`` calls, or, by default, adaptive: the first
    :data:`PROBE_CALLS` calls one per chunk, whose first answer says how
    long a call runs (:func:`auto_chunksize`), then the rest.

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
