"""What ``--dashboard`` costs ``submit``: the same pool with and without it.

    python -m benchmarks.dashboard [--workers 2] [--rounds 6] [--tasks 20000]
        [--browser throughout|with-dashboard|none]

Two ``pool up`` processes of ``--workers`` workers each, one with
``--dashboard 127.0.0.1:0``. Headless Chromium (Debian's, driven by
Playwright) keeps the dashboard's page open, and ``/metrics`` is scraped
every 5 s, as Prometheus would. Each round submits ``--tasks`` tasks of
``pow`` (256 in flight) to one pool, then the other, in alternating order;
the pool not measured is idle. Prints the median submit rate of each and
their ratio, with the rounds' spread.

``--browser throughout`` (the default) keeps the page open for every
round, so that both pools share the machine with the same browser and
the ratio is what the pool itself pays: the dispatcher's telemetry, the
supervisor's board and the page's stream. ``with-dashboard`` opens it only
for the dashboard pool's rounds (a browser on the pool's own 2 cores, the
worst case); ``none`` leaves it closed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import timeit
import urllib.request
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

if not __package__:  # run as a file: this file must not shadow the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from pool import Client
from tests.support.browser import launch

IN_FLIGHT = 256
ROLES = ("supervisor", "dispatcher")


@contextlib.contextmanager
def pool_up(workers: int, *args: str) -> Iterator[tuple[str, str, list[int]]]:
    """A running ``pool up``: its namespace, its ready line, and the pids of
    its supervisor and dispatcher."""
    namespace = f"bench-dash-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "pool", "up", "-n", namespace]
    proc = subprocess.Popen(
        [*argv, "--workers", str(workers), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    try:
        pids = [proc.pid]
        for line in proc.stdout:
            if line.startswith("dispatcher-started "):
                pids.append(int(line.split("pid=")[1]))
            if line.startswith("ready "):
                break
        else:
            raise RuntimeError("the pool did not start")
        drain = threading.Thread(target=proc.stdout.read, daemon=True)
        drain.start()
        yield namespace, line, pids
    finally:
        proc.send_signal(2)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_s(pids: list[int]) -> float:
    """CPU seconds (user and system) the processes have used so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def submit_rate(client: Client, tasks: int) -> float:
    started = time.perf_counter()
    window: deque[Future[Any]] = deque()
    for i in range(tasks):
        window.append(client.submit(pow, i, 2))
        if len(window) >= IN_FLIGHT:
            window.popleft().result()
    for future in window:
        future.result()
    return tasks / (time.perf_counter() - started)


