"""How ``pool up`` shows a pool's life: a live table on a terminal, plain
lines anywhere else.

Both views take the same calls: :meth:`event` for each discovery event and
:meth:`note` for what the supervisor itself sees (a worker started or
exited, the pool ready, stopping, stopped). Plain lines are
``<kind> key=value ...``, one per call, flushed at once, so that scripts
and tests can follow them.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any, Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from discovery import DiscoveryEvent, WorkerInfo


class View(Protocol):
    def event(self, event: DiscoveryEvent) -> None: ...
    def note(self, kind: str, **fields: Any) -> None: ...
    def close(self) -> None: ...


def describe(info: WorkerInfo) -> dict[str, Any]:
    """The fields of a worker a line shows."""
    return {
        "pid": info.pid,
        "uid": str(info.uid)[:8],
        "status": info.status,
        "address": info.address,
        "running": info.extra.get("running", "0"),
        "done": info.extra.get("done", "0"),
    }


def line(kind: str, fields: dict[str, Any]) -> str:
    return " ".join([kind, *(f"{key}={value}" for key, value in fields.items())])


class PlainView:
    """One line per event or note."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out or sys.stdout

    def event(self, event: DiscoveryEvent) -> None:
        fields = describe(event.worker_info)
        if event.type == "worker-dropped":
            fields = {k: fields[k] for k in ("pid", "uid")}
        self._write(line(event.type, fields))

    def note(self, kind: str, **fields: Any) -> None:
        self._write(line(kind, fields))

    def _write(self, text: str) -> None:
        self._out.write(text + "\n")
        self._out.flush()

    def close(self) -> None:
        pass


class LiveView:
    """A table of workers above the latest events, redrawn as they come."""

    def __init__(self, namespace: str, console: Console | None = None) -> None:
        self._namespace = namespace
        self._workers: dict[str, WorkerInfo] = {}
        self._log: deque[Text] = deque(maxlen=12)
        self._status = "starting"
        self._live = Live(
            self._render(), console=console, auto_refresh=False, transient=False
        )
        self._live.start()

    def event(self, event: DiscoveryEvent) -> None:
        info = event.worker_info
        if event.type == "worker-dropped":
            self._workers.pop(str(info.uid), None)
        else:
            self._workers[str(info.uid)] = info
        if event.type != "worker-updated" or info.status == "draining":
            fields = describe(info)
            self._add_log(event.type, f"pid={fields['pid']} status={info.status}")
        self._refresh()

    def note(self, kind: str, **fields: Any) -> None:
        if kind in {"ready", "stopping", "stopped"}:
            self._status = kind
        self._add_log(kind, " ".join(f"{k}={v}" for k, v in fields.items()))
        self._refresh()

    def _add_log(self, kind: str, text: str) -> None:
        style = {"worker-dropped": "red", "worker-exited": "red", "ready": "green"}
        stamp = time.strftime("%H:%M:%S")
        self._log.append(Text(f"{stamp} {kind:<15} {text}", style=style.get(kind, "")))

    def _refresh(self) -> None:
        self._live.update(self._render(), refresh=True)

    def _render(self) -> Group:
        table = Table(
            title=f"pool {self._namespace!r}: {len(self._workers)} workers, "
            f"{self._status}  (Ctrl-C drains, twice stops at once)"
        )
        for column in ("pid", "uid", "address", "status", "running", "done"):
            table.add_column(
                column,
                justify="right" if column in {"pid", "running", "done"} else "left",
            )
        for info in sorted(self._workers.values(), key=lambda i: i.pid):
            fields = describe(info)
            table.add_row(
                *(
                    str(fields[c])
                    for c in ("pid", "uid", "address", "status", "running", "done")
                )
            )
        return Group(table, *self._log)

    def close(self) -> None:
        self._live.stop()
