"""``pool up --dashboard``: the page in a real browser, ``/metrics`` parsed
by Prometheus' own parser, and the access rule off loopback.

The page test drives Debian's Chromium (``/usr/bin/chromium``, which
``.ci/run`` installs) with Playwright, and saves a screenshot of the page
to ``test-artifacts/`` (or ``$SHMPOOL_ARTIFACTS``).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pool import Client, Pool
from tests.support import sample_tasks
from tests.support.helpers import ROOT, wait_until
from tests.support.pools import (
    dashboard_url,
    http_get,
    metrics_of,
    pool_command,
    running_pool,
    self_signed,
)
from workers.protocol.auth import read_token

pytestmark = pytest.mark.integration

ARTIFACTS = Path(os.environ.get("SHMPOOL_ARTIFACTS", ROOT / "test-artifacts"))


@pytest.mark.timeout(180)
def test_the_page_follows_the_pool_live(namespace: str, browser: Any) -> None:
    """The page names the namespace and both workers' pids; a SIGKILLed
    worker shows as dropped beside its replacement; tasks draw bars in the
    task stream, a failure among them; a map is a bar of its calls done, to
    the end; a screenshot is kept."""
    with running_pool(
        namespace, "--workers", "2", "--dashboard", "127.0.0.1:0"
    ) as pool:
        pids = [
            int(line.split("pid=")[1].split()[0])
            for line in pool.lines.seen
            if line.startswith("worker-started ")
        ]
        assert len(pids) == 2
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(dashboard_url(pool))
        page.wait_for_function(
            "ns => document.getElementById('namespace').textContent === ns",
            arg=namespace,
        )
        for pid in pids:
            page.wait_for_selector(
                f'#workers tr[data-pid="{pid}"][data-status="ready"]'
            )
        os.kill(pids[0], signal.SIGKILL)
        replacement = pool.wait_for("worker-started ")
        new_pid = int(replacement.split("pid=")[1].split()[0])
        page.wait_for_selector(
            f'#workers tr.gone[data-pid="{pids[0]}"][data-status="dropped"]'
        )
        page.wait_for_selector(
            f'#workers tr[data-pid="{new_pid}"][data-status="ready"]'
        )
        drops = "shmpool_worker_drop_seconds_count{}"
        wait_until(lambda: metrics_of(dashboard_url(pool))[drops] == 1)
        after_kill = metrics_of(dashboard_url(pool))
        assert after_kill["shmpool_worker_restarts_total{}"] == 1
        assert after_kill["shmpool_worker_drop_seconds_bucket{le=1.0}"] == 1
        with Client(namespace) as client:
            assert list(client.map(pow, range(40), [2] * 40)) == [
                i * i for i in range(40)
            ]
            with pytest.raises(ZeroDivisionError):
                client.submit(divmod, 1, 0).result(timeout=30)
        page.wait_for_function(
            "document.getElementById('stream').dataset.bars > 0"
            " && document.getElementById('stream').dataset.failed > 0"
        )
        page.wait_for_selector("#failures details summary >> text=ZeroDivisionError")
        page.wait_for_selector("#maps .map.ended .count >> text=40/40 (100%)")
        assert page.locator("#events li.k-ready").count() == 1  # (none twice)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        phone = browser.new_page(viewport={"width": 390, "height": 844})
        phone.goto(dashboard_url(pool))
        phone.wait_for_selector(f'#workers tr[data-pid="{new_pid}"]')
        phone.screenshot(path=str(ARTIFACTS / "dashboard-phone.png"), full_page=True)
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the page is {width} px wide on a 390 px phone"


def test_metrics_count_every_task(namespace: str) -> None:
    """``/metrics`` parses with prometheus_client's own parser, says 2 ready
    workers, and its task counters grow by exactly the tasks that ran."""
    with running_pool(
        namespace, "--workers", "2", "--dashboard", "127.0.0.1:0"
    ) as pool:
        url = dashboard_url(pool)
        wait_until(lambda: metrics_of(url)["shmpool_workers{status=ready}"] == 2)
        before = metrics_of(url)
        ok, error = (
            "shmpool_tasks_total{outcome=ok}",
            "shmpool_tasks_total{outcome=error}",
        )
        with Client(namespace) as client:
            futures = [client.submit(pow, i, 2) for i in range(25)]
            assert [f.result(timeout=30) for f in futures] == [i * i for i in range(25)]
            with pytest.raises(ZeroDivisionError):
                client.submit(divmod, 1, 0).result(timeout=30)
        wait_until(lambda: metrics_of(url)[ok] >= before[ok] + 25)
        wait_until(lambda: metrics_of(url)[error] >= before[error] + 1)
        after = metrics_of(url)
        assert after[ok] - before[ok] == 25
        assert after[error] - before[error] == 1
        count = "shmpool_task_duration_seconds_count{}"
        assert after[count] - before[count] == 26
        assert after["shmpool_queued_tasks{}"] == 0
        for name in (
            "shmpool_running_tasks{}",
            "shmpool_worker_restarts_total{}",
            "shmpool_worker_drop_seconds_count{}",
        ):
            assert name in after


def _key_file(tmp_path: Path) -> tuple[str, Path]:
    key = secrets.token_hex(32)
    key_file = tmp_path / "dashboard-key"
    key_file.write_text(key)
    key_file.chmod(0o600)
    return key, key_file


def test_a_dashboard_off_loopback_asks_for_its_own_key(
    namespace: str, tmp_path: Path
) -> None:
    """On 0.0.0.0 every request needs the dashboard's key, not the pool's
    token (which is refused there, as any other wrong key): taken as a
    header, or once as ?key=, which redirects to the page without it and
    sets a session cookie that is not the key (HttpOnly, SameSite=Strict,
    named for the port, and not Secure on plain HTTP)."""
    key, key_file = _key_file(tmp_path)
    args = ("--workers", "1", "--dashboard", "0.0.0.0:0")
    with running_pool(namespace, *args, "--dashboard-key-file", str(key_file)) as pool:
        url = dashboard_url(pool).replace("0.0.0.0", "127.0.0.1")
        port = url.rsplit(":", 1)[1].strip("/")
        token = read_token(namespace)
        for path in ("", "metrics", "events", "api/state", "static/dashboard.js"):
            status, _, body = http_get(url + path)
            assert status == 401, (path, status)
            assert "needs its key" in body and token not in body
        for wrong in ("0" * 64, token):
            bearer = {"Authorization": f"Bearer {wrong}"}
            assert http_get(url + "metrics", bearer)[0] == 401
        assert http_get(url + f"?key={token}")[0] == 401
        status, _, body = http_get(url + "metrics", {"Authorization": f"Bearer {key}"})
        assert status == 200 and "shmpool_workers" in body
        status, headers, _ = http_get(url + f"?key={key}")
        assert status == 303 and headers["Location"] == "/"
        cookie = headers["Set-Cookie"]
        assert cookie.startswith(f"shmpool_view_{port}=")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert "Secure" not in cookie and "Path=/" in cookie
        session = cookie.split(";")[0]
        assert key not in session and token not in session
        status, _, body = http_get(url, {"Cookie": session})
        assert status == 200 and "<title>shm-pool</title>" in body
        forged = session.rsplit(".", 1)[0] + "." + "0" * 64
        assert http_get(url, {"Cookie": forged})[0] == 401


def test_a_dashboard_off_loopback_serves_tls_with_the_pools_certificate(
    namespace: str, tmp_path: Path
) -> None:
    """A pool with a certificate serves its dashboard off loopback over TLS,
    with that certificate, and its session cookie is Secure."""
    key, key_file = _key_file(tmp_path)
    cert, cert_key = self_signed(tmp_path, "127.0.0.1")
    tls = ("--tls-cert", str(cert), "--tls-key", str(cert_key), "--tls-ca", str(cert))
    args = ("--workers", "1", "--host", "127.0.0.1", *tls, "--dashboard", "0.0.0.0:0")
    with running_pool(namespace, *args, "--dashboard-key-file", str(key_file)) as pool:
        url = dashboard_url(pool).replace("0.0.0.0", "127.0.0.1")
        assert url.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(cert))
        status, headers, _ = http_get(url + f"?key={key}", context=trusted)
        assert status == 303 and "Secure" in headers["Set-Cookie"]
        with pytest.raises(urllib.error.URLError):  # (a client that checks)
            http_get(url)
        plain = url.replace("https://", "http://")
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            http_get(plain)


def test_a_dashboard_off_loopback_without_a_key_file_is_refused(
    namespace: str,
) -> None:
    """Without a key its viewers know, a dashboard on 0.0.0.0 does not start
    (a token file is not enough: the page never takes the pool's token):
    exit status 2, saying what to give."""
    done = pool_command(
        "up", "-n", namespace, "--workers", "1", "--dashboard", "0.0.0.0:8787"
    )
    assert done.returncode == 2, done.stderr
    assert "--dashboard on 0.0.0.0 is open to other machines" in done.stderr
    assert "give --dashboard-key-file PATH" in done.stderr


def test_a_busy_dashboard_port_is_named(namespace: str) -> None:
    """A port another program holds stops the pool before any worker starts,
    with an error that names the address and what to do."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = pool_command(
            "up", "-n", namespace, "--workers", "1", "--dashboard", f"127.0.0.1:{port}"
        )
    assert done.returncode == 1, done.stderr
    assert f"the dashboard cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "worker-started" not in done.stdout


