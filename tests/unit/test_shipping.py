"""How a callable travels (workers.protocol.shipping, workers.imports), in-process:
by name when a worker can import it, else by value, once per stream."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import traceback
import uuid
from types import ModuleType
from typing import Any

import pytest

from pool.client.core import Submissions
from pool.client.ledger import Ledger
from tests.support import sample_tasks
from workers import imports
from workers.protocol import namespaces, shipping
from workers.protocol.errors import FunctionNotFound
from workers.protocol.worker_pb2 import Task

pytestmark = pytest.mark.timeout(10)


def _run_in_worker(ref: shipping.Reference, *args: Any) -> Any:
    """What a worker does with the reference: find the callable, call it."""
    task = Task(function=ref.name, digest=ref.digest)
    return imports.find(task, ref.code)(*args)


def test_importable_callables_travel_by_name_and_resolve_to_themselves() -> None:
    for fn in (sample_tasks.square, sample_tasks.Scaler.twice, sample_tasks.Scaler):
        ref = shipping.reference(fn)
        assert not ref.by_value and ref.name.startswith("tests.support.sample_tasks:")
        assert imports.resolve(ref.name) is fn


def _nested() -> Any:
    base = 10

    def add(x: int) -> int:
        return base + x

    return add


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (lambda x: x * 3, 63),
        (_nested(), 31),
        (functools.partial(sample_tasks.fail_on, 5), 21),
        (sample_tasks.Scaler(42).scale, 42 * 21),
        (sample_tasks.Scaler.unit, 21),
    ],
    ids=["lambda", "closure", "partial", "bound method", "classmethod"],
)
def test_other_callables_travel_by_value_and_keep_their_state(
    fn: Any, expected: int
) -> None:
    """Regression: a bound method travelled as "module:Class.method", and the
    worker called the plain function with the argument as self."""
    ref = shipping.reference(fn)
    assert ref.by_value and not ref.name
    assert ref.digest == hashlib.sha256(ref.code).digest()
    assert _run_in_worker(ref, 21) == expected


def test_a_shipped_module_travels_by_value() -> None:
    ref = shipping.reference(sample_tasks.square, ship_modules=["tests"])
    assert ref.by_value
    assert _run_in_worker(ref, 7) == 49


def test_a_wrapper_registered_under_anothers_name_goes_by_value() -> None:
    """A name that leads elsewhere (a decorator that did not copy the
    function) would call the wrong thing: the callable travels by value."""

    def square(x: int) -> int:
        return -x

    square.__module__, square.__qualname__ = "tests.support.sample_tasks", "square"
    ref = shipping.reference(square)
    assert ref.by_value and _run_in_worker(ref, 3) == -3


def test_both_ends_of_a_stream_agree_on_what_it_carried() -> None:
    """The sender attaches code only when the receiver lacks it, through
    evictions: a long run of many functions never leaves the receiver
    without the code of a task."""
    sender, receiver = (
        shipping.StreamCache(4, 1 << 20),
        shipping.StreamCache(4, 1 << 20),
    )
    codes = {i: pickle.dumps(("f", i)) for i in range(10)}
    digests = {i: hashlib.sha256(code).digest() for i, code in codes.items()}
    attached = 0
    for step in range(500):
        i = (step * 7 + step // 3) % 10
        sent = sender.outgoing(digests[i], codes[i])
        attached += bool(sent)
        assert receiver.incoming(digests[i], sent) == codes[i]
    assert 10 <= attached < 500


def test_a_receiver_refuses_code_that_is_missing_or_not_its_digest() -> None:
    cache = shipping.StreamCache()
    code = pickle.dumps(len)
    with pytest.raises(shipping.ShippingError, match="has not carried"):
        cache.incoming(hashlib.sha256(code).digest(), b"")
    with pytest.raises(shipping.ShippingError, match="does not match"):
        cache.incoming(hashlib.sha256(b"other").digest(), code)


def test_a_shipped_function_needing_a_missing_module_says_where_workers_look() -> None:
    code = pickle.dumps(sample_tasks.square).replace(
        b"tests.support.sample_tasks", b"tests.support.sample_taskz"
    )
    task = Task(digest=hashlib.sha256(code).digest())
    with pytest.raises(FunctionNotFound) as raised:
        imports.find(task, code)
    message = str(raised.value)
    assert "'tests.support.sample_taskz'" in message and "sys.path[0]=" in message
    assert "--path" in message and "ship_modules" in message


def test_values_plain_pickle_refuses_fall_back_to_cloudpickle() -> None:
    value = [lambda: 5]
    assert pickle.loads(shipping.dumps(value))[0]() == 5


def test_a_client_stream_carries_a_function_once() -> None:
    """50 submissions of one lambda: its bytes go out with the first only,
    and again once on a new stream (after a reconnect)."""
    submissions = Submissions()
    ledger = Ledger()
    ref = submissions.reference(lambda x: x + 1)
    assert ref.by_value

    def carried() -> list[bytes]:
        return [
            s.task.code
            for batch in ledger.batches()
            for s in batch.submissions
            if s.task.digest == ref.digest
        ]

    for i in range(50):
        submission, code, _ = submissions.make(ref, (i,), {})
        ledger.add(submission, _Ignore(), code)
    sent = carried()
    assert len(sent) == 50 and sent[0] == ref.code and not any(sent[1:])
    ledger.new_stream()
    ledger.resend_all()
    again = carried()
    assert len(again) == 50 and again[0] == ref.code and not any(again[1:])


class _Ignore:
    def started(self) -> None:
        pass

    def resolve(self, result: object) -> None:
        pass

    def withdrawn(self) -> bool:
        return False  # (nothing is cancelled here)

    def undecided(self) -> None:
        pass


def test_a_value_naming_main_goes_by_value() -> None:
    """Plain pickle stores a function of the client's ``__main__`` by name,
    without failing, and a worker has no such name: such a pickle is made
    again by value, and loads where ``__main__`` lacks the function."""
    main = sys.modules["__main__"]

    def key(x: int) -> int:
        return -x

    key.__module__, key.__qualname__ = "__main__", "shipping_probe_key"
    main.shipping_probe_key = key  # type: ignore[attr-defined]
    try:
        assert b"shipping_probe_key" in pickle.dumps(key)  # by name, plainly
        data = shipping.dumps([3, key])
    finally:
        delattr(main, "shipping_probe_key")
    number, loaded = pickle.loads(data)
    assert number == 3 and loaded(4) == -4


def test_plain_values_stay_plain_pickle() -> None:
    value = {"a": [1, 2.5, b"x"], "b": sample_tasks.square}
    assert shipping.dumps(value) == pickle.dumps(
        value, protocol=pickle.HIGHEST_PROTOCOL
    )


def test_shipped_code_keeps_its_file_name_and_a_traceback_its_lines() -> None:
    """A function shipped by value raises in a frame of this file, not of
    ``<dynamic-code>``; a remote traceback without the line gets it back
    from this process's copy of the file."""

    def raises() -> None:
        raise ValueError("here")  # the shipped line

    ref = shipping.reference(raises)
    assert ref.by_value
    with pytest.raises(ValueError) as raised:
        _run_in_worker(ref)
    frame = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert frame.filename == __file__ and frame.name == "raises"
    bare = (
        "Traceback (most recent call last):\n"
        f'  File "{__file__}", line {frame.lineno}, in raises\n'
        "ValueError: here\n"
    )
    filled = shipping.fill_source_lines(bare)
    assert '    raise ValueError("here")  # the shipped line\n' in filled
    assert shipping.fill_source_lines(filled) == filled  # a line is not added twice
    unknown = '  File "/nowhere/at/all.py", line 3, in f\n'
    assert shipping.fill_source_lines(unknown) == unknown


