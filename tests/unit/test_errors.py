"""Every error of the project crosses a process as itself: a task that
raises one (or lets one of ours through) hands its client the same class,
facts and message, not a ``RemoteError``."""

from __future__ import annotations

import inspect
import pickle
import types
import uuid
from typing import Any

import pytest

import discovery.errors
import pool.errors
import workers.protocol.errors

# A value for each kind of fact, by its annotation (as written).
_SAMPLES: dict[str, Any] = {
    "str": "a fact",
    "int": 7,
    "float": 2.5,
    "object": "a path",
    "UUID": uuid.UUID(int=1),
    "tuple[str, ...]": ("gpu", "big"),
    "tuple[str, ...] | None": ("cpu",),
    "BaseException | None": ValueError("the initializer's own"),
}


def _errors(*modules: types.ModuleType) -> list[type[BaseException]]:
    return [
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == module.__name__
        and value is not discovery.errors.Facts  # (a form, never raised itself)
    ]


def _sample(cls: type[BaseException]) -> BaseException:
    """``cls`` made with a value for each of its facts (a message, for an
    error that takes only one)."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if any(param.kind is param.VAR_POSITIONAL for param in params):
        return cls("what went wrong")  # (a builtin's __init__: a message)
    return cls(**{param.name: _SAMPLES[str(param.annotation)] for param in params})


@pytest.mark.parametrize(
    "cls",
    _errors(discovery.errors, workers.protocol.errors, pool.errors),
    ids=lambda cls: cls.__qualname__,
)
def test_an_error_pickles_as_itself(cls: type[BaseException]) -> None:
    """An error unpickled elsewhere is of its class, with its facts and its
    message. Guards against a leaf that passed its message, not its facts,
    to ``Exception`` (pickling replays ``args``: it failed to rebuild, and
    the client got a ``RemoteError``)."""
    error = _sample(cls)
    rebuilt = pickle.loads(pickle.dumps(error))
    assert type(rebuilt) is cls
    assert str(rebuilt) == str(error)
    facts = {name: repr(value) for name, value in vars(error).items()}
    assert {name: repr(value) for name, value in vars(rebuilt).items()} == facts


def test_an_error_whose_message_names_no_fact_is_refused_when_declared() -> None:
    """A ``MESSAGE`` that names a field the error does not have fails where
    the class is written, not when the error is raised (where formatting it
    would raise ``KeyError`` in place of the error)."""
    with pytest.raises(TypeError, match=r"^Typo\.MESSAGE names \{namspace\}, "):

        class Typo(discovery.errors.Facts, discovery.errors.DiscoveryError):
            namespace: str

            MESSAGE = "namespace {namspace!r} is gone"


def test_an_error_with_facts_and_no_message_is_refused_when_declared() -> None:
    """An error with facts says what happened: one with neither a
    ``MESSAGE`` nor a ``__str__`` of its own fails where it is written."""
    with pytest.raises(TypeError, match=r"^Mute says nothing"):

        class Mute(discovery.errors.Facts, discovery.errors.DiscoveryError):
            namespace: str


def test_an_error_message_fills_in_its_facts_as_written() -> None:
    """The template's conversions and format specs apply to the facts."""
    error = discovery.errors.LockTimeout("ns-1", 2.50)
    assert str(error) == (
        "the registry lock of namespace 'ns-1' was held for more than 2.5 s; a "
        "process holding it may be stuck (see `fuser` on its lock file) or the "
        "wait may need raising"
    )
