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
from typing import Any, Final, Protocol

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from discovery import DiscoveryEvent, WorkerInfo


class View(Protocol):
    def event(self, event: DiscoveryEvent) -> None: ...
    def note(self, kind: str, **fields: Any) -> None: ...
    def output(self, name: str, pid: int, text: str) -> None: ...
    def tick(self, queued: int | None) -> None: ...
    def close(self) -> None: ...


def output_line(name: str, pid: int, text: str) -> str:
    """A line a child wrote, as shown: ``[w3 pid=1234] hello``."""
    return f"[{name} pid={pid}] {text}"


def output_text(name: str, pid: int, text: str) -> Text:
    """A line a child wrote, for the live view: its colours kept, every
    other escape (a cursor move, a screen clear) and control character
    dropped, so that a task cannot redraw the terminal."""
    kept = "".join(c for c in text if c == "\x1b" or c.isprintable())
    return Text.from_ansi(
        output_line(name, pid, kept), style="cyan", no_wrap=True, overflow="ellipsis"
    )


def describe(info: WorkerInfo) -> dict[str, Any]:
    """The fields of a worker a line shows."""
    return {
        "pid": info.pid,
        "uid": str(info.uid)[:8],
        "status": info.status,
        "address": info.address,
        "running": info.extra.get("running", "0"),
        "done": info.extra.get("done", "0"),
        "rss": f"{info.extra['rss_mb']} MB" if "rss_mb" in info.extra else "",
    }


def line(kind: str, fields: dict[str, Any]) -> str:
    return " ".join([kind, *(f"{key}={value}" for key, value in fields.items())])


class Tee:
    """Shows everything through each of ``views`` (a terminal's view and a
    dashboard's board)."""

    def __init__(self, *views: View) -> None:
        self._views = views

    def event(self, event: DiscoveryEvent) -> None:
        for view in self._views:
            view.event(event)

    def note(self, kind: str, **fields: Any) -> None:
        for view in self._views:
            view.note(kind, **fields)

    def output(self, name: str, pid: int, text: str) -> None:
        for view in self._views:
            view.output(name, pid, text)

    def tick(self, queued: int | None) -> None:
        for view in self._views:
            view.tick(queued)

    def close(self) -> None:
        for view in self._views:
            view.close()


