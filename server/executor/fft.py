"""The ``fft`` extension, with numpy.fft."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from protocol import to_numpy
from protocol.codec import Buffer
from protocol.ops import FFT

from .base import Array, Runner


def fft(op: FFT, args: Sequence[Array], buffers: Sequence[Buffer]) -> Array:
    (x,) = args
    fn: Any = getattr(np.fft, op.op)
    if op.op in ("fftshift", "ifftshift"):
        return np.asarray(fn(x, axes=op.axes))
    if op.op.endswith("n"):
        result = fn(x, s=op.n, axes=op.axes, norm=op.norm)
    else:
        n = op.n[0] if op.n else None
        result = fn(x, n=n, axis=op.axes[0] if op.axes else -1, norm=op.norm)
    real = op.op in ("irfft", "irfftn", "hfft")
    single = x.dtype in (np.float32, np.complex64)
    dtype = (
        ("float32" if single else "float64") if real else ("complex64" if single else "complex128")
    )
    return np.asarray(result).astype(to_numpy(dtype), copy=False)  # type: ignore[arg-type]


RUNNERS: dict[type, Runner] = {FFT: fft}
