"""The layers of dense models: ``Linear``, ``Sequential``, the activations, ``LayerNorm``,
``Embedding``, ``Flatten`` and ``Dropout``, with PyTorch's names, shapes and default
initialisations (the convolutional, normalization and attention layers have modules of their
own).

Every layer with parameters takes ``ad=`` (the autodiff namespace they live in; the local
numpy one by default), ``rng=`` (the numpy generator that draws them on the client; the
default generator of :func:`client.nn.manual_seed` by default) and ``dtype=`` (float32).
Parameters are drawn on the client and uploaded once, so a seed gives the same model on every
device. A layer computes in the namespace of its parameters; one without parameters in that
of its input.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from client.autodiff import Autodiff, Tensor

from . import functional as F
from .functional import ArrayLike
from .functional.dropout import check_probability
from .init import DTypeLike, constant, fan_in_bound, normal, resolve, uniform
from .module import Module


class Linear(Module):
    """``y = x @ weight.mT + bias``, weight (out_features, in_features) as PyTorch stores it,
    so weights files interchange with PyTorch's. Both drawn from U(-k, k), k =
    1/sqrt(in_features): PyTorch's default."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        ad: Autodiff | None = None,
        rng: np.random.Generator | None = None,
        dtype: DTypeLike = "float32",
    ) -> None:
        super().__init__()
        if in_features < 0 or out_features < 0:
            raise ValueError(f"Linear({in_features}, {out_features}): sizes must be >= 0")
        ad, rng = resolve(ad, rng)
        self.in_features, self.out_features = in_features, out_features
        bound = fan_in_bound(in_features)
        self.weight = uniform(ad, (out_features, in_features), bound, rng, dtype)
        self.bias: Tensor | None = uniform(ad, (out_features,), bound, rng, dtype) if bias else None

    def forward(self, x: ArrayLike) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )


class Sequential(Module):
    """Modules applied in order, each to the previous one's output; registered as ``"0"``,
    ``"1"``, ... so their parameters are named ``"0.weight"`` and so on, as PyTorch's."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for index, module in enumerate(modules):
            if not isinstance(module, Module):
                raise TypeError(
                    f"Sequential: argument {index} is a {type(module).__name__}, not a Module"
                )
            setattr(self, str(index), module)

    def forward(self, x: ArrayLike) -> ArrayLike:
        for module in self:
            x = module(x)
        return x

    @overload
    def __getitem__(self, index: int) -> Module: ...
    @overload
    def __getitem__(self, index: slice) -> Sequential: ...
    def __getitem__(self, index: int | slice) -> Module | Sequential:
        modules = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*modules[index])  # the same modules, as PyTorch's slice
        return modules[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))


class ReLU(Module):
    """``maximum(x, 0)``."""

    def forward(self, x: ArrayLike) -> Tensor:
        return F.relu(x)


class Tanh(Module):
    """The hyperbolic tangent."""

    def forward(self, x: ArrayLike) -> Tensor:
        return F.tanh(x)


class GELU(Module):
    """GELU by its tanh approximation, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    The exact GELU needs ``erf``, which the Array API standard lacks (so a remote device
    cannot compute it): ``approximate`` must be ``"tanh"`` (the default here, unlike
    PyTorch's), and ``"none"`` is refused with a ValueError rather than approximated silently.
    """

    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        if approximate != "tanh":
            raise ValueError(
                f"GELU(approximate={approximate!r}) is not available: the exact GELU needs "
                "erf, which the Array API standard lacks; use GELU(approximate='tanh')"
            )
        self.approximate = approximate

    def forward(self, x: ArrayLike) -> Tensor:
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class LayerNorm(Module):
    """Normalise over the last ``len(normalized_shape)`` axes (mean and biased variance, as
    PyTorch's), then ``* weight + bias``: ones and zeros to start, when
    ``elementwise_affine``."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        *,
        ad: Autodiff | None = None,
        dtype: DTypeLike = "float32",
    ) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        self.normalized_shape = tuple(int(n) for n in shape)
        if not self.normalized_shape or min(self.normalized_shape) < 1:
            raise ValueError(f"LayerNorm: normalized_shape must be positive sizes, got {shape}")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        ad, _ = resolve(ad, None)
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        if elementwise_affine:
            self.weight = constant(ad, self.normalized_shape, 1.0, dtype)
            self.bias = constant(ad, self.normalized_shape, 0.0, dtype)

    def forward(self, x: ArrayLike) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of ``embedding_dim``, drawn from N(0, 1) as
    PyTorch's; called with integer indices of any shape, it returns their rows, of shape
    ``indices.shape + (embedding_dim,)``."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        ad: Autodiff | None = None,
        rng: np.random.Generator | None = None,
        dtype: DTypeLike = "float32",
    ) -> None:
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1:
            raise ValueError(f"Embedding({num_embeddings}, {embedding_dim}): sizes must be >= 1")
        ad, rng = resolve(ad, rng)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = normal(ad, (num_embeddings, embedding_dim), rng, 1.0, dtype)

    def forward(self, indices: ArrayLike) -> Tensor:
        return F.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Flatten(Module):
    """Axes ``start_dim`` to ``end_dim`` merged into one: by default everything but the batch
    axis, (N, C, H, W) -> (N, C*H*W), between a convolution and a ``Linear``."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: ArrayLike) -> Tensor:
        return F.flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Dropout(Module):
    """In training mode, each element zeroed with probability ``p`` and the others scaled by
    ``1/(1-p)``, the mask drawn on the device (``F.dropout``); in evaluation mode (``eval()``)
    the input as it is."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        check_probability("Dropout", p, inplace)
        self.p, self.inplace = float(p), inplace

    def forward(self, x: ArrayLike) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"