class Out(Protocol):
    """Where a :class:`PlainView` writes: a text stream, or what keeps its
    lines (:class:`pool.client.embedded.RecentLines`)."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class PlainView:
    """One line per event or note."""

    def __init__(self, out: Out | None = None) -> None:
        self._out = out or sys.stdout

    def event(self, event: DiscoveryEvent) -> None:
        fields = describe(event.worker_info)
        if event.type == "worker-dropped":
            fields = {k: fields[k] for k in ("pid", "uid")}
        self._write(line(event.type, fields))

    def note(self, kind: str, **fields: Any) -> None:
        self._write(line(kind, fields))

    def output(self, name: str, pid: int, text: str) -> None:
        self._write(output_line(name, pid, text))

    def tick(self, queued: int | None) -> None:
        pass  # (plain lines say only what happened)

    def _write(self, text: str) -> None:
        self._out.write(text + "\n")
        self._out.flush()

    def close(self) -> None:
        pass


class LiveView:
    """A table of workers above the latest events and output, redrawn as they
    come; readable at 80 columns.

    :param paths: where the workers import task modules from (shown).
    """

    def __init__(
        self,
        namespace: str,
        console: Console | None = None,
        *,
        paths: tuple[str, ...] = (),
    ) -> None:
        self._namespace = namespace
        self._paths = paths
        self._dashboard = ""  # its URL, once the pool is ready
        self._workers: dict[str, WorkerInfo] = {}
        self._log: deque[Text] = deque(maxlen=LOG_LINES)
        self._status = "starting"
        self._queued: int | None = None
        self._done = 0  # tasks finished, summed over workers' counters
        self._rate = Rate()
        self._live = Live(
            self.render(), console=console, auto_refresh=False, transient=False
        )
        self._live.start()
        self._width = self._live.console.width

    def event(self, event: DiscoveryEvent) -> None:
        info = event.worker_info
        uid = str(info.uid)
        before = self._workers.get(uid)
        if event.type == "worker-dropped":
            self._workers.pop(uid, None)
        else:
            self._workers[uid] = info
            self._done += max(0, _done(info) - (_done(before) if before else 0))
        if event.type != "worker-updated" or info.status != getattr(
            before, "status", info.status
        ):
            self._add_log(event.type, f"pid={info.pid} status={info.status}")
        self._refresh()

    def note(self, kind: str, **fields: Any) -> None:
        if kind in {"ready", "stopping", "stopped"}:
            self._status = kind
        if kind == "ready" and "dashboard" in fields:
            self._dashboard = str(fields["dashboard"])
        self._add_log(kind, " ".join(f"{k}={v}" for k, v in fields.items()))
        self._refresh()

    def output(self, name: str, pid: int, text: str) -> None:
        self._log.append(output_text(name, pid, text))
        self._refresh()

    def tick(self, queued: int | None) -> None:
        """About once a second: the dispatcher's queue length (None: not
        known), and a fresh rate."""
        self._queued = queued
        self._refresh()

    def _add_log(self, kind: str, text: str) -> None:
        style = {"worker-dropped": "red", "worker-exited": "red", "ready": "green"}
        stamp = time.strftime("%H:%M:%S")
        self._log.append(_line(f"{stamp} {kind:<15} {text}", style.get(kind, "")))

    def _refresh(self) -> None:
        console = self._live.console
        if console.width != self._width:
            # The terminal reflowed what was drawn at the old width, so the
            # redraw would not land on it (a title left twice): start clean.
            self._width = console.width
            console.clear()
        self._live.update(self.render(), refresh=True)

    def render(self) -> Group:
        """What the view shows now."""
        rate = self._rate.per_second(self._done)
        queued = "?" if self._queued is None else f"{self._queued:,}"
        title = _line(
            f"pool {shorten(self._namespace, 24)!r} · {len(self._workers)} workers "
            f"· {self._status} · {rate:,.0f} tasks/s · queue {queued}",
            "bold",
        )
        table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
        for column in COLUMNS:
            table.add_column(column, justify="right" if column in NUMERIC else "left")
        for info in sorted(self._workers.values(), key=lambda i: i.pid):
            table.add_row(*cells(info))
        lines: list[Text | Table] = [title]
        if self._paths:
            lines.append(_line(f"imports from {', '.join(self._paths)}"))
        if self._dashboard:
            lines.append(_line(f"dashboard {self._dashboard}", "bold"))
        lines += [table, *self._log]
        if self._status == "stopping":
            lines.append(_line("draining: Ctrl-C again stops at once", "dim"))
        elif self._status != "stopped":
            lines.append(_line("Ctrl-C drains, twice stops at once", "dim"))
        return Group(*lines)

    def close(self) -> None:
        self._live.stop()


LOG_LINES: Final = 12
COLUMNS: Final = (
    "pid",
    "uid",
    "address",
    "status",
    "running",
    "done",
    "last ms",
    "rss",
)
NUMERIC: Final = frozenset({"pid", "running", "done", "last ms", "rss"})
ADDRESS_WIDTH: Final = 22


def cells(info: WorkerInfo) -> tuple[str, ...]:
    """A worker's row: its address shortened from the left, keeping the part
    that tells workers apart (a socket's name, a port)."""
    fields = describe(info)
    return (
        str(fields["pid"]),
        fields["uid"],
        shorten_left(fields["address"], ADDRESS_WIDTH),
        fields["status"],
        fields["running"],
        fields["done"],
        info.extra.get("last_ms", ""),
        fields["rss"],
    )


def _line(text: str, style: str = "") -> Text:
    """One line of the view: cut at the terminal's width, never wrapped."""
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


def shorten(text: str, width: int) -> str:
    """``text``, cut at the end to ``width`` characters."""
    return text if len(text) <= width else text[: width - 1] + "…"


def shorten_left(text: str, width: int) -> str:
    """``text``, cut at the start to ``width`` characters."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


def _done(info: WorkerInfo) -> int:
    try:
        return int(info.extra.get("done", "0"))
    except ValueError:
        return 0


class Rate:
    """Tasks per second over the last few seconds, from a running total."""

    WINDOW_S: Final = 5.0

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def per_second(self, total: int, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self._samples.append((now, total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.WINDOW_S:
            self._samples.popleft()
        then, before = self._samples[0]
        return (total - before) / (now - then) if now - then >= 1.0 else 0.0
