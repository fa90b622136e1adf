"""The convolutional layers: ``Conv1d``, ``Conv2d`` and ``ConvTranspose2d``, with PyTorch's
arguments, weight layouts and default initialisation, so weights files interchange with
PyTorch's.

A convolution's weight is (out_channels, in_channels/groups, *kernel_size), a transposed
one's (in_channels, out_channels/groups, *kernel_size). Both weight and bias are drawn from
U(-k, k), k = 1/sqrt(fan_in), fan_in = weight.shape[1] * prod(kernel_size): PyTorch's
``kaiming_uniform_(a=sqrt(5))`` works out to it, and PyTorch computes ``fan_in`` from the
weight's second axis for the transposed layer too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from client.autodiff import Autodiff, Tensor

from . import functional as F
from .functional import ArrayLike
from .functional.arguments import check_groups, per_dimension
from .functional.convolution import transposed_sizes
from .init import DTypeLike, fan_in_bound, resolve, uniform
from .module import Module

Size = int | Sequence[int]


class _ConvNd(Module):
    """What every convolution holds: its arguments as PyTorch keeps them, and its weight and
    bias drawn as PyTorch draws them."""

    def __init__(
        self,
        name: str,
        dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: Size,
        *,
        stride: Size,
        padding: str | Size,
        dilation: Size,
        groups: int,
        bias: bool,
        padding_mode: str,
        transposed: bool = False,
        output_padding: Size = 0,
        init: tuple[Autodiff | None, np.random.Generator | None, DTypeLike],
    ) -> None:
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"{name}({in_channels}, {out_channels}): channels must be >= 1")
        self.groups = check_groups(name, groups)
        if in_channels % self.groups or out_channels % self.groups:
            raise ValueError(
                f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must "
                f"be divisible by groups ({groups})"
            )
        if padding_mode != "zeros":
            raise ValueError(f"{name}: padding_mode={padding_mode!r} is not supported; 'zeros'")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = per_dimension(name, "kernel_size", kernel_size, dims)
        self.stride = per_dimension(name, "stride", stride, dims)
        self.dilation = per_dimension(name, "dilation", dilation, dims)
        self.output_padding = per_dimension(name, "output_padding", output_padding, dims, 0)
        self.padding: str | tuple[int, ...]
        if isinstance(padding, str):
            if transposed or padding not in ("same", "valid"):
                raise ValueError(f"{name}: padding={padding!r} is not supported")
            if padding == "same" and self.stride != (1,) * dims:
                raise ValueError(
                    f"{name}: padding='same' is not supported for strided convolutions"
                )
            self.padding = padding
        else:
            self.padding = per_dimension(name, "padding", padding, dims, minimum=0)
        self.padding_mode, self.transposed = padding_mode, transposed
        ad, rng = resolve(init[0], init[1])
        channels = (in_channels, out_channels // self.groups)
        if not transposed:
            channels = (out_channels, in_channels // self.groups)
        bound = fan_in_bound(channels[1] * math.prod(self.kernel_size))
        self.weight = uniform(ad, (*channels, *self.kernel_size), bound, rng, init[2])
        self.bias: Tensor | None = None
        if bias:
            self.bias = uniform(ad, (out_channels,), bound, rng, init[2])

    def extra_repr(self) -> str:
        dims = len(self.kernel_size)
        parts = [f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"]
        parts.append(f"stride={self.stride}")
        if self.padding != (0,) * dims:
            parts.append(f"padding={self.padding!r}")
        if self.dilation != (1,) * dims:
            parts.append(f"dilation={self.dilation}")
        if self.output_padding != (0,) * dims:
            parts.append(f"output_padding={self.output_padding}")
        if self.groups != 1:
            parts.append(f"groups={self.groups}")
        if self.bias is None:
            parts.append("bias=False")
        return ", ".join(parts)


class _Conv(_ConvNd):
    """``Conv1d`` and ``Conv2d``: one signature, PyTorch's, for any number of dimensions."""

    _dims: int

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Size,
        stride: Size = 1,
        padding: str | Size = 0,
        dilation: Size = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        *,
        ad: Autodiff | None = None,
        rng: np.random.Generator | None = None,
        dtype: DTypeLike = "float32",
    ) -> None:
        super().__init__(
            type(self).__name__,
            self._dims,
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=bias,
            padding_mode=padding_mode,
            init=(ad, rng, dtype),
        )

    def forward(self, x: ArrayLike) -> Tensor:
        conv = F.conv1d if self._dims == 1 else F.conv2d
        return conv(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )


class Conv1d(_Conv):
    """A 1-D convolution over (N, C_in, L) inputs (``F.conv1d``)."""

    _dims = 1


class Conv2d(_Conv):
    """A 2-D convolution over (N, C_in, H, W) inputs (``F.conv2d``); ``padding`` may be
    ``"same"`` (stride 1) or ``"valid"``."""

    _dims = 2


class ConvTranspose2d(_ConvNd):
    """The transposed 2-D convolution (``F.conv_transpose2d``): the gradient of ``Conv2d``
    with respect to its input, used to upsample. PyTorch's argument order: ``output_padding``
    and ``groups`` before ``bias``, ``dilation`` after it."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Size,
        stride: Size = 1,
        padding: Size = 0,
        output_padding: Size = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: Size = 1,
        padding_mode: str = "zeros",
        *,
        ad: Autodiff | None = None,
        rng: np.random.Generator | None = None,
        dtype: DTypeLike = "float32",
    ) -> None:
        super().__init__(
            "ConvTranspose2d",
            2,
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=bias,
            padding_mode=padding_mode,
            transposed=True,
            output_padding=output_padding,
            init=(ad, rng, dtype),
        )

    def forward(self, x: ArrayLike, output_size: Sequence[int] | None = None) -> Tensor:
        """``x`` (N, C_in, H, W) or (C_in, H, W) upsampled; ``output_size`` ((H, W), or the
        whole output shape) picks among the sizes a strided ``Conv2d`` maps to ``x``'s size
        in place of ``output_padding``, as PyTorch's."""
        extra = self.output_padding
        if output_size is not None:
            shape = tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
            extra = self._output_padding(shape, tuple(output_size))
        return F.conv_transpose2d(
            x,
            self.weight,
            self.bias,
            self.stride,
            self._padding(),
            extra,
            self.groups,
            self.dilation,
        )

    def _output_padding(self, shape: tuple[int, ...], size: tuple[int, ...]) -> tuple[int, ...]:
        """The ``output_padding`` that gives ``size``: from the smallest output (none) to
        ``stride - 1`` more, PyTorch's range."""
        if len(size) == len(shape):  # the whole output shape: its spatial part
            size = size[-2:]
        if len(size) != 2:
            raise ValueError(
                f"ConvTranspose2d: output_size must be (H, W) or the output's {len(shape)} "
                f"sizes for an input of shape {shape}, not {size}"
            )
        smallest = transposed_sizes(
            shape[-2:], self.stride, self._padding(), self.dilation, self.kernel_size, (0, 0)
        )
        largest = [m + s - 1 for m, s in zip(smallest, self.stride, strict=True)]
        if any(not lo <= n <= hi for n, lo, hi in zip(size, smallest, largest, strict=True)):
            raise ValueError(
                f"ConvTranspose2d: output_size {size} is outside the sizes {smallest} to "
                f"{largest} that an input of spatial size {shape[-2:]} can give"
            )
        return tuple(n - m for n, m in zip(size, smallest, strict=True))

    def _padding(self) -> tuple[int, ...]:
        padding = self.padding
        assert not isinstance(padding, str)  # the constructor refuses strings
        return padding
