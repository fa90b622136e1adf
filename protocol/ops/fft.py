"""The ``fft`` extension: one op family (every function but the two frequency helpers, which the
client computes itself)."""

from __future__ import annotations

from typing import Literal

from ..dtypes import is_complex, is_floating
from ..errors import OpDTypeError, OpShapeError
from .base import I64, MultiOutputOp, TensorId, TensorMeta, normalize_axes, normalize_axis
from .rules import complex_dtype, real_dtype

FFTName = Literal[
    "fft",
    "ifft",
    "fftn",
    "ifftn",
    "rfft",
    "irfft",
    "rfftn",
    "irfftn",
    "hfft",
    "ihfft",
    "fftshift",
    "ifftshift",
]


class FFT(MultiOutputOp):
    """One function of ``fft``. ``n`` lists the output lengths (``n`` or ``s``) along ``axes``;
    the 1-D functions take one axis."""

    kind: Literal["fft"] = "fft"
    op: FFTName
    x: TensorId
    n: tuple[I64 | None, ...] | None = None
    axes: tuple[I64, ...] | None = None
    norm: Literal["backward", "ortho", "forward"] = "backward"

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def _infer_all(self, *args: TensorMeta) -> tuple[TensorMeta, ...]:
        (x,) = args
        if self.op in ("fftshift", "ifftshift"):
            normalize_axes(self.axes, len(x.shape))
            return (x,)
        if x.dtype == "bool" or not (is_floating(x.dtype) or is_complex(x.dtype)):
            raise OpDTypeError(f"fft.{self.op} needs a floating-point array, not {x.dtype}")
        if self.op in ("rfft", "rfftn", "ihfft") and is_complex(x.dtype):
            raise OpDTypeError(f"fft.{self.op} needs a real array")
        nd = self.op.endswith("n")
        axes = normalize_axes(self.axes, len(x.shape)) if nd else self._one_axis(x)
        if len(set(axes)) != len(axes) or not axes and x.shape == ():
            raise OpShapeError(f"fft.{self.op} needs distinct axes of a non-0-d array")
        lengths = self.n or (None,) * len(axes)
        if len(lengths) != len(axes):
            raise OpShapeError(f"fft.{self.op}: s and axes differ in length")
        shape = list(x.shape)
        for i, (axis, n) in enumerate(zip(axes, lengths, strict=True)):
            last = i == len(axes) - 1
            shape[axis] = self._length(shape[axis], n, last)
        real_out = self.op in ("irfft", "irfftn", "hfft")
        dtype = real_dtype(x.dtype) if real_out else complex_dtype(x.dtype)
        return (TensorMeta(tuple(shape), dtype),)

    def _one_axis(self, x: TensorMeta) -> tuple[int, ...]:
        if len(x.shape) == 0:
            raise OpShapeError(f"fft.{self.op} needs at least one dimension")
        axis = self.axes[0] if self.axes else -1
        return (normalize_axis(axis, len(x.shape)),)

    def _length(self, m: int, n: int | None, last: bool) -> int:
        if n is not None and n < 1:
            raise OpShapeError(f"fft.{self.op}: invalid length {n}")
        if self.op in ("irfft", "hfft") or (self.op == "irfftn" and last):
            out = n if n is not None else 2 * (m - 1)
        elif self.op in ("rfft", "ihfft") or (self.op == "rfftn" and last):
            out = (n if n is not None else m) // 2 + 1
        else:
            out = n if n is not None else m
        if out < 1 or (n is None and m < 1):
            raise OpShapeError(f"fft.{self.op}: invalid length along an axis of {m}")
        return out
