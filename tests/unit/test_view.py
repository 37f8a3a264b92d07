"""`pool up`'s live view, rendered at 80 columns (pool.supervisor.view)."""

from __future__ import annotations

import io
import uuid

import pytest
from rich.console import Console

from discovery import DiscoveryEvent, WorkerInfo
from pool.client.embedded import LOG_LINES, Pool
from pool.supervisor.view import LiveView, PlainView, Rate, shorten_left

pytestmark = pytest.mark.timeout(10)

RUNTIME = "unix:/run/user/1000/shm-pool/shmp-0123456789abcdef01234567"


def _worker(pid: int, done: int = 0, status: str = "ready") -> WorkerInfo:
    uid = uuid.UUID(int=pid)
    return WorkerInfo(
        uid,
        f"{RUNTIME}/w-{uid.hex[-12:]}.sock",
        pid,
        "0.1.0",
        status=status,  # type: ignore[arg-type]
        extra={"running": "1", "done": str(done), "last_ms": "0.4"},
        capacity=4,
    )


def _screen(view: LiveView) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(view.render())
    return out.getvalue().splitlines()


def test_at_80_columns_every_line_fits_and_workers_stay_apart() -> None:
    quiet = Console(file=io.StringIO(), width=80, color_system=None)
    view = LiveView(
        "a-rather-long-namespace-name-for-a-pool", quiet, paths=("/srv/app",)
    )
    try:
        for pid in range(1000, 1008):
            view.event(DiscoveryEvent("worker-added", _worker(pid)))
        view.note("ready", namespace="n", workers=8, address=RUNTIME + "/d.sock")
        view.output("w3", 1003, "x" * 200)
        view.tick(5)
        screen = _screen(view)
        assert all(len(line) <= 80 for line in screen), screen
        title = screen[0]
        assert "8 workers" in title and "queue 5" in title and "tasks/s" in title
        assert "ready" in title and "imports from /srv/app" in screen[1]
        rows = [line for line in screen if line.lstrip().startswith("100")]
        tails = {uuid.UUID(int=pid).hex[-12:] for pid in range(1000, 1008)}
        assert len(rows) == 8
        assert all(any(tail in row for tail in tails) for row in rows)
        assert "0.4" in rows[0]  # the last task's duration, in ms
        assert any(line.startswith("[w3 pid=1003] xxx") for line in screen)
        assert "Ctrl-C drains" in screen[-1]
        view.note("stopping")
        assert "Ctrl-C again stops at once" in _screen(view)[-1]
        view.note("stopped")
        assert not any("Ctrl-C" in line for line in _screen(view))
    finally:
        view.close()


def test_tasks_per_second_follow_the_workers_counters() -> None:
    rate = Rate()
    assert rate.per_second(0, now=100.0) == 0.0
    assert rate.per_second(500, now=101.0) == 500.0
    assert rate.per_second(1500, now=102.0) == 750.0
    assert rate.per_second(1500, now=110.0) == 0.0  # none in the last window


def test_addresses_are_shortened_from_the_left() -> None:
    assert shorten_left("127.0.0.1:5000", 22) == "127.0.0.1:5000"
    assert shorten_left("unix:/a/long/path/w-0123.sock", 12) == "…w-0123.sock"


def test_pool_workers_at_80_columns_keeps_the_end_of_each_address(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every row fits 80 columns, and each keeps the end of its address
    (the socket's name, which tells workers apart), and the RSS."""
    from pool.cli.inspect import _print_workers

    monkeypatch.setenv("COLUMNS", "80")
    columns = ["pid", "uid", "address", "status", "running", "done", "rss", "in_flight"]
    rows = [
        {
            "pid": 1000 + i,
            "uid": f"{i}abcdef0",
            "address": f"unix:/tmp/shm-pool-0/shmp-5fb97d8ff42f/w-{i}bc53e076b3.sock",
            "status": "ready",
            "running": "0",
            "done": "12",
            "rss": "38 MB",
            "in_flight": 0,
        }
        for i in range(3)
    ]
    _print_workers("3 workers in 'ns'", columns, rows)
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    for i in range(3):
        assert any(
            f"w-{i}bc53e076b3.sock" in line and "38 MB" in line for line in lines
        )


def test_a_tasks_escapes_do_not_reach_the_terminal_raw() -> None:
    """Colours are kept as styles; a screen clear, a cursor move, a title
    change and a bell are dropped."""
    from pool.supervisor.view import output_text

    line = output_text("w1", 42, "ok \x1b[31mred\x1b[0m \x1b[2J\x1b[H\x1b]0;t\x07\x07!")
    assert "\x1b" not in line.plain and "\x07" not in line.plain
    assert line.plain.startswith("[w1 pid=42] ok red") and line.plain.endswith("!")
    assert [line.plain[span.start : span.end] for span in line.spans] == ["red"]


def test_the_live_view_starts_clean_when_the_terminal_is_resized() -> None:
    """From 100 columns to 80, the screen is cleared before the redraw
    (the terminal reflowed the old one: else its title stays twice); no
    clear while the width holds."""
    import io

    from rich.console import Console

    from pool.supervisor.view import LiveView

    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True)
    view = LiveView("resized", console)
    try:
        view.tick(0)
        assert "\x1b[2J" not in out.getvalue()
        console.width = 80
        view.tick(0)
        assert out.getvalue().count("\x1b[2J") == 1
        view.tick(0)
        assert out.getvalue().count("\x1b[2J") == 1
    finally:
        view.close()


def test_the_live_view_names_the_dashboard_once_ready() -> None:
    """The dashboard's URL, from the ready note, stays on screen below the
    title, however many events scroll by."""
    view = LiveView("dash", Console(file=io.StringIO(), width=80, color_system=None))
    try:
        assert not any("dashboard" in line for line in _screen(view))
        view.note("ready", namespace="dash", dashboard="http://127.0.0.1:8787/")
        for pid in range(2000, 2040):
            view.event(DiscoveryEvent("worker-added", _worker(pid)))
        assert _screen(view)[1] == "dashboard http://127.0.0.1:8787/"
    finally:
        view.close()


def test_an_embedded_pools_log_keeps_only_its_last_lines() -> None:
    """``Pool.log`` holds what ``pool up`` would have printed, but only its
    last ``LOG_LINES`` lines: a pool that runs for days (a worker-updated
    line a second per busy worker) does not grow it for ever. Regression:
    an ``io.StringIO`` kept every line."""
    embedded = Pool(workers=1)  # (never started: its log is made with it)
    view = PlainView(embedded.log)
    for second in range(3 * LOG_LINES):
        view.note("worker-updated", pid=7, second=second)
    view.output("worker-0", 7, "a task's print")
    lines = embedded.log.getvalue().splitlines()
    assert len(lines) == LOG_LINES
    assert lines[-2] == f"worker-updated pid=7 second={3 * LOG_LINES - 1}"
    assert lines[-1].endswith("a task's print")
