"""Where parameters come from: drawn on the client with a numpy generator, then uploaded.

Initialising on the client keeps a model's starting point independent of where it lives: the
same seed gives the same weights on numpy, on any server and on any server's version, because
the numbers are numpy's and only their bytes travel. (A remote generator would make results
depend on the server's numpy.) It costs one upload per parameter, once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from client.autodiff import Autodiff, Tensor

DTypeLike = Any  # what np.dtype() accepts: "float32", np.float32, np.dtype("float64")

_generator: np.random.Generator = np.random.default_rng()
_local: Autodiff | None = None


def reseed(seed: int) -> np.random.Generator:
    """Reset the default generator to ``numpy.random.default_rng(seed)`` (returned), so that
    layers built after it without ``rng=`` start from the same weights every run
    (:func:`client.nn.manual_seed` calls it, and seeds the device generators too)."""
    global _generator
    _generator = np.random.default_rng(seed)
    return _generator


def default_generator() -> np.random.Generator:
    """The generator layers draw from when given no ``rng=`` (fresh entropy until
    :func:`client.nn.manual_seed`, as numpy's own default)."""
    return _generator


def local_autodiff() -> Autodiff:
    """``Autodiff(numpy)``, created once per process: the namespace of layers given no ``ad=``,
    so that two local layers share it (as they would share a device)."""
    global _local
    if _local is None:
        _local = Autodiff(np)
    return _local


def resolve(
    ad: Autodiff | None,
    rng: np.random.Generator | None,
) -> tuple[Autodiff, np.random.Generator]:
    """A layer's ``ad=`` and ``rng=`` with their defaults filled in."""
    return (local_autodiff() if ad is None else ad), (_generator if rng is None else rng)


def float_dtype(dtype: DTypeLike) -> np.dtype[Any]:
    """``dtype`` as a numpy floating dtype, refused early if it cannot carry a gradient."""
    resolved = np.dtype(dtype)
    if resolved.kind != "f":
        raise ValueError(f"parameters must have a real floating dtype, not {resolved}")
    return resolved


def parameter(ad: Autodiff, values: np.ndarray[Any, Any]) -> Tensor:
    """``values`` (a fresh numpy array) uploaded to ``ad``'s namespace as a leaf that requires
    grad: the one way every layer makes its parameters."""
    return ad.asarray(values, requires_grad=True)


def uniform(
    ad: Autodiff,
    shape: Sequence[int],
    bound: float,
    rng: np.random.Generator,
    dtype: DTypeLike = "float32",
) -> Tensor:
    """A parameter drawn from U(-bound, bound) (drawn in float64, then cast, as PyTorch's
    ``uniform_`` is exact to the dtype)."""
    values = rng.uniform(-bound, bound, size=tuple(shape)).astype(float_dtype(dtype))
    return parameter(ad, values)


def normal(
    ad: Autodiff,
    shape: Sequence[int],
    rng: np.random.Generator,
    std: float = 1.0,
    dtype: DTypeLike = "float32",
) -> Tensor:
    """A parameter drawn from N(0, std^2)."""
    values = (std * rng.standard_normal(size=tuple(shape))).astype(float_dtype(dtype))
    return parameter(ad, values)


def constant(
    ad: Autodiff, shape: Sequence[int], value: float, dtype: DTypeLike = "float32"
) -> Tensor:
    """A parameter filled with ``value`` (LayerNorm's ones and zeros)."""
    return parameter(ad, np.full(tuple(shape), value, dtype=float_dtype(dtype)))


def buffer(ad: Autodiff, values: np.ndarray[Any, Any]) -> Tensor:
    """``values`` uploaded to ``ad``'s namespace as a tensor that does not require grad: the
    one way layers make their buffers (batch norm's running statistics)."""
    return ad.asarray(values)


def xavier_bound(fan_in: int, fan_out: int) -> float:
    """The bound of PyTorch's ``xavier_uniform_`` (gain 1): sqrt(6 / (fan_in + fan_out))."""
    return math.sqrt(6.0 / (fan_in + fan_out)) if fan_in + fan_out > 0 else 0.0


def fan_in_bound(fan_in: int) -> float:
    """PyTorch's default bound for ``Linear``: 1/sqrt(fan_in), for the weight (kaiming_uniform
    with a=sqrt(5) works out to it) and the bias alike."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
