"""How a setting of a pool process is declared once: a :class:`Spec`
(default, help, bounds, flag), the field of a frozen dataclass per process.
From it come the settings' validation (:func:`check`: a
:class:`SettingError` names setting and value), their command line
(:func:`add_arguments`, :func:`parse`: a bad value exits 2) and the slow
way's (:func:`to_argv`, while the zygote is down). Fields that several
processes take together are a :class:`Group`, a base of each process's
dataclass, declared once and shown under its title in ``--help``. The
settings themselves
are :mod:`workers.settings` (the worker's, and those more than one process
takes), :mod:`pool.dispatcher.settings` and :mod:`pool.supervisor.settings`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from discovery.errors import PoolError

Form = Literal["value", "switch", "csv", "append", "optional"]
T = TypeVar("T")


class SettingError(PoolError, ValueError):
    """A setting's value cannot be used; the message names both."""


@dataclass(frozen=True)
class Spec:
    """One setting: everything about it but its name, which its field gives.

    ``form`` is how it reads on a command line: ``value`` (``--x V``),
    ``switch`` (``--x``; with ``invert``, ``--no-x`` turns a True default
    off), ``csv`` (``--x a,b``), ``append`` (``--x A --x B``), ``optional``
    (``--x [V]``, ``const`` when bare). ``check`` raises ValueError for a
    bad value. ``flag`` is None for a setting the command line does not take.
    """

    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    flag: str | None = ""  # "": --<field-name>
    short: str | None = None
    metavar: str | None = None
    form: Form = "value"
    const: Any = None
    check: Callable[[Any], object] | None = None
    shown_default: str | None = None  # the default as --help says it

    def field(self, **changes: Any) -> Any:
        """A dataclass field of this setting (``changes``: of this spec)."""
        spec = dataclasses.replace(self, **changes) if changes else self
        return dataclasses.field(default=spec.default, metadata={"spec": spec})


class Group:
    """A base of settings dataclasses: fields that more than one process
    takes together (a frozen dataclass of its own), shown under ``TITLE``
    in ``--help``. A process's dataclass inherits the group, and declares
    one of its fields again only to word its help for that process; the
    field keeps its place in the group. A group that extends another (with
    a process's own fields of the same kind) shows under its title.
    """

    TITLE: ClassVar[str]


def values(settings: object, group: type[Group]) -> dict[str, Any]:
    """The fields of ``group`` in ``settings``, by name: what a process
    passes on to a child that takes the same group."""
    fields = dataclasses.fields(typing.cast(Any, group))
    return {f.name: getattr(settings, f.name) for f in fields}


def _titles(cls: type) -> dict[str, str]:
    """The title of each field of ``cls`` that a :class:`Group` declares."""
    return {
        field.name: base.TITLE
        for base in cls.__mro__[1:]
        if issubclass(base, Group) and base is not Group
        for field in dataclasses.fields(typing.cast(Any, base))
    }


def _specs(cls: type) -> list[tuple[dataclasses.Field[Any], Spec]]:
    return [
        (f, f.metadata["spec"]) for f in dataclasses.fields(cls) if "spec" in f.metadata
    ]


def _flag(field: dataclasses.Field[Any], spec: Spec) -> str:
    return spec.flag or "--" + field.name.replace("_", "-")


def check(settings: object) -> None:
    """Check every field against its spec's bounds and check.

    :raises SettingError: for the first bad value.
    """
    for field, spec in _specs(type(settings)):
        value = getattr(settings, field.name)
        if value is None or isinstance(value, bool):
            continue
        low, high = _number(spec.low), _number(spec.high)
        if spec.low is not None and value < spec.low:
            bound = f"{low} to {high}" if spec.high is not None else f"at least {low}"
            raise SettingError(f"{field.name} must be {bound}, got {value}")
        if spec.high is not None and value > spec.high:
            bound = f"{low} to {high}" if spec.low is not None else f"at most {high}"
            raise SettingError(f"{field.name} must be {bound}, got {value}")
        if spec.check is not None:
            try:
                spec.check(value)
            except ValueError as exc:
                raise SettingError(str(exc)) from None


