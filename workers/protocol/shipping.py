"""Callables a worker cannot import, shipped by value with cloudpickle.

A task names its callable one of two ways (``proto/workers/worker.proto``):

- by name, ``"module:qualname"``, when the worker can import it: a
  top-level function or class of a module (cheap, resolved once per worker);
- by value: a lambda, a closure, a function of ``__main__`` or a notebook,
  a ``functools.partial``, a bound method, an instance with ``__call__``,
  or anything from a module the client ships (``ship_modules``). It is
  pickled with cloudpickle, and the task carries the pickle's SHA-256.

The pickle itself travels once per stream, not once per task. Both ends of
a stream keep a :class:`StreamCache` of the functions it has carried, and
apply the same operations in the same order (the order of the stream's
tasks), so they agree without a word about it: the sender attaches the
pickle only to a task whose digest the receiver does not hold. The client
sends on its stream to the dispatcher, the dispatcher on its stream to each
worker, and a worker keeps each function it has unpickled
(:func:`load_function`) by digest.

Arguments and results go through plain pickle, which is fast, unless
they hold something a worker cannot import by name: plain pickle stores a
function or class of ``__main__`` (or of a module the client ships) by
reference, without failing, and the other end has no such name. A pickle
that names one of those modules is made again with cloudpickle, which
ships them by value (and keeps ``isinstance`` on the way back); so is
anything plain pickle refuses (:func:`dumps`). Arguments of a by-value
call go through cloudpickle from the start.

Code objects keep their real file name (cloudpickle writes
``<dynamic-code>``), so that a remote traceback of a shipped function shows
its source lines wherever the file exists: in the worker, or, filled in
from the client's own files, in the client (:func:`fill_source_lines`).

Unpickling is code execution: only authenticated peers' bytes reach here
(see :mod:`workers.protocol.auth`).
"""

from __future__ import annotations

import hashlib
import io
import linecache
import os
import pickle
import re
import sys
import types
from collections import ChainMap, OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol

from discovery.errors import PoolError
from workers.protocol import namespaces

# How much one stream's cache holds (the same limits at both of its ends).
MAX_FUNCTIONS: Final = 256
MAX_CACHED_BYTES: Final = 64 * 1024 * 1024
# Functions a worker keeps unpickled, by digest.
MAX_LOADED: Final = 1024
DIGEST_BYTES: Final = 32


class ShippingError(PoolError, ValueError):
    """A shipped function's bytes are not what the task says they are."""


@dataclass(frozen=True, slots=True)
class Reference:
    """How a task names its callable: ``name``, or ``digest`` and ``code``
    (the cloudpickle of a callable sent by value)."""

    name: str = ""
    digest: bytes = b""
    code: bytes = b""
    label: str = ""  # a shipped one's name, for display (Task.label)

    @property
    def by_value(self) -> bool:
        return bool(self.digest)


def reference(
    fn: Callable[..., Any] | str, ship_modules: Collection[str] = ()
) -> Reference:
    """How to send ``fn``: by name if a worker can import it, else by value.

    :param ship_modules: names of modules whose functions go by value (the
        client registered them with cloudpickle).
    :raises pickle.PicklingError: (or what cloudpickle raises) if ``fn``
        cannot be pickled at all.
    """
    if isinstance(fn, str):
        return Reference(name=fn)
    name = importable_name(fn)
    if name is not None and not _shipped(name.partition(":")[0], ship_modules):
        return Reference(name=name)
    code = _by_value(fn)
    digest = hashlib.sha256(code).digest()
    return Reference(digest=digest, code=code, label=_label(fn))


def _label(fn: Callable[..., Any]) -> str:
    """``"module:qualname"`` of ``fn`` (a partial's function; an instance's
    class), to show."""
    fn = getattr(fn, "func", fn)
    named = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(named, '__module__', '?')}:{named.__qualname__}"


def importable_name(fn: Callable[..., Any]) -> str | None:
    """``"module:qualname"`` if that name leads back to ``fn`` itself, else
    None (a lambda, a local function, a bound method, a partial, a callable
    instance, a function of a script run by path or of a notebook)."""
    if not isinstance(fn, (types.FunctionType, types.BuiltinFunctionType, type)):
        return None  # methods, partials, instances: state a name cannot carry
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    if "<" in qualname:
        return None
    if module == "__main__":  # run with `python -m package.module`: its real name
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = getattr(spec, "name", None)
        if not module:
            return None
    owner = sys.modules.get(module)
    if owner is not None:  # the name must lead back to fn (not a wrapper of it)
        target: Any = owner
        for part in qualname.split("."):
            target = getattr(target, part, None)
        if target is not fn:
            return None
    return f"{module}:{qualname}"


