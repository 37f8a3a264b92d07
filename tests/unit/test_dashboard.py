"""The dashboard's state, in-process: the dispatcher's telemetry and the
supervisor's board stay bounded, merge fast streams of tasks, and keep
their totals monotonic across a restarted dispatcher."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from discovery import DiscoveryEvent
from pool.dispatcher import telemetry
from pool.dispatcher.telemetry import Telemetry, outcome_of
from pool.errors import WorkerLost
from pool.routing.jobs import Job
from pool.supervisor.dashboard import is_loopback, listen_address
from pool.supervisor.dashboard.board import GONE_KEEP_S, MAP_KEEP_S, MAX_EVENTS, Board
from pool.supervisor.dashboard.metrics import Metrics
from tests.support.streams import make_info
from workers.protocol import codec
from workers.protocol.worker_pb2 import MapPart, Result, Task


class _Owner:
    def on_started(self, job: Job) -> None: ...
    def on_result(self, job: Job, result: Result) -> None: ...
    def on_wanted(self, job: Job, source: str) -> None: ...


def _job(function: str = "m:f") -> Job:
    return Job(Task(id=1, function=function), frozenset(), _Owner(), 1)


def _ok(run_us: int, slot: int = 0) -> Result:
    return Result(id=1, value=b"", run_us=run_us, slot=slot)


def test_outcomes_are_named_by_their_failure() -> None:
    """ok, error, cancelled (CANCELLED) and lost (WorkerLost)."""
    lost = codec.failure_of(WorkerLost(3, ()), remote=False)
    assert [
        outcome_of(r)
        for r in (
            _ok(1),
            Result(id=1, failure=codec.failure_of(ValueError("x"))),
            Result(id=1, failure=codec.cancelled()),
            Result(id=1, failure=lost),
        )
    ] == ["ok", "error", "cancelled", "lost"]


def test_a_fast_stream_of_tasks_is_few_bars() -> None:
    """Tasks back to back on one slot, of one function, are one bar that
    counts them; past MAX_BARS every task joins its lane's last bar."""
    t = Telemetry()
    worker = make_info()
    for _ in range(10_000):
        t.finished(_job(), _ok(5), worker)
    report = t.report({}, {})
    bars = [bar for lane in report["lanes"] for bar in lane["bars"]]
    assert sum(bar[3] for bar in bars) == 10_000
    assert len(bars) < 100
    assert report["outcomes"]["ok"] == 10_000
    assert sum(report["buckets"]) == 10_000
    assert t.report({}, {})["lanes"] == []  # (each report starts afresh)


