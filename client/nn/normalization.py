"""Batch normalization layers: ``BatchNorm1d`` and ``BatchNorm2d``, with PyTorch's arguments,
parameters and buffers (``weight``, ``bias``, ``running_mean``, ``running_var``,
``num_batches_tracked``), so weights files interchange with PyTorch's.

In training mode a layer normalizes with the batch's statistics and updates its running ones
in place, on the device (``F.batch_norm``), counting the batches in ``num_batches_tracked``;
in evaluation mode (``eval()``) it normalizes with the running statistics. With
``momentum=None`` the running statistics are the average of every batch's, as PyTorch's: the
n-th batch weighs 1/n, n read from ``num_batches_tracked`` on the device (no round trip, and
a replayed step counts its batches too).
"""

from __future__ import annotations

import numpy as np

from client.autodiff import Autodiff, Tensor

from . import functional as F
from .functional import ArrayLike
from .init import DTypeLike, buffer, constant, float_dtype, resolve
from .module import Module


class _BatchNorm(Module):
    """What ``BatchNorm1d`` and ``BatchNorm2d`` share; they differ in the inputs they take."""

    _ranks: tuple[int, ...]  # the input dimensions the layer takes
    _layouts: str

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        *,
        ad: Autodiff | None = None,
        dtype: DTypeLike = "float32",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if num_features < 1:
            raise ValueError(f"{name}({num_features}): num_features must be >= 1")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        ad, _ = resolve(ad, None)
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        if affine:
            self.weight = constant(ad, (num_features,), 1.0, dtype)
            self.bias = constant(ad, (num_features,), 0.0, dtype)
        stats = None
        if track_running_stats:
            floating = float_dtype(dtype)
            stats = (
                buffer(ad, np.zeros(num_features, floating)),
                buffer(ad, np.ones(num_features, floating)),
                buffer(ad, np.zeros((), np.int64)),
            )
        self.register_buffer("running_mean", None if stats is None else stats[0])
        self.register_buffer("running_var", None if stats is None else stats[1])
        self.register_buffer("num_batches_tracked", None if stats is None else stats[2])

    def forward(self, x: ArrayLike) -> Tensor:
        ndim = len(np.shape(x)) if not hasattr(x, "ndim") else int(x.ndim)
        if ndim not in self._ranks:
            raise ValueError(
                f"{type(self).__name__}: expected an input {self._layouts}, got a {ndim}-D input"
            )
        momentum: float | Tensor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.num_batches_tracked is not None:
            self.num_batches_tracked += 1  # in place, on the device
            if self.momentum is None:  # a cumulative average: the n-th batch weighs 1/n
                ad = self.num_batches_tracked.namespace
                momentum = 1.0 / ad.astype(self.num_batches_tracked, self.running_var.dtype)
        return F.batch_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or self.running_mean is None,
            momentum,
            self.eps,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, track_running_stats={self.track_running_stats}"
        )


class BatchNorm1d(_BatchNorm):
    """Batch normalization of (N, C) or (N, C, L) inputs over each of the C features."""

    _ranks = (2, 3)
    _layouts = "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """Batch normalization of (N, C, H, W) inputs over each of the C channels."""

    _ranks = (4,)
    _layouts = "(N, C, H, W)"