def _shipped(module: str, ship_modules: Collection[str]) -> bool:
    return any(module == m or module.startswith(m + ".") for m in ship_modules)


# Modules whose objects a pickle must not name by reference: the client's
# script, and each module a client ships (see :func:`ship_by_value`).
_by_value_marks: list[bytes] = [b"__main__"]


def ship_by_value(module: types.ModuleType) -> None:
    """Send ``module``'s functions and classes by value from now on, in
    this process, wherever they appear: as a task's callable or inside its
    arguments and results."""
    _cloudpickle().register_pickle_by_value(module)
    mark = module.__name__.encode()
    if mark not in _by_value_marks:
        _by_value_marks.append(mark)


class OutOfBand(Protocol):
    """A ``buffer_callback`` that keeps the buffers it takes out of the
    pickle (:class:`workers.protocol.payload.Buffers`)."""

    def __call__(self, buffer: pickle.PickleBuffer) -> bool:
        """True: the buffer goes in the pickle; False: it was taken."""

    def clear(self) -> None:
        """Forget what it took (the pickling starts again)."""


def dumps(
    value: Any, *, by_value: bool = False, out_of_band: OutOfBand | None = None
) -> bytes:
    """Pickle ``value`` (protocol 5): with plain pickle, unless ``by_value``
    or the pickle names a module whose objects go by value (``__main__``, a
    shipped module), or plain pickle refuses it: then with cloudpickle.
    ``out_of_band`` takes the buffers that are to travel outside it.

    A mention of such a name anywhere in the bytes (a string that says
    ``__main__``) only costs the slower pickler: the outcome is the same.
    """
    if not by_value:
        try:
            data = pickle.dumps(
                value, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=out_of_band
            )
        except (pickle.PicklingError, AttributeError, TypeError):
            pass
        else:
            for mark in _by_value_marks:  # (a loop: cheaper than any() here)
                if mark in data:
                    break
            else:
                return data
        if out_of_band is not None:
            out_of_band.clear()
    return _by_value(value, out_of_band)


def _by_value(value: Any, out_of_band: OutOfBand | None = None) -> bytes:
    """The cloudpickle of ``value``, its code keeping its file names."""
    buffer = io.BytesIO()
    pickler = _pickler_class()(
        buffer, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=out_of_band
    )
    pickler.dump(value)
    return buffer.getvalue()


_pickler: type | None = None
_DYNAMIC_FILE: Final = "<dynamic-code>"
# Functions every shipped function's pickle names: plain pickle saves them
# by name, as cloudpickle would after a slower look.
_BY_NAME: Final = (namespaces.namespace, namespaces.set_function_state)


def _pickler_class() -> type:
    """cloudpickle's Pickler, with code objects that keep ``co_filename``.

    cloudpickle writes ``<dynamic-code>`` in its place (so that a pickle is
    the same wherever its function was defined); the remote traceback then
    lacks the line that raised, where ``ProcessPoolExecutor``, Ray and Dask
    show it. Our digest is taken of these bytes, so it stays stable for a
    given function.
    """
    global _pickler
    if _pickler is None:
        cloudpickle = _cloudpickle()
        from cloudpickle import cloudpickle as inner

        reduce_code = inner._code_reduce
        _, probe = reduce_code(_pickler_class.__code__)
        at = probe.index(_DYNAMIC_FILE)

        def code_keeping_file(code: types.CodeType) -> Any:
            kind, args = reduce_code(code)
            return kind, (*args[:at], code.co_filename, *args[at + 1 :])

        _pickler = _sharing(cloudpickle.Pickler, code_keeping_file)
    return _pickler


def _sharing(base: Any, reduce_code: Callable[[types.CodeType], Any]) -> type:
    """cloudpickle's ``base`` Pickler reducing code with ``reduce_code``, whose
    functions of a module name its shared namespace
    (:mod:`workers.protocol.namespaces`)."""

    class Pickler(base):  # type: ignore[misc]
        dispatch_table: ClassVar = ChainMap(
            {types.CodeType: reduce_code}, base.dispatch_table
        )

        def reducer_override(self, obj: Any) -> Any:
            if obj is _BY_NAME[0] or obj is _BY_NAME[1]:  # (faster so)
                return NotImplemented
            return super().reducer_override(obj)

        def _function_getnewargs(self, func: types.FunctionType) -> Any:
            code, fields, *rest = super()._function_getnewargs(func)
            key = namespaces.key_of(func.__globals__)
            if key is None:
                return (code, fields, *rest)
            shared = namespaces.Shared(key, tuple(sorted(fields.items())))
            return (code, shared, *rest)

        def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
            reduced = super()._dynamic_function_reduce(func)
            if not isinstance(reduced[1][1], namespaces.Shared):
                return reduced
            return (*reduced[:5], namespaces.set_function_state)

    return Pickler


