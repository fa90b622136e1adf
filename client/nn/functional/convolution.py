"""Convolutions with PyTorch's signatures: ``conv1d``, ``conv2d`` and ``conv_transpose2d``
(cross-correlations, as PyTorch's, over ``(N, C, *spatial)`` inputs).

PyTorch's arguments (an int or one per dimension, ``padding="same"``/``"valid"``) are
resolved here into the explicit ones of the ``conv`` op (a ``(before, after)`` padding pair
per dimension), and checked first, so that a mistake names the function and the argument.
An unbatched input (no N axis) is taken as a batch of one, as PyTorch does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from client.autodiff import Autodiff, Tensor

from .arguments import (
    ArrayLike,
    as_tensor,
    batched,
    check_groups,
    check_same_dtype,
    check_vector,
    namespace_of,
    optional_tensor,
    per_dimension,
    sizes,
    unbatched,
)

Padding = str | int | Sequence[int]
Pair = tuple[int, int]


def conv1d(
    input: ArrayLike,
    weight: ArrayLike,
    bias: ArrayLike | None = None,
    stride: int | Sequence[int] = 1,
    padding: Padding = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> Tensor:
    """A 1-D convolution of ``input`` (N, C_in, L) with ``weight`` (C_out, C_in/groups, k)."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(
    input: ArrayLike,
    weight: ArrayLike,
    bias: ArrayLike | None = None,
    stride: int | Sequence[int] = 1,
    padding: Padding = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> Tensor:
    """A 2-D convolution of ``input`` (N, C_in, H, W) with ``weight`` (C_out, C_in/groups, kH,
    kW). ``padding`` is an int, one per dimension, ``"valid"`` (none) or ``"same"`` (the
    output as large as the input: for an even kernel the extra row and column go after, as
    PyTorch pads; refused with a stride, as PyTorch does)."""
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv_transpose2d(
    input: ArrayLike,
    weight: ArrayLike,
    bias: ArrayLike | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    output_padding: int | Sequence[int] = 0,
    groups: int = 1,
    dilation: int | Sequence[int] = 1,
) -> Tensor:
    """The transposed 2-D convolution (the adjoint of ``conv2d``, "deconvolution") of
    ``input`` (N, C_in, H, W) with ``weight`` (C_in, C_out/groups, kH, kW), PyTorch's argument
    order (``groups`` before ``dilation``). ``padding`` crops the output on both sides,
    ``output_padding`` grows it at the end (it picks among the output sizes a strided
    ``conv2d`` maps to one input size): each must be below the stride or the dilation."""
    name, dims = "conv_transpose2d", 2
    ad, x, w, b, was_unbatched = _operands(name, dims, input, weight, bias)
    strides = per_dimension(name, "stride", stride, dims)
    dilations = per_dimension(name, "dilation", dilation, dims)
    pads = per_dimension(name, "padding", padding, dims, minimum=0)
    extra = per_dimension(name, "output_padding", output_padding, dims, minimum=0)
    g = check_groups(name, groups)
    (_, c_in, *lengths), (w_in, w_out, *kernel) = sizes(x), sizes(w)
    if w_in != c_in or c_in % g:
        raise ValueError(
            f"{name}: weight of shape {w.shape} expects {w.shape[0]} input channels "
            f"(C_in, C_out/groups, kH, kW), in {g} group(s); the input has {c_in}"
        )
    check_vector(name, "bias", b, w_out * g)
    for o, s, d in zip(extra, strides, dilations, strict=True):
        if o >= s and o >= d:
            raise ValueError(
                f"{name}: output_padding {extra} must be smaller than the stride {strides} "
                f"or the dilation {dilations}"
            )
    out = transposed_sizes(lengths, strides, pads, dilations, kernel, extra)
    if min(out) < 1:
        raise ValueError(
            f"{name}: padding {pads} leaves no output for input {lengths} and kernel {kernel}"
        )
    y: Tensor = ad.conv_transpose(
        x,
        w,
        b,
        stride=strides,
        padding=tuple((p, p) for p in pads),
        output_padding=extra,
        dilation=dilations,
        groups=g,
    )
    return unbatched(y, was_unbatched)


