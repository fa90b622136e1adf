"""Graph files: what :meth:`Graph.save <client.capture.Graph.save>` writes and
:meth:`Graph.load <client.capture.Graph.load>` reads.

The format is the protocol's own message layout (``protocol.codec``): a u32 length, the graph
as a versioned JSON header (``protocol.graphs.GraphDef``: ``"type": "graph"``, ``"format": 1``),
then the constants' raw little-endian bytes. Nothing in a graph file is evaluated or unpickled.

A file is read in proportion to its size, whatever it holds. Its header is located element by
element (``protocol.stepwise``), its declarations validated whole, then its ops validated a
piece at a time and checked one by one (``protocol.graphs.GraphChecking``), each piece let go
once checked; a pydantic model of an op takes about ten times its JSON, so the ops are made
again, the same way, only when something needs them all (:class:`FileOps`). Each constant is
read straight into its own array, once the header's sizes are checked against the file's.
"""

from __future__ import annotations

import io
import math
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import TypeAdapter

from protocol import DecodeError, to_numpy
from protocol.codec import MAX_BUFFERS, MAX_HEADER, encode
from protocol.errors import GraphError
from protocol.graphs import GraphCheck, GraphChecking, GraphConstant, GraphDef
from protocol.ops import AnyOp
from protocol.ops.base import MAX_NDIM
from protocol.stepwise import Header, complete, read_header

from ..errors import GraphFileError

FILE_ADAPTER: TypeAdapter[GraphDef] = TypeAdapter(GraphDef)
MAX_FILE_BYTES = 2**40  # a guard against a length that cannot be a graph, not a policy
DECLARATIONS = ("inputs", "outputs", "constants")


@dataclass(frozen=True)
class FileOps:
    """A loaded file's ops, kept as their JSON (located once): :meth:`__iter__` validates them
    again, a piece at a time, exactly as the load did."""

    header: Header
    count: int

    def __iter__(self) -> Iterator[AnyOp]:
        for piece in self.header.pieces(FILE_ADAPTER, "ops"):
            yield from piece


@dataclass(frozen=True)
class GraphFile:
    """What a graph file holds: its declarations (a graph without its ops), its ops, what
    checking them found, and its constants' values in the order it declares them."""

    declared: GraphDef
    ops: FileOps
    op_counts: Counter[str]
    peak_bytes: int
    constants: list[np.ndarray[Any, Any]]


def write_graph_file(
    path: str | os.PathLike[str], definition: GraphDef, buffers: Sequence[memoryview]
) -> None:
    """Write ``definition`` and its constants' bytes (``buffers``, in order) to ``path``."""
    with open(path, "wb") as file:
        for chunk in encode(definition, buffers):
            file.write(chunk)


def read_graph_file(path: str | os.PathLike[str]) -> GraphFile:
    """The graph in ``path``, checked whole before it is returned.

    Raises:
        GraphFileError: the file is not a graph of this format, is truncated or has bytes
            to spare, or holds a graph that does not hold together.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size > MAX_FILE_BYTES:
            raise GraphFileError(f"{path}: {size} bytes is not a graph file")
        try:
            header = _read_header(file, size)
            declared, ops, check = _check(header)
            constants = _read_constants(file, declared.constants, size)
        except DecodeError as exc:
            raise GraphFileError(f"{path} is not a Tensorwire graph file: {exc}") from None
        except GraphError as exc:
            raise GraphFileError(
                f"{path} holds a graph that does not hold together: {exc}"
            ) from None
    return GraphFile(declared, ops, check.op_counts, check.peak_bytes, constants)


def _read_header(file: io.BufferedReader, size: int) -> Header:
    """The header, located (its length checked against the file's before it is read).

    Raises:
        DecodeError: no header, a truncated one, or one that is not a JSON object.
    """
    prefix = file.read(4)
    length = int.from_bytes(prefix, "little")
    if len(prefix) < 4 or 4 + length > size:
        raise DecodeError("truncated header")
    if not 1 <= length <= MAX_HEADER:
        raise DecodeError(f"header length {length} outside 1..{MAX_HEADER}")
    return complete(read_header(file.read(length)))


def _check(header: Header) -> tuple[GraphDef, FileOps, GraphCheck]:
    """The declarations, validated; the ops, validated and checked a piece at a time (the
    check keeps no op's metas).

    Raises:
        DecodeError: a declaration or an op is not valid.
        GraphError: the graph does not hold together.
    """
    declared = header.skeleton(FILE_ADAPTER).model_copy(
        update={
            key: [item for piece in header.pieces(FILE_ADAPTER, key) for item in piece]
            for key in DECLARATIONS
        }
    )
    if len(declared.constants) > MAX_BUFFERS:
        raise DecodeError(f"{len(declared.constants)} buffers exceed the limit of {MAX_BUFFERS}")
    checking = GraphChecking(declared, keep_op_metas=False)
    count = 0
    for piece in header.pieces(FILE_ADAPTER, "ops"):
        for op in piece:
            checking.add(op)
        count += len(piece)
    return declared, FileOps(header, count), checking.finish()


def _read_constants(
    file: io.BufferedReader, constants: Sequence[GraphConstant], size: int
) -> list[np.ndarray[Any, Any]]:
    """Each constant, read into an array of its own once their sizes add up to the file's.

    Raises:
        DecodeError: the file holds fewer bytes than the constants declare, or more.
        GraphError: numpy cannot make a constant of the shape it is declared.
    """
    start = file.tell()
    declared = sum(c.nbytes for c in constants)
    if start + declared > size:
        raise DecodeError(f"truncated message: {start + declared - size} buffer bytes missing")
    if start + declared < size:
        raise DecodeError(f"{size - start - declared} bytes more than the message declares")
    arrays = []
    for constant in constants:
        _check_makeable(constant)
        array = np.empty(constant.shape, dtype=to_numpy(constant.dtype).newbyteorder("<"))
        if file.readinto(array.reshape(-1).view(np.uint8).data) != array.nbytes:
            raise DecodeError("truncated message: the file ended while it was read")
        arrays.append(array)
    return arrays


def _check_makeable(constant: GraphConstant) -> None:
    """Refuse a constant whose shape numpy cannot make an array of: more than
    :data:`MAX_NDIM` dimensions, or nonzero dimensions whose product in bytes passes
    ``2**63 - 1`` (numpy refuses it even when another dimension is 0).

    Raises:
        GraphError: naming the constant.
    """
    nbytes = to_numpy(constant.dtype).itemsize * math.prod(d for d in constant.shape if d)
    if len(constant.shape) > MAX_NDIM or nbytes >= 2**63:
        raise GraphError(
            f"constant #{constant.id} is declared {constant.dtype}{list(constant.shape)}: numpy "
            f"cannot make an array of that shape ({MAX_NDIM} dimensions and 2**63 - 1 bytes at "
            "most)"
        )
