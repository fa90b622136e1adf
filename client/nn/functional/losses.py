"""The losses: ``mse_loss`` and ``cross_entropy``, averaged, summed or per element."""

from __future__ import annotations

from typing import Literal

from client.autodiff import Tensor

from .arguments import ArrayLike, as_tensor, namespace_of

Reduction = Literal["mean", "sum", "none"]


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
