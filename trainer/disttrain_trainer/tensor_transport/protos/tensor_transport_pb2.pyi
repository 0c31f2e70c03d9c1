from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class StreamHeader(_message.Message):
    __slots__ = ("kind", "round", "tensors", "scalars", "attrs")
    class ScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    SCALARS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    round: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    scalars: _containers.ScalarMap[str, float]
    attrs: _containers.ScalarMap[str, str]
    def __init__(self, kind: _Optional[str] = ..., round: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., scalars: _Optional[_Mapping[str, float]] = ..., attrs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: StreamHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[StreamHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("client_ids",)
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    client_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("round", "rounds", "session")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    round: int
    rounds: int
    session: str
    def __init__(self, round: _Optional[int] = ..., rounds: _Optional[int] = ..., session: _Optional[str] = ...) -> None: ...

class TaskRequest(_message.Message):
    __slots__ = ("client_id",)
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    def __init__(self, client_id: _Optional[str] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("accepted", "reason", "sequence")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    sequence: int
    def __init__(self, accepted: bool = ..., reason: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class PublicKeys(_message.Message):
    __slots__ = ("client_id", "round", "cipher_pk", "mask_pk")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CIPHER_PK_FIELD_NUMBER: _ClassVar[int]
    MASK_PK_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    round: int
    cipher_pk: bytes
    mask_pk: bytes
    def __init__(self, client_id: _Optional[str] = ..., round: _Optional[int] = ..., cipher_pk: _Optional[bytes] = ..., mask_pk: _Optional[bytes] = ...) -> None: ...

class KeyBook(_message.Message):
    __slots__ = ("round", "keys", "aborted")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    round: int
    keys: _containers.RepeatedCompositeFieldContainer[PublicKeys]
    aborted: bool
    def __init__(self, round: _Optional[int] = ..., keys: _Optional[_Iterable[_Union[PublicKeys, _Mapping]]] = ..., aborted: bool = ...) -> None: ...

class EncryptedShare(_message.Message):
    __slots__ = ("sender", "recipient", "ciphertext")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    sender: str
    recipient: str
    ciphertext: bytes
    def __init__(self, sender: _Optional[str] = ..., recipient: _Optional[str] = ..., ciphertext: _Optional[bytes] = ...) -> None: ...

class ShareBundle(_message.Message):
    __slots__ = ("client_id", "round", "shares", "aborted", "sharers")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    SHARERS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    round: int
    shares: _containers.RepeatedCompositeFieldContainer[EncryptedShare]
    aborted: bool
    sharers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_id: _Optional[str] = ..., round: _Optional[int] = ..., shares: _Optional[_Iterable[_Union[EncryptedShare, _Mapping]]] = ..., aborted: bool = ..., sharers: _Optional[_Iterable[str]] = ...) -> None: ...

class UnmaskRequest(_message.Message):
    __slots__ = ("client_id", "round")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    round: int
    def __init__(self, client_id: _Optional[str] = ..., round: _Optional[int] = ...) -> None: ...

class UnmaskPlan(_message.Message):
    __slots__ = ("round", "survivors", "dropped", "aborted")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    round: int
    survivors: _containers.RepeatedScalarFieldContainer[str]
    dropped: _containers.RepeatedScalarFieldContainer[str]
    aborted: bool
    def __init__(self, round: _Optional[int] = ..., survivors: _Optional[_Iterable[str]] = ..., dropped: _Optional[_Iterable[str]] = ..., aborted: bool = ...) -> None: ...

class RevealedShare(_message.Message):
    __slots__ = ("owner", "x", "y", "what")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    WHAT_FIELD_NUMBER: _ClassVar[int]
    owner: str
    x: int
    y: bytes
    what: str
    def __init__(self, owner: _Optional[str] = ..., x: _Optional[int] = ..., y: _Optional[bytes] = ..., what: _Optional[str] = ...) -> None: ...

class Reveal(_message.Message):
    __slots__ = ("client_id", "round", "shares")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    round: int
    shares: _containers.RepeatedCompositeFieldContainer[RevealedShare]
    def __init__(self, client_id: _Optional[str] = ..., round: _Optional[int] = ..., shares: _Optional[_Iterable[_Union[RevealedShare, _Mapping]]] = ...) -> None: ...
