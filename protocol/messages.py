"""Protocol v2 messages. See ``protocol/README.md`` for the message flow and the compatibility
policy (what may change within a version).

Client to server: :class:`Hello` first, then any number of :class:`Batch`.
Server to client: :class:`Welcome` or :class:`Refused` first, then replies to the requests in
batches (:class:`ReadReply`, :class:`SyncReply`, :class:`StatsReply`, :class:`RequestFailed`) in
request order; :class:`SessionError` for a failure that no request reports, and
:class:`Dropped` for a message the server could not use at all; :class:`Ack` now and then.

Sessions outlive their connection (protocol/README.md, "Resuming a session"): both sides
number the messages they send after the handshake, from 1, across connections; each keeps what
it sent until the other acknowledges it (the client's ``Batch.ack``, the server's :class:`Ack`
and replies), and a client that reconnects presents :class:`Resume` in its hello to take up the
session where its messages and the server's replies stopped arriving.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from .dtypes import DType
from .errors import ErrorInfo
from .graphs import RegisterGraph
from .model import Message as Message
from .ops import Capability, Dim, GraphId, Op, TensorId

PROTOCOL_VERSION = 2
FEATURE_RESUME = "resume"  # sessions resume after a lost connection (Welcome.resume_secret)
FEATURE_NN = "nn"  # the neural-network extension's ops (protocol/ops/nn.py)
FEATURE_SEGMENTS = "segments"  # run_segment, and GraphRefused (client._segments)
FEATURE_LIMITS = "limits"  # Welcome.max_message_size
FEATURE_OPTIM = "optim"  # the optimizer extension's ops (protocol/ops/optim.py)
# what this package speaks, beyond its version's baseline
FEATURES = (FEATURE_RESUME, FEATURE_NN, FEATURE_SEGMENTS, FEATURE_LIMITS, FEATURE_OPTIM)

RequestId = Annotated[int, Field(ge=0, lt=2**63)]
ServerId = Annotated[str, Field(pattern=r"^[0-9a-f]{1,64}$")]  # Welcome.server_id
NBytes = Annotated[int, Field(ge=0, lt=2**63)]
Count = Annotated[int, Field(ge=0, lt=2**63)]  # messages so far
Feature = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
Features = Annotated[list[Feature], Field(max_length=64)]
SessionId = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
Secret = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{43}$")]  # secrets.token_urlsafe(32)


# --- client to server -------------------------------------------------------------------------


class Resume(BaseModel):
    """A hello's claim on a session that lost its connection: its id, the secret its welcome
    gave, and how many of the server's messages the client received whole (the server sends
    the rest again)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    session_id: SessionId
    secret: Secret = Field(repr=False)  # never in a repr, a log or a metric
    received: Count


class Hello(Message):
    """The first client message: protocol version, the optional features the client speaks,
    the device index, and, on a reconnection, the session to resume.

    The token is not here: it travels as ``Authorization: Bearer TOKEN`` in the websocket
    upgrade request and is checked before any message is read (protocol/README.md, "Upgrade").
    """

    type: Literal["hello"] = "hello"
    protocol: int
    device_index: Annotated[int, Field(ge=0)] = 0
    features: Features = []
    resume: Resume | None = None


class Read(BaseModel):
    """Send back tensor ``tensor`` once every op before this request has run."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    kind: Literal["read"] = "read"
    request_id: RequestId
    tensor: TensorId


class Sync(BaseModel):
    """Answer once every op before this request has run."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    kind: Literal["sync"] = "sync"
    request_id: RequestId


class Stats(BaseModel):
    """Report the session's tensor count and bytes once every op before it has run."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    kind: Literal["stats"] = "stats"
    request_id: RequestId


class Describe(BaseModel):
    """Send back tensor ``tensor``'s shape and dtype once every op before it has run: how the
    client learns a data-dependent shape (``nonzero``, ``unique_*``, boolean masks)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    kind: Literal["describe"] = "describe"
    request_id: RequestId
    tensor: TensorId


class Expose(BaseModel):
    """Once every op before this request has run, let tensor ``tensor`` be copied once by the
    server whose ``server_id`` (its :class:`Welcome`'s) is ``audience``: the reply carries a
    capability for it (:class:`ExposeReply`), which that server presents in a :class:`Claim`.
    The tensor's value is the one it has now; later in-place writes do not reach the copy."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    kind: Literal["expose"] = "expose"
    request_id: RequestId
    tensor: TensorId
    audience: ServerId


class Claim(BaseModel):
    """Send back the tensor behind ``capability`` (a :class:`ReadReply`), as the server
    ``claimant`` (the server_id the capability is bound to), if it has ``shape`` and
    ``dtype``: the claimant reserved that much and receives no more. A capability is used
    once, refused or not."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    kind: Literal["claim"] = "claim"
    request_id: RequestId
    capability: Capability
    claimant: ServerId
    shape: tuple[Dim, ...]
    dtype: DType


Request = Annotated[Read | Sync | Stats | Describe | Expose | Claim, Field(discriminator="kind")]


