"""Every error of the project crosses a process as itself: a task that
raises one (or lets one of ours through) hands its client the same class,
facts and message, not a ``RemoteError``; and every one is a
``pool.PoolError``. The errors are found by walking every module of the
three packages, so a new one is checked without being listed."""

from __future__ import annotations

import base64
import importlib
import inspect
import pickle
import pkgutil
import uuid
from typing import Any

import pytest

import discovery
import discovery.errors
import pool
import pool.errors
import workers
from workers.protocol.worker_pb2 import Failure

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


# A value for a fact whose name says more than its annotation.
_BY_NAME: dict[str, Any] = {
    "failure": base64.b64encode(
        Failure(message="it raised").SerializeToString()
    ).decode(),
}


def _errors() -> list[type[BaseException]]:
    """Every exception class defined in a module of the three packages
    (their ``__main__`` modules aside: importing one runs it)."""
    found = []
    for package in (discovery, workers, pool):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if info.name.endswith(".__main__"):
                continue
            module = importlib.import_module(info.name)
            found += [
                value
                for value in vars(module).values()
                if isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and value is not discovery.errors.Facts  # (a form, never raised)
            ]
    return found


ERRORS = _errors()


def _sample(cls: type[BaseException]) -> BaseException:
    """``cls`` made with a value for each of its facts (a message, for an
    error that takes only one)."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if any(param.kind is param.VAR_POSITIONAL for param in params):
        return cls("what went wrong")  # (a builtin's __init__: a message)
    return cls(
        **{
            param.name: _BY_NAME.get(param.name, _SAMPLES[str(param.annotation)])
            for param in params
        }
    )


def test_the_walk_finds_the_errors_of_every_package() -> None:
    """(So that the tests below cannot pass on an empty list.)"""
    modules = {cls.__module__.split(".")[0] for cls in ERRORS}
    assert modules == {"discovery", "workers", "pool"} and len(ERRORS) > 40


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__qualname__)
def test_every_error_is_a_pool_error(cls: type[BaseException]) -> None:
    """``except pool.PoolError`` catches every error shm-pool raises."""
    assert issubclass(cls, pool.PoolError)


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__qualname__)
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
