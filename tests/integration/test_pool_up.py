"""``python -m pool up`` end to end: real supervisor, dispatcher, workers."""

from __future__ import annotations

import signal
from unittest import mock

import grpc
import pytest

from discovery import list_workers, paths
from pool import Client
from pool.client.rendezvous import locate
from pool.dispatcher_pb2 import ListWorkersRequest, SubmissionBatch
from pool.dispatcher_pb2_grpc import DispatcherStub
from pool.errors import PoolStopping, ProtocolMismatch, RemoteTraceback
from tests.support import sample_tasks
from tests.support.helpers import wait_until
from tests.support.pools import (
    pool_command,
    processes_mentioning,
    running_pool,
    watching,
)
from workers.protocol import auth
from workers.protocol.worker_pb2 import Task, TaskBatch
from workers.protocol.worker_pb2_grpc import WorkerStub

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_pool_up_runs_tasks_and_every_command(namespace: str) -> None:
    """With 8 workers and stdout not a terminal: 1,000 tasks through map come
    back right and in order, an exception re-raises with its remote
    traceback, and submit, workers, watch and down all work."""
    with running_pool(namespace, "--workers", "8") as pool:
        with Client(namespace) as client:
            values = list(client.map(sample_tasks.square, range(1000)))
            assert values == [x * x for x in range(1000)]
            future = client.submit(sample_tasks.fail, "boom")
            with pytest.raises(ValueError, match=r"^boom$") as raised:
                future.result(timeout=30)
            assert isinstance(raised.value.__cause__, RemoteTraceback)
            assert "in fail" in str(raised.value.__cause__)

        done = pool_command(
            "submit", "-n", namespace, "tests.support.sample_tasks:square", "7"
        )
        assert (done.returncode, done.stdout) == (0, "49\n")
        called = pool_command(
            "submit",
            "-n",
            namespace,
            "tests.support.sample_tasks:call",
            "1",
            "b='x'",
            "c=[2]",
        )
        assert called.stdout == repr("(1,) [('b', 'x'), ('c', [2])]") + "\n"
        huge = pool_command("submit", "-n", namespace, "math:factorial", "2000")
        assert huge.returncode == 0 and len(huge.stdout.strip()) == 5736
        for args, said in (
            (["tests.support.sample_tasks:exit_with", "3"], "SystemExit: 3"),
            (
                ["tests.support.sample_tasks:fail", "'two\\nlines'"],
                "ValueError: two lines",
            ),
        ):
            failed = pool_command("submit", "-n", namespace, *args)
            assert failed.returncode == 1
            assert failed.stderr == f"pool: the task raised {said}\n"

        listed = pool_command("workers", "-n", namespace)
        lines = listed.stdout.splitlines()
        assert listed.returncode == 0 and len(lines) == 9
        assert all(
            line.startswith("worker pid=")
            and "status=ready" in line
            and line.endswith(" in_flight=0")
            for line in lines[:8]
        )
        address = pool.ready_line.split("address=")[1].split()[0]
        assert lines[8] == f"dispatcher address={address} queued=0 clients=0"

        with watching(namespace) as watch:
            watch.wait_counts({"worker-added ": 8}, 30)

        down = pool_command("down", "-n", namespace, timeout_s=90)
        assert down.returncode == 0, down.stderr
        assert down.stdout.startswith(f"stopped pool {namespace!r}")
        assert pool.proc.wait(30) == 0
        pool.wait_for("stopped ")
    _assert_nothing_left(namespace)


@pytest.mark.timeout(90)
def test_sigint_drains_and_leaves_nothing(namespace: str) -> None:
    """SIGINT drains the pool: exit 0, every worker dropped, and no segment,
    runtime file or process left."""
    with running_pool(namespace, "--workers", "3") as pool:
        assert len(list_workers(namespace)) == 3
        assert pool.stop(signal.SIGINT) == 0
        for _ in range(3):
            pool.wait_for("worker-dropped ")
        pool.wait_for("stopped ")
    _assert_nothing_left(namespace)


