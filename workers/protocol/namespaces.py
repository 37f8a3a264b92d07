"""The module namespaces that functions shipped by value share in a worker.

cloudpickle gives each pickle's functions a globals dict of their own: a
script's initializer and its task, shipped apart, would each get one, and
what the first sets the second would never see. Under
``ProcessPoolExecutor`` both live in the script's module. Here too: the
functions of one module of one client process (its ``__main__``, a script
or a notebook; a module it ships) share one dict in each worker, for the
worker's life. The pickle names that dict by the client's session and the
module's name (:class:`Shared`, written by :mod:`workers.protocol.shipping`'s
pickler), and unpickling finds or makes it (:func:`namespace`).

A shipped function's globals are merged into that dict
(:func:`set_function_state`): the functions, classes and modules it names
replace what the dict holds (a notebook cell run again sends its new
definitions), and any other value only fills a name the dict lacks, so
what an initializer or a task set there stays, as it does in a
``ProcessPoolExecutor`` worker, which a client's later assignments do not
reach either. Unpickled in the client that made it, a :class:`Shared` is
that client's own module, whose names are never replaced.

A worker keeps at most :data:`MAX_NAMESPACES`, the least recently used
going first (functions that hold one keep it).
"""

from __future__ import annotations

import builtins
import os
import sys
import types
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

MAX_NAMESPACES: Final = 256
# What a shipped global is, when it replaces the namespace's value.
_DEFINITIONS: Final = (types.FunctionType, type, types.ModuleType)

Key = tuple[str, str]  # (the client's session, the module's name)

_session: tuple[int, str] | None = None
_namespaces: OrderedDict[Key, dict[str, Any]] = OrderedDict()
_keys: dict[int, Key] = {}  # id(a namespace made here) -> its key


def session() -> str:
    """This process's session: new in every process (a fork's child too)."""
    global _session
    if _session is None or _session[0] != os.getpid():
        _session = (os.getpid(), uuid.uuid4().hex)
    return _session[1]


def key_of(namespace: dict[str, Any]) -> Key | None:
    """The key of a function's globals if they are a module's (one of this
    process's, or one made here for a client), else None."""
    key = _keys.get(id(namespace))
    if key is not None:
        return key
    name = namespace.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is not None and vars(module) is namespace:
        return session(), module.__name__
    return None


@dataclass(frozen=True, slots=True)
class Shared:
    """A pickled stand-in for a module's namespace; ``fields`` are the
    module attributes cloudpickle keeps (``__file__``, ``__package__``)."""

    key: Key
    fields: tuple[tuple[str, Any], ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return namespace, (self.key, self.fields)


def namespace(key: Key, fields: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """The dict that ``key``'s functions share in this process (unpickling
    a :class:`Shared`)."""
    module_name = key[1]
    if key[0] == session() and module_name in sys.modules:
        return vars(sys.modules[module_name])
    held = _namespaces.get(key)
    if held is not None:
        _namespaces.move_to_end(key)
        return held
    made: dict[str, Any] = {**dict(fields), "__name__": module_name}
    made["__builtins__"] = builtins
    _namespaces[key] = made
    _keys[id(made)] = key
    while len(_namespaces) > MAX_NAMESPACES:
        _, dropped = _namespaces.popitem(last=False)
        del _keys[id(dropped)]
    return made


def set_function_state(fn: types.FunctionType, state: Any) -> None:
    """Set a shipped function's state (cloudpickle's state setter), merging
    its globals into its shared namespace as the module docstring says."""
    own, slots = state
    shipped, target = slots["__globals__"], fn.__globals__
    ours = id(target) not in _keys  # this process's own module
    for name, value in shipped.items():
        if name not in target or (not ours and isinstance(value, _DEFINITIONS)):
            target[name] = value
    kept = target.get("__builtins__")
    _cloudpickle_setstate()(fn, (own, {**slots, "__globals__": {}}))
    if kept is not None:  # (it sets the builtins dict: keep a module's own)
        target["__builtins__"] = kept


_setstate: Any = None


def _cloudpickle_setstate() -> Any:
    """cloudpickle's own state setter of a function (imported once: only
    what it pickled calls it)."""
    global _setstate
    if _setstate is None:
        from cloudpickle import cloudpickle as inner

        _setstate = inner._function_setstate
    return _setstate
