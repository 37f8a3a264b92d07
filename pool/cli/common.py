"""What every command of ``python -m pool`` shares: the usage error (exit
2), the namespace option (``-n``), the options that reach a pool of
another machine, and printing errors, each on its own line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TypeAlias

from discovery import DiscoveryError, backends
from pool.errors import PoolError, leaves
from workers.common.options import NAMESPACE
from workers.common.spec import existing_file
from workers.protocol.errors import TaskError

# What a command reports as one line, exit status 1 (anything else is a bug,
# shown with its traceback).
EXPECTED = (PoolError, DiscoveryError, TaskError, OSError)


# What add_parser is called on.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class UsageError(PoolError):
    """A command-line argument that cannot be used as given."""


def command(
    commands: Commands,
    name: str,
    run: Callable[[argparse.Namespace], int],
    text: str,
) -> argparse.ArgumentParser:
    """The parser of one command, which ``run`` runs; ``text`` is its
    one-line summary, a blank line, and its description."""
    summary, _, description = text.strip().partition("\n\n")
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=" ".join(summary.split()), description=" ".join(description.split())
    )
    parser.set_defaults(run=run)
    return parser


def add_namespace(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    parser.add_argument(
        NAMESPACE.short or "-n",
        "--namespace",
        default=NAMESPACE.default,
        help=help or f"{NAMESPACE.help} (default: {NAMESPACE.default})",
    )


def add_remote(parser: argparse.ArgumentParser, *, token: bool = True) -> None:
    """Options to reach a pool of another machine through its Redis."""
    parser.add_argument(
        "--discovery",
        metavar="URL",
        help="reach the pool through the Redis it registers in (`pool up "
        "--discovery redis://HOST:PORT`), from any machine (default: the pool "
        "of this machine)",
    )
    if token:
        parser.add_argument(
            "--token-file",
            metavar="PATH",
            help="with --discovery: the pool's token (else $SHMPOOL_TOKEN, else "
            "this machine's pool's)",
        )
        parser.add_argument(
            "--tls-ca",
            metavar="PEM",
            help="with --discovery: the CA of a dispatcher that serves TLS "
            "(`pool up --tls-cert`; default: the system's roots)",
        )


def remote_url(args: argparse.Namespace) -> str | None:
    """The ``--discovery`` URL, checked; and the files given with it.

    :raises UsageError: for a URL we cannot use, or a file that is missing.
    """
    try:
        for flag in ("--token-file", "--tls-ca"):
            path = getattr(args, flag[2:].replace("-", "_"), None)
            if path is not None:
                existing_file(flag)(path)
        return backends.check_url(args.discovery)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def report(error: BaseException) -> int:
    """Print each error ``error`` holds on its own line; the exit status.

    :raises BaseException: ``error`` itself if it holds an unexpected one.
    """
    found = list(leaves(error))
    if not all(isinstance(e, (UsageError, *EXPECTED)) for e in found):
        raise error
    for each in found:
        print(f"pool: error: {each}", file=sys.stderr)
    return 2 if any(isinstance(e, UsageError) for e in found) else 1
