"""The functions of dense models: activations, softmax, ``linear``, ``embedding`` and
``flatten``."""

from __future__ import annotations

import math

from client.autodiff import Tensor

from .arguments import ArrayLike, as_tensor, namespace_of, sizes

_GELU_SCALE = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def relu(x: ArrayLike) -> Tensor:
    """``maximum(x, 0)``."""
    ad = namespace_of(x)
    out: Tensor = ad.relu(as_tensor(ad, x))
    return out


def tanh(x: ArrayLike) -> Tensor:
    """The hyperbolic tangent."""
    ad = namespace_of(x)
    out: Tensor = ad.tanh(as_tensor(ad, x))
    return out


def gelu(x: ArrayLike, approximate: str = "tanh") -> Tensor:
    """GELU by its tanh approximation, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    The exact GELU is ``x * Phi(x)`` with the normal CDF, which needs ``erf``: the Array API
    standard has no ``erf``, so a remote namespace cannot compute it. The tanh form (PyTorch's
    ``approximate="tanh"``, GPT-2's) is within 5e-4 of it everywhere and is the only one here;
    ``approximate="none"`` is refused rather than silently approximated.
    """
    if approximate != "tanh":
        raise ValueError(
            f"gelu: approximate={approximate!r} is not available: the exact GELU needs erf, "
            "which the Array API standard lacks; use approximate='tanh'"
        )
    ad = namespace_of(x)
    t = as_tensor(ad, x)
    # t * t * t, not t**3: numpy's power of a negative base takes its slow general path
    # (bench/REASONS.md, 'The GELU cube as products')
    inner = _GELU_SCALE * (t + _GELU_CUBIC * (t * t * t))
    out: Tensor = (0.5 * t) * (1.0 + ad.tanh(inner))
    return out


def linear(x: ArrayLike, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.mT + bias``, with ``weight`` of shape (out_features, in_features) as
    PyTorch stores it."""
    ad = weight.namespace
    t = as_tensor(ad, x)
    in_features = weight.shape[-1]
    if t.ndim == 0 or t.shape[-1] != in_features:
        raise ValueError(
            f"linear: the input's last axis must have {in_features} features, "
            f"got an input of shape {t.shape}"
        )
    result: Tensor = ad.linear(t, weight, bias)  # one op: see client.autodiff.linalg.linear
    return result


def embedding(indices: ArrayLike, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by integer ``indices`` of any shape:
    the result has shape ``indices.shape + (dim,)``. A row picked twice gets the sum of both
    gradients. Out-of-range indices are reported by the namespace (numpy's IndexError, the
    server's error), not checked here: that would need a read."""
    ad = weight.namespace
    index = as_tensor(ad, indices)
    if not ad.xp.isdtype(index.dtype, "integral"):
        raise TypeError(f"embedding: indices must be integers, not {index.dtype}")
    if index.ndim == 1:  # the rows as they are taken: no reshape before or after
        taken: Tensor = ad.take(weight, index, axis=0)
        return taken
    rows = ad.take(weight, ad.reshape(index, (-1,)), axis=0)
    out: Tensor = ad.reshape(rows, (*index.shape, weight.shape[-1]))
    return out


def softmax(input: ArrayLike, dim: int) -> Tensor:
    """``exp(input) / sum(exp(input), dim)``, computed stably (the maximum taken out). ``dim``
    is required: PyTorch's implicit choice of it is deprecated."""
    ad = namespace_of(input)
    t = as_tensor(ad, input)
    _check_dim("softmax", t, dim)
    out: Tensor = ad.softmax(t, axis=dim)
    return out


def log_softmax(input: ArrayLike, dim: int) -> Tensor:
    """``input - logsumexp(input, dim)``, stable for any magnitude; ``dim`` is required."""
    ad = namespace_of(input)
    t = as_tensor(ad, input)
    _check_dim("log_softmax", t, dim)
    out: Tensor = ad.log_softmax(t, axis=dim)
    return out


def _check_dim(function: str, t: Tensor, dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or not -t.ndim <= dim < max(t.ndim, 1):
        raise ValueError(
            f"{function}: dim must be an int in [{-t.ndim}, {t.ndim}) for an input of shape "
            f"{t.shape}, not {dim!r}"
        )


def flatten(input: ArrayLike, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """``input`` with axes ``start_dim`` to ``end_dim`` (both included) merged into one, as
    ``torch.flatten``; ``nn.Flatten`` keeps the batch axis (``start_dim=1``)."""
    ad = namespace_of(input)
    t = as_tensor(ad, input)
    rank = max(t.ndim, 1)
    start = start_dim + rank if start_dim < 0 else start_dim
    end = end_dim + rank if end_dim < 0 else end_dim
    if not 0 <= start <= end < rank:
        raise ValueError(
            f"flatten: start_dim={start_dim} and end_dim={end_dim} do not name axes in order "
            f"of an input of shape {t.shape}"
        )
    shape = sizes(t)
    merged = math.prod(shape[start : end + 1])
    out: Tensor = ad.reshape(t, (*shape[:start], merged, *shape[end + 1 :]))
    return out
