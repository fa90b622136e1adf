"""Pooling with PyTorch's signatures: ``max_pool2d`` and ``avg_pool2d`` over ``(N, C, H, W)``
inputs (or ``(C, H, W)``, one sample).

The ``pool`` op pads symmetrically, at most half the kernel (PyTorch's rule), and rounds the
output size down: ``ceil_mode=True``, dilation and ``divisor_override`` are refused here with
a message rather than computed differently from PyTorch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from client.autodiff import Tensor

from .arguments import ArrayLike, as_tensor, batched, namespace_of, per_dimension, sizes, unbatched

Size = int | Sequence[int]


def max_pool2d(
    input: ArrayLike,
    kernel_size: Size,
    stride: Size | None = None,
    padding: Size = 0,
    dilation: Size = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor:
    """The maximum of each ``kernel_size`` window, moved by ``stride`` (the kernel size by
    default), over the input padded with -inf by ``padding`` on each side. The gradient goes
    to each window's first largest element, as PyTorch's."""
    name = "max_pool2d"
    if per_dimension(name, "dilation", dilation, 2) != (1, 1):
        raise ValueError(f"{name}: dilation {dilation!r} is not supported; only 1")
    if return_indices:
        raise ValueError(f"{name}: return_indices=True is not supported")
    return _pool(name, "max", input, kernel_size, stride, padding, ceil_mode, True)


def avg_pool2d(
    input: ArrayLike,
    kernel_size: Size,
    stride: Size | None = None,
    padding: Size = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """The mean of each ``kernel_size`` window, moved by ``stride`` (the kernel size by
    default), over the input padded with zeros by ``padding`` on each side; the padding
    counts in the divisor when ``count_include_pad`` (PyTorch's default)."""
    name = "avg_pool2d"
    if divisor_override is not None:
        raise ValueError(f"{name}: divisor_override is not supported; leave it None")
    return _pool(name, "avg", input, kernel_size, stride, padding, ceil_mode, count_include_pad)


def _pool(
    name: str,
    op: Literal["max", "avg"],
    input: ArrayLike,
    kernel_size: Size,
    stride: Size | None,
    padding: Size,
    ceil_mode: bool,
    count_include_pad: bool,
) -> Tensor:
    if ceil_mode:
        raise ValueError(
            f"{name}: ceil_mode=True is not supported: the output size is rounded down "
            "(ceil_mode=False, PyTorch's default)"
        )
    ad = namespace_of(input)
    x, was_unbatched = batched(name, as_tensor(ad, input), 2)
    kernel = per_dimension(name, "kernel_size", kernel_size, 2)
    strides = kernel if stride is None or stride == () else per_dimension(name, "stride", stride, 2)
    pads = per_dimension(name, "padding", padding, 2, minimum=0)
    if any(2 * p > k for p, k in zip(pads, kernel, strict=True)):
        raise ValueError(
            f"{name}: padding {pads} should be at most half of the kernel size {kernel}"
        )
    lengths = sizes(x)[2:]
    if any(n + 2 * p < k for n, p, k in zip(lengths, pads, kernel, strict=True)):
        raise ValueError(
            f"{name}: the kernel {kernel} is larger than the padded input {lengths} "
            f"(padding {pads})"
        )
    pool = ad.max_pool if op == "max" else ad.avg_pool
    options = {} if op == "max" else {"count_include_pad": bool(count_include_pad)}
    y: Tensor = pool(x, kernel=kernel, stride=strides, padding=pads, **options)
    return unbatched(y, was_unbatched)
