from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    STATUS_READY: _ClassVar[Status]
    STATUS_DRAINING: _ClassVar[Status]
    STATUS_STUCK: _ClassVar[Status]
STATUS_UNSPECIFIED: Status
STATUS_READY: Status
STATUS_DRAINING: Status
STATUS_STUCK: Status

class WorkerInfo(_message.Message):
    __slots__ = ("uid", "address", "pid", "version", "tags", "extra", "status", "capacity")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    UID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    uid: bytes
    address: str
    pid: int
    version: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    extra: _containers.ScalarMap[str, str]
    status: Status
    capacity: int
    def __init__(self, uid: _Optional[bytes] = ..., address: _Optional[str] = ..., pid: _Optional[int] = ..., version: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., extra: _Optional[_Mapping[str, str]] = ..., status: _Optional[_Union[Status, str]] = ..., capacity: _Optional[int] = ...) -> None: ...