MODULE_CODE = """
MODEL = None

def load(name):
    global MODEL
    MODEL = name

def use():
    return MODEL
"""


@pytest.fixture
def script_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A module of this process's, shipped by value as a script is."""
    module = ModuleType("shmp_script_under_test")
    exec(MODULE_CODE, vars(module))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    shipping.ship_by_value(module)
    try:
        yield module
    finally:
        import cloudpickle

        cloudpickle.unregister_pickle_by_value(module)


def _in_another_process(monkeypatch: pytest.MonkeyPatch, data: bytes) -> Any:
    """Unpickle ``data`` as a worker would: in a process of another session."""
    with monkeypatch.context() as other:
        other.setattr(namespaces, "_session", (os.getpid(), uuid.uuid4().hex))
        return pickle.loads(data)


def test_functions_of_one_module_share_its_globals_where_they_run(
    script_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An initializer and a task of one script, shipped apart, see one
    namespace in the worker: what the first sets the second reads, and a
    later shipment of the script's functions does not undo it; a function
    defined again replaces the old one there (a notebook cell run again)."""
    load = _in_another_process(monkeypatch, shipping.dumps(script_module.load))
    use = _in_another_process(monkeypatch, shipping.dumps(script_module.use))
    assert use.__globals__ is load.__globals__ is not vars(script_module)
    load("small")
    again = _in_another_process(monkeypatch, shipping.dumps(script_module.use))
    assert (use(), again(), script_module.use()) == ("small", "small", None)
    exec("def helper():\n    return 'new'\n", vars(script_module))
    exec("def use():\n    return helper()\n", vars(script_module))
    redefined = _in_another_process(monkeypatch, shipping.dumps(script_module.use))
    assert redefined() == "new" and redefined.__globals__ is use.__globals__


def test_a_module_function_coming_back_is_the_clients_own(
    script_module: Any,
) -> None:
    """Unpickled in the process that shipped it, a function's namespace is
    its module's own, whose values it leaves alone."""
    script_module.MODEL = "mine"
    back = pickle.loads(shipping.dumps(script_module.use))
    assert back.__globals__ is vars(script_module)
    assert (back(), script_module.MODEL) == ("mine", "mine")