def _said(url: str, text: str) -> bool:
    """Whether the dashboard's output shows a line ending in ``text``."""
    state = json.loads(http_get(url + "api/state")[2])
    return any(line.endswith(text) for line in state["output"])


def test_an_embedded_pool_serves_a_dashboard() -> None:
    """``Pool(dashboard=...)`` serves the same page and metrics, at the URL
    it gives, with what its tasks print, and stops serving when the pool
    stops."""
    pool = Pool(workers=1, dashboard="127.0.0.1:0")
    with pool as client:
        assert client.submit(pow, 3, 2).result(timeout=30) == 9
        url = pool.dashboard_url
        assert url.startswith("http://127.0.0.1:")
        wait_until(lambda: metrics_of(url)["shmpool_tasks_total{outcome=ok}"] == 1)
        assert "<title>shm-pool</title>" in http_get(url)[2]
        client.submit(print, "said by a task").result(timeout=30)
        wait_until(lambda: _said(url, "] said by a task"))
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "metrics", timeout=5)


def test_a_loopback_dashboard_answers_only_to_loopback_names(namespace: str) -> None:
    """A page of another site that rebinds its name to 127.0.0.1 (its Host
    says that name) is refused; 127.0.0.1 and localhost are served."""
    with running_pool(
        namespace, "--workers", "1", "--dashboard", "127.0.0.1:0"
    ) as pool:
        url = dashboard_url(pool)
        port = url.rsplit(":", 1)[1].strip("/")
        assert http_get(url + "metrics")[0] == 200
        assert http_get(url + "metrics", {"Host": f"localhost:{port}"})[0] == 200
        status, _, body = http_get(url + "api/state", {"Host": f"evil.example:{port}"})
        assert status == 403 and "only to loopback names" in body