def test_second_pool_on_a_live_namespace_is_refused(namespace: str) -> None:
    """A live pool is never taken over: a second `up` says so and exits 1."""
    with running_pool(namespace, "--workers", "1"):
        second = pool_command("up", "-n", namespace, "--workers", "1", timeout_s=30)
        assert second.returncode == 1
        assert second.stderr.startswith(
            f"pool: error: a pool already runs in namespace {namespace!r}"
        )
        assert "Traceback" not in second.stderr


@pytest.mark.timeout(60)
def test_calls_without_the_token_are_refused(namespace: str) -> None:
    """The dispatcher and every worker refuse a call with no or a wrong
    token (UNAUTHENTICATED), and keep serving the pool."""
    with running_pool(namespace, "--workers", "1"):
        address, _ = locate(namespace)
        worker = list_workers(namespace)[0]
        for metadata in [(), auth.call_metadata("0" * 64)]:
            with grpc.insecure_channel(address) as channel:
                stub = DispatcherStub(channel)  # type: ignore[no-untyped-call]
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ListWorkers(
                        ListWorkersRequest(), metadata=metadata, timeout=10
                    )
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                stream = stub.SubmitStream(iter([SubmissionBatch()]), metadata=metadata)
                with pytest.raises(grpc.RpcError) as refused:
                    list(stream)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with grpc.insecure_channel(worker.address) as channel:
                run = WorkerStub(channel).Run(  # type: ignore[no-untyped-call]
                    iter([TaskBatch(tasks=[Task(id=1, function="os:system")])]),
                    metadata=metadata,
                )
                with pytest.raises(grpc.RpcError) as refused:
                    list(run)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with Client(namespace) as client:
            assert client.submit(sample_tasks.square, 3).result(timeout=30) == 9


@pytest.mark.timeout(60)
def test_another_protocol_version_is_refused_at_connect(namespace: str) -> None:
    """A caller of another protocol version, with the right token, is
    refused by the dispatcher and by every worker with FAILED_PRECONDITION
    and a message that says what to do; a Client of another version gets
    ProtocolMismatch at its first task, and the pool serves the next."""
    with running_pool(namespace, "--workers", "1"):
        address, token = locate(namespace)
        worker = list_workers(namespace)[0]
        ours, other = auth.PROTOCOL_VERSION, str(int(auth.PROTOCOL_VERSION) + 1)
        expected = (
            f"protocol mismatch: this pool speaks shm-pool protocol {ours}, the "
            "caller {}; use the same shm-pool version for the pool and its clients"
        )
        for protocol, said in [(other, other), ("", "none")]:
            metadata = auth.call_metadata(token, protocol)
            with grpc.insecure_channel(address) as channel:
                stub = DispatcherStub(channel)  # type: ignore[no-untyped-call]
                stream = stub.SubmitStream(iter([SubmissionBatch()]), metadata=metadata)
                with pytest.raises(grpc.RpcError) as refused:
                    list(stream)
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert refused.value.details() == expected.format(said)
            with grpc.insecure_channel(worker.address) as channel:
                run = WorkerStub(channel).Run(  # type: ignore[no-untyped-call]
                    iter([TaskBatch()]), metadata=metadata
                )
                with pytest.raises(grpc.RpcError) as refused:
                    list(run)
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with mock.patch.object(auth, "PROTOCOL_VERSION", other):
            with Client(namespace) as client:
                future = client.submit(sample_tasks.square, 3)
                with pytest.raises(ProtocolMismatch, match=r"speaks shm-pool protocol"):
                    future.result(timeout=30)
        with Client(namespace) as client:
            assert client.submit(sample_tasks.square, 4).result(timeout=30) == 16