def _number(value: float | None) -> str:
    return str(int(value)) if value is not None and value == int(value) else f"{value}"


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _scalar(cls: type, name: str) -> type:
    """The type a command line gives field ``name`` (int, float or str)."""
    hint = _hints(cls)[name]
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option in (int, float, str):
            return typing.cast(type, option)
    return str


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add the flags of ``cls``'s settings to ``parser``, a group's under
    its title."""
    titles = _titles(cls)
    groups: dict[str, argparse._ArgumentGroup] = {}  # (a name for typing only)
    # A process's own flags first, then each group's.
    for field, spec in sorted(_specs(cls), key=lambda pair: pair[0].name in titles):
        if spec.flag is None:
            continue
        title = titles.get(field.name)
        if title is not None and title not in groups:
            groups[title] = parser.add_argument_group(title)
        target = parser if title is None else groups[title]
        flags = [f for f in (spec.short, _flag(field, spec)) if f]
        target.add_argument(*flags, **_options(cls, field, spec))


def _options(cls: type, field: dataclasses.Field[Any], spec: Spec) -> dict[str, Any]:
    """What ``add_argument`` is given for one setting.

    :raises TypeError: for a bool setting that is not a switch (its value
        would parse as a string, and ``False`` as true).
    """
    if _hints(cls)[field.name] is bool and spec.form != "switch":
        raise TypeError(f"{cls.__name__}.{field.name} is a bool: declare it a switch")
    shown = _shown_default(spec)
    text = f"{spec.help} (default: {shown})" if shown else spec.help
    options: dict[str, Any] = {"dest": field.name, "help": text}
    if spec.form == "switch":
        options["action"] = "store_false" if spec.default else "store_true"
    elif spec.form == "append":
        options.update(action="append", default=[], metavar=spec.metavar)
    else:
        kind = _scalar(cls, field.name)
        options.update(metavar=spec.metavar or _metavar(field.name, kind))
        options["default"] = spec.default
        if spec.form == "optional":
            options.update(nargs="?", const=spec.const)
        if spec.form != "csv":
            options["type"] = kind
    return options


def _shown_default(spec: Spec) -> str | None:
    """The default as ``--help`` says it, if it says one."""
    default = spec.default
    if spec.shown_default is not None:
        return spec.shown_default
    if default is None or isinstance(default, bool) or default in ((), ""):
        return None
    return f"{default:g}" if isinstance(default, float) else str(default)


def _metavar(name: str, kind: type) -> str:
    if kind is int:
        return "N"
    if kind is float:
        return "SECONDS" if name.endswith("_s") else "X"
    return name.upper()


def from_arguments(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """``cls`` from what :func:`add_arguments` parsed, and ``given``.

    :raises SettingError: for a bad value.
    """
    values = dict(given)
    for field, spec in _specs(cls):
        if field.name in values or not hasattr(args, field.name):
            continue
        value = getattr(args, field.name)
        if spec.form == "csv" and isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        elif spec.form == "append":
            value = tuple(value)
        values[field.name] = value
    try:
        return cls(**values)
    except SettingError:
        raise
    except ValueError as exc:  # a check of the class's own, across fields
        raise SettingError(str(exc)) from None


def to_argv(settings: object) -> list[str]:
    """The command line that gives ``settings`` (what differs from defaults)."""
    argv: list[str] = []
    for field, spec in _specs(type(settings)):
        value = getattr(settings, field.name)
        if spec.flag is None or value == spec.default:
            continue
        flag = _flag(field, spec)
        if spec.form == "switch":
            argv.append(flag)
        elif spec.form == "csv":
            argv += [flag, ",".join(value)]
        elif spec.form == "append":
            for item in value:
                argv += [flag, str(item)]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def parse(
    cls: type[T], argv: Sequence[str] | None, *, prog: str, description: str
) -> T:
    """``cls`` from a command line; a bad value exits 2 with one line."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser, cls)
    args = parser.parse_args(argv)
    try:
        return from_arguments(cls, args)
    except SettingError as exc:
        parser.error(str(exc))


def existing_file(flag: str) -> Callable[[str], None]:
    """A check that a path names a file (``flag`` names it in the error)."""

    def check_file(path: str) -> None:
        if not os.path.isfile(path):  # (a missing bind mount is a directory)
            why = " is a directory" if os.path.isdir(path) else ": no such file"
            raise ValueError(f"{flag} {path!r}{why}")

    return check_file


def port(value: int) -> None:
    """A check that a TCP port is one."""
    if not 0 <= value <= 65535:
        raise ValueError(f"port must be 0 to 65535, got {value}")