def transposed_sizes(
    lengths: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    kernel: Sequence[int],
    extra: Sequence[int],
) -> list[int]:
    """The spatial sizes of a transposed convolution's output: each input position's window
    scattered, cropped by ``pads`` on both sides and grown by ``extra`` (output_padding)."""
    return [
        (n - 1) * s - 2 * p + d * (k - 1) + o + 1
        for n, s, p, d, k, o in zip(lengths, strides, pads, dilations, kernel, extra, strict=True)
    ]


def _conv(
    name: str,
    dims: int,
    input: ArrayLike,
    weight: ArrayLike,
    bias: ArrayLike | None,
    stride: int | Sequence[int],
    padding: Padding,
    dilation: int | Sequence[int],
    groups: int,
) -> Tensor:
    ad, x, w, b, was_unbatched = _operands(name, dims, input, weight, bias)
    strides = per_dimension(name, "stride", stride, dims)
    dilations = per_dimension(name, "dilation", dilation, dims)
    g = check_groups(name, groups)
    (_, c_in, *lengths), (c_out, per_group, *kernel) = sizes(x), sizes(w)
    if c_out % g or per_group * g != c_in:
        raise ValueError(
            f"{name}: weight of shape {w.shape} in {g} group(s) expects "
            f"{per_group * g} input channels and a C_out divisible by {g}; "
            f"the input has {c_in} channels"
        )
    check_vector(name, "bias", b, c_out)
    pads = _resolved_padding(name, padding, tuple(kernel), strides, dilations)
    for n, (lo, hi), d, k in zip(lengths, pads, dilations, kernel, strict=True):
        if n + lo + hi < d * (k - 1) + 1:
            raise ValueError(
                f"{name}: the kernel {kernel} (dilation {dilations}) is larger than the padded "
                f"input {lengths} (padding {pads})"
            )
    y: Tensor = ad.conv(x, w, b, stride=strides, padding=pads, dilation=dilations, groups=g)
    return unbatched(y, was_unbatched)


def _operands(
    name: str, dims: int, input: ArrayLike, weight: ArrayLike, bias: ArrayLike | None
) -> tuple[Autodiff, Tensor, Tensor, Tensor | None, bool]:
    """The namespace, the input (batched), weight and bias as tensors, and whether the input
    was unbatched."""
    ad = namespace_of(weight, input, bias)  # the weight's: where the model lives
    x, w, b = as_tensor(ad, input), as_tensor(ad, weight), optional_tensor(ad, bias)
    if w.ndim != dims + 2:
        raise ValueError(f"{name}: the weight must be {dims + 2}-D, got shape {w.shape}")
    x, was_unbatched = batched(name, x, dims)
    check_same_dtype(name, x, weight=w, bias=b)
    return ad, x, w, b, was_unbatched


def _resolved_padding(
    name: str,
    padding: Any,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
) -> tuple[Pair, ...]:
    """PyTorch's ``padding`` as a ``(before, after)`` pair per dimension."""
    if padding == "valid":
        return tuple((0, 0) for _ in kernel)
    if padding == "same":
        if any(s != 1 for s in strides):
            raise ValueError(f"{name}: padding='same' is not supported for strided convolutions")
        totals = [d * (k - 1) for d, k in zip(dilations, kernel, strict=True)]
        return tuple((t // 2, t - t // 2) for t in totals)  # the odd one after, as PyTorch's
    if isinstance(padding, str):
        raise ValueError(f"{name}: padding must be 'valid', 'same', or ints, not {padding!r}")
    pads = per_dimension(name, "padding", padding, len(kernel), minimum=0)
    return tuple((p, p) for p in pads)
