"""Settings of a pool process, declared once: each process has a frozen
dataclass, each field from a :class:`Spec` (default, help, bounds,
flag) shared by every process that takes the setting. From it come its
validation (:func:`check`: a :class:`SettingError` names setting and
value), its command line (:func:`add_arguments`, :func:`parse`: a bad
value exits 2) and the slow way's (:func:`to_argv`, while the zygote is
down). The worker's are :class:`WorkerSettings`.
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
from typing import Any, Final, Literal, TypeVar

from discovery import backends, paths
from workers.limits import parse_size
from workers.protocol.codec import MAX_ARGS_BYTES, MAX_ARGS_LIMIT
from workers.serving import LOOPBACK

Form = Literal["value", "switch", "csv", "append", "optional"]
T = TypeVar("T")


class SettingError(ValueError):
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
    """Add the flags of ``cls``'s settings to ``parser``."""
    for field, spec in _specs(cls):
        if spec.flag is None:
            continue
        flags = [f for f in (spec.short, _flag(field, spec)) if f]
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
        parser.add_argument(*flags, **options)


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


def _port(value: int) -> None:
    if not 0 <= value <= 65535:
        raise ValueError(f"port must be 0 to 65535, got {value}")


# -- what more than one process takes, declared once --------------------------

NAMESPACE: Final = Spec(
    "default",
    "the pool's namespace",
    short="-n",
    check=paths.validate_namespace,
)
DISCOVERY: Final = Spec(
    None,
    "register in Redis at redis://HOST:PORT instead of this machine's shared "
    "memory, so that workers on other hosts can join",
    flag="--discovery",
    metavar="URL",
    check=backends.check_url,
)
HOST: Final = Spec(
    None,
    f"listen on TCP at HOST (bare: {LOOPBACK}, this machine only) instead of a "
    "unix socket; any other address exposes the pool: read SECURITY.md",
    form="optional",
    const=LOOPBACK,
)
PORT: Final = Spec(
    0, "with --host: the TCP port", check=_port, shown_default="a free one"
)
ADVERTISE: Final = Spec(
    None,
    "with --host: the address published for others, for NAT and containers "
    "(the bound port unless given; default: the bound address, or this host's "
    "name when --host is 0.0.0.0 or ::)",
    metavar="HOST[:PORT]",
)
TLS_CERT: Final = Spec(
    None,
    "with --host: serve TLS on the TCP port with this certificate (and --tls-key)",
    metavar="PEM",
    check=existing_file("--tls-cert"),
)
TLS_KEY: Final = Spec(
    None, "the key of --tls-cert", metavar="PEM", check=existing_file("--tls-key")
)
TOKEN_FILE: Final = Spec(
    None,
    "read the pool's token from PATH (else $SHMPOOL_TOKEN, else this host's "
    "pool's); never give the token itself on a command line",
    metavar="PATH",
    check=existing_file("--token-file"),
)
CONCURRENCY: Final = Spec(
    1, "tasks each worker runs at once: threads for plain functions", low=1
)
TAGS: Final = Spec((), "comma-separated labels that tasks may require", form="csv")
GRACE_S: Final = Spec(
    30.0,
    "on SIGTERM, how long a draining worker may finish its tasks",
    low=0,
    metavar="SECONDS",
)
MAX_ARGS_BYTES_SPEC: Final = Spec(
    MAX_ARGS_BYTES,
    "refuse a task whose pickled arguments are larger, with RESOURCE_EXHAUSTED",
    flag="--max-args-bytes",
    low=0,
    high=MAX_ARGS_LIMIT,
)
MAX_TASKS_PER_CHILD: Final = Spec(
    0,
    "retire a worker once it has run N tasks: it hands back what it holds, "
    "finishes, exits, and is replaced (0: never)",
    low=0,
)
MAX_MEMORY: Final = Spec(
    None,
    "retire a worker whose resident memory is over SIZE (2GB, 512MiB) after "
    "a task; a task that takes it past 1.5 x SIZE while it runs ends the "
    "worker (an attempt of that task, as any death)",
    metavar="SIZE",
    check=parse_size,
)
INITIALIZER: Final = Spec(
    None,
    "run MODULE:FUNCTION in each worker before its first task, and in each "
    "replacement; after 3 failures in a row the pool starts no more workers, "
    "and every task fails with InitializerFailed",
    metavar="MODULE:FUNCTION",
)
INITARGS: Final = Spec(
    (),
    "an argument for --initializer, a string (repeatable, in order)",
    flag="--initarg",
    form="append",
    metavar="ARG",
)
PATHS: Final = Spec(
    (),
    "import task modules from DIR first (repeatable)",
    flag="--path",
    form="append",
    metavar="DIR",
)
RELOAD: Final = Spec(
    False,
    "import a task's module again when its source file has changed (only that "
    "module, not the ones it imports)",
    form="switch",
)
PARENT_FD: Final = Spec(
    None, "a pidfd (inherited) of the process whose death ends this one"
)
READY_FD: Final = Spec(None, "write the READY line here, not to stdout")
OUTPUT_FD: Final = Spec(None, "send stdout and stderr here, line by line")


def check_tcp(settings: Any) -> None:
    """What goes with ``host``: port, advertise and a whole TLS pair.

    :raises SettingError: naming the flags.
    """
    tls = settings.tls_cert or settings.tls_key
    if settings.host is None and (settings.port or settings.advertise or tls):
        raise SettingError("--port, --advertise and --tls-cert go with --host (TCP)")
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise SettingError("--tls-cert and --tls-key go together")


@dataclass(frozen=True)
class WorkerSettings:
    """One worker's settings (``python -m workers``)."""

    namespace: str = NAMESPACE.field()
    concurrency: int = CONCURRENCY.field(
        help="tasks run at once: threads for plain functions"
    )
    tags: tuple[str, ...] = TAGS.field()
    grace_s: float = GRACE_S.field()
    max_args_bytes: int = MAX_ARGS_BYTES_SPEC.field()
    max_tasks_per_child: int = MAX_TASKS_PER_CHILD.field()
    max_memory: str | int | None = MAX_MEMORY.field()
    initializer: str | None = INITIALIZER.field()
    initargs: tuple[str, ...] = INITARGS.field()
    initializer_pickle: str | None = Spec(
        None, "the Pool(initializer=...) given, pickled, in base64", metavar="TEXT"
    ).field()
    paths: tuple[str, ...] = PATHS.field()
    reload: bool = RELOAD.field()
    discovery_url: str | None = DISCOVERY.field(
        help="publish into the registry at redis://HOST:PORT instead of the "
        "namespace's shared memory"
    )
    host: str | None = HOST.field()
    port: int = PORT.field()
    advertise: str | None = ADVERTISE.field()
    tls_cert: str | None = TLS_CERT.field(
        help=TLS_CERT.help + "; the dispatcher checks it against its --tls-ca"
    )
    tls_key: str | None = TLS_KEY.field()
    token_file: str | None = TOKEN_FILE.field()
    parent_fd: int | None = PARENT_FD.field()
    ready_fd: int | None = READY_FD.field()
    output_fd: int | None = OUTPUT_FD.field()

    def __post_init__(self) -> None:
        check(self)
        check_tcp(self)
        object.__setattr__(self, "paths", tuple(map(os.path.abspath, self.paths)))

    @property
    def tls(self) -> tuple[str, str] | None:
        """The certificate and key files, if it serves TLS."""
        return (self.tls_cert, self.tls_key) if self.tls_cert and self.tls_key else None
