"""What :class:`~pool.client.executor.Client` and
:class:`~pool.client.async_client.AsyncClient` share: how a call becomes a
submission (:class:`Submissions`), how a result becomes a value
(:func:`outcome`), and the options both take (:func:`open_options`). How a
map's calls are cut into tasks is :mod:`pool.client.mapping`. No I/O; the
connection (:mod:`pool.client.connection`) carries what is made here.
"""

from __future__ import annotations

import copy
import itertools
import pickle
import types
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Final

from discovery import backends, paths
from pool.client.mapping import MIN_TIMED_CALLS, Args, InMap, calls_in
from pool.client.options import CallOptions, CallOptionsGiven
from pool.client.rendezvous import Locator
from pool.client.store import HOLD_NOTHING, Hold, Store
from pool.dispatcher_pb2 import Submission
from workers.protocol import codec, shipping, transfer
from workers.protocol.worker_pb2 import MapPart, Result, Task

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


class Submissions:
    """What both clients put on a task: a fresh id, the callable (by name,
    or by value: see :mod:`workers.protocol.shipping`), the pickled call, and
    its :class:`~pool.client.options.CallOptions` (tags, time limit,
    priority, retries). :meth:`with_options` makes the same with other
    options, sharing the rest (ids, the callables found, the calls timed).

    :param ship_modules: modules whose functions and classes travel by value
        (registered with cloudpickle for the life of the process).
    """

    def __init__(
        self,
        options: CallOptions | None = None,
        ship_modules: Iterable[types.ModuleType] = (),
    ) -> None:
        self.options = options or CallOptions()
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

    def with_options(self, given: CallOptionsGiven) -> Submissions:
        """The same submissions (one stream of ids), with ``given`` options
        in place of these.

        :raises ValueError: for a bad value (and :raises TypeError:).
        """
        other = copy.copy(self)
        other.options = CallOptions.of(given, self.options)
        return other

    @property
    def timeout_s(self) -> float:
        """The calls' time limit (0: none)."""
        return self.options.task_timeout_s or 0.0

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
        store: Store | None = None,
        in_map: InMap | None = None,
    ) -> tuple[Submission, bytes, Hold]:
        """A submission calling ``ref``, the code to ship with it, and what
        its arguments hold in shared memory (through ``store``, when the
        pool shares this machine's) until it is answered; ``in_map``: the
        map it is a task of (:meth:`map_part`), if any.

        :raises ArgumentsTooLarge: if its function would not fit a message.
        :raises SharedMemoryFull: if its arguments do not fit shared memory.
        :raises Exception: whatever pickling the arguments raises.
        """
        tags = self.options.tags
        submission = Submission(tags=tags) if tags else Submission()
        task = submission.task  # (filled in place: no Task made and copied)
        task.id = next(self._ids)
        hold = _pack(task, ref, args, kwargs, store)
        if ref.name:
            task.function = ref.name
        if ref.digest:
            task.digest, task.label = ref.digest, ref.label
        self.options.apply(task)
        if in_map is not None:
            task.chunk = in_map.chunk
            task.map.CopyFrom(in_map.part)
            task.map.calls = calls_in(args, in_map.chunk)
        return submission, ref.code, hold

    def map_part(self, total: int) -> MapPart:
        """A new map's part, of ``total`` calls (each task sets its own
        ``calls``)."""
        return MapPart(id=f"{self._client}/{next(self._maps)}", total=total)


class ClientOptions(CallOptionsGiven, total=False):
    """What both clients take besides their namespace (see
    :class:`~pool.client.executor.Client` for each): the per-call options'
    defaults, and how to find the pool."""

    ship_modules: Iterable[types.ModuleType]
    discovery_url: str | None
    token_file: str | None
    tls_ca: str | None


def open_options(
    namespace: str, options: ClientOptions
) -> tuple[str, Locator, Submissions]:
    """A client's namespace, how it finds its pool, and how its calls go.

    :raises TypeError: for an option no client takes.
    :raises ValueError: for a bad namespace, discovery URL or option.
    """
    if unknown := options.keys() - ClientOptions.__optional_keys__:
        raise TypeError(f"a client takes no option {', '.join(sorted(unknown))}")
    namespace = paths.validate_namespace(namespace)
    url = backends.check_url(options.get("discovery_url"))
    locator = Locator(namespace, url, options.get("token_file"), options.get("tls_ca"))
    given = {
        k: v for k, v in options.items() if k in CallOptionsGiven.__optional_keys__
    }
    calls = CallOptions.of(given)  # type: ignore[arg-type]
    submissions = Submissions(calls, options.get("ship_modules", ()))
    return namespace, locator, submissions


def _ship(module: types.ModuleType) -> str:
    if not isinstance(module, types.ModuleType):
        raise TypeError(
            f"ship_modules takes modules (import them first), got "
            f"{type(module).__name__} {module!r}"
        )
    shipping.ship_by_value(module)
    return module.__name__
