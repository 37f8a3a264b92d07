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

Arguments of a by-value call are pickled with cloudpickle too (they are
often objects of ``__main__`` classes), and any value or exception that
plain pickle refuses falls back to it (:func:`dumps`).

Unpickling is code execution: only authenticated peers' bytes reach here
(see :mod:`workers.protocol.auth`).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import types
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Final

# How much one stream's cache holds (the same limits at both of its ends).
MAX_FUNCTIONS: Final = 256
MAX_CACHED_BYTES: Final = 64 * 1024 * 1024
# Functions a worker keeps unpickled, by digest.
MAX_LOADED: Final = 1024
DIGEST_BYTES: Final = 32


class ShippingError(ValueError):
    """A shipped function's bytes are not what the task says they are."""


@dataclass(frozen=True, slots=True)
class Reference:
    """How a task names its callable: ``name``, or ``digest`` and ``code``
    (the cloudpickle of a callable sent by value)."""

    name: str = ""
    digest: bytes = b""
    code: bytes = b""

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
    code = _cloudpickle().dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    return Reference(digest=hashlib.sha256(code).digest(), code=code)


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


def dumps(value: Any, *, by_value: bool = False) -> bytes:
    """Pickle ``value``: with cloudpickle if ``by_value``, else with plain
    pickle, falling back to cloudpickle for what plain pickle refuses (a
    lambda, an object of a class defined in ``__main__``)."""
    if not by_value:
        try:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError):
            pass
    data: bytes = _cloudpickle().dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return data


def _cloudpickle() -> Any:
    """cloudpickle, imported when first needed: it adds about 17 ms to an
    import, which every worker's zygote would pay for callables that are
    mostly sent by name. (Unpickling what it made imports it by itself.)"""
    import cloudpickle

    return cloudpickle


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
        f"--path DIR`, set PYTHONPATH, or pass ship_modules=[module] to the "
        f"client to send the module with the task"
    )
