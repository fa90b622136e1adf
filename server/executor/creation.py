"""Creation ops: from_buffer, full, arange, eye, linspace."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from protocol import InvalidOpError, to_numpy
from protocol.codec import Buffer
from protocol.ops import AnyOp, Arange, Eye, FromBuffer, Full, Linspace
from protocol.scalars import scalar_to_python

from .base import Array, Runner


def from_buffer(op: FromBuffer, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    if op.buffer >= len(buffers):
        raise InvalidOpError(f"buffer {op.buffer} does not exist ({len(buffers)} in message)")
    data = buffers[op.buffer]
    if len(data) != op.nbytes():
        raise InvalidOpError(
            f"buffer {op.buffer} has {len(data)} bytes; shape {list(op.shape)} of {op.dtype} "
            f"needs {op.nbytes()}"
        )
    if isinstance(data, np.ndarray):  # a view whose base is the buffer (see Session._owned)
        return data.view(to_numpy(op.dtype)).reshape(op.shape)
    return np.frombuffer(data, dtype=to_numpy(op.dtype)).reshape(op.shape)


def uploads_kept_apart(ops: Sequence[AnyOp], buffers: Sequence[Buffer]) -> Sequence[Buffer]:
    """``buffers``, each one that two or more ``from_buffer`` ops of the batch name handed as
    a read-only memoryview, which every such op copies (``Outcomes._owned``).

    An upload is zero-copy when its buffer is an array the decoder allocated (a fragmented
    message): the tensor *is* the buffer. Were two uploads of one buffer both that array, a
    write into the first (``setitem``) would reach the second, made before or after it.
    Copying only the buffers named twice costs an honest client nothing (it names each once);
    moving written memory instead (``TensorStore.prepare_write``) would cost a copy for every
    tensor written in the batch that uploaded it. A message that arrived whole has memoryview
    buffers (the decoder makes all of one kind), which are copied anyway: no scan then.
    """
    if not buffers or not isinstance(buffers[0], np.ndarray):
        return buffers
    named = Counter(op.buffer for op in ops if isinstance(op, FromBuffer))
    shared = [index for index, uses in named.items() if uses > 1 and index < len(buffers)]
    if not shared:
        return buffers
    apart = list(buffers)
    for index in shared:
        buffer = buffers[index]
        apart[index] = (buffer.data if isinstance(buffer, np.ndarray) else buffer).toreadonly()
    return apart


def full(op: Full, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.full(op.shape, scalar_to_python(op.value), dtype=to_numpy(op.dtype))


def arange(op: Arange, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    # Note: computed in numpy's natural dtype (int64 or float64), then cast, so that the length
    # is always ceil((stop - start) / step), as inferred.
    # numpy computes the length in C and can overflow where the exact length is 0.
    if op.length() == 0:
        return np.empty((0,), dtype=to_numpy(op.dtype))
    return np.arange(op.start, op.stop, op.step).astype(to_numpy(op.dtype), copy=False)


def eye(op: Eye, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    return np.eye(op.n_rows, op.n_cols, k=op.k, dtype=to_numpy(op.dtype))


def linspace(op: Linspace, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    dtype = to_numpy(op.dtype)
    if dtype.kind == "c":
        start: complex | float = complex(op.start, op.start_imag)
        stop: complex | float = complex(op.stop, op.stop_imag)
    else:
        start, stop = op.start, op.stop
    return np.linspace(start, stop, op.num, endpoint=op.endpoint, dtype=dtype)


RUNNERS: dict[type, Runner] = {
    FromBuffer: from_buffer,
    Full: full,
    Arange: arange,
    Eye: eye,
    Linspace: linspace,
}
