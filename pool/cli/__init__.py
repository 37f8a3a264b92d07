"""``python -m pool``: start, use, watch and stop a pool.

Each command prints one clear line an error and exits non-zero on error,
never a traceback: 2 for how it was called (argparse's convention), 1 for
what went wrong. ``up`` owns the pool it starts; the other commands find it
by namespace through the private runtime directory. One module per command
group: :mod:`~pool.cli.up`, :mod:`~pool.cli.submit`, :mod:`~pool.cli.inspect`
(``workers``, ``watch``, ``ls``), :mod:`~pool.cli.down`,
:mod:`~pool.cli.bench`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import discovery
from discovery import paths
from discovery.errors import InvalidNamespace
from pool.cli import bench, down, inspect, submit, up
from pool.cli.common import UsageError, report

__all__ = ["UsageError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pool",
        description="A local worker pool whose workers find each other through "
        "shared memory. Start one with `up`, use it with `submit` or "
        "pool.Client, stop it with `down` (or Ctrl-C).",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {discovery.__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (up, submit, inspect, down, bench):
        group.add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        # (`bench` has none by default, and `ls` none at all)
        if getattr(args, "namespace", None) is not None:
            try:
                paths.validate_namespace(args.namespace)
            except InvalidNamespace as exc:
                raise UsageError(str(exc)) from None
        return run(args)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # each error it holds on a line of its own
        if isinstance(exc, SystemExit):
            raise
        return report(exc)


if __name__ == "__main__":
    sys.exit(main())