class Scraper(threading.Thread):
    """``/metrics`` every 5 s, as a Prometheus would."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.scrapes = url, threading.Event(), 0

    def run(self) -> None:
        while not self.stop.wait(5.0):
            with urllib.request.urlopen(self.url + "metrics", timeout=5) as reply:
                reply.read()
            self.scrapes += 1


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument(
        "--browser",
        choices=("throughout", "with-dashboard", "none"),
        default="throughout",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="start the second pool without --dashboard too (and open no page): "
        "the ratio then says how far apart two like pools measure here",
    )
    args = parser.parse_args()
    if args.control:
        args.browser = "none"
    return args


class Page:
    """The dashboard's page in the browser, opened and closed as
    ``--browser`` says."""

    def __init__(self, browser: Any, url: str, mode: str) -> None:
        self._browser, self._url, self._mode = browser, url, mode
        self.page: Any = None

    def open(self) -> None:
        if self.page is None and self._mode != "none":
            self.page = self._browser.new_page(viewport={"width": 1366, "height": 900})
            self.page.goto(self._url)
            self.page.wait_for_selector("#workers tbody tr")

    def close(self) -> None:
        if self.page is not None and self._mode == "with-dashboard":
            self.page.close()
            self.page = None

    def seen(self) -> tuple[str, Any]:
        """The bars the page shows, and how long it took to draw them."""
        if self.page is None:
            return "-", None
        bars = self.page.evaluate("document.getElementById('stream').dataset.bars")
        return bars, self.page.evaluate("window.dashboardPerf")


Rates = dict[str, list[float]]
Cpu = dict[tuple[str, str], float]


def _rounds(
    args: argparse.Namespace,
    clients: dict[str, Client],
    pids: dict[str, list[int]],
    page: Page,
) -> tuple[Rates, Cpu]:
    """Each round, one pool then the other (alternating which first): their
    submit rates, and the CPU their supervisor and dispatcher spent."""
    rates: Rates = {name: [] for name in clients}
    cpu: Cpu = {(name, role): 0.0 for name in clients for role in ROLES}
    for client in clients.values():
        submit_rate(client, 2000)  # warm every worker
    page.open()
    order = list(clients.items())
    for round_ in range(args.rounds):
        for name, client in order if round_ % 2 == 0 else order[::-1]:
            if name == "dashboard":
                page.open()
            else:
                page.close()
            before = [cpu_s([pid]) for pid in pids[name]]
            rates[name].append(submit_rate(client, args.tasks))
            for role, pid, then in zip(ROLES, pids[name], before, strict=True):
                cpu[name, role] += cpu_s([pid]) - then
    return rates, cpu


def main() -> None:
    args = _arguments()
    from playwright.sync_api import sync_playwright

    dashboard = () if args.control else ("--dashboard", "127.0.0.1:0")
    with (
        pool_up(args.workers) as (plain_ns, _, plain_pids),
        pool_up(args.workers, *dashboard) as (dash_ns, ready, dash_pids),
        sync_playwright() as playwright,
        Client(plain_ns) as plain,
        Client(dash_ns) as dash,
    ):
        found = re.search(r"dashboard=(\S+)", ready)
        url = found.group(1) if found else ""
        browser = launch(playwright)
        scraper = Scraper(url)
        if url:
            scraper.start()
        page = Page(browser, url, args.browser)
        clients = {"plain": plain, "dashboard": dash}
        pids = {"plain": plain_pids, "dashboard": dash_pids}
        rates, cpu = _rounds(args, clients, pids, page)
        bars, drawn = page.seen()
        scraper.stop.set()
        browser.close()
    _report(args, rates, cpu, f"{bars}), /metrics scraped {scraper.scrapes} times")
    if drawn and drawn["renders"]:
        mean = drawn["totalMs"] / drawn["renders"]
        print(
            f"  the page drew {drawn['renders']} times: {mean:.1f} ms on average, "
            f"{drawn['maxMs']:.1f} ms at most"
        )


def _report(args: argparse.Namespace, rates: Rates, cpu: Cpu, seen: str) -> None:
    plain_rate = statistics.median(rates["plain"])
    dash_rate = statistics.median(rates["dashboard"])
    ratios = [d / p for d, p in zip(rates["dashboard"], rates["plain"], strict=True)]
    print(
        f"pow submits, {args.workers} workers per pool, {args.tasks} tasks a round, "
        f"{IN_FLIGHT} in flight, median of {args.rounds} rounds; browser "
        f"{args.browser} (bars on the page at the end: {seen}"
        + ("; CONTROL: both pools plain" if args.control else "")
    )
    print(f"  without --dashboard {plain_rate:>10,.0f} tasks/s")
    second = "plain again" if args.control else "with    --dashboard"
    print(f"  {second:<19} {dash_rate:>10,.0f} tasks/s")
    print(
        f"  with/without {dash_rate / plain_rate:.3f}x (round by round: "
        f"{', '.join(f'{r:.3f}' for r in ratios)}; "
        f"median {statistics.median(ratios):.3f})"
    )
    tasks = args.rounds * args.tasks
    for role in ROLES:
        plain_us, dash_us = (cpu[k, role] / tasks * 1e6 for k in ("plain", "dashboard"))
        print(
            f"  {role} CPU a task: {plain_us:.1f} us without, {dash_us:.1f} us with "
            f"(+{dash_us - plain_us:.1f} us)"
        )
    print(f"  Telemetry.finished: {finished_ns():.0f} ns a task (median of 5)")


def finished_ns() -> float:
    """Median ns of one ``Telemetry.finished`` (the dispatcher's cost per
    task with a dashboard), in this process: a figure the noise of a shared
    machine moves less than a rate."""
    from pool.dispatcher.telemetry import Telemetry
    from pool.routing.jobs import Job
    from tests.support.streams import make_info
    from workers.protocol.worker_pb2 import Result, Task

    telemetry, worker = Telemetry(), make_info()
    job = Job(Task(id=1, function="builtins:pow"), frozenset(), None, 1)  # type: ignore[arg-type]
    result = Result(id=1, value=b"\x80\x05K\x04.", run_us=5)
    each = [
        timeit.timeit(lambda: telemetry.finished(job, result, worker), number=100_000)
        * 1e4
        for _ in range(5)
    ]
    return statistics.median(each)


if __name__ == "__main__":
    main()