def test_task_counters_survive_a_restarted_dispatcher(namespace: str) -> None:
    """A SIGKILLed dispatcher is replaced and counts from 0 again; /metrics
    keeps counting from where the first left off."""
    with running_pool(
        namespace, "--workers", "1", "--dashboard", "127.0.0.1:0"
    ) as pool:
        url, ok = dashboard_url(pool), "shmpool_tasks_total{outcome=ok}"
        with Client(namespace) as client:
            assert [client.submit(pow, i, 2).result(30) for i in range(3)] == [0, 1, 4]
        wait_until(lambda: metrics_of(url)[ok] == 3)
        first = next(s for s in pool.lines.seen if s.startswith("dispatcher-started"))
        os.kill(int(first.split("pid=")[1]), signal.SIGKILL)
        pool.wait_for("dispatcher-exited ")
        pool.wait_for("dispatcher-started ")
        with Client(namespace) as client:
            assert [client.submit(pow, i, 2).result(30) for i in range(2)] == [0, 1]
        wait_until(lambda: metrics_of(url)[ok] == 5)
        assert metrics_of(url)[ok] == 5


@pytest.mark.timeout(120)
def test_the_page_and_pool_workers_show_what_waits_by_priority(
    namespace: str, browser: Any, tmp_path: Path
) -> None:
    """With the one worker held, 3 calls of priority 0 and 2 of priority 10
    wait (the worker holds one of 10 unstarted, having given back the one
    of 0 it held): the queued tile and `pool workers` say how many wait at
    each priority; a screenshot is kept."""
    gate = tmp_path / "gate"
    with running_pool(
        namespace, "--workers", "1", "--dashboard", "127.0.0.1:0"
    ) as pool:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(dashboard_url(pool))
        try:
            with Client(namespace) as client:
                held = client.submit(sample_tasks.gated_pid, str(gate))
                wait_until(held.running)
                low = [client.submit(sample_tasks.square, i) for i in range(3)]
                urgent = client.options(priority=10)
                high = [urgent.submit(sample_tasks.square, i) for i in range(2)]
                by = "queued: 1 at priority 10, 3 at priority 0"
                page.wait_for_function(
                    "by => document.getElementById('t-queued-by').textContent === by",
                    arg=by,
                )
                assert page.locator("#t-queued").text_content() == "4"
                listed = pool_command("workers", "-n", namespace)
                assert "queued=4 by_priority=10:1,0:3 " in listed.stdout
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "dashboard-priorities.png"))
                gate.touch()
                assert [f.result(timeout=30) for f in [*low, *high]] == [0, 1, 4, 0, 1]
        finally:
            gate.touch()
