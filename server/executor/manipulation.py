"""Manipulation and indexing: reshape, permute_dims, getitem."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol.codec import Buffer
from protocol.ops import GetItem, PermuteDims, Reshape

Array = np.ndarray[Any, Any]


def reshape(op: Reshape, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.reshape(args[0], op.shape)


def permute_dims(op: PermuteDims, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.transpose(args[0], op.axes)


def getitem(op: GetItem, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.asarray(args[0][op.numpy_key()])