class Batch(Message):
    """Graphs to register, then ops to run in order, then ids to free, then graphs to drop,
    then requests to answer, in that order.

    ``buffers`` lists the byte lengths of the raw buffers after the header; a
    :class:`~protocol.ops.FromBuffer` op names one by its position, a registered graph's
    constants start at its ``first_buffer``. ``ack`` is how many of the server's numbered
    messages the client has received whole: the server forgets those (a resumable session).
    """

    type: Literal["batch"] = "batch"
    graphs: list[RegisterGraph] = []
    ops: list[Op] = []
    frees: list[TensorId] = []
    drop_graphs: list[GraphId] = []
    requests: list[Request] = []
    buffers: list[NBytes] = []
    ack: Count = 0

    def buffer_sizes(self) -> tuple[int, ...]:
        return tuple(self.buffers)


ClientMessage = Annotated[Hello | Batch, Field(discriminator="type")]

# --- server to client -------------------------------------------------------------------------


class Welcome(Message):
    """The handshake succeeded. ``server_id`` is random per server start.

    ``resume_secret`` (None: the session cannot resume) is what a reconnecting client presents
    to take the session up again within ``resume_window`` seconds of losing its connection.
    On a resumed session ``resumed`` is true and ``received`` is how many of the client's
    messages the server has received whole: the client sends the ones after them again.

    ``max_message_size`` (feature ``limits``; None: not said) is the largest message, in bytes,
    that the server takes: a larger one closes the connection, so the client checks before it
    sends. Left out of the JSON when None, for a client that does not speak ``limits``.
    """

    type: Literal["welcome"] = "welcome"
    protocol: int
    device_index: int
    device_count: int
    server_id: str
    session_id: str
    features: Features = []
    resume_secret: Secret | None = Field(default=None, repr=False)
    resume_window: float = 0.0
    resumed: bool = False
    received: Count = 0
    max_message_size: NBytes | None = Field(default=None, exclude_if=lambda size: size is None)


class Refused(Message):
    """The handshake failed; the server closes the connection after sending this.
    ``server_id`` tells a client whose session could not be resumed whether the server
    restarted since."""

    type: Literal["refused"] = "refused"
    protocol: int
    error: ErrorInfo
    server_id: str | None = None


class ReadReply(Message):
    """A tensor's bytes: one buffer, C order, little-endian."""

    type: Literal["read_reply"] = "read_reply"
    request_id: RequestId
    shape: tuple[Dim, ...]
    dtype: DType
    nbytes: NBytes

    def buffer_sizes(self) -> tuple[int, ...]:
        return (self.nbytes,)


class SyncReply(Message):
    type: Literal["sync_reply"] = "sync_reply"
    request_id: RequestId


class StatsReply(Message):
    type: Literal["stats_reply"] = "stats_reply"
    request_id: RequestId
    tensors: int  # ids held by this session, failed ones included
    tensor_bytes: int  # bytes of the arrays this session holds
    failed: int  # ids marked failed
    server_tensor_bytes: int = 0  # bytes held by all sessions together (the budget in use)
    connections: int = 0  # open sessions on the server


class DescribeReply(Message):
    type: Literal["describe_reply"] = "describe_reply"
    request_id: RequestId
    shape: tuple[Dim, ...]
    dtype: DType


class ExposeReply(Message):
    """The capability for an :class:`Expose`: it expires ``ttl`` seconds after it was made."""

    type: Literal["expose_reply"] = "expose_reply"
    request_id: RequestId
    capability: Capability
    ttl: float


class RequestFailed(Message):
    """A request that could not be answered, e.g. a read of a tensor whose op failed."""

    type: Literal["request_failed"] = "request_failed"
    request_id: RequestId
    error: ErrorInfo


class SessionError(Message):
    """A failure of a client message that no request reports (e.g. a graph id in use); the
    session goes on where it can."""

    type: Literal["error"] = "error"
    error: ErrorInfo


class GraphRefused(Message):
    """The graph ``graph_id`` was not registered, for ``error``: sent, before the replies to
    the batch that carried the registration, only to a client that speaks the feature
    ``segments`` (a segment's registration must be known to hold before it is run)."""

    type: Literal["graph_refused"] = "graph_refused"
    graph_id: GraphId
    error: ErrorInfo


class Dropped(Message):
    """A client message the server could not use at all (undecodable, over a limit, a second
    hello): none of its ops ran and none of its requests will be answered. ``message`` is its
    number among the client's messages after the hello, counted from 1, so that the client
    fails exactly the requests it carried instead of waiting for them."""

    type: Literal["dropped"] = "dropped"
    message: Annotated[int, Field(ge=1, lt=2**63)]
    error: ErrorInfo


class Ack(Message):
    """The server has received the client's first ``received`` messages whole: the client
    may forget them. Sent, for a resumable session, after a message with large buffers and
    after every few messages that no reply acknowledged; not numbered, never sent again."""

    type: Literal["ack"] = "ack"
    received: Count


AnyServerMessage = (
    Welcome
    | Refused
    | ReadReply
    | SyncReply
    | StatsReply
    | DescribeReply
    | ExposeReply
    | RequestFailed
    | SessionError
    | GraphRefused
    | Dropped
    | Ack
)
ServerMessage = Annotated[AnyServerMessage, Field(discriminator="type")]

CLIENT_ADAPTER: TypeAdapter[Hello | Batch] = TypeAdapter(ClientMessage)
SERVER_ADAPTER: TypeAdapter[AnyServerMessage] = TypeAdapter(ServerMessage)
