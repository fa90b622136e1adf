"""Normalization: ``layer_norm`` over each sample's trailing axes, ``batch_norm`` over each
channel of a batch (with its running statistics updated in place on the device)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from client.autodiff import Tensor, no_grad

from .arguments import (
    ArrayLike,
    as_tensor,
    check_same_dtype,
    check_vector,
    namespace_of,
    optional_tensor,
    sizes,
)


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


def batch_norm(
    input: ArrayLike,
    running_mean: ArrayLike | None,
    running_var: ArrayLike | None,
    weight: ArrayLike | None = None,
    bias: ArrayLike | None = None,
    training: bool = False,
    momentum: float | Tensor = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalize each channel (axis 1) of ``input`` (N, C, ...), then ``* weight + bias``
    when given: PyTorch's ``F.batch_norm``, with its argument order and defaults.

    In training, with the batch's mean and biased variance over every axis but the channel's
    (the gradient flows through both), and, when the running statistics are given, updates
    them in place on the device, ``running = (1 - momentum) * running + momentum * batch``,
    the variance with its unbiased estimate, as PyTorch does. Otherwise with
    ``running_mean`` and ``running_var``. The running statistics are updated where they are,
    so they must be tensors (or arrays) of the input's namespace; so may ``momentum`` be (a
    0-d one: ``BatchNorm(momentum=None)``'s 1/n)."""
    ad = namespace_of(input, weight, bias, running_mean, running_var)
    x = as_tensor(ad, input)
    if x.ndim < 2:
        raise ValueError(f"batch_norm: expected an input (N, C, ...), got shape {x.shape}")
    if not ad.is_real_floating(x.array):
        raise TypeError(f"batch_norm: the input must be float32 or float64, not {x.dtype}")
    channels = sizes(x)[1]
    mean_run, var_run = optional_tensor(ad, running_mean), optional_tensor(ad, running_var)
    w, b = optional_tensor(ad, weight), optional_tensor(ad, bias)
    named = {"running_mean": mean_run, "running_var": var_run, "weight": w, "bias": b}
    for name, value in named.items():
        check_vector("batch_norm", name, value, channels)
    check_same_dtype("batch_norm", x, **named)
    if (mean_run is None) != (var_run is None):
        raise ValueError("batch_norm: give both running_mean and running_var, or neither")
    if not training:
        if mean_run is None or var_run is None:
            raise ValueError(
                "batch_norm: evaluation (training=False) normalizes with running_mean and "
                "running_var, and none were given"
            )
        out: Tensor = ad.batch_norm(x, mean_run, var_run, w, b, eps=eps)
        return out
    axes = (0, *range(2, x.ndim))
    count = math.prod(sizes(x)[a] for a in axes)
    if count <= 1:
        raise ValueError(
            f"batch_norm: expected more than 1 value per channel when training, got an input "
            f"of shape {x.shape}"
        )
    mean = ad.mean(x, axis=axes)
    var = ad.var(x, axis=axes)  # biased, as PyTorch normalizes with
    if mean_run is not None and var_run is not None:
        with no_grad():
            mean_run *= 1.0 - momentum
            mean_run += momentum * mean
            var_run *= 1.0 - momentum
            var_run += (momentum * count / (count - 1)) * var  # the unbiased estimate
    result: Tensor = ad.batch_norm(x, mean, var, w, b, eps=eps)
    return result
