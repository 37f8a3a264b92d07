"""Progress bars for a long ``map`` or a set of futures (``progress=``).

- ``True``: on a terminal, rich's bar (calls done of all, the rate, the
  time left, and how many failed), drawn on stdout, which it keeps printing
  above it; in a notebook (an IPython kernel), a line of text that updates
  in place under the cell; anywhere else (stdout a pipe or a file, or
  ``$CI`` set), nothing.
- A tqdm-like class (``tqdm.tqdm``, ``tqdm.auto.tqdm``, ``tqdm.notebook.tqdm``):
  made with ``total=`` and ``desc=``, advanced with ``update(n)``, failures
  shown with ``set_postfix(failed=n)``, closed at the end, so the bar is
  tqdm's own, wherever tqdm draws.

A :class:`Bar` is advanced from the client's loop thread (a future's done
callback) and closed by whoever ends first: the last call, or the caller's
iteration. Both are safe from any thread.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Protocol

from workers.protocol import codec

NOTEBOOK_EVERY_S: Final = 0.2  # how often a notebook's line is written again

Progress = bool | Callable[..., Any] | None


class Bar(Protocol):
    def advance(self, calls: int, failed: int = 0) -> None:
        """``calls`` more are done, ``failed`` of them with an exception."""

    def close(self) -> None:
        """Draw the last state and stop (again: nothing)."""


def open_bar(progress: Progress, total: int, label: str) -> Bar | None:
    """The bar ``progress`` asks for, of ``total`` calls; None for none.

    :raises TypeError: if ``progress`` is neither a bool nor a class to call.
    """
    if progress is None or progress is False:
        return None
    if progress is True:
        if in_notebook():
            return NotebookBar(total, label)
        if not sys.stdout.isatty() or os.environ.get("CI"):
            return None
        return RichBar(total, label)
    if callable(progress):
        return TqdmBar(progress(total=total, desc=label))
    raise TypeError(
        f"progress= takes True, False, or a tqdm-like class such as "
        f"tqdm.tqdm; got {progress!r}"
    )


def in_notebook() -> bool:
    """Whether this process is an IPython kernel's (a notebook's)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


class RichBar:
    """rich's bar on the terminal, with the rate and the failures."""

    def __init__(self, total: int, label: str) -> None:
        from rich import progress as rp
        from rich.text import Text

        class Rate(rp.ProgressColumn):
            def render(self, task: rp.Task) -> Any:
                speed = task.finished_speed or task.speed
                return Text(f"{speed or 0:,.0f}/s", style="progress.data.speed")

        self._progress = rp.Progress(
            rp.TextColumn("[progress.description]{task.description}"),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TaskProgressColumn(),
            Rate(),
            rp.TimeRemainingColumn(),
            rp.TextColumn("{task.fields[failed]} failed"),
        )
        self._task = self._progress.add_task(label, total=total, failed=0)
        self._failed, self._lock = 0, threading.Lock()
        self._progress.start()

    def advance(self, calls: int, failed: int = 0) -> None:
        with self._lock:
            self._failed += failed
            self._progress.update(self._task, advance=calls, failed=self._failed)

    def close(self) -> None:
        self._progress.stop()


class TqdmBar:
    """A tqdm-like bar the caller chose."""

    def __init__(self, bar: Any) -> None:
        self._bar, self._failed = bar, 0
        self._lock, self._closed = threading.Lock(), False

    def advance(self, calls: int, failed: int = 0) -> None:
        with self._lock:
            if self._closed:
                return
            self._bar.update(calls)
            if failed:
                self._failed += failed
                self._bar.set_postfix(failed=self._failed)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._bar.close()


class NotebookBar:
    """A line of text under the running cell, written again in place
    (IPython's ``display`` with a ``display_id``) every
    :data:`NOTEBOOK_EVERY_S` and at the end."""

    def __init__(self, total: int, label: str) -> None:
        from IPython.display import display

        self._total, self._label = total, label
        self._done = self._failed = 0
        self._started = self._shown = time.monotonic()
        self._lock, self._closed = threading.Lock(), False
        self._handle = display(self._shown_line(), raw=True, display_id=True)  # type: ignore[no-untyped-call]

    def advance(self, calls: int, failed: int = 0) -> None:
        with self._lock:
            self._done += calls
            self._failed += failed
            now = time.monotonic()
            if self._closed or now - self._shown < NOTEBOOK_EVERY_S:
                return
            self._shown = now
            self._handle.update(self._shown_line(), raw=True)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._handle.update(self._shown_line(), raw=True)

    def _shown_line(self) -> dict[str, str]:
        return {"text/plain": self._line()}  # (raw: shown as is, not repr'd)

    def _line(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = self._done / elapsed
        left = (self._total - self._done) / rate if rate else 0.0
        share = 100 * self._done // max(self._total, 1)
        filled = share // 5
        return (
            f"{self._label} {'█' * filled}{'·' * (20 - filled)} {share}% "
            f"{self._done:,}/{self._total:,} {rate:,.0f}/s {left:.0f} s left, "
            f"{self._failed} failed"
        )


def follow(
    bar: Bar, futures: list[concurrent.futures.Future[Any]], sizes: list[int]
) -> None:
    """Advance ``bar`` as each of a map's futures ends (``sizes``: the calls
    each carries); close it after the last. A cancelled one is not done."""
    left = [len(futures)]
    lock = threading.Lock()

    def ended(future: concurrent.futures.Future[Any], size: int) -> None:
        if not future.cancelled():
            bar.advance(*_calls_in(future, size))
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            bar.close()

    for future, size in zip(futures, sizes, strict=True):
        future.add_done_callback(functools.partial(ended, size=size))
    if not futures:
        bar.close()


def _calls_in(future: concurrent.futures.Future[Any], size: int) -> tuple[int, int]:
    """(calls done, of which failed) of a finished map future."""
    if future.exception() is not None:
        return size, size
    result = future.result()
    if isinstance(result, codec.ChunkResult):
        return len(result.values), len(result.failures)
    return 1, 0


def as_completed(
    fs: Iterable[concurrent.futures.Future[Any]],
    timeout: float | None = None,
    *,
    progress: Progress = False,
) -> Iterator[concurrent.futures.Future[Any]]:
    """:func:`concurrent.futures.as_completed`, with a bar if ``progress``
    asks for one (see the module docstring): each future as it finishes.

    :raises TimeoutError: if they are not all done within ``timeout``.
    """
    fs = set(fs)
    bar = open_bar(progress, len(fs), "as_completed")
    try:
        for future in concurrent.futures.as_completed(fs, timeout):
            if bar is not None:
                failed = not future.cancelled() and future.exception() is not None
                bar.advance(1, int(failed))
            yield future
    finally:
        if bar is not None:
            bar.close()