def _cloudpickle() -> Any:
    """cloudpickle, imported when first needed: it adds about 17 ms to an
    import, which every worker's zygote would pay for callables that are
    mostly sent by name. (Unpickling what it made imports it by itself.)"""
    import cloudpickle

    return cloudpickle


_FRAME_LINE: Final = re.compile(r'^(\s*)File "([^"]+)", line (\d+), in .*$')


def fill_source_lines(trace: str) -> str:
    """A remote traceback with the source line of each frame that lacks
    one filled in from this process's files (``linecache``), where it has
    the file: the client holds the script that the worker ran by value."""
    lines = trace.splitlines(keepends=True)
    out: list[str] = []
    for at, line in enumerate(lines):
        out.append(line)
        frame = _FRAME_LINE.match(line)
        if frame is None:
            continue
        following = lines[at + 1] if at + 1 < len(lines) else ""
        if following.startswith(frame.group(1) + "    "):
            continue  # it has its line
        source = linecache.getline(frame.group(2), int(frame.group(3))).strip()
        if source:
            out.append(f"{frame.group(1)}    {source}\n")
    return "".join(out)


class StreamCache:
    """The functions one stream has carried, kept alike at both of its ends.

    Least recently named first out, past :data:`MAX_FUNCTIONS` or
    :data:`MAX_CACHED_BYTES`; both ends make the same calls in the same
    order, so they evict the same entries.
    """

    def __init__(
        self, max_functions: int = MAX_FUNCTIONS, max_bytes: int = MAX_CACHED_BYTES
    ) -> None:
        self._codes: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._max_functions = max_functions
        self._max_bytes = max_bytes

    def outgoing(self, digest: bytes, code: bytes) -> bytes:
        """The sender's side: the code to attach to the task naming
        ``digest`` (empty if the receiver holds it)."""
        if digest in self._codes:
            self._codes.move_to_end(digest)
            return b""
        self._keep(digest, code)
        return code

    def incoming(self, digest: bytes, code: bytes) -> bytes:
        """The receiver's side: the code of the task naming ``digest``.

        :raises ShippingError: if ``code`` is empty and not held, or is not
            what ``digest`` says.
        """
        if not code:
            held = self._codes.get(digest)
            if held is None:
                raise ShippingError(
                    f"the task names function {digest.hex()[:16]} by digest, "
                    f"which this stream has not carried"
                )
            self._codes.move_to_end(digest)
            return held
        if len(digest) != DIGEST_BYTES or hashlib.sha256(code).digest() != digest:
            raise ShippingError("the task's function does not match its digest")
        if digest in self._codes:  # sent again anyway: the same bytes
            self._codes.move_to_end(digest)
            return self._codes[digest]
        self._keep(digest, code)
        return code

    def _keep(self, digest: bytes, code: bytes) -> None:
        self._codes[digest] = code
        self._bytes += len(code)
        while len(self._codes) > 1 and (
            len(self._codes) > self._max_functions or self._bytes > self._max_bytes
        ):
            _, dropped = self._codes.popitem(last=False)
            self._bytes -= len(dropped)


_loaded: OrderedDict[bytes, Callable[..., Any]] = OrderedDict()


def loaded(digest: bytes) -> Callable[..., Any] | None:
    """The function shipped as ``digest``, if this worker has unpickled it."""
    return _loaded.get(digest)


def load_function(digest: bytes, code: bytes) -> Any:
    """Unpickle a shipped function (which may import modules: call it off
    the loop) and keep it by digest if it is callable.

    :raises ImportError: if it needs a module this worker cannot import.
    :raises Exception: whatever unpickling raises.
    """
    fn = pickle.loads(code)
    if not callable(fn):
        return fn
    _loaded[digest] = fn
    while len(_loaded) > MAX_LOADED:
        _loaded.popitem(last=False)
    return fn


def where_imports_look() -> str:
    """Where this process imports from, and how to add to it: the text a
    failed import of a task's module ends with."""
    first = sys.path[0] if sys.path else ""
    return (
        f"the worker imports from sys.path[0]={first or os.getcwd()!r} and its "
        f"working directory {os.getcwd()!r}; start the pool with `pool up "
        f"--path DIR` (a worker started on its own: `python -m workers --path "
        f"DIR`), set PYTHONPATH, or pass ship_modules=[module] to the client "
        f"to send the module with the task"
    )
