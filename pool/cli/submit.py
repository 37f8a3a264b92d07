"""``pool submit MODULE:FUNC ARG...``: run one task and print its result."""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Sequence
from typing import Any

from pool.cli.common import (
    Commands,
    UsageError,
    add_namespace,
    add_remote,
    command,
    remote_url,
)
from pool.client.executor import Client
from pool.errors import PoolError
from workers.protocol.errors import BadTask

SUBMIT = """run one task and print its result

Run MODULE:FUNC(ARG, ..., NAME=ARG, ...) in the pool and print the result's
repr. Each ARG is a Python literal: 42, 'text', [1, 2], {'a': 1}; NAME=ARG
passes it by keyword (after the positional ones). Exits 1 if the task
raises, saying what it raised.
"""
TIMEOUT_HELP = "fail the task if it runs longer than this (default: no limit)"


def add(commands: Commands) -> None:
    submit = command(commands, "submit", run_submit, SUBMIT)
    add_namespace(submit)
    add_remote(submit)
    submit.add_argument("function", metavar="MODULE:FUNC")
    submit.add_argument("args", nargs="*", metavar="ARG")
    submit.add_argument("--timeout-s", type=float, metavar="SECONDS", help=TIMEOUT_HELP)


def run_submit(args: argparse.Namespace) -> int:
    positional, keywords = _call(args.args)
    client = Client(
        args.namespace,
        task_timeout_s=args.timeout_s,
        discovery_url=remote_url(args),
        token_file=args.token_file,
        tls_ca=args.tls_ca,
    )
    try:
        result = client.submit(args.function, *positional, **keywords).result()
    except (PoolError, BadTask):
        raise
    except (Exception, SystemExit) as exc:  # (the task's own SystemExit too)
        text = " ".join(str(exc).split())
        print(f"pool: the task raised {type(exc).__name__}: {text}", file=sys.stderr)
        return 1
    finally:
        client.shutdown()
    sys.set_int_max_str_digits(0)  # the whole number, however long
    try:
        printed = repr(result)
    except Exception as exc:
        raise PoolError(
            f"the task's result (a {type(result).__name__}) cannot be printed: "
            f"its repr raised {type(exc).__name__}"
        ) from None
    print(printed)
    return 0


def _call(texts: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments from ``ARG`` and ``NAME=ARG`` texts."""
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    for text in texts:
        name, equals, value = text.partition("=")
        if equals and name.isidentifier():
            keywords[name] = _literal(value)
        elif keywords:
            raise UsageError(f"positional argument {text!r} follows a keyword one")
        else:
            positional.append(_literal(text))
    return positional, keywords


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise UsageError(
            f"argument {text!r} is not a Python literal; quote text as \"'{text}'\""
        ) from None