@pytest.mark.timeout(60)
def test_the_dispatcher_serves_clients_only(namespace: str) -> None:
    """Only SubmitStream and ListWorkers are served: how workers died comes
    from the supervisor on a pipe only it holds, so a client (even with the
    token) cannot forge it, and the RPCs nothing used are gone."""
    with running_pool(namespace, "--workers", "1"):
        address, token = locate(namespace)
        with grpc.insecure_channel(address) as channel:
            for method in ("ReportExit", "Submit", "Watch"):
                path = f"/shmpool.dispatcher.v1.Dispatcher/{method}"
                call: grpc.UnaryUnaryMultiCallable[bytes, bytes]
                call = channel.unary_unary(path)
                with pytest.raises(grpc.RpcError) as refused:
                    call(b"", metadata=auth.call_metadata(token), timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_cli_errors_are_one_line(namespace: str) -> None:
    """Without a pool, commands fail with one line naming the next step and
    exit 1; `down` has nothing to stop and exits 0; a usage error exits 2
    (argparse's convention), still in one line."""
    for args in (
        ["submit", "-n", namespace, "math:sqrt", "4"],
        ["workers", "-n", namespace],
    ):
        done = pool_command(*args)
        assert done.returncode == 1
        assert done.stderr == (
            f"pool: error: no pool is running in namespace {namespace!r}; start one "
            f"with `python -m pool up --namespace {namespace}`\n"
        )
    watch = pool_command("watch", "-n", namespace, "--timeout-s", "0.5")
    assert watch.returncode == 1
    assert watch.stderr == (
        f"waiting for a pool in namespace {namespace!r}\n"
        f"pool: error: no pool is running in namespace {namespace!r} (none started "
        f"within 0.5 s); start one with `python -m pool up --namespace {namespace}`\n"
    )
    down = pool_command("down", "-n", namespace)
    assert (down.returncode, down.stderr) == (0, "")
    assert (
        down.stdout
        == f"nothing to stop: no pool is running in namespace {namespace!r}\n"
    )
    for args in (["workers", "-n", "../etc"], ["up", "-n", ""]):
        bad = pool_command(*args)
        assert bad.returncode == 2
        assert bad.stderr.startswith("pool: error: invalid namespace")
        assert bad.stderr.count("\n") == 1
    none = pool_command("up", "-n", namespace, "--workers", "0")
    assert none.returncode == 2
    assert none.stderr == (
        "pool: error: workers must be at least 1, got 0; 0 only with --discovery "
        "or --external-workers (see --help)\n"
    )
    for host in ("nosuch.invalid", "192.0.2.1"):  # (no name; TEST-NET-1)
        unbound = pool_command("up", "-n", namespace, "--host", host)
        assert unbound.returncode == 2
        assert unbound.stderr.startswith(
            f"pool: error: --host: cannot listen on {host!r}: "
        )
        assert unbound.stderr.endswith("; give an address of this machine\n")
        assert unbound.stderr.count("\n") == 1
    paths.remove_namespace_dir(namespace)


def _assert_nothing_left(namespace: str) -> None:
    assert not (paths.SHM_DIR / paths.segment_name(namespace)).exists()
    assert not paths.namespace_dir(namespace, create=False).exists()
    assert processes_mentioning(namespace) == []


@pytest.mark.timeout(60)
def test_second_sigint_stops_at_once(namespace: str) -> None:
    """While a drain waits on a long task, a second SIGINT stops at once:
    the worker is killed, and still nothing is left behind."""
    with running_pool(namespace, "--workers", "1") as pool, Client(namespace) as client:
        napping = client.submit(sample_tasks.nap, 50)
        wait_until(lambda: _running(namespace) == 1, 30)
        pool.proc.send_signal(signal.SIGINT)
        pool.wait_for("stopping ")
        pool.wait_for("worker-updated ")  # draining, and waiting on the nap
        assert pool.stop(signal.SIGINT, timeout_s=20) == 0  # not the nap's 50 s
        assert any(
            line.startswith("worker-exited ") and "signal=SIGKILL" in line
            for line in pool.lines.wait_counts({"stopped ": 1}, 10)
        )
        with pytest.raises(PoolStopping, match="its worker stopped before it"):
            napping.result(timeout=30)
    _assert_nothing_left(namespace)


def _running(namespace: str) -> int:
    return sum(int(w.extra.get("running", "0")) for w in list_workers(namespace))
