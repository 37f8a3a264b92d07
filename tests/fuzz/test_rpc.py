"""Hypothesis against a live worker and dispatcher: whatever tasks a caller
with the token sends, each is answered exactly once with a documented
status, and both processes go on serving."""

from __future__ import annotations

import math
import pickle

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discovery import list_workers
from pool import Client
from pool.dispatcher_pb2 import Submission, SubmissionBatch
from tests.support import sample_tasks
from tests.support.pools import running_pool
from tests.support.rpc import SQUARE, call, dispatcher_stub, run, status, worker_stub
from workers.protocol.worker_pb2 import Result, Task, TaskBatch

pytestmark = pytest.mark.integration

LIMIT = 2048
EXAMPLES = 150
S = grpc.StatusCode
DOCUMENTED = {
    S.UNKNOWN,
    S.INVALID_ARGUMENT,
    S.NOT_FOUND,
    S.ALREADY_EXISTS,
    S.RESOURCE_EXHAUSTED,
    S.DEADLINE_EXCEEDED,
    S.CANCELLED,
}

functions = st.one_of(
    st.sampled_from(
        [
            SQUARE,
            "tests.support.sample_tasks:async_double",
            "tests.support.sample_tasks:fail",
            "tests.support.sample_tasks:NOT_CALLABLE",
            "tests.support.sample_tasks:square.__call__",
            "tests.support.sample_tasks:",
            ":square",
            "no_such_module:f",
            "os.path:no_such_name",
            "..x:y",
            "tests..sample_tasks:square",
        ]
    ),
    st.text(max_size=40),
)
arguments = st.one_of(
    st.binary(max_size=64),
    st.binary(min_size=LIMIT + 1, max_size=LIMIT + 64),
    st.integers().map(lambda n: call(n)),
    st.builds(lambda *a, **k: pickle.dumps((a, k)), st.integers(), st.text()),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner),
        max_leaves=6,
    ).map(pickle.dumps),
)
# Limits the worker refuses, none, or ones too long to end a call here: a
# call over its limit ends its worker (workers.ending), which these
# fuzzers keep (test_control.py ends workers so).
timeouts = st.one_of(
    st.just(0.0),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.floats(max_value=0.0, exclude_max=True),
    st.floats(60.0, 1e12),
)
ids = st.integers(0, 5) | st.integers(0, 2**64 - 1)
task_lists = st.lists(
    st.builds(Task, id=ids, function=functions, args=arguments, timeout_s=timeouts),
    max_size=6,
)


def status_or_none(result: Result) -> grpc.StatusCode | None:
    return status(result) if result.HasField("failure") else None


def check_answers(sent: list[Task], answers: dict[int, list[Result]]) -> None:
    """Exactly one answer per task sent, each a value or a documented status
    with a message."""
    assert sorted(answers) == sorted(set(t.id for t in sent))
    for task_id, results in answers.items():
        assert len(results) == sum(t.id == task_id for t in sent)
        for result in results:
            if result.HasField("failure"):
                assert status(result) in DOCUMENTED | {S.UNAVAILABLE}, result.failure
                assert result.failure.message or result.failure.type
            if status_or_none(result) == S.UNAVAILABLE:
                # Only when a task timed out while it ran, holding the one
                # thread: the worker hands the others back (to go elsewhere).
                assert any(0 < t.timeout_s < math.inf for t in sent), result
    for task in sent:
        alone = len(answers[task.id]) == 1
        if alone and not (math.isfinite(task.timeout_s) and task.timeout_s >= 0):
            (result,) = answers[task.id]
            assert status(result) == S.INVALID_ARGUMENT, "a bad timeout_s is refused"


@pytest.mark.timeout(300)
def test_fuzzed_tasks_are_each_answered_and_both_go_on_serving(namespace: str) -> None:
    """Arbitrary ids, names, argument bytes and timeouts, sent to a worker
    directly and through the dispatcher."""
    with running_pool(namespace, "--workers", "1", "--max-args-bytes", str(LIMIT)):
        pid = list_workers(namespace)[0].pid
        settings_ = settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        with worker_stub(namespace) as (stub, metadata):

            @settings_
            @given(st.lists(task_lists, min_size=1, max_size=3))
            def fuzz_worker(batches: list[list[Task]]) -> None:
                sent = [t for b in batches for t in b]
                answers = run(stub, metadata, [TaskBatch(tasks=b) for b in batches])
                check_answers(sent, answers)

            fuzz_worker()
        with dispatcher_stub(namespace) as (dispatcher, metadata):

            @settings_
            @given(task_lists)
            def fuzz_dispatcher(sent: list[Task]) -> None:
                batch = SubmissionBatch(submissions=[Submission(task=t) for t in sent])
                answers: dict[int, list[Result]] = {}
                stream = dispatcher.SubmitStream(
                    iter([batch]), metadata=metadata, timeout=30
                )
                for results in stream:
                    for result in results.results:
                        answers.setdefault(result.id, []).append(result)
                check_answers(sent, answers)

            fuzz_dispatcher()
        assert list_workers(namespace)[0].pid == pid  # the same worker, alive
        with Client(namespace) as client:
            assert client.submit(sample_tasks.square, 6).result(timeout=30) == 36