def test_a_report_holds_at_most_max_bars(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spread-out tasks (no merging by time) still make no more than MAX_BARS
    bars a report, nor more than MAX_FAILURES failures."""
    monkeypatch.setattr(telemetry, "MERGE_GAP_MS", -1.0)  # never merge by time
    t = Telemetry()
    workers = [make_info() for _ in range(4)]
    for i in range(20_000):
        failed = Result(id=1, failure=codec.failure_of(ValueError(i)), run_us=3)
        t.finished(
            _job(f"m:f{i % 3}"), failed if i % 2 else _ok(3, i % 2), workers[i % 4]
        )
    report = t.report({}, {})
    bars = [bar for lane in report["lanes"] for bar in lane["bars"]]
    assert len(bars) <= telemetry.MAX_BARS
    assert sum(bar[3] for bar in bars) == 20_000
    assert len(report["failures"]) == telemetry.MAX_FAILURES
    assert report["failures_left_out"] == 10_000 - telemetry.MAX_FAILURES


def _report(ok: int, since: float = 1.0, **changes: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "t": 0,
        "since": since,
        "queued": 0,
        "running": 0,
        "outcomes": {"ok": ok, "error": 0, "cancelled": 0, "lost": 0},
        "buckets": [ok] + [0] * len(telemetry.DURATION_BUCKETS_S),
        "duration_sum_s": ok * 0.001,
        "labels": [],
        "lanes": [],
        "failures": [],
        "failures_left_out": 0,
    }
    return {**report, **changes}


def test_totals_stay_monotonic_across_a_restarted_dispatcher() -> None:
    """A new dispatcher counts from 0 again: what the old one counted is
    kept, so that Prometheus sees a counter that only grows."""
    board = Board("ns")
    board.stats(_report(5))
    board.stats(_report(8))
    board.stats(_report(9, since=2.0))  # a new dispatcher, already busy
    board.stats(_report(10, since=2.0))
    assert board.outcomes["ok"] == 18
    assert board.buckets[0] == 18
    text = Metrics(board).text().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples["shmpool_tasks_total", (("outcome", "ok"),)] == 18
    assert samples["shmpool_task_duration_seconds_count", ()] == 18


def test_a_dropped_worker_stays_marked_for_a_while_then_goes() -> None:
    """A SIGKILLed worker's row says dropped and how it ended; the time from
    its exit to its drop is observed; after GONE_KEEP_S it leaves."""
    drops: list[float] = []
    board = Board("ns")
    board.on_drop_seen = drops.append
    info = make_info(pid=4242)
    board.event(DiscoveryEvent("worker-added", info))
    board.note("worker-exited", pid=4242, signal="SIGKILL")
    board.event(DiscoveryEvent("worker-dropped", info))
    row = board.workers[str(info.uid)]
    assert (row["status"], row["ended"]) == ("dropped", "signal SIGKILL")
    assert len(drops) == 1 and drops[0] >= 0
    board.sample(now=row["gone_at"] + 1)
    assert str(info.uid) in board.workers
    board.sample(now=row["gone_at"] + GONE_KEEP_S + 1)
    assert str(info.uid) not in board.workers
    assert str(info.uid) in board.take_changes()["removed"]  # type: ignore[index]


def test_restarts_are_counted_by_name() -> None:
    """A worker started again under a name seen before is a restart."""
    board = Board("ns")
    for name in ("worker-0", "worker-1", "worker-0", "worker-0"):
        board.note("worker-started", pid=1, name=name)
    assert board.restarts == 2
    assert [e["kind"] for e in board.events].count("worker-restarted") == 2


def test_what_a_page_is_sent_is_bounded() -> None:
    """However much happens between two pushes, the changes hold only the
    newest events and output lines."""
    board = Board("ns")
    for i in range(10 * MAX_EVENTS):
        board.note("worker-stuck", pid=i)
        board.output("w0", 1, f"line {i}")
    changes = board.take_changes()
    assert changes is not None
    assert len(changes["events"]) == MAX_EVENTS
    assert changes["output"][-1] == f"[w0 pid=1] line {10 * MAX_EVENTS - 1}"
    assert len(board.events) == MAX_EVENTS
    assert board.take_changes() is None


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("8787", ("127.0.0.1", 8787)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9000", ("::1", 9000)),
        ("localhost:80", ("localhost", 80)),
    ],
)
def test_dashboard_addresses(given: str, address: tuple[str, int]) -> None:
    assert listen_address(given) == address


@pytest.mark.parametrize("bad", ["", "host:", "99999", "a:b"])
def test_a_bad_dashboard_address_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match=r"give \[HOST:\]PORT"):
        listen_address(bad)


def test_only_loopback_is_trusted() -> None:
    assert [is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "0.0.0.0")] == [
        True,
        True,
        True,
        False,
    ]
    assert not is_loopback("my-host.example")


def test_a_dashboard_without_its_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without aiohttp installed, asking for a dashboard is a setting error
    that gives the install line (checked before anything starts)."""
    import importlib.util

    from pool.supervisor.settings import PoolSettings
    from workers.common.spec import SettingError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "aiohttp" else real(name, *a),
    )
    with pytest.raises(
        SettingError, match=r"needs the dashboard extra: .*\[dashboard\]"
    ):
        PoolSettings(namespace="n", dashboard="127.0.0.1:0")
    assert PoolSettings(namespace="n").dashboard is None


