"""The neural-network extension: convolutions, pooling, batch normalization, softmax and
random numbers drawn on the device. The Array API standard has none of these; they are
Tensorwire's own ops (``client.nn.functional`` is their front), with the backward ops that
autodiff needs (``conv_transpose`` is also convolution's input gradient, ``conv_weight_grad``
its weight gradient, ``pool_backward`` both poolings').

Layouts are PyTorch's: ``x`` is ``(N, C, *spatial)`` with one or more spatial dimensions
(``len(stride)`` of them), a convolution's weight ``(C_out, C_in / groups, *kernel)``, a
transposed convolution's ``(C_in, C_out / groups, *kernel)``. Padding is explicit, a
``(before, after)`` pair per spatial dimension (the client resolves ``"same"``). Every op
computes in its inputs' floating dtype (float32 or float64) and gives that dtype.

Random numbers are a pure function of a generator state, a ``uint64`` tensor ``[seed,
offset]`` kept on the device: ``random`` draws from numpy's Philox bit generator keyed by the
two words (counter 0), so the same state gives the same numbers on a server, on the
``ndarray`` device and on numpy in the client. Whoever draws advances the offset in place (an
ordinary in-place add), so that a replayed step draws fresh numbers each time.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field

from ..dtypes import DType, is_floating
from ..errors import OpDTypeError, OpShapeError
from .base import I64, BaseOp, Dim, TensorId, TensorMeta, check_shape, normalize_axis

MAX_SPATIAL = 3  # 1-D, 2-D and 3-D convolutions and poolings
Positive = Annotated[int, Field(ge=1, lt=2**31)]
Padding = tuple[Annotated[int, Field(ge=0, lt=2**31)], Annotated[int, Field(ge=0, lt=2**31)]]
FloatDType = Literal["float32", "float64"]


def _float(name: str, *dtypes: DType) -> DType:
    """The one floating dtype of an op's inputs."""
    if any(not is_floating(d) for d in dtypes) or len(set(dtypes)) != 1:
        raise OpDTypeError(f"{name} needs inputs of one floating dtype, not {', '.join(dtypes)}")
    return dtypes[0]


def _spatial(name: str, x: TensorMeta, dims: int) -> tuple[int, int, tuple[int, ...]]:
    """``(N, C, spatial)`` of ``x``, which must have ``dims`` spatial dimensions."""
    if not 1 <= dims <= MAX_SPATIAL:
        raise OpShapeError(f"{name} takes 1 to {MAX_SPATIAL} spatial dimensions, not {dims}")
    if len(x.shape) != dims + 2:
        raise OpShapeError(
            f"{name} with {dims} spatial dimension(s) needs an input of {dims + 2} dimensions "
            f"(N, C, ...), not shape {x.shape}"
        )
    return x.shape[0], x.shape[1], x.shape[2:]


def _same_length(name: str, dims: int, **fields: tuple[object, ...]) -> None:
    for field, values in fields.items():
        if len(values) != dims:
            raise OpShapeError(f"{name}: {field} has {len(values)} entries for {dims} dimensions")


def conv_length(length: int, kernel: int, stride: int, pad: Padding, dilation: int) -> int:
    """A convolution's (or pooling's) output length along one dimension; negative when the
    window does not fit."""
    span = dilation * (kernel - 1) + 1
    room = length + pad[0] + pad[1] - span
    return room // stride + 1 if room >= 0 else -1


def conv_transpose_length(
    length: int, kernel: int, stride: int, pad: Padding, dilation: int, extra: int
) -> int:
    """A transposed convolution's output length: the full scatter, cropped by ``pad`` and
    grown by ``extra`` (PyTorch's ``output_padding``) at the end."""
    return (length - 1) * stride + dilation * (kernel - 1) + 1 - pad[0] - pad[1] + extra


