"""What the dashboard shows: the pool's state, kept bounded, and the
changes its pages are sent.

:class:`Board` is a :class:`~pool.supervisor.view.View` (the supervisor
shows it every discovery event, note and output line, as it shows the
terminal) and takes the dispatcher's reports
(:mod:`pool.dispatcher.telemetry`) in :meth:`Board.stats`. It keeps:

- a row per worker, and each dropped or exited one, marked, for
  :data:`GONE_KEEP_S` (at most :data:`MAX_GONE` of them);
- the last :data:`MAX_EVENTS` events, :data:`MAX_OUTPUT` output lines and
  :data:`MAX_FAILURES` failures;
- a point a second of tasks/s, queue and running tasks, for
  :data:`SERIES_POINTS` seconds;
- the task stream's last :data:`MAX_STREAM_BARS` bars (already merged by
  the dispatcher, so that a fast stream of tasks is few bars);
- each running ``map``'s calls done of its total (at most :data:`MAX_MAPS`;
  a finished one stays :data:`MAP_KEEP_S`);
- on Redis, a row per dispatcher of the pool (:mod:`.dispatchers`);
- the totals that ``/metrics`` exports (:mod:`.metrics`), kept monotonic
  across a restarted dispatcher, whose own counts start again at 0.

:meth:`Board.snapshot` is everything, for a page that connects;
:meth:`Board.take_changes` what changed since it was last called, which
the server sends every page twice a second. Runs on the supervisor's loop;
nothing here blocks or waits.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from discovery import DiscoveryEvent, WorkerInfo
from pool.dispatcher.telemetry import DURATION_BUCKETS_S, OUTCOMES
from pool.supervisor.view import output_line

GONE_KEEP_S: Final = 120.0
MAX_GONE: Final = 32
MAX_EVENTS: Final = 200
MAX_OUTPUT: Final = 500
MAX_FAILURES: Final = 20
SERIES_POINTS: Final = 300  # five minutes, a point a second
MAX_STREAM_BARS: Final = 5000
MAX_LANES: Final = 256  # worker slots the stream has rows for; then the oldest go
MAX_MAPS: Final = 32
MAP_KEEP_S: Final = 30.0
MAX_LABELS: Final = 24  # functions with a colour of their own; then "other"
CPU_STALE_S: Final = 5.0  # a CPU % older than this is not shown
CPU_SPAN_S: Final = 0.2
# A terminal's escape sequences (colours, cursor moves): the page shows text.
_ESCAPES: Final = re.compile(
    r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|.)"
)


class Board:
    """See the module docstring.

    :param namespace: the pool's.
    """

    # Told, for each of the supervisor's workers that died, how long from its
    # exit (seen through its pidfd) until discovery dropped it.
    on_drop_seen: Callable[[float], None] | None = None

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.state = "starting"
        self.url = ""
        self.workers: dict[str, dict[str, Any]] = {}  # uid -> row
        self._uid_of_pid: dict[int, str] = {}
        self._cpu: dict[str, tuple[float, float]] = {}  # uid -> (at, cpu_s)
        self._exited_at: dict[int, float] = {}  # pid -> when its exit was seen
        self._started_names: set[str] = set()
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self.lines: deque[str] = deque(maxlen=MAX_OUTPUT)  # output
        self.failures: deque[dict[str, Any]] = deque(maxlen=MAX_FAILURES)
        self.series: deque[list[float]] = deque(maxlen=SERIES_POINTS)
        self.stream: deque[list[Any]] = deque(maxlen=MAX_STREAM_BARS)
        self.labels: list[str] = []
        self.lanes: dict[str, dict[str, Any]] = {}  # lane key -> uid, pid, slot
        self.maps: dict[str, dict[str, Any]] = {}  # map id -> its row
        self.queued: int | None = None
        self.queued_by_priority: dict[str, int] = {}  # (when priorities differ)
        # Every dispatcher of a pool on Redis (:mod:`.dispatchers`); None:
        # this pool has only its own.
        self.dispatcher_rows: list[dict[str, Any]] | None = None
        self.running = 0
        self.restarts = 0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.buckets = [0] * (len(DURATION_BUCKETS_S) + 1)
        self.duration_sum_s = 0.0
        self._last: dict[str, Any] | None = None  # the dispatcher's last totals
        self._base = (dict.fromkeys(OUTCOMES, 0), [0] * len(self.buckets), 0.0)
        self._rate_from: tuple[float, int] | None = None
        self._changes: dict[str, Any] = _empty()

    # -- the View calls --------------------------------------------------------

    def event(self, event: DiscoveryEvent) -> None:
        info, now = event.worker_info, time.time()
        uid = str(info.uid)
        before = self.workers.get(uid)
        row = self._row(info, now)
        if before is not None:  # an exit seen first is kept
            row["ended"] = before["ended"]
            if before["gone_at"]:
                row.update(status=before["status"], gone_at=before["gone_at"])
        if event.type == "worker-dropped":
            row.update(status="dropped", gone_at=row["gone_at"] or now)
            self._drop_seen(info.pid, now)
        self.workers[uid] = row
        self._uid_of_pid[info.pid] = uid
        self._changes["workers"][uid] = row
        was = before["status"] if before is not None else None
        if event.type != "worker-updated" or was != row["status"]:
            self._event(event.type, f"pid={info.pid} status={info.status}")

    def note(self, kind: str, **fields: Any) -> None:
        if kind in {"ready", "stopping", "stopped"}:
            self.state = kind
            self._changes["header"] = True
        if kind == "worker-started":
            name = str(fields.get("name", ""))
            if name in self._started_names:
                self.restarts += 1
                kind = "worker-restarted"
            self._started_names.add(name)
        elif kind == "worker-exited":
            self._exited(int(fields["pid"]), fields)
        self._event(kind, " ".join(f"{k}={v}" for k, v in fields.items()))

    def output(self, name: str, pid: int, text: str) -> None:
        plain = "".join(c for c in _ESCAPES.sub("", text) if c.isprintable())
        line = output_line(name, pid, plain)
        self.lines.append(line)
        self._changes["output"].append(line)

    def dispatchers(self, rows: list[dict[str, Any]]) -> None:
        """Every dispatcher of the pool, as :mod:`.dispatchers` saw them."""
        if rows != self.dispatcher_rows:
            self.dispatcher_rows = rows
            self._changes["dispatchers"] = rows

    def tick(self, queued: int | None) -> None:
        pass  # (the dispatcher's reports say its queue)

    def close(self) -> None:
        pass

    # -- the dispatcher's reports ---------------------------------------------

    def stats(self, report: dict[str, Any]) -> None:
        """A report of :class:`~pool.dispatcher.telemetry.Telemetry`."""
        self.queued, self.running = int(report["queued"]), int(report["running"])
        self.queued_by_priority = dict(report.get("queued_by_priority", {}))
        self._totals(report)
        labels = [self._label(name) for name in report["labels"]]
        for lane in report["lanes"]:
            key = f"{lane['uid'][:8]}/{lane['slot']}"
            if key not in self.lanes:
                self.lanes[key] = {"pid": lane["pid"], "slot": lane["slot"]}
                self._changes["lanes"][key] = self.lanes[key]
                if len(self.lanes) > MAX_LANES:
                    del self.lanes[next(iter(self.lanes))]
            for start, end, label, n, failed in lane["bars"]:
                bar = [key, start, end, labels[label], n, failed]
                self.stream.append(bar)
                self._changes["bars"].append(bar)
        for failure in report["failures"]:
            self.failures.append(failure)
            self._changes["failures"].append(failure)
        for row in report.get("maps", ()):
            self._map_moved({**row, "t": report["t"]})
        self._changes["header"] = True

    def _map_moved(self, row: dict[str, Any]) -> None:
        self.maps.pop(row["id"], None)  # (the newest last)
        self.maps[row["id"]] = self._changes["maps"][row["id"]] = row
        while len(self.maps) > MAX_MAPS:
            self._changes["maps_removed"].append(
                self.maps.pop(next(iter(self.maps)))["id"]
            )

    def _totals(self, report: dict[str, Any]) -> None:
        """Add the dispatcher's totals to ours; a restarted dispatcher (its
        reports say another ``since``) starts from 0, so what its predecessor
        counted becomes the base."""
        last = self._last
        if last is not None and last["since"] != report["since"]:
            outcomes, buckets, total_s = self._base
            for key in OUTCOMES:
                outcomes[key] += last["outcomes"].get(key, 0)
            buckets[:] = [a + b for a, b in zip(buckets, last["buckets"], strict=True)]
            self._base = (outcomes, buckets, total_s + last["duration_sum_s"])
        self._last = report
        outcomes, buckets, total_s = self._base
        for key in OUTCOMES:
            self.outcomes[key] = outcomes[key] + report["outcomes"].get(key, 0)
        self.buckets = [a + b for a, b in zip(buckets, report["buckets"], strict=True)]
        self.duration_sum_s = total_s + report["duration_sum_s"]

    def sample(self, now: float | None = None) -> None:
        """A point of the throughput series (called once a second); and
        what has been gone long enough leaves the table."""
        now = time.time() if now is None else now
        done = sum(self.outcomes.values())
        rate = 0.0
        if self._rate_from is not None and now > self._rate_from[0]:
            rate = (done - self._rate_from[1]) / (now - self._rate_from[0])
        self._rate_from = (now, done)
        point = [round(now * 1e3), round(rate, 1), self.queued or 0, self.running]
        self.series.append(point)
        self._changes["series"].append(point)
        self._forget_gone(now)
        for map_id, row in list(self.maps.items()):
            if row["done"] >= row["total"] and now * 1e3 - row["t"] > MAP_KEEP_S * 1e3:
                self._changes["maps_removed"].append(self.maps.pop(map_id)["id"])

    # -- what pages are sent ---------------------------------------------------

    def header(self) -> dict[str, Any]:
        by_status: dict[str, int] = {}
        for row in self.workers.values():
            by_status[row["status"]] = by_status.get(row["status"], 0) + 1
        rate = self.series[-1][1] if self.series else 0.0
        return {
            "namespace": self.namespace,
            "state": self.state,
            "workers": by_status,
            "rate": rate,
            "queued": self.queued,
            "queued_by_priority": self.queued_by_priority,
            "running": self.running,
            "outcomes": self.outcomes,
            "restarts": self.restarts,
        }

    def snapshot(self) -> dict[str, Any]:
        """Everything a page shows, for one that has just connected."""
        return {
            "header": self.header(),
            "workers": {uid: self._shown(row) for uid, row in self.workers.items()},
            "lanes": self.lanes,
            "bars": list(self.stream),
            "series": list(self.series),
            "events": list(self.events),
            "output": list(self.lines),
            "failures": list(self.failures),
            "maps": self.maps,
            "dispatchers": self.dispatcher_rows,
        }

    def take_changes(self) -> dict[str, Any] | None:
        """What changed since the last call (None: nothing)."""
        changes, self._changes = self._changes, _empty()
        if not any(changes.values()):
            return None
        for key in ("bars", "events", "output", "failures"):
            changes[key] = list(changes[key])
        changes["workers"] = {
            uid: self._shown(row) for uid, row in changes["workers"].items()
        }
        changes["header"] = self.header()
        return changes

    # -- inside ----------------------------------------------------------------

    def _row(self, info: WorkerInfo, now: float) -> dict[str, Any]:
        extra, uid = info.extra, str(info.uid)
        # CPU % between readings at least CPU_SPAN_S apart (closer ones keep
        # the last figure: a short span would say 0 or 100).
        before = self.workers.get(uid)
        cpu = before["cpu"] if before is not None else None
        cpu_s, then = _number(extra.get("cpu_s")), self._cpu.get(uid)
        if cpu_s is not None and (then is None or now - then[0] > CPU_SPAN_S):
            if then is not None:
                cpu = max(0.0, 100 * (cpu_s - then[1]) / (now - then[0]))
            self._cpu[uid] = (now, cpu_s)
        return {
            "pid": info.pid,
            "uid": uid[:8],
            "address": info.address,
            "status": info.status,
            "running": _number(extra.get("running")) or 0,
            "done": _number(extra.get("done")) or 0,
            "rss_mb": _number(extra.get("rss_mb")),
            "cpu": cpu,
            "cpu_at": now,
            "last_ms": _number(extra.get("last_ms")),
            "gone_at": None,
            "ended": None,  # how its process ended, once the supervisor saw it
        }

    def _shown(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row as sent: a CPU % only while the worker says how it goes."""
        shown = dict(row)
        if shown["gone_at"] or time.time() - shown["cpu_at"] > CPU_STALE_S:
            shown["cpu"] = None
        return shown

    def _event(self, kind: str, text: str) -> None:
        event = {"t": round(time.time() * 1e3), "kind": kind, "text": text}
        self.events.append(event)
        self._changes["events"].append(event)

    def _exited(self, pid: int, fields: dict[str, Any]) -> None:
        """One of the supervisor's workers ended: mark its row, and time how
        long discovery takes to drop it (no time at all if it did first)."""
        uid = self._uid_of_pid.get(pid)
        row = self.workers.get(uid) if uid is not None else None
        if row is not None and row["status"] == "dropped":
            if self.on_drop_seen is not None:
                self.on_drop_seen(0.0)
        else:
            self._exited_at[pid] = time.time()
        if row is None or uid is None:
            return
        how = f"signal {fields['signal']}" if "signal" in fields else None
        row["ended"] = how or f"exit code {fields.get('code')}"
        if row["gone_at"] is None:
            row.update(status="exited", gone_at=time.time())
        self._changes["workers"][uid] = row

    def _drop_seen(self, pid: int, now: float) -> None:
        exited_at = self._exited_at.pop(pid, None)
        if exited_at is not None and self.on_drop_seen is not None:
            self.on_drop_seen(max(0.0, now - exited_at))

    def _forget_gone(self, now: float) -> None:
        gone = sorted(
            (row["gone_at"], uid) for uid, row in self.workers.items() if row["gone_at"]
        )
        for index, (gone_at, uid) in enumerate(gone):
            if now - gone_at > GONE_KEEP_S or index < len(gone) - MAX_GONE:
                pid = self.workers.pop(uid)["pid"]
                self._cpu.pop(uid, None)
                if self._uid_of_pid.get(pid) == uid:
                    del self._uid_of_pid[pid]
                self._changes["removed"].append(uid)
        if len(self._exited_at) > MAX_GONE:  # (exits discovery never dropped)
            for pid in sorted(self._exited_at)[: -MAX_GONE or None]:
                del self._exited_at[pid]

    def _label(self, name: str) -> str:
        if name in self.labels:
            return name
        if len(self.labels) < MAX_LABELS:
            self.labels.append(name)
            return name
        return "other"


def _empty() -> dict[str, Any]:
    """No changes: the lists that can grow fast keep only their newest."""
    return {
        "header": False,
        "workers": {},
        "removed": [],
        "lanes": {},
        "bars": deque(maxlen=MAX_STREAM_BARS),
        "series": [],
        "events": deque(maxlen=MAX_EVENTS),
        "output": deque(maxlen=MAX_OUTPUT),
        "failures": deque(maxlen=MAX_FAILURES),
        "maps": {},
        "maps_removed": [],
        "dispatchers": None,  # (unchanged)
    }


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