def test_a_drop_seen_before_the_exit_counts_as_seen_at_once() -> None:
    """Discovery may drop a killed worker before the supervisor's pidfd says
    it exited: its drop time is then 0, and it is still observed once."""
    drops: list[float] = []
    board = Board("ns")
    board.on_drop_seen = drops.append
    info = make_info(pid=4343)
    board.event(DiscoveryEvent("worker-added", info))
    board.event(DiscoveryEvent("worker-dropped", info))
    board.note("worker-exited", pid=4343, signal="SIGKILL")
    assert drops == [0.0]
    row = board.workers[str(info.uid)]
    assert (row["status"], row["ended"]) == ("dropped", "signal SIGKILL")


def test_output_reaches_the_page_as_plain_text() -> None:
    """Colours, cursor moves, a title escape and control characters a task
    writes are dropped; its text stays."""
    board = Board("ns")
    board.output("w1", 7, "\x1b[31mred\x1b[0m \x1b[2J\x1b]0;title\x07done\x08!")
    assert list(board.lines) == ["[w1 pid=7] red done!"]


def test_a_map_is_a_row_of_its_calls_done_until_a_while_after_its_end() -> None:
    """The telemetry counts a map's calls from its tasks' parts (a failed
    task's calls failed; a cancelled one's not done), reports the maps
    that moved, and forgets one that ended; the board keeps its row, then
    drops it MAP_KEEP_S after its end."""
    meter = Telemetry()
    worker = make_info()
    for n, (calls, result) in enumerate([(10, _ok(5)), (10, _ok(5)), (5, None)]):
        task = Task(id=n, function="m:f", map=MapPart(id="c/1", calls=calls, total=30))
        job = Job(task, frozenset(), _Owner(), n)
        if result is None:  # (the last fails as a whole)
            result = Result(id=n, failure=codec.failure_of(ValueError("x")))
        meter.finished(job, result, worker)
    cancelled = Task(id=9, function="m:f", map=MapPart(id="c/1", calls=5, total=30))
    meter.finished(
        Job(cancelled, frozenset(), _Owner(), 9),
        Result(id=9, failure=codec.cancelled()),
        worker,
    )
    report = meter.report({}, {})
    assert report["maps"] == [
        {"id": "c/1", "label": "m:f", "done": 25, "failed": 5, "total": 30}
    ]
    assert meter.report({}, {})["maps"] == []
    board = Board("ns")
    board.stats(_report(0, t=1000.0, maps=report["maps"]))
    assert board.take_changes()["maps"]["c/1"]["done"] == 25  # type: ignore[index]
    done = {**report["maps"][0], "done": 30}
    board.stats(_report(0, t=2000.0, maps=[done]))
    board.sample(now=2.0 + MAP_KEEP_S - 1)
    assert list(board.maps) == ["c/1"]
    board.sample(now=2.0 + MAP_KEEP_S + 1)
    assert board.maps == {}
    assert "c/1" in board.take_changes()["maps_removed"]  # type: ignore[index]


def test_the_dispatchers_are_sent_when_they_change() -> None:
    """A pool on Redis shows each of its dispatchers: a page that connects
    gets them; the others get them once when they change, not each poll."""
    board = Board("ns")
    assert board.snapshot()["dispatchers"] is None  # (one's own only: hidden)
    rows = [
        {
            "address": "10.0.0.5:7070",
            "here": True,
            "clients": 2,
            "queued": 0,
            "sent": 3,
        },
        {"address": "10.0.0.6:7070", "here": False, "clients": None},
    ]
    board.dispatchers(rows)
    changes = board.take_changes()
    assert changes is not None and changes["dispatchers"] == rows
    board.dispatchers([dict(row) for row in rows])  # (the next poll: the same)
    assert board.take_changes() is None
    assert board.snapshot()["dispatchers"] == rows