class Conv(BaseOp):
    """A convolution (cross-correlation, as PyTorch's), its transpose, or its weight gradient.

    - ``conv``: ``x`` (N, C_in, *L), ``w`` the weight (C_out, C_in/groups, *k) -> (N, C_out, *L');
    - ``conv_transpose``: ``x`` (N, C_in, *L), ``w`` (C_in, C_out/groups, *k) -> (N, C_out, *L'),
      the adjoint of ``conv`` with the same parameters (its input gradient);
    - ``conv_weight_grad``: ``x`` the convolution's input, ``w`` the gradient of its output
      (N, C_out, *L') -> the weight's gradient (C_out, C_in/groups, *kernel).
    """

    kind: Literal["conv"] = "conv"
    op: Literal["conv", "conv_transpose", "conv_weight_grad"] = "conv"
    x: TensorId
    w: TensorId
    stride: tuple[Positive, ...]
    padding: tuple[Padding, ...]
    dilation: tuple[Positive, ...]
    groups: Positive = 1
    output_padding: tuple[Annotated[int, Field(ge=0, lt=2**31)], ...] = ()  # conv_transpose
    kernel: tuple[Positive, ...] = ()  # conv_weight_grad: the weight's spatial shape

    def inputs(self) -> tuple[int, ...]:
        return (self.x, self.w)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        x, w = args
        dims = len(self.stride)
        n, c_in, lengths = _spatial(self.op, x, dims)
        _same_length(self.op, dims, padding=self.padding, dilation=self.dilation)
        dtype = _float(self.op, x.dtype, w.dtype)
        g = self.groups
        if c_in % g:
            raise OpShapeError(f"{self.op}: {c_in} input channels do not split into {g} groups")
        if self.op == "conv_weight_grad":
            return self._weight_grad(x, w, dtype)
        if len(w.shape) != dims + 2:
            raise OpShapeError(f"{self.op}: a weight of {dims + 2} dimensions, not {w.shape}")
        kernel = w.shape[2:]
        if self.op == "conv":
            c_out, per_group = w.shape[0], w.shape[1]
            if per_group * g != c_in or c_out % g:
                raise OpShapeError(
                    f"conv: weight {w.shape} does not fit {c_in} input channels in {g} groups"
                )
            out = tuple(map(conv_length, lengths, kernel, self.stride, self.padding, self.dilation))
        else:
            extra = self.output_padding or (0,) * dims
            _same_length(self.op, dims, output_padding=extra)
            if w.shape[0] != c_in:
                raise OpShapeError(f"conv_transpose: weight {w.shape} does not fit {c_in} channels")
            c_out = w.shape[1] * g
            out = tuple(
                map(
                    conv_transpose_length,
                    lengths,
                    kernel,
                    self.stride,
                    self.padding,
                    self.dilation,
                    extra,
                )
            )
        if any(d < 0 for d in out):
            raise OpShapeError(f"{self.op}: kernel {kernel} does not fit input {lengths}")
        return TensorMeta(check_shape((n, c_out, *out)), dtype)

    def _weight_grad(self, x: TensorMeta, g: TensorMeta, dtype: DType) -> TensorMeta:
        dims = len(self.stride)
        _same_length(self.op, dims, kernel=self.kernel)
        lengths = x.shape[2:]
        out = tuple(
            map(conv_length, lengths, self.kernel, self.stride, self.padding, self.dilation)
        )
        c_out = g.shape[1] if len(g.shape) == dims + 2 else -1
        if g.shape != (x.shape[0], c_out, *out) or c_out % self.groups:
            raise OpShapeError(
                f"conv_weight_grad: output gradient {g.shape} does not fit input {x.shape}"
            )
        return TensorMeta((c_out, x.shape[1] // self.groups, *self.kernel), dtype)


class Pool(BaseOp):
    """Max or average pooling over the spatial dimensions of ``x`` (N, C, *L). ``padding`` is
    symmetric, at most half the kernel (PyTorch's rule); max pooling pads with -inf, average
    pooling with zeros, counted in the divisor when ``count_include_pad`` (PyTorch's
    default)."""

    kind: Literal["pool"] = "pool"
    op: Literal["max", "avg"]
    x: TensorId
    kernel: tuple[Positive, ...]
    stride: tuple[Positive, ...]
    padding: tuple[Annotated[int, Field(ge=0, lt=2**31)], ...]
    count_include_pad: bool = True

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def name(self) -> str:
        return f"{self.op}_pool"  # max alone would read as the reduction

    def infer(self, *args: TensorMeta) -> TensorMeta:
        return TensorMeta(pooled_shape(self, args[0]), _float(self.name(), args[0].dtype))


def pooled_shape(op: Pool | PoolBackward, x: TensorMeta) -> tuple[int, ...]:
    dims = len(op.kernel)
    name = f"{op.op}_pool"
    n, c, lengths = _spatial(name, x, dims)
    _same_length(name, dims, stride=op.stride, padding=op.padding)
    if any(2 * p > k for p, k in zip(op.padding, op.kernel, strict=True)):
        raise OpShapeError(f"{name}: padding {op.padding} exceeds half of kernel {op.kernel}")
    out = tuple(
        conv_length(n_, k, s, (p, p), 1)
        for n_, k, s, p in zip(lengths, op.kernel, op.stride, op.padding, strict=True)
    )
    if any(d < 1 for d in out):
        raise OpShapeError(f"{name}: kernel {op.kernel} does not fit input {lengths}")
    return (n, c, *out)


class PoolBackward(BaseOp):
    """The gradient of :class:`Pool` with respect to its input: ``grad`` (the pooled output's
    gradient) spread back over ``x``'s shape. Max pooling gives each window's gradient to the
    window's first largest element, as PyTorch does."""

    kind: Literal["pool_backward"] = "pool_backward"
    op: Literal["max", "avg"]
    x: TensorId
    grad: TensorId
    kernel: tuple[Positive, ...]
    stride: tuple[Positive, ...]
    padding: tuple[Annotated[int, Field(ge=0, lt=2**31)], ...]
    count_include_pad: bool = True

    def inputs(self) -> tuple[int, ...]:
        return (self.x, self.grad)

    def name(self) -> str:
        return f"{self.op}_pool_backward"

    def infer(self, *args: TensorMeta) -> TensorMeta:
        x, grad = args
        dtype = _float(f"{self.op}_pool backward", x.dtype, grad.dtype)
        if grad.shape != pooled_shape(self, x):
            raise OpShapeError(f"{self.op}_pool backward: gradient {grad.shape} does not fit {x}")
        return TensorMeta(x.shape, dtype)


class BatchNorm(BaseOp):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over channel axis 1 of ``x`` (N, C,
    ...), with ``mean``, ``var``, ``weight`` and ``bias`` of shape (C,); ``weight`` and
    ``bias`` may be left out (an affine-free batch norm). ONNX's ``BatchNormalization``."""

    kind: Literal["batch_norm"] = "batch_norm"
    x: TensorId
    mean: TensorId
    var: TensorId
    weight: TensorId | None = None
    bias: TensorId | None = None
    eps: float = 1e-5

    def inputs(self) -> tuple[int, ...]:
        optional = tuple(i for i in (self.weight, self.bias) if i is not None)
        return (self.x, self.mean, self.var, *optional)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        x, *stats = args
        dtype = _float("batch_norm", x.dtype, *(s.dtype for s in stats))
        if len(x.shape) < 2:
            raise OpShapeError(f"batch_norm needs (N, C, ...), not shape {x.shape}")
        if any(s.shape != (x.shape[1],) for s in stats):
            shapes = ", ".join(str(s.shape) for s in stats)
            raise OpShapeError(f"batch_norm: statistics of shape ({x.shape[1]},), not {shapes}")
        if not math.isfinite(self.eps) or self.eps < 0:
            raise OpShapeError(f"batch_norm: eps must be finite and non-negative, not {self.eps}")
        return TensorMeta(x.shape, dtype)


class Softmax(BaseOp):
    """``softmax`` or ``log_softmax`` along ``axis``, computed stably (the maximum taken out)."""

    kind: Literal["softmax"] = "softmax"
    op: Literal["softmax", "log_softmax"] = "softmax"
    x: TensorId
    axis: I64 = -1

    def inputs(self) -> tuple[int, ...]:
        return (self.x,)

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (x,) = args
        normalize_axis(self.axis, len(x.shape))
        return TensorMeta(x.shape, _float(self.op, x.dtype))


class Random(BaseOp):
    """``shape`` numbers drawn from the generator state ``state`` (a ``uint64`` tensor
    ``[seed, offset]``): ``uniform`` on [0, 1) or ``normal`` (standard), in ``dtype``. The
    state is read, not changed: the caller advances its offset."""

    kind: Literal["random"] = "random"
    op: Literal["uniform", "normal"] = "uniform"
    state: TensorId
    shape: tuple[Dim, ...]
    dtype: FloatDType = "float32"

    def inputs(self) -> tuple[int, ...]:
        return (self.state,)

    def name(self) -> str:
        return f"random_{self.op}"

    def infer(self, *args: TensorMeta) -> TensorMeta:
        (state,) = args
        if state.shape != (2,) or state.dtype != "uint64":
            raise OpShapeError(f"random: a generator state is uint64 of shape (2,), not {state}")
        return TensorMeta(check_shape(self.shape), self.dtype)
