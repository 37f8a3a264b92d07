from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Data(_message.Message):
    __slots__ = ("host", "segments", "pickle", "parts", "transfer")
    HOST_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    PICKLE_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    host: str
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    pickle: bytes
    parts: _containers.RepeatedCompositeFieldContainer[Part]
    transfer: Transfer
    def __init__(self, host: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., pickle: _Optional[bytes] = ..., parts: _Optional[_Iterable[_Union[Part, _Mapping]]] = ..., transfer: _Optional[_Union[Transfer, _Mapping]] = ...) -> None: ...

class Transfer(_message.Message):
    __slots__ = ("token", "size", "source")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    size: int
    source: str
    def __init__(self, token: _Optional[bytes] = ..., size: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("token", "source")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    source: str
    def __init__(self, token: _Optional[bytes] = ..., source: _Optional[str] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("data", "token", "size", "source")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    token: bytes
    size: int
    source: str
    def __init__(self, data: _Optional[bytes] = ..., token: _Optional[bytes] = ..., size: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class UploadReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Want(_message.Message):
    __slots__ = ("id", "source")
    ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    id: int
    source: str
    def __init__(self, id: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("name", "nonce", "size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    nonce: int
    size: int
    def __init__(self, name: _Optional[str] = ..., nonce: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class Part(_message.Message):
    __slots__ = ("segment", "offset", "length")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    segment: int
    offset: int
    length: int
    def __init__(self, segment: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class Home(_message.Message):
    __slots__ = ("host", "owner", "tag", "lend")
    HOST_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    LEND_FIELD_NUMBER: _ClassVar[int]
    host: str
    owner: str
    tag: int
    lend: Segment
    def __init__(self, host: _Optional[str] = ..., owner: _Optional[str] = ..., tag: _Optional[int] = ..., lend: _Optional[_Union[Segment, _Mapping]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "function", "args", "timeout_s", "attempt", "digest", "code", "chunk", "label", "data", "home", "map", "priority", "retries", "retry_on")
    ID_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    RETRY_ON_FIELD_NUMBER: _ClassVar[int]
    id: int
    function: str
    args: bytes
    timeout_s: float
    attempt: int
    digest: bytes
    code: bytes
    chunk: bool
    label: str
    data: Data
    home: Home
    map: MapPart
    priority: int
    retries: int
    retry_on: bytes
    def __init__(self, id: _Optional[int] = ..., function: _Optional[str] = ..., args: _Optional[bytes] = ..., timeout_s: _Optional[float] = ..., attempt: _Optional[int] = ..., digest: _Optional[bytes] = ..., code: _Optional[bytes] = ..., chunk: _Optional[bool] = ..., label: _Optional[str] = ..., data: _Optional[_Union[Data, _Mapping]] = ..., home: _Optional[_Union[Home, _Mapping]] = ..., map: _Optional[_Union[MapPart, _Mapping]] = ..., priority: _Optional[int] = ..., retries: _Optional[int] = ..., retry_on: _Optional[bytes] = ...) -> None: ...

class MapPart(_message.Message):
    __slots__ = ("id", "calls", "total")
    ID_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    id: str
    calls: int
    total: int
    def __init__(self, id: _Optional[str] = ..., calls: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("type", "message", "traceback", "exception", "code")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    traceback: str
    exception: bytes
    code: int
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ..., traceback: _Optional[str] = ..., exception: _Optional[bytes] = ..., code: _Optional[int] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("id", "value", "failure", "data", "run_us", "slot")
    ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    RUN_US_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    id: int
    value: bytes
    failure: Failure
    data: Data
    run_us: int
    slot: int
    def __init__(self, id: _Optional[int] = ..., value: _Optional[bytes] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., data: _Optional[_Union[Data, _Mapping]] = ..., run_us: _Optional[int] = ..., slot: _Optional[int] = ...) -> None: ...

class TaskBatch(_message.Message):
    __slots__ = ("tasks", "cancel", "stop", "abandon")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    ABANDON_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    cancel: _containers.RepeatedScalarFieldContainer[int]
    stop: _containers.RepeatedScalarFieldContainer[int]
    abandon: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., cancel: _Optional[_Iterable[int]] = ..., stop: _Optional[_Iterable[int]] = ..., abandon: _Optional[_Iterable[int]] = ...) -> None: ...

class ResultBatch(_message.Message):
    __slots__ = ("results", "started", "pace_us", "wants", "others")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    PACE_US_FIELD_NUMBER: _ClassVar[int]
    WANTS_FIELD_NUMBER: _ClassVar[int]
    OTHERS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Result]
    started: _containers.RepeatedScalarFieldContainer[int]
    pace_us: int
    wants: _containers.RepeatedCompositeFieldContainer[Want]
    others: int
    def __init__(self, results: _Optional[_Iterable[_Union[Result, _Mapping]]] = ..., started: _Optional[_Iterable[int]] = ..., pace_us: _Optional[int] = ..., wants: _Optional[_Iterable[_Union[Want, _Mapping]]] = ..., others: _Optional[int] = ...) -> None: ...
