from discovery import worker_info_pb2 as _worker_info_pb2
from workers.protocol import worker_pb2 as _worker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Submission(_message.Message):
    __slots__ = ("task", "tags")
    TASK_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    task: _worker_pb2.Task
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task: _Optional[_Union[_worker_pb2.Task, _Mapping]] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class SubmissionBatch(_message.Message):
    __slots__ = ("submissions", "cancel", "stop", "abandon")
    SUBMISSIONS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    ABANDON_FIELD_NUMBER: _ClassVar[int]
    submissions: _containers.RepeatedCompositeFieldContainer[Submission]
    cancel: _containers.RepeatedScalarFieldContainer[int]
    stop: _containers.RepeatedScalarFieldContainer[int]
    abandon: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, submissions: _Optional[_Iterable[_Union[Submission, _Mapping]]] = ..., cancel: _Optional[_Iterable[int]] = ..., stop: _Optional[_Iterable[int]] = ..., abandon: _Optional[_Iterable[int]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerState(_message.Message):
    __slots__ = ("info", "in_flight", "done", "others")
    INFO_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    OTHERS_FIELD_NUMBER: _ClassVar[int]
    info: _worker_info_pb2.WorkerInfo
    in_flight: int
    done: int
    others: int
    def __init__(self, info: _Optional[_Union[_worker_info_pb2.WorkerInfo, _Mapping]] = ..., in_flight: _Optional[int] = ..., done: _Optional[int] = ..., others: _Optional[int] = ...) -> None: ...

class ListWorkersReply(_message.Message):
    __slots__ = ("workers", "queued", "clients", "queued_by_priority")
    class QueuedByPriorityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_BY_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerState]
    queued: int
    clients: int
    queued_by_priority: _containers.ScalarMap[int, int]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerState, _Mapping]]] = ..., queued: _Optional[int] = ..., clients: _Optional[int] = ..., queued_by_priority: _Optional[_Mapping[int, int]] = ...) -> None: ...
