"""Tensorwire protocol v2: messages, op catalogue, shape/dtype rules and the binary codec.

A pure library: no sockets, no event loop, no global state. Client and server both import it;
it imports neither (ARCHITECTURE.md, invariant 1; the import contracts in ``pyproject.toml``
check it).
"""

from __future__ import annotations

from .shadowing import refuse_shadowing

refuse_shadowing(__file__)  # before a sibling package's import can run a user's file

from .codec import MessageDecoder as MessageDecoder
from .codec import byte_view as byte_view
from .codec import decode as decode
from .codec import encode as encode
from .devices import CaptureSpec as CaptureSpec
from .devices import DeviceSpec as DeviceSpec
from .devices import NdArraySpec as NdArraySpec
from .devices import RemoteSpec as RemoteSpec
from .devices import parse_device_spec as parse_device_spec
from .dtypes import DTYPES as DTYPES
from .dtypes import DType as DType
from .dtypes import from_numpy as from_numpy
from .dtypes import to_numpy as to_numpy
from .errors import DecodeError as DecodeError
from .errors import DeviceSpecError as DeviceSpecError
from .errors import ErrorCode as ErrorCode
from .errors import ErrorInfo as ErrorInfo
from .errors import InvalidOpError as InvalidOpError
from .errors import MessageLimitError as MessageLimitError
from .errors import OpArgumentError as OpArgumentError
from .errors import OpDTypeError as OpDTypeError
from .errors import OpIndexError as OpIndexError
from .errors import OpShapeError as OpShapeError
from .errors import ProtocolError as ProtocolError
from .messages import CLIENT_ADAPTER as CLIENT_ADAPTER
from .messages import FEATURE_LIMITS as FEATURE_LIMITS
from .messages import FEATURE_NN as FEATURE_NN
from .messages import FEATURE_OPTIM as FEATURE_OPTIM
from .messages import FEATURE_RESUME as FEATURE_RESUME
from .messages import FEATURE_SEGMENTS as FEATURE_SEGMENTS
from .messages import FEATURES as FEATURES
from .messages import PROTOCOL_VERSION as PROTOCOL_VERSION
from .messages import SERVER_ADAPTER as SERVER_ADAPTER
from .messages import Ack as Ack
from .messages import Batch as Batch
from .messages import Claim as Claim
from .messages import Describe as Describe
from .messages import DescribeReply as DescribeReply
from .messages import Dropped as Dropped
from .messages import Expose as Expose
from .messages import ExposeReply as ExposeReply
from .messages import GraphRefused as GraphRefused
from .messages import Hello as Hello
from .messages import Read as Read
from .messages import ReadReply as ReadReply
from .messages import Refused as Refused
from .messages import RequestFailed as RequestFailed
from .messages import Resume as Resume
from .messages import SessionError as SessionError
from .messages import Stats as Stats
from .messages import StatsReply as StatsReply
from .messages import Sync as Sync
from .messages import SyncReply as SyncReply
from .messages import Welcome as Welcome
from .ops import AnyOp as AnyOp
from .ops import Op as Op
from .ops import TensorMeta as TensorMeta
from .version import distribution_version

__version__ = distribution_version()
