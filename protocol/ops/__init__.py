"""The op catalogue: one module per op family, over one base (``base``) and one set of dtype
rules (``rules``). The families mirror the server's executor (``server/executor/``) and the
client's categories of the Array API standard:

- ``creation``: ``from_buffer``, ``full``, ``arange``, ``eye``, ``linspace``
- ``elementwise``: ``unary``, ``binary`` (``matmul`` included), ``binary_scalar``,
  ``binary_inplace``, ``binary_inplace_scalar``, ``where``, ``astype``
- ``reduction``: ``reduce``
- ``manipulation``: ``reshape``, ``permute_dims``, ``join``, ``axes``, ``roll``, ``moveaxis``,
  ``broadcast_to``, ``tile``, ``repeat``, ``triangle``
- ``indexing``: ``getitem``, ``setitem``, ``take``
- ``data``: ``sort``, ``cumulative``, ``searchsorted``, ``nonzero``, ``unique``
- ``linalg``, ``fft``: the standard's two extensions
- ``nn``: Tensorwire's own extension for neural networks: ``conv`` (with its transpose and
  weight gradient), ``pool``, ``pool_backward``, ``batch_norm``, ``softmax``, ``random``
- ``optim``: Tensorwire's own extension for optimizers: ``moment_update`` (in place) and
  ``adam_direction``, Adam's per-parameter chains as one op each
- ``graph``: ``run_graph``, a registered graph (``protocol.graphs``) run on new inputs, and
  ``run_segment``, one run as if its ops came one by one (``client._segments``)
- ``transfer``: ``pull``, a tensor fetched from another session's exposure (no executor runner:
  the server's transfers run it)

Adding an op: its model (with its inference rule) in one family module, its name in
:data:`AnyOp` below, its runner in the executor's module of the same name.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import I64 as I64
from .base import MAX_NDIM as MAX_NDIM
from .base import UNKNOWN as UNKNOWN
from .base import BaseOp as BaseOp
from .base import Dim as Dim
from .base import MultiOutputOp as MultiOutputOp
from .base import TensorId as TensorId
from .base import TensorMeta as TensorMeta
from .base import broadcast_shapes as broadcast_shapes
from .base import numel as numel
from .creation import Arange as Arange
from .creation import Eye as Eye
from .creation import FromBuffer as FromBuffer
from .creation import Full as Full
from .creation import Linspace as Linspace
from .data import Cumulative as Cumulative
from .data import Nonzero as Nonzero
from .data import SearchSorted as SearchSorted
from .data import Sort as Sort
from .data import Unique as Unique
from .elementwise import AsType as AsType
from .elementwise import Binary as Binary
from .elementwise import BinaryName as BinaryName
from .elementwise import BinaryScalar as BinaryScalar
from .elementwise import InPlaceBinary as InPlaceBinary
from .elementwise import InPlaceBinaryScalar as InPlaceBinaryScalar
from .elementwise import Unary as Unary
from .elementwise import UnaryName as UnaryName
from .elementwise import Where as Where
from .fft import FFT as FFT
from .graph import GraphId as GraphId
from .graph import RunGraph as RunGraph
from .graph import RunSegment as RunSegment
from .indexing import ArrayIndex as ArrayIndex
from .indexing import GetItem as GetItem
from .indexing import IndexItem as IndexItem
from .indexing import SetItem as SetItem
from .indexing import SliceSpec as SliceSpec
from .indexing import Take as Take
from .linalg import Linalg as Linalg
from .manipulation import Axes as Axes
from .manipulation import BroadcastTo as BroadcastTo
from .manipulation import Join as Join
from .manipulation import MoveAxis as MoveAxis
from .manipulation import PermuteDims as PermuteDims
from .manipulation import Repeat as Repeat
from .manipulation import Reshape as Reshape
from .manipulation import Roll as Roll
from .manipulation import Tile as Tile
from .manipulation import Triangle as Triangle
from .nn import BatchNorm as BatchNorm
from .nn import Conv as Conv
from .nn import Pool as Pool
from .nn import PoolBackward as PoolBackward
from .nn import Random as Random
from .nn import Softmax as Softmax
from .optim import AdamDirection as AdamDirection
from .optim import MomentUpdate as MomentUpdate
from .reduction import Reduce as Reduce
from .reduction import ReduceName as ReduceName
from .transfer import Capability as Capability
from .transfer import Pull as Pull
from .transfer import SourceURL as SourceURL

AnyOp = (
    FromBuffer
    | Full
    | Arange
    | Eye
    | Linspace  # creation
    | Unary
    | Binary
    | BinaryScalar
    | InPlaceBinary
    | InPlaceBinaryScalar
    | Where
    | AsType  # elementwise
    | Reduce  # reduction
    | Reshape
    | PermuteDims
    | Join
    | Axes
    | Roll
    | MoveAxis
    | BroadcastTo
    | Tile
    | Repeat
    | Triangle  # manipulation
    | GetItem
    | SetItem
    | Take  # indexing
    | Sort
    | Cumulative
    | SearchSorted
    | Nonzero
    | Unique  # data
    | Linalg  # linalg
    | FFT  # fft
    | Conv
    | Pool
    | PoolBackward
    | BatchNorm
    | Softmax
    | Random  # nn
    | MomentUpdate
    | AdamDirection  # optim
    | RunGraph
    | RunSegment  # graph
    | Pull  # transfer
)
Op = Annotated[AnyOp, Field(discriminator="kind")]
