"""The layers' computations as functions (PyTorch's ``torch.nn.functional`` names), over
tensors of any autodiff namespace.

Each function takes tensors or plain arrays and runs in the namespace of its first tensor, so
the same call computes on numpy or on a server, wherever the model's parameters are. A plain
array is taken as a constant of that namespace (a numpy array given to a remote model is
uploaded). Shapes are checked here, on the client, so a mistake is reported with the names a
user knows instead of as a broadcasting error from deep inside the server.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from client.autodiff import Autodiff, Tensor

from .init import local_autodiff

ArrayLike = Any  # a Tensor, an array of any Array API namespace, or a nested list
Reduction = Literal["mean", "sum", "none"]

_GELU_SCALE = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def namespace_of(*values: ArrayLike) -> Autodiff:
    """The autodiff namespace of the first tensor among ``values``; with none, one over the
    first array's own namespace (numpy's is the shared local one)."""
    for value in values:
        if isinstance(value, Tensor):
            return value.namespace
    for value in values:
        if hasattr(value, "__array_namespace__"):
            xp = value.__array_namespace__()
            local = local_autodiff()
            return local if xp is local.xp else Autodiff(xp)
    return local_autodiff()


def as_tensor(ad: Autodiff, value: ArrayLike) -> Tensor:
    """``value`` as a tensor of ``ad``: a tensor as it is, anything else through ``asarray``
    (no copy for an array already of ``ad``'s namespace, an upload for a numpy array given to
    a remote one)."""
    return value if isinstance(value, Tensor) else ad.asarray(value)


def _reduced(loss: Tensor, reduction: str) -> Tensor:
    ad = loss.namespace
    out: Tensor = loss
    if reduction == "mean":
        out = ad.mean(loss)
    elif reduction == "sum":
        out = ad.sum(loss)
    return out


def _check_reduction(name: str, reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', not {reduction!r}")


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
    inner = _GELU_SCALE * (t + _GELU_CUBIC * t**3)
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


def layer_norm(
    x: ArrayLike,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise over the last ``len(normalized_shape)`` axes with their mean and biased
    variance (as PyTorch's), then scale by ``weight`` and shift by ``bias`` when given."""
    ad = namespace_of(x, weight, bias)
    t = as_tensor(ad, x)
    shape = tuple(normalized_shape)
    if not shape or t.ndim < len(shape) or t.shape[t.ndim - len(shape) :] != shape:
        raise ValueError(
            f"layer_norm: the input's trailing axes must be {shape}, got an input of shape "
            f"{t.shape}"
        )
    axes = tuple(range(-len(shape), 0))
    centred = t - ad.mean(t, axis=axes, keepdims=True)
    var = ad.mean(centred * centred, axis=axes, keepdims=True)
    y: Tensor = centred / ad.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def embedding(indices: ArrayLike, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by integer ``indices`` of any shape:
    the result has shape ``indices.shape + (dim,)``. A row picked twice gets the sum of both
    gradients. Out-of-range indices are reported by the namespace (numpy's IndexError, the
    server's error), not checked here: that would need a read."""
    ad = weight.namespace
    index = as_tensor(ad, indices)
    if not ad.xp.isdtype(index.dtype, "integral"):
        raise TypeError(f"embedding: indices must be integers, not {index.dtype}")
    flat = ad.reshape(index, (-1,))
    rows = ad.take(weight, flat, axis=0)
    out: Tensor = ad.reshape(rows, (*index.shape, weight.shape[-1]))
    return out


def mse_loss(input: ArrayLike, target: ArrayLike, reduction: Reduction = "mean") -> Tensor:
    """The squared error ``(input - target)**2``, averaged (``"mean"``), summed or per element
    (``"none"``). ``input`` and ``target`` must have the same shape: PyTorch only warns when
    they broadcast, which hides a (N,) against (N, 1) mistake as an (N, N) loss."""
    _check_reduction("mse_loss", reduction)
    ad = namespace_of(input, target)
    x, y = as_tensor(ad, input), as_tensor(ad, target)
    if x.shape != y.shape:
        raise ValueError(
            f"mse_loss: input of shape {x.shape} and target of shape {y.shape} differ; "
            "reshape one so that they match"
        )
    diff = x - y
    return _reduced(diff * diff, reduction)


def cross_entropy(
    logits: ArrayLike,
    labels: ArrayLike,
    reduction: Reduction = "mean",
) -> Tensor:
    """The negative log-likelihood of integer class ``labels`` (N,) under the softmax of
    ``logits`` (N, C): ``-log_softmax(logits)[i, labels[i]]``, averaged, summed or per row.

    The log-softmax is the stable one (shifted by the row maximum), so large logits do not
    overflow. Labels outside [0, C) are reported by the namespace, not checked here (that
    would need a read from the device)."""
    _check_reduction("cross_entropy", reduction)
    ad = namespace_of(logits, labels)
    z, y = as_tensor(ad, logits), as_tensor(ad, labels)
    if z.ndim != 2:
        raise ValueError(f"cross_entropy: logits must be (N, C), got shape {z.shape}")
    if not ad.xp.isdtype(z.dtype, "real floating"):
        raise TypeError(f"cross_entropy: logits must be real floating, not {z.dtype}")
    if y.ndim != 1 or y.shape[0] != z.shape[0]:
        raise ValueError(
            f"cross_entropy: labels must be 1-D with one label per row of logits "
            f"({z.shape[0]}), got shape {y.shape}"
        )
    if not ad.xp.isdtype(y.dtype, "integral"):
        raise TypeError(f"cross_entropy: labels must be integer class indices, not {y.dtype}")
    log_p = ad.log_softmax(z, axis=-1)
    picked = ad.take_along_axis(log_p, ad.expand_dims(y, axis=-1), axis=-1)  # (N, 1)
    if reduction == "none":
        per_row: Tensor = -ad.reshape(picked, (z.shape[0],))
        return per_row
    return -_reduced(picked, reduction)  # the sign after the reduction: one op on a scalar
