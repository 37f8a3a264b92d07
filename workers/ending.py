"""How a worker ends work early, the tasks' and its own:
:class:`EndingEarly`, the part of :class:`~workers.service.WorkerService`
that withdraws, cancels, times out and stops tasks, and retires or ends
the worker.

- A *cancel* withdraws a task not started (a slot thread's start and the
  withdrawal are decided under one lock: the answer is exactly one of the
  two); a started one runs on. An *abandon* (its caller is gone) also
  cancels a running coroutine; a *stop* stops the task whatever its state
  (:data:`~workers.protocol.stream.Withdraw`).
- A *time limit* runs from a task's start: over it, a coroutine is
  cancelled; a plain function, which no thread can interrupt, is answered
  (:class:`~workers.protocol.errors.TaskTimeout`) and the worker *ends*, as
  for a stop of a running plain function.
- A worker that *ends* (:meth:`EndingEarly.end`) takes nothing more, hands
  back what it holds unstarted (UNAVAILABLE: the dispatcher sends it
  elsewhere, counting no attempt), and its process exits at once with
  :data:`ENDED_EXIT`, taking along what else runs there (run again
  elsewhere, as after any death); its supervisor starts another.
- A worker past its limits (:mod:`workers.limits`) *retires*: it hands
  back what it holds and finishes what runs before it exits.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from typing import Final

from workers.limits import Limits
from workers.protocol import codec
from workers.protocol.errors import TaskTimeout
from workers.protocol.stream import Withdraw
from workers.protocol.worker_pb2 import Result
from workers.running import Entry, Phase, Stream, failed

# How a worker that ended to stop a task exits (its supervisor replaces it).
ENDED_EXIT: Final = 4


class EndingEarly(abc.ABC):
    """See the module docstring; the service keeps the state it reads."""

    limits: Limits
    retiring: asyncio.Event  # set once it retires or ends: its process stops
    ending: str | None  # why it ends now, if it does
    draining: bool
    _streams: set[Stream]
    _on_change: Callable[[], None]

    @abc.abstractmethod
    def _answer(
        self, entry: Entry, result: Result | None, *, withdraw: bool = False
    ) -> None:
        """Settle a task once (see :class:`~workers.service.WorkerService`)."""

    def _cancel(self, entry: Entry, kind: Withdraw) -> None:
        """Withdraw a task not started. A started one runs on (its start
        was, or is being, reported), but for ``abandon`` a running coroutine
        is cancelled, and for ``stop`` a coroutine is cancelled and a plain
        function stopped by ending the worker."""
        cancelled = failed(entry.task.id, codec.cancelled())
        if entry.job is not None and kind != "cancel":
            entry.job.cancel()
            self._answer(entry, cancelled)
        elif kind == "stop":
            self._end_for(entry, cancelled, "a task it ran was stopped by its client")
        else:
            self._answer(entry, cancelled, withdraw=True)

    def _time_out(self, entry: Entry) -> None:
        limit = entry.task.timeout_s
        timeout = failed(entry.task.id, codec.failure_of(TaskTimeout(limit)))
        if entry.job is not None:
            entry.job.cancel()
            self._answer(entry, timeout)
        else:
            self._end_for(entry, timeout, f"a task ran past its {limit:g} s limit")

    def _end_for(self, entry: Entry, result: Result, why: str) -> None:
        """Answer a plain task with ``result``; if its thread still runs it
        (it is stuck), end the worker: nothing else stops a call."""
        self._answer(entry, result)
        if entry.phase is Phase.STUCK:
            self.end(why)

    def end(self, why: str) -> None:
        """End this worker now (see the module docstring): take nothing
        more, hand back what it holds unstarted, and let :attr:`retiring`
        tell the process to exit at once, with :data:`ENDED_EXIT`."""
        if self.ending is None:
            self.ending = why
            self._leave(why)

    def retire(self) -> None:
        """Take no more tasks (:mod:`workers.limits` says why), and hand back
        those held; :attr:`retiring` tells the process to drain and exit."""
        self._leave(self.limits.why or "it is retiring")

    def _leave(self, why: str) -> None:
        if not self.retiring.is_set():
            self.draining = True
            self._hand_back(why, coroutines=True)
            self.retiring.set()
            self._on_change()

    def _refuse_held(self, entry: Entry) -> None:
        """Hand back a task that may not start here (the worker retires)."""
        failure = codec.rejected(self.limits.why or "it is retiring")
        self._answer(entry, failed(entry.task.id, failure), withdraw=True)

    def _hand_back(self, reason: str, *, coroutines: bool = False) -> None:
        """Answer every held task UNAVAILABLE (the dispatcher sends it to
        another worker, counting no attempt): those waiting for a thread, and
        with ``coroutines`` those waiting for their callable too."""
        for stream in self._streams:
            for entry in list(stream.entries.values()):
                if not entry.started and (coroutines or entry.kind != "coroutine"):
                    failure = codec.rejected(reason)
                    self._answer(entry, failed(entry.task.id, failure), withdraw=True)
