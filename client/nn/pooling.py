"""The pooling layers: ``MaxPool2d`` and ``AvgPool2d``, with PyTorch's arguments (their
functions, ``F.max_pool2d`` and ``F.avg_pool2d``, say what is supported)."""

from __future__ import annotations

from collections.abc import Sequence

from client.autodiff import Tensor

from . import functional as F
from .functional import ArrayLike
from .module import Module

Size = int | Sequence[int]


class MaxPool2d(Module):
    """The maximum of each ``kernel_size`` window of an (N, C, H, W) input, moved by
    ``stride`` (the kernel size by default)."""

    def __init__(
        self,
        kernel_size: Size,
        stride: Size | None = None,
        padding: Size = 0,
        dilation: Size = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.kernel_size, self.padding, self.dilation = kernel_size, padding, dilation
        self.stride = kernel_size if stride is None else stride
        self.return_indices, self.ceil_mode = return_indices, ceil_mode
        if return_indices or ceil_mode or dilation not in (1, (1, 1)):
            raise ValueError(
                "MaxPool2d: return_indices, ceil_mode and dilation are not supported; leave "
                "them at their defaults"
            )

    def forward(self, x: ArrayLike) -> Tensor:
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(Module):
    """The mean of each ``kernel_size`` window of an (N, C, H, W) input, moved by ``stride``
    (the kernel size by default); zero padding counts in the divisor when
    ``count_include_pad``."""

    def __init__(
        self,
        kernel_size: Size,
        stride: Size | None = None,
        padding: Size = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size, self.padding = kernel_size, padding
        self.stride = kernel_size if stride is None else stride
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override
        if ceil_mode or divisor_override is not None:
            raise ValueError(
                "AvgPool2d: ceil_mode and divisor_override are not supported; leave them at "
                "their defaults"
            )

    def forward(self, x: ArrayLike) -> Tensor:
        return F.avg_pool2d(
            x, self.kernel_size, self.stride, self.padding, count_include_pad=self.count_include_pad
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
